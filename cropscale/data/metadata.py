"""Reading the PASTIS-HD ``metadata.geojson`` and ``classes.json``.

Layout (PASTIS, Sainte Fare Garnot & Landrieu, ICCV 2021; PASTIS-R, ISPRS J. 2022; PASTIS-HD adds
SPOT-6/7): ``metadata.geojson`` is a GeoJSON FeatureCollection with one feature per patch. The
properties used here are ``ID_PATCH`` (int), ``Fold`` (int, 1..5) and ``dates-<MODALITY>``
(``dates-S2``, ``dates-S1A``, ``dates-S1D``), each a mapping ``{index: yyyymmdd}`` whose index
``i`` is the position of the date on axis 0 of the modality's array, so the dates must not decrease
with ``i`` (refused otherwise: the arrays would not be in time order). The geometry is the patch
polygon in a projected CRS (the collection's ``crs`` member; PASTIS: EPSG:2154, the bundled
Flanders sample: EPSG:32631) or, in reduced copies such as ``pastis-r-mini``, only the patch centre in
lon/lat, which cannot georeference a high-grid image.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cropscale.errors import CropScaleError

MODALITIES: tuple[str, ...] = ("S2", "S1A", "S1D")
"""Modalities whose acquisition dates the metadata may list (``dates-<name>``)."""


@dataclass(frozen=True)
class PatchGeo:
    """Georeference of a patch: its CRS and the bounds ``(left, bottom, right, top)`` in CRS units."""

    crs: str
    bounds: tuple[float, float, float, float]


@dataclass(frozen=True)
class PatchRecord:
    """One feature of ``metadata.geojson``.

    Attributes:
        patch_id: ``ID_PATCH``.
        fold: ``Fold``.
        dates: modality (``"S2"``, ``"S1A"``, ``"S1D"``) -> ``[T]`` int64 acquisition dates ``yyyymmdd``
            in array order; a modality the feature does not list is absent.
        geo: the patch polygon's bounds in a projected CRS, or None when the metadata has none.
    """

    patch_id: int
    fold: int
    dates: dict[str, np.ndarray] = field(default_factory=dict)
    geo: PatchGeo | None = None


def day_of_year(dates: np.ndarray) -> np.ndarray:
    """Day of year (1..366) of ``yyyymmdd`` integer dates, shape kept, int64."""
    flat = np.asarray(dates, dtype=np.int64).reshape(-1)
    out = np.empty(flat.shape, dtype=np.int64)
    for i, value in enumerate(flat):
        out[i] = _parse_date(int(value)).timetuple().tm_yday
    return out.reshape(np.shape(dates))


def _parse_date(value: int) -> _dt.date:
    return _dt.datetime.strptime(str(int(value)), "%Y%m%d").date()


def _parse_dates(raw: Any, *, patch_id: int, key: str, path: Path) -> np.ndarray:
    if isinstance(raw, str):  # some PASTIS exports store the mapping as a JSON string
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise CropScaleError(
                f"{path}: patch {patch_id}: {key} is not a mapping {{index: yyyymmdd}}: {err}"
            ) from None
    if isinstance(raw, list):
        raw = {str(i): v for i, v in enumerate(raw)}
    if not isinstance(raw, dict):
        raise CropScaleError(
            f"{path}: patch {patch_id}: {key} must be a mapping {{index: yyyymmdd}}, got {type(raw).__name__}"
        )
    try:
        items = sorted((int(k), int(v)) for k, v in raw.items())
    except (TypeError, ValueError):
        raise CropScaleError(f"{path}: patch {patch_id}: {key} has a non-integer index or date") from None
    if [k for k, _ in items] != list(range(len(items))):
        raise CropScaleError(f"{path}: patch {patch_id}: {key} indices must be 0..{len(items) - 1} without gaps")
    for _, v in items:
        try:
            _parse_date(v)
        except ValueError:
            raise CropScaleError(
                f"{path}: patch {patch_id}: {key} has an invalid date {v} (expected yyyymmdd)"
            ) from None
    dates = np.array([v for _, v in items], dtype=np.int64)
    _check_chronological(dates, patch_id=patch_id, key=key, path=path)
    return dates


def _check_chronological(dates: np.ndarray, *, patch_id: int, key: str, path: Path) -> None:
    """Refuse a date earlier than the one before it (equal dates are allowed).

    Index ``i`` is the position on the array's time axis, so dates out of order mean the arrays are not in
    time order (or the metadata is wrong): the day of year would reach the temporal encoder out of order,
    and which of the two is right cannot be told from the files.
    """
    back = np.flatnonzero(np.diff(dates) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise CropScaleError(
            f"{path}: patch {patch_id}: {key} is not in chronological order: the date at index {i}, {int(dates[i])},"
            f" is earlier than the one at index {i - 1}, {int(dates[i - 1])} ({back.size} such step(s)); the index"
            " is the position on the array's time axis, so store the arrays and dates in time order"
        )


def _collection_crs(collection: dict, path: Path) -> Any:
    """The collection's CRS as a rasterio CRS, or None for lon/lat (GeoJSON's default) or no crs member."""
    from rasterio.crs import CRS
    from rasterio.errors import CRSError

    name = ((collection.get("crs") or {}).get("properties") or {}).get("name")
    if not name:
        return None
    try:
        crs = CRS.from_user_input(name)
    except CRSError as err:
        raise CropScaleError(f"{path}: unknown crs {name!r}: {err}") from None
    return crs if crs.is_projected else None


def _polygon_bounds(geometry: dict | None) -> tuple[float, float, float, float] | None:
    if not geometry or geometry.get("type") != "Polygon":
        return None
    ring = np.asarray(geometry["coordinates"][0], dtype=np.float64)
    return (float(ring[:, 0].min()), float(ring[:, 1].min()), float(ring[:, 0].max()), float(ring[:, 1].max()))


def read_metadata(path: str | Path) -> list[PatchRecord]:
    """Parse ``metadata.geojson`` into one :class:`PatchRecord` per feature (file order).

    Raises:
        CropScaleError: the file is missing or not JSON, a feature lacks ``ID_PATCH`` or ``Fold``,
            a patch id repeats, or a ``dates-*`` mapping is malformed or not in chronological order
            (each message names the file and the patch).
    """
    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"metadata file not found: {path} (a PASTIS-HD root holds metadata.geojson)")
    try:
        collection = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CropScaleError(f"cannot read metadata {path}: {err}") from None
    features = collection.get("features") if isinstance(collection, dict) else None
    if not isinstance(features, list):
        raise CropScaleError(f"{path}: not a GeoJSON FeatureCollection (no 'features' list)")
    crs = _collection_crs(collection, path)
    records: list[PatchRecord] = []
    seen: set[int] = set()
    for n, feature in enumerate(features):
        props = feature.get("properties") or {}
        if "ID_PATCH" not in props or "Fold" not in props:
            raise CropScaleError(f"{path}: feature {n} lacks ID_PATCH or Fold")
        try:
            patch_id, fold = int(props["ID_PATCH"]), int(props["Fold"])
        except (TypeError, ValueError):
            raise CropScaleError(f"{path}: feature {n}: ID_PATCH and Fold must be integers") from None
        if patch_id in seen:
            raise CropScaleError(f"{path}: patch {patch_id} appears twice")
        seen.add(patch_id)
        dates = {
            m: _parse_dates(props[f"dates-{m}"], patch_id=patch_id, key=f"dates-{m}", path=path)
            for m in MODALITIES
            if props.get(f"dates-{m}") is not None
        }
        bounds = _polygon_bounds(feature.get("geometry")) if crs is not None else None
        geo = PatchGeo(crs=crs.to_string(), bounds=bounds) if bounds is not None else None
        records.append(PatchRecord(patch_id=patch_id, fold=fold, dates=dates, geo=geo))
    return records


def read_classes(path: str | Path) -> list[str]:
    """Class names from ``classes.json``, index = class id.

    Accepts ``{"0": "name", ...}``, ``{"0": {"name": ...}, ...}`` (the Flanders sample) or a list of
    names. Ids must be 0..C-1 without gaps.

    Raises:
        CropScaleError: missing or malformed file (message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"class list not found: {path} (a PASTIS-HD root holds classes.json)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CropScaleError(f"cannot read class list {path}: {err}") from None
    if isinstance(raw, list):
        raw = {str(i): v for i, v in enumerate(raw)}
    if not isinstance(raw, dict) or not raw:
        raise CropScaleError(f"{path}: expected a non-empty mapping {{class id: name}}")
    try:
        items = sorted((int(k), v) for k, v in raw.items())
    except ValueError:
        raise CropScaleError(f"{path}: class ids must be integers") from None
    if [k for k, _ in items] != list(range(len(items))):
        raise CropScaleError(f"{path}: class ids must be 0..{len(items) - 1} without gaps")
    names = []
    for k, v in items:
        name = v.get("name") if isinstance(v, dict) else v
        if not isinstance(name, str):
            raise CropScaleError(f"{path}: class {k} has no name")
        names.append(name)
    return names
