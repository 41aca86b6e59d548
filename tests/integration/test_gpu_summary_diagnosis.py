"""The GPU check's summary prints each fit's diagnosis: its limit, the next findings, how host gaps are judged."""

from __future__ import annotations

import json

from tests.integration.test_gpu_check_script import _summary_module

GAPS = ("host gaps between kernels and launch overhead: the step windows are on the device timeline, so a gap ...")


def _run_json(folder, diagnosis):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"evidence": "measured-run", "status": "finished", "summary": {},
                                                 **({"diagnosis": diagnosis} if diagnosis else {})}))


def test_each_fit_line_is_followed_by_its_limit_and_findings(tmp_path):
    mod = _summary_module()
    lines = [f"finding {i}" for i in range(4)]
    _run_json(tmp_path / "runs" / "fit-bf16" / "version_0",
              {"limit": "input", "findings": [{"line": line} for line in lines], "not_judged": [GAPS]})
    _run_json(tmp_path / "runs" / "fit-fp16" / "version_0", None)
    fits = mod.fit_figures(tmp_path)
    assert fits["fit-bf16"]["diagnosis"] == {"limit": "input", "lines": lines, "not_judged": [GAPS], "error": None}
    text = mod._fit_lines(fits)
    bf16 = next(i for i, line in enumerate(text) if line.startswith("- fit-bf16"))
    assert text[bf16 + 1:bf16 + 4] == ["  - limit: finding 0 [measured-run; bounds analytical-scenario]",
                                       "  - also: finding 1", "  - also: finding 2"]
    fp16 = next(i for i, line in enumerate(text) if line.startswith("- fit-fp16"))
    assert text[fp16 + 1] == "  - limit: n/a (no diagnosis in run.json)"
    assert text[-1] == f"- {GAPS}"          # said once, after the fits
