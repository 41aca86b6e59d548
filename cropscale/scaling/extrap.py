"""Extra-P interchange: export series as JSON Lines for Extra-P, import Extra-P's text format.

JSON Lines (Extra-P's ``jsonlines`` reader: ``extrap --jsonlines file.jsonl`` or File > Open in its
GUI). One JSON object per line and per measured value; repetitions are separate lines at the same
coordinate (a list of values in ``value`` is accepted when reading):

    {"params": {"batch_size": 4}, "metric": "step_time_s", "callpath": "train_step", "value": 0.123}

``params`` maps the parameter name to its value (the first line fixes the parameters); ``metric``
and ``callpath`` are optional in the format (defaults ``"<default>"`` and ``"<root>"``; ``->``
separates the levels of a call path) and always written here. Extra-P validates a file as one
experiment: **every (callpath, metric) pair must have measurements at every coordinate that occurs
in the file**, otherwise it refuses the file ("the number of measurements ... does not match the
number of coordinates"). So :func:`write_extrap_jsonl` writes only series that share one parameter
and one point set (also when appending), and :func:`write_extrap_jsonl_by_points` writes one file
per point set.

Text format (Extra-P's ``--text`` reader), read by :func:`read_extrap_text`: lines ``PARAMETER
<name>``, ``POINTS <x1> <x2> ...`` (each point optionally in parentheses; several POINTS lines
append), then blocks ``REGION <callpath>`` / ``METRIC <name>`` (either order; METRIC is optional and
holds until the next METRIC) followed by one ``DATA <value> <value> ...`` line per point in POINTS
order, its values the repetitions at that point. ``#`` starts a comment line; blank lines are
ignored. Every (region, metric) block must have exactly one DATA line per point. Only
single-parameter files are read (the PMNF models here have one parameter).

Files are written atomically (a temporary file in the same folder, then ``os.replace``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

from cropscale.errors import CropScaleError
from cropscale.evidence import check_label
from cropscale.files import atomic_write_text
from cropscale.scaling.series import ScalingSeries

DEFAULT_CALLPATH = "<root>"
DEFAULT_METRIC = "<default>"


# ------------------------------------------------------------------------------ JSON Lines out


def _number(v: float):
    return int(v) if float(v).is_integer() else float(v)


def extrap_records(series) -> list[dict]:
    """One Extra-P JSON Lines record per repetition of a :class:`~cropscale.scaling.series.ScalingSeries`.

    Raises:
        CropScaleError: a non-finite ``x`` or value (JSON has no NaN), naming the metric.
    """
    records = []
    for xv, reps in zip(series.x, series.y, strict=True):
        for v in reps:
            if not math.isfinite(float(v)) or not math.isfinite(float(xv)):
                raise CropScaleError(f"{series.metric}: non-finite value at {series.parameter}={xv!r}")
            records.append(
                {"params": {series.parameter: _number(xv)}, "metric": series.metric, "callpath": series.callpath,
                 "value": float(v)}
            )
    return records


def _as_list(series) -> list:
    if hasattr(series, "x") and hasattr(series, "y"):
        return [series]
    return list(series)


def _points(s) -> tuple[float, ...]:
    return tuple(sorted({float(x) for x in s.x}))


def _check_one_experiment(items: list[tuple[str, tuple[float, ...], str]], where: str) -> None:
    """Refuse ``(parameter, points, callpath/metric)`` items that Extra-P could not read as one experiment.

    The rules are in the module docstring.
    """
    params = sorted({p for p, _, _ in items})
    if len(params) != 1:
        raise CropScaleError(
            f"{where}: Extra-P needs one parameter per file, got {params}; write one file per parameter")
    sets: dict[tuple[float, ...], list[str]] = {}
    for _, pts, name in items:
        sets.setdefault(pts, []).append(name)
    if len(sets) > 1:
        detail = "; ".join(f"{', '.join(names)} at {params[0]} = {[_number(x) for x in pts]}"
                           for pts, names in sets.items())
        raise CropScaleError(
            f"{where}: series with different point sets cannot share an Extra-P file (Extra-P requires every "
            f"callpath and metric at every point of the file): {detail}. Use write_extrap_jsonl_by_points"
        )


def write_extrap_jsonl(path: str | Path, series: Iterable, append: bool = False) -> Path:
    """Write series to ``path`` in Extra-P's JSON Lines format (module docstring).

    Args:
        path: the file (folders are created).
        series: one :class:`~cropscale.scaling.series.ScalingSeries` or several, sharing one
            parameter and one point set; metrics and callpaths may differ.
        append: add to an existing file, whose parameter and point set must then be the same.

    Returns:
        The path written.

    Raises:
        CropScaleError: no series, different parameters or point sets (within ``series`` or
            against the file appended to), a non-finite value, an unreadable file to append to.
    """
    series = _as_list(series)
    path = Path(path)
    if not series:
        raise CropScaleError(f"write_extrap_jsonl {path}: no series to write")
    items = [(s.parameter, _points(s), f"{s.callpath}/{s.metric}") for s in series]
    existing = ""
    if append and path.exists():
        param = _parameter_of(path)
        old = [(param, tuple(sorted(pts)), f"{cp}/{m} (in the file)")
               for (cp, m), pts in read_extrap_jsonl(path).items()]
        _check_one_experiment(old + items, f"appending to {path}")
        existing = path.read_text(encoding="utf-8")
        if existing and not existing.endswith("\n"):
            existing += "\n"
    else:
        _check_one_experiment(items, f"write_extrap_jsonl {path}")
    lines = [json.dumps(rec) for s in series for rec in extrap_records(s)]
    atomic_write_text(path, existing + "\n".join(lines) + "\n")
    return path


def write_extrap_jsonl_by_points(path: str | Path, series: Iterable) -> list[Path]:
    """Write one Extra-P JSON Lines file per (parameter, point set) of ``series``.

    With one group the file is ``path`` itself; otherwise ``<stem>.1<suffix>``, ``<stem>.2<suffix>``
    ... in the order the groups first occur in ``series``.

    Returns:
        The paths written, in group order.

    Raises:
        CropScaleError: no series, a non-finite value.
    """
    series = _as_list(series)
    path = Path(path)
    if not series:
        raise CropScaleError(f"write_extrap_jsonl_by_points {path}: no series to write")
    groups: dict[tuple, list] = {}
    for s in series:
        groups.setdefault((s.parameter, _points(s)), []).append(s)
    if len(groups) == 1:
        return [write_extrap_jsonl(path, series)]
    return [write_extrap_jsonl(path.with_name(f"{path.stem}.{k}{path.suffix}"), group)
            for k, group in enumerate(groups.values(), start=1)]


# ------------------------------------------------------------------------------ JSON Lines in


def _parameter_of(path: Path) -> str:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                return next(iter(json.loads(line)["params"]))
    raise CropScaleError(f"{path}: empty file")


def _record(path: Path, ln: int, line: str) -> tuple[dict, object, tuple[str, str]]:
    """``(params, value, (callpath, metric))`` of one line."""
    try:
        rec = json.loads(line)
        key = (str(rec.get("callpath", DEFAULT_CALLPATH)), str(rec.get("metric", DEFAULT_METRIC)))
        return dict(rec["params"]), rec["value"], key
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
        raise CropScaleError(f"{path}:{ln}: not an Extra-P JSON Lines record ({err})") from err


def read_extrap_jsonl(path: str | Path) -> dict[tuple[str, str], dict[float, list[float]]]:
    """Read a single-parameter JSON Lines file with Extra-P's rules (module docstring).

    Returns:
        ``{(callpath, metric): {x: [values...]}}`` (defaults ``"<root>"`` and ``"<default>"``).

    Raises:
        CropScaleError: a missing file, a line that is not JSON or lacks ``params`` or ``value``,
            other parameters than the first line's, more than one parameter, or a (callpath,
            metric) without measurements at every point of the file (Extra-P refuses such files).
    """
    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"{path}: no such file")
    out: dict[tuple[str, str], dict[float, list[float]]] = {}
    names = None
    with path.open(encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            params, value, key = _record(path, ln, line)
            if names is None:
                names = list(params)
                if len(names) != 1:
                    raise CropScaleError(f"{path}:{ln}: expected one parameter, got {names}")
            if list(params) != names:
                raise CropScaleError(f"{path}:{ln}: parameters {list(params)} differ from the first line's {names}")
            values = value if isinstance(value, list) else [value]
            out.setdefault(key, {}).setdefault(float(params[names[0]]), []).extend(float(v) for v in values)
    _check_complete(path, out)
    return out


def _check_complete(path: Path, data: dict) -> None:
    points = set().union(*(set(v) for v in data.values())) if data else set()
    for (callpath, metric), pts in data.items():
        if set(pts) != points:
            raise CropScaleError(
                f"{path}: callpath {callpath!r}, metric {metric!r} has measurements at {len(pts)} of the file's "
                f"{len(points)} points; Extra-P refuses such a file (every callpath and metric at every point)"
            )


def read_extrap_jsonl_series(path: str | Path, *, evidence: str, unit: str = "") -> list[ScalingSeries]:
    """The series of a JSON Lines file (:func:`read_extrap_jsonl`), labelled with ``evidence``."""
    path = Path(path)
    check_label(evidence)
    data = read_extrap_jsonl(path)
    param = _parameter_of(path) if data else ""
    return [ScalingSeries(param, metric, unit, sorted(pts), [pts[x] for x in sorted(pts)], evidence, callpath)
            for (callpath, metric), pts in data.items()]


# ------------------------------------------------------------------------------ text in

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class _TextReader:
    """State of :func:`read_extrap_text` while it walks the lines (one method per section)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parameters: list[str] = []
        self.points: list[float] = []
        self.region: str | None = None
        self.metric = DEFAULT_METRIC
        self.index = 0  # next point of the current block
        self.blocks: dict[tuple[str, str], list[list[float]]] = {}
        self.started: dict[tuple[str, str], int] = {}

    def error(self, ln: int, message: str) -> CropScaleError:
        return CropScaleError(f"{self.path}: line {ln}: {message}")

    def numbers(self, ln: int, text: str) -> list[float]:
        out = []
        for tok in text.replace("(", " ").replace(")", " ").split():
            if not _NUMBER.fullmatch(tok):
                raise self.error(ln, f"{tok!r} is not a number")
            out.append(float(tok))
        return out

    def parameter(self, ln: int, value: str) -> None:
        self.parameters += value.split()
        if len(self.parameters) != 1:
            got = " ".join(self.parameters)
            raise self.error(ln, f"only files with one parameter can be read, got PARAMETER {got}")

    def points_line(self, ln: int, value: str) -> None:
        if not self.parameters:
            raise self.error(ln, "POINTS before PARAMETER")
        if re.search(r"\(\s*[^()\s]+\s+[^()\s]+", value):
            raise self.error(ln, "a point with several coordinates: only files with one parameter can be read")
        for x in self.numbers(ln, value):
            if x in self.points:
                raise self.error(ln, f"point {x:g} is given twice")
            self.points.append(x)

    def new_block(self, ln: int, region: str | None = None, metric: str | None = None) -> None:
        self.close_block()
        self.region = region if region is not None else self.region
        self.metric = metric if metric is not None else self.metric
        self.index = 0
        self.block_line = ln

    def data(self, ln: int, value: str) -> None:
        if not self.points:
            raise self.error(ln, "DATA before POINTS")
        if self.region is None:
            raise self.error(ln, "DATA before any REGION")
        values = self.numbers(ln, value)
        if not values:
            raise self.error(ln, "DATA without values")
        key = (self.region, self.metric)
        if self.index == 0:
            if key in self.blocks:
                raise self.error(self.block_line, f"REGION {key[0]!r}, METRIC {key[1]!r} is given twice")
            self.blocks[key] = []
            self.started[key] = ln
        if self.index >= len(self.points):
            raise self.error(ln, f"more DATA lines than the {len(self.points)} POINTS for REGION {key[0]!r}, "
                                 f"METRIC {key[1]!r}")
        self.blocks[key].append(values)
        self.index += 1

    def close_block(self) -> None:
        key = (self.region, self.metric)
        if self.index and self.index != len(self.points):
            raise CropScaleError(
                f"{self.path}: line {self.started[key]}: REGION {key[0]!r}, METRIC {key[1]!r}: {self.index} DATA "
                f"lines for {len(self.points)} POINTS (one DATA line per point is needed)"
            )


