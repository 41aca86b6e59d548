"""``cropscale.scaling`` imports no submodule until a public name is used (the report needs only Amdahl)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cropscale.scaling

LOADED = "import sys, {mod}; print(' '.join(sorted(m for m in sys.modules if m.startswith('cropscale.scaling.'))))"


def _scaling_modules_after(import_line: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", LOADED.format(mod=import_line)], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_importing_the_package_imports_no_submodule():
    assert _scaling_modules_after("cropscale.scaling") == set()


def test_the_report_command_loads_only_the_scaling_model_it_uses():
    # the report's device scaling and Amdahl columns use amdahl.py; nothing of PMNF, verdicts or all-reduce
    assert _scaling_modules_after("cropscale.report.command") == {"cropscale.scaling.amdahl"}


@pytest.mark.parametrize("name", sorted(cropscale.scaling.__all__))
def test_every_public_name_resolves_to_its_submodule_object(name):
    value = getattr(cropscale.scaling, name)
    module = sys.modules[f"cropscale.scaling.{cropscale.scaling._EXPORTS[name]}"]
    assert getattr(module, name) is value


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'fit_amdahl'"):
        cropscale.scaling.fit_amdahl  # noqa: B018
