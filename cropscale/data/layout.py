"""What a PASTIS-HD root holds, resolved once per run: the metadata, the modality folders read, what is absent.

:func:`resolve_layout` checks the root and the orbit names (the only place that does), parses
``metadata.geojson`` (once), lists the root's folders (once) and decides each optional modality:

================  ===================================  ========================================================
modality          option (None: read where present)    absent from the whole data set
================  ===================================  ========================================================
``DATA_S2_MASK``  ``s2_mask``: None / True / False     cloudy observations count as clear unless all ten bands
                                                       are 0
``DATA_S1A``      ``s1_orbits``: None / a list         the ascending inputs are zeros with masks False
``DATA_S1D``      ``s1_orbits``                        the descending inputs are zeros with masks False
``DATA_SPOT``     ``high_grid``: None / True / False   no x10 detail target (``hr_present`` False); the folder
                  (folder: ``hr_dir``)                 is ``hr_dir``
================  ===================================  ========================================================

With None a modality absent from the whole data set is one data warning, a single line for all of them that
says what the model is trained without (:func:`trained_without`); a modality the configuration asks for
(``s1_orbits`` listing the orbit, ``s2_mask=True``, ``high_grid=True``) and absent is an error; False (or an
orbit left out of the list) is not read, without a word. A folder of a similar name (``DATA_S1a``,
``DATA_SPOT6``) is named in the same line as a likely misspelling. ``t2`` or ``t1`` above every series' length
is a data warning with the padding it causes (:func:`padding_warning`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.data.metadata import PatchRecord, read_metadata
from cropscale.errors import CropScaleError

S1_ORBITS: tuple[str, ...] = ("S1A", "S1D")
"""Sentinel-1 orbits of the batch contract: ascending (``s1a``), descending (``s1d``)."""
ORBIT_NAMES = {"S1A": "Sentinel-1 ascending", "S1D": "Sentinel-1 descending"}
"""What each orbit is called in messages."""
DEFAULT_HR_DIR = "DATA_SPOT"
"""High-grid folder read where present when ``hr_dir`` is not given."""
KNOWN_FOLDERS = frozenset({"DATA_S2", "DATA_S2_MASK", "ANNOTATIONS", "INSTANCE_ANNOTATIONS", "DATA_SPOT",
                           *(f"DATA_{o}" for o in S1_ORBITS)})
"""Folders of the layout; another folder of a similar name beside an absent one is a likely misspelling."""

_WITHOUT = {
    "DATA_S2_MASK": ("the Sentinel-2 cloud mask", "only pixels whose ten bands are all 0 count as no data, so every"
                     " cloudy observation is fed as clear"),
    **{f"DATA_{o}": (name, "its inputs are zeros with masks False") for o, name in ORBIT_NAMES.items()},
    "hr": ("the high-grid image", "hr_present False, no x10 detail target"),
}


@dataclass
class DataLayout:
    """A data root resolved once (:func:`resolve_layout`).

    Attributes:
        root: the data set's folder.
        meta_path: its ``metadata.geojson``; ``records`` its features, parsed once.
        orbits: Sentinel-1 orbits read (wanted and present).
        mask_dir: ``DATA_S2_MASK`` when read, else None.
        inst_dir: ``INSTANCE_ANNOTATIONS`` when present, else None.
        hr_root: high-grid folder when read, else None; ``hr_pattern`` its file names (``{patch_id}``).
        warnings: what the layout found that is not an error (the :func:`trained_without` line), in order.
    """

    root: Path
    meta_path: Path
    records: list[PatchRecord]
    orbits: list[str]
    mask_dir: Path | None
    inst_dir: Path | None
    hr_root: Path | None
    hr_pattern: str
    warnings: list[str] = field(default_factory=list)


def check_orbits(s1_orbits: list[str] | tuple[str, ...] | None) -> None:
    """Refuse orbit names other than :data:`S1_ORBITS` (``data.s1_orbits``)."""
    bad = [o for o in (s1_orbits or []) if o not in S1_ORBITS]
    if bad:
        raise CropScaleError(f"data.s1_orbits: unknown orbit(s) {bad}; expected a subset of {list(S1_ORBITS)}")


def misspelling_hint(wanted: str, others: list[str]) -> str:
    """The misspelling hint for ``wanted``, or ``""``.

    ``"; there is X: a misspelling? rename it to <wanted>"`` for the folder of ``others`` closest to ``wanted``
    (similarity ratio >= 0.75, case-insensitive).
    """
    ratios = [difflib.SequenceMatcher(None, wanted.upper(), o.upper()).ratio() for o in others]
    if not ratios or max(ratios) < 0.75:
        return ""
    return f"; there is {others[ratios.index(max(ratios))]}: a misspelling? rename it to {wanted}"


def trained_without(root: Path, absent: dict[str, tuple[str, str]]) -> str:
    """The one line saying what the model is trained without.

    ``absent`` maps a key of the layout table (``DATA_S2_MASK``, ``DATA_S1A``, ``DATA_S1D``, ``hr``) to its folder
    name and misspelling hint.
    """
    parts = []
    for key in ("DATA_S2_MASK", "DATA_S1A", "DATA_S1D", "hr"):
        if key in absent:
            name, effect = _WITHOUT[key]
            folder, hint = absent[key]
            parts.append(f"{name} (no {folder} folder: {effect}{hint})")
    return f"{root}: the model is trained without {', '.join(parts)}"


def _required(option: str, what: str, root: Path, folder: str, hint: str, instead: str) -> CropScaleError:
    return CropScaleError(f"data.{option} asks for {what} but {root} has no {folder} folder{hint}: no patch has it"
                          f" ({instead})")


def resolve_layout(root: str | Path, *, s1_orbits: list[str] | tuple[str, ...] | None = None,
                   s2_mask: bool | None = None, high_grid: bool | None = None, hr_dir: str = DEFAULT_HR_DIR,
                   hr_pattern: str = "SPOT_{patch_id}.tif") -> DataLayout:
    """Check ``root``, parse its metadata and decide which modality folders are read (module docstring).

    Raises:
        CropScaleError: missing root or metadata, an unknown orbit name, or a modality the arguments ask for that
            the root has no folder for (each names the option and the folder).
    """
    root = Path(root)
    if not root.is_dir():
        raise CropScaleError(f"data.root: dataset root not found: {root}")
    check_orbits(s1_orbits)
    meta_path = root / "metadata.geojson"
    records = read_metadata(meta_path)
    folders = sorted(d.name for d in root.iterdir() if d.is_dir())
    others = [f for f in folders if f not in KNOWN_FOLDERS]
    absent: dict[str, tuple[str, str]] = {}
    orbits = []
    for orbit in S1_ORBITS if s1_orbits is None else list(s1_orbits):
        folder = f"DATA_{orbit}"
        if folder in folders:
            orbits.append(orbit)
        elif s1_orbits is not None:
            raise _required("s1_orbits", orbit, root, folder, misspelling_hint(folder, others),
                            f"leave {orbit} out of data.s1_orbits to train without it")
        else:
            absent[folder] = (folder, misspelling_hint(folder, others))
    mask_dir = None
    if s2_mask is not False and "DATA_S2_MASK" in folders:
        mask_dir = root / "DATA_S2_MASK"
    elif s2_mask:
        raise _required("s2_mask", "DATA_S2_MASK", root, "DATA_S2_MASK", misspelling_hint("DATA_S2_MASK", others),
                        "set data.s2_mask=false to detect no data from all-zero pixels only")
    elif s2_mask is None:
        absent["DATA_S2_MASK"] = ("DATA_S2_MASK", misspelling_hint("DATA_S2_MASK", others))
    hr_root = root / hr_dir if high_grid is not False and (root / hr_dir).is_dir() else None
    if hr_root is None and high_grid:
        raise _required("high_grid", hr_dir, root, hr_dir, misspelling_hint(hr_dir, others),
                        "set data.high_grid=false to train without the high-grid image")
    if hr_root is None and high_grid is None:
        absent["hr"] = (hr_dir, misspelling_hint(hr_dir, others))
    return DataLayout(
        root=root, meta_path=meta_path, records=records, orbits=orbits, mask_dir=mask_dir,
        inst_dir=root / "INSTANCE_ANNOTATIONS" if "INSTANCE_ANNOTATIONS" in folders else None,
        hr_root=hr_root, hr_pattern=hr_pattern, warnings=[trained_without(root, absent)] if absent else [],
    )


def padding_warning(option: str, t: int, lengths: list[int], series: str) -> str | None:
    """The data warning for ``t`` dates per sample above every series' length, or None.

    Args:
        option: ``t2`` or ``t1``.
        t: dates per sample.
        lengths: the series' lengths, one per patch read.
        series: what they are (``Sentinel-2``, ``Sentinel-1 ascending``).

    Returns:
        The line with the padding per sample (``t - length``, least..most) and the share of padding among the dates
        fed, when ``t > max(lengths)``; None otherwise (or without series).
    """
    if not lengths or t <= max(lengths):
        return None
    pads = t - np.asarray(lengths)
    share = round(100 * float(pads.sum()) / (len(lengths) * t))
    return (f"data.{option} {t} is above every {series} series' length (at most {max(lengths)} dates): each sample is"
            f" padded with {int(pads.min())}..{int(pads.max())} dates of zeros ({share} % of the {series} dates fed are"
            f" padding, computed on but masked); lower data.{option} to {max(lengths)} or less")
