"""Export measurement series to Extra-P's JSON Lines input format, so models can be cross-checked
in Extra-P (``extrap --jsonlines file.jsonl``, or File > Open in its GUI).

Format (Extra-P's ``jsonlines`` reader, docs/file-formats.md of the Extra-P repository): one JSON
object per line, one line per measured value (repetitions are separate lines at the same
coordinate; Extra-P aggregates them):

    {"params": {"batch_size": 4}, "metric": "step_time_s", "callpath": "train_step", "value": 0.123}

``params`` maps every parameter name to its value at that measurement point (the first line fixes
the parameter order); ``metric`` and ``callpath`` are optional in the format and always written
here; ``value`` is a number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from cropscale.errors import CropScaleError


def extrap_records(series) -> list[dict]:
    """One Extra-P JSON Lines record per repetition of a :class:`~cropscale.bench.measure.ScalingSeries`."""
    records = []
    for xv, reps in zip(series.x, series.y, strict=True):
        for v in reps:
            if not math.isfinite(float(v)) or not math.isfinite(float(xv)):
                raise CropScaleError(f"{series.metric}: non-finite value at {series.parameter}={xv!r}")
            x_out = int(xv) if float(xv).is_integer() else float(xv)
            records.append(
                {"params": {series.parameter: x_out}, "metric": series.metric, "callpath": series.callpath,
                 "value": float(v)}
            )
    return records


def write_extrap_jsonl(path: str | Path, series: Iterable, append: bool = False) -> Path:
    """Write one or more series to ``path`` in Extra-P's JSON Lines format.

    All series in one file must share one parameter name (Extra-P fixes the parameters from the
    first line); different metrics and callpaths may be mixed.

    Returns:
        The path written.

    Raises:
        CropScaleError: no series, or series with different parameter names.
    """
    if hasattr(series, "x") and hasattr(series, "y"):
        series = [series]
    series = list(series)
    if not series:
        raise CropScaleError("write_extrap_jsonl: no series to write")
    params = {s.parameter for s in series}
    if len(params) != 1:
        raise CropScaleError(
            f"write_extrap_jsonl: Extra-P needs one parameter set per file, got {sorted(params)}; "
            "write one file per parameter"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for s in series:
            for rec in extrap_records(s):
                fh.write(json.dumps(rec) + "\n")
    return path


def read_extrap_jsonl(path: str | Path) -> dict[tuple[str, str], dict[float, list[float]]]:
    """Read a JSON Lines file as Extra-P does, for round-trip checks.

    Returns:
        ``{(callpath, metric): {x: [values...]}}`` for single-parameter files (the default callpath
        is ``"<root>"`` and the default metric ``"<default>"``, as in Extra-P).

    Raises:
        CropScaleError: a line that is not JSON, lacks ``params`` or ``value``, or has other
            parameters than the first line, or more than one parameter.
    """
    path = Path(path)
    out: dict[tuple[str, str], dict[float, list[float]]] = {}
    names = None
    with path.open(encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                params = rec["params"]
                value = rec["value"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise CropScaleError(f"{path}:{ln}: not an Extra-P JSON Lines record ({err})") from err
            if names is None:
                names = list(params)
                if len(names) != 1:
                    raise CropScaleError(f"{path}:{ln}: expected one parameter, got {names}")
            if list(params) != names:
                raise CropScaleError(f"{path}:{ln}: parameters {list(params)} differ from the first line's {names}")
            key = (rec.get("callpath", "<root>"), rec.get("metric", "<default>"))
            values = value if isinstance(value, list) else [value]
            out.setdefault(key, {}).setdefault(float(params[names[0]]), []).extend(float(v) for v in values)
    return out