def read_extrap_text(path: str | Path, *, evidence: str, unit: str = "") -> list[ScalingSeries]:
    """Read a single-parameter file in Extra-P's text format (module docstring) as series.

    Args:
        path: the text file.
        evidence: what the measurements are (``measured-run``, ``measured-microbenchmark`` ...);
            the file does not say, the caller must.
        unit: unit of the values, if known.

    Returns:
        One :class:`~cropscale.scaling.series.ScalingSeries` per (region, metric), in file order:
        ``x`` the POINTS, ``y`` the DATA values (repetitions) per point; ``metric`` is
        ``"<default>"`` before any METRIC line.

    Raises:
        CropScaleError: a missing file, an unknown section, a number that is not one, DATA before
            PARAMETER/POINTS/REGION, more than one parameter, a point given twice, a (region,
            metric) given twice, or a block without exactly one DATA line per point; the message
            names the file and the line.
    """
    check_label(evidence)
    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"{path}: no such file")
    reader = _TextReader(path)
    sections = {
        "PARAMETER": reader.parameter,
        "POINTS": reader.points_line,
        "REGION": lambda ln, v: reader.new_block(ln, region=v.strip()),
        "METRIC": lambda ln, v: reader.new_block(ln, metric=v.strip()),
        "DATA": reader.data,
    }
    for ln, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name not in sections:
            raise reader.error(ln, f"unknown section {name!r} (PARAMETER, POINTS, REGION, METRIC, DATA)")
        sections[name](ln, value)
    reader.close_block()
    if not reader.blocks:
        raise CropScaleError(f"{path}: no data (PARAMETER, POINTS, REGION and DATA lines are needed)")
    return [ScalingSeries(reader.parameters[0], metric, unit, list(reader.points), rows, evidence, region)
            for (region, metric), rows in reader.blocks.items()]
