"""Import every package the GPU check needs and every module of cropscale; one line per missing piece.

``python scripts/gpu_imports.py [--json FILE]``: prints ``MISSING <module>: <error>`` for each import that
fails (a package the image lacks and the carry did not bring, or a project module that needs one), then
one line ``imports: N of M imported`` with the versions of the third-party packages and torch's CUDA
view. Exit status 1 when anything is missing. Standard library only, so it runs before anything is known
to import.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path

# (module, distribution): what cropscale and its tests import from outside the standard library
THIRD_PARTY = (
    ("torch", "torch"), ("lightning", "lightning"), ("torchmetrics", "torchmetrics"),
    ("tensorboard", "tensorboard"), ("pynvml", "nvidia-ml-py"), ("numpy", "numpy"), ("scipy", "scipy"),
    ("matplotlib", "matplotlib"), ("yaml", "pyyaml"), ("typing_extensions", "typing-extensions"),
    ("pytest", "pytest"), ("jsonargparse", "jsonargparse"), ("docstring_parser", "docstring-parser"),
    ("typeshed_client", "typeshed-client"), ("pytorch_optimizer", "pytorch-optimizer"),
    ("rasterio", "rasterio"), ("affine", "affine"), ("cligj", "cligj"), ("click_plugins", "click-plugins"),
)


def _try(name: str) -> str | None:
    try:
        importlib.import_module(name)
    except BaseException as err:  # noqa: BLE001 - any failure at import is a missing piece
        return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    return None


def check() -> dict:
    """Import everything; returns ``{"missing": {module: error}, "versions": {...}, "modules": n, "cuda": {...}}``."""
    from importlib import metadata

    missing: dict[str, str] = {}
    versions: dict[str, str | None] = {}
    for module, dist in THIRD_PARTY:
        err = _try(module)
        if err:
            missing[module] = err
            continue
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = getattr(sys.modules[module], "__version__", None)
    names = ["cropscale"]
    err = _try("cropscale")
    if err:
        missing["cropscale"] = err
    else:
        pkg = sys.modules["cropscale"]
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, "cropscale.")]
        for name in names[1:]:
            err = _try(name)
            if err:
                missing[name] = err
    cuda: dict = {}
    if "torch" not in missing:
        import torch

        cuda = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
                "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    return {"missing": missing, "versions": versions, "modules": len(names), "third_party": len(THIRD_PARTY),
            "cuda": cuda, "python": sys.version.split()[0], "sys_path_head": sys.path[:4]}


def main() -> int:
    """Entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    result = check()
    for name, err in result["missing"].items():
        print(f"MISSING {name}: {err}")
    total = result["third_party"] + result["modules"]
    print(f"imports: {total - len(result['missing'])} of {total} imported (Python {result['python']}; "
          + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + f"; torch CUDA {result['cuda']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
