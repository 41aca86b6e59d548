"""``predict --output DIR``: one class map per patch, a GeoTIFF where the patch is georeferenced, else ``.npz``.

:class:`PredictionWriter` is a Lightning :class:`~lightning.pytorch.callbacks.BasePredictionWriter`
(``write_interval="batch"``): each rank writes the patches of its own batches as they come
(``CropMappingTask.predict_step`` has already dropped the evaluation placeholders, ``patch_id = -1``, of
:class:`~cropscale.data.sharding.EvalShardSampler`, which gives every patch to exactly one rank), so no
patch is written twice and nothing is gathered but the list of files. At the end of the epoch the ranks'
lists are gathered and global rank 0 writes the index, ``predictions.json`` (atomically).

Files, named ``PRED_<patch_id>.tif`` or ``PRED_<patch_id>.npz`` as the PASTIS layout names its arrays:

- GeoTIFF (rasterio, deflate): one ``uint8`` band of class ids (the argmax of the tiled semantic logits),
  ``[H, W]`` on the patch's 10 m grid, its CRS and the affine transform of the patch polygon's bounds
  (:func:`patch_transform`); no-data value :data:`NODATA` (255, never a class id: at most 255 classes),
  band description ``class id``, dataset tags ``CLASS_NAMES`` (JSON list, index = class id) and
  ``IGNORE_INDEX``.
- ``.npz`` (a patch without georeference, e.g. ``pastis-r-mini``, whose metadata has only patch centres in
  lon/lat): ``semantic`` ``[H, W]`` uint8 class ids, ``patch_id`` int64, ``class_names`` (unicode array),
  ``nodata`` uint8; readable with ``numpy.load`` without pickle.

Only the class map is written: the parcel probabilities and the high-grid RGB stay in the task's
``predict_step`` output (three float maps per patch, ten times the class map's size for ``hr``).

Which data is georeferenced: a ``metadata.geojson`` whose collection ``crs`` is projected and whose
features are patch polygons (:mod:`cropscale.data.metadata`): the bundled ``worldcereal-flanders``
(EPSG:32631) and the original PASTIS (EPSG:2154); not ``pastis-r-mini`` (points in CRS84).

Index ``predictions.json``: ``{"format": "cropscale-predictions/1", "num_classes", "class_names",
"ignore_index", "nodata", "patches": [{"patch_id", "file", "shape": [H, W], "georeferenced", "crs",
"rank"}, ...]}`` sorted by patch id (``crs`` is None for ``.npz``; ``rank`` is the global rank that wrote
the file).

The output folder must be new or empty (:func:`check_output_folder`): a previous run's maps are never
overwritten or mixed with this run's. ``predict`` ends with :func:`written_line`: how many maps, in which
format, and the folder.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from cropscale.data.metadata import PatchGeo
from cropscale.errors import CropScaleError
from cropscale.files import atomic_write, atomic_write_json, check_writable_folder

INDEX_NAME = "predictions.json"
INDEX_FORMAT = "cropscale-predictions/1"
#: No-data value of the class maps (uint8); class ids are 0..254.
NODATA = 255
#: Name prefix of :func:`~cropscale.files.check_writable_folder`'s probe file (not a previous run's file).
_PROBE_PREFIX = ".cropscale-write-check."


@dataclass(frozen=True)
class WrittenPatch:
    """One written class map, as listed in the index.

    Attributes:
        patch_id: ``ID_PATCH``.
        file: file name inside the output folder.
        shape: ``(H, W)`` of the class map, 10 m pixels.
        georeferenced: a GeoTIFF with CRS and transform (else ``.npz``).
        crs: the CRS (``EPSG:...``) of a GeoTIFF, else None.
        rank: the global rank that wrote it.
    """

    patch_id: int
    file: str
    shape: tuple[int, int]
    georeferenced: bool
    crs: str | None
    rank: int


def written_line(entries: Sequence[WrittenPatch], folder: Path) -> str:
    """One line of what ``predict --output`` wrote: the count of class maps, their format, the index and the folder.

    E.g. ``cropscale predict: wrote 2 class maps (GeoTIFF, EPSG:32631) and predictions.json to /abs/maps``; a mix
    of formats gives each format's count.
    """
    crss = sorted({e.crs or "no CRS" for e in entries if e.georeferenced})
    formats = [(sum(e.georeferenced for e in entries), f"GeoTIFF, {' and '.join(crss)}"),
               (sum(not e.georeferenced for e in entries), ".npz, no georeference")]
    present = [(n, what) for n, what in formats if n]
    kinds = (f" ({present[0][1]})" if len(present) == 1 else
             f" ({'; '.join(f'{n} {what}' for n, what in present)})" if present else "")
    maps = f"{len(entries)} class map{'s' if len(entries) != 1 else ''}"
    return f"cropscale predict: wrote {maps}{kinds} and {INDEX_NAME} to {folder}"


def check_output_folder(path: str | os.PathLike) -> Path:
    """Refuse an output folder that cannot be written or already holds files.

    Args:
        path: the folder (created at the first write when it does not exist).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        CropScaleError: naming ``path``: it is a file, it (or the parent it would be created in) is not
            writable, or it holds files (a previous run's maps are never overwritten).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CropScaleError(f"--output {folder}: is a file, not a folder")
    check_writable_folder(folder, what="--output folder")
    if folder.is_dir():
        held = sorted(p.name for p in folder.iterdir() if not p.name.startswith(_PROBE_PREFIX))
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise CropScaleError(f"--output {folder} is not empty ({shown}): give a new or empty folder, so that no"
                                 " earlier prediction is overwritten or mixed with this run's")
    return folder


def patch_transform(geo: PatchGeo, hw: tuple[int, int]) -> Any:
    """The affine transform (``rasterio.Affine``) of a north-up ``hw = (H, W)`` grid over the patch bounds.

    Pixel ``(row, col)``'s upper-left corner is ``(left + col * res_x, top - row * res_y)`` with
    ``res_x = (right - left) / W``, ``res_y = (top - bottom) / H`` (CRS units, 10 m for PASTIS).

    Raises:
        CropScaleError: empty bounds or grid.
    """
    from rasterio.transform import from_bounds

    left, bottom, right, top = geo.bounds
    if hw[0] < 1 or hw[1] < 1 or right <= left or top <= bottom:
        raise CropScaleError(f"cannot georeference a {hw[0]}x{hw[1]} grid over the bounds {geo.bounds}")
    return from_bounds(left, bottom, right, top, width=hw[1], height=hw[0])


def geotiff_bytes(class_map: np.ndarray, geo: PatchGeo, class_names: Sequence[str],
                  ignore_index: int | None) -> bytes:
    """A deflate GeoTIFF of a ``[H, W]`` uint8 class map on the patch's grid (module docstring), as bytes."""
    from rasterio.io import MemoryFile

    h, w = class_map.shape
    profile = {"driver": "GTiff", "width": w, "height": h, "count": 1, "dtype": "uint8", "crs": geo.crs,
               "transform": patch_transform(geo, (h, w)), "nodata": NODATA, "compress": "deflate"}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(class_map, 1)
            dst.set_band_description(1, "class id")
            dst.update_tags(CLASS_NAMES=json.dumps(list(class_names)), IGNORE_INDEX=str(ignore_index),
                            SOURCE="cropscale predict: argmax of the tiled semantic logits")
        return memory.read()


def npz_bytes(class_map: np.ndarray, patch_id: int, class_names: Sequence[str]) -> bytes:
    """A compressed ``.npz`` of a ``[H, W]`` uint8 class map without georeference (module docstring), as bytes."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, semantic=class_map, patch_id=np.int64(patch_id),
                        class_names=np.array(list(class_names), dtype=str), nodata=np.uint8(NODATA))
    return buffer.getvalue()


def _patch_table(trainer: Trainer) -> dict[int, Any]:
    """``patch_id -> patch`` (``hw``, ``geo``) of the predict dataset(s); empty for a dataset without ``patches``."""
    loaders = trainer.predict_dataloaders
    table: dict[int, Any] = {}
    for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
        dataset = getattr(loader, "dataset", None)
        while dataset is not None and not hasattr(dataset, "patches") and hasattr(dataset, "dataset"):
            dataset = dataset.dataset  # PaddedEvalDataset under DDP
        for patch in getattr(dataset, "patches", []):
            table[int(patch.patch_id)] = patch
    return table


class PredictionWriter(BasePredictionWriter):
    """Write each predicted patch's class map under ``output_dir`` and an index (module docstring).

    Args:
        output_dir: new or empty folder (checked at construction, :func:`check_output_folder`).

    Raises:
        CropScaleError: at construction, a folder that cannot be used; while predicting, a model with more
            than 255 classes (uint8 maps), a patch predicted twice or whose file already exists, or a
            class map whose shape differs from the patch's.

    Example::

        trainer = Trainer(callbacks=[PredictionWriter("predictions")])
        trainer.predict(task, datamodule=dm, return_predictions=False)
    """

    def __init__(self, output_dir: str | os.PathLike) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = check_output_folder(output_dir)
        self.written: list[WrittenPatch] = []
        self.index: list[WrittenPatch] = []  # every rank's maps, once written to the index (global rank 0)
        self._patches: dict[int, Any] = {}
        self._classes: tuple[list[str], int | None] = ([], None)

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        hp = getattr(pl_module, "hparams", {})
        num_classes = int(hp.get("num_classes") or 0)
        if num_classes > NODATA:
            raise CropScaleError(f"model.num_classes={num_classes}: the class maps are uint8 with no-data {NODATA},"
                                 f" so at most {NODATA} classes can be written")
        names = list(hp.get("class_names") or [str(i) for i in range(num_classes)])
        self._classes = (names, hp.get("ignore_index"))
        self._patches = _patch_table(trainer)
        self.written = []

    @override
    def write_on_batch_end(self, trainer: Trainer, pl_module: LightningModule, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        ids = prediction["patch_id"].tolist()
        maps = prediction["semantic"].to(torch.uint8).cpu().numpy()  # ids < 255 (on_predict_start)
        for patch_id, class_map in zip(ids, maps, strict=True):
            self.written.append(self._write(int(patch_id), np.ascontiguousarray(class_map), trainer.global_rank))

    def _write(self, patch_id: int, class_map: np.ndarray, rank: int) -> WrittenPatch:
        patch = self._patches.get(patch_id)
        geo = getattr(patch, "geo", None)
        if patch is not None and tuple(patch.hw) != class_map.shape:
            raise CropScaleError(f"patch {patch_id}: class map {class_map.shape} differs from the patch's {patch.hw}")
        names, ignore = self._classes
        name = f"PRED_{patch_id}.{'tif' if geo is not None else 'npz'}"
        target = self.output_dir / name
        if target.exists() or any(w.patch_id == patch_id for w in self.written):
            raise CropScaleError(f"patch {patch_id} predicted twice: {target} exists (written earlier by this or"
                                 " another rank: the patch ids repeat, or the predict sampler gave it to two ranks)")
        data = geotiff_bytes(class_map, geo, names, ignore) if geo is not None else npz_bytes(class_map, patch_id,
                                                                                               names)
        atomic_write(target, lambda f: f.write(data), binary=True)
        return WrittenPatch(patch_id=patch_id, file=name, shape=(int(class_map.shape[0]), int(class_map.shape[1])),
                            georeferenced=geo is not None, crs=geo.crs if geo is not None else None, rank=rank)

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        entries = _gather(self.written)
        if not trainer.is_global_zero:
            return
        seen: dict[int, int] = {}
        for entry in entries:
            if entry.patch_id in seen:
                raise CropScaleError(f"patch {entry.patch_id} was written by ranks {seen[entry.patch_id]} and"
                                     f" {entry.rank}: the predict sampler gave it to two ranks")
            seen[entry.patch_id] = entry.rank
        names, ignore = self._classes
        self.index = sorted(entries, key=lambda e: e.patch_id)
        index = {"format": INDEX_FORMAT, "num_classes": len(names), "class_names": names, "ignore_index": ignore,
                 "nodata": NODATA, "patches": [asdict(e) for e in self.index]}
        atomic_write_json(self.output_dir / INDEX_NAME, index)


def _gather(entries: list[WrittenPatch]) -> list[WrittenPatch]:
    """Every rank's ``entries`` (``torch.distributed.all_gather_object``, a collective); ``entries`` on one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(entries)
    per_rank: list[list[WrittenPatch] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, list(entries))
    return [e for rank_entries in per_rank for e in (rank_entries or [])]
