"""``PastisHDDataModule``: PASTIS-HD patches for training (random crops), validation and test (whole patches).

Every split is normalised with statistics of the training folds.

Built by LightningCLI from ``data:`` in ``configs/*.yaml`` (every constructor argument is type
annotated for jsonargparse). ``num_classes`` and ``class_names`` come from ``classes.json`` and are
available right after construction (the CLI links them into the model).

Determinism and exact resume: the training order is a function of ``(seed, epoch)`` and the rank's
shard (:class:`~cropscale.data.sharding.TrainShardSampler`, also with one process), each training
sample's crop, dates and augmentation a function of ``(seed, epoch, sample index)``
(:class:`~cropscale.data.dataset.PastisHDDataset`), and the DataLoader workers' seeds a function of
``(seed, epoch, rank, worker)`` (:func:`~cropscale.data.sharding.loader_seed`). :meth:`~PastisHDDataModule.state_dict`
(saved in every checkpoint) records the training position (epoch and batches done);
:meth:`~PastisHDDataModule.load_state_dict` makes the first training epoch after a resume continue
from there, so that a resumed run draws exactly the samples the uninterrupted run draws, whatever
``num_workers``. Validation and test are deterministic without any seed.

Under DDP (world size > 1), validation, test and predict use
:class:`~cropscale.data.sharding.EvalShardSampler` with ``pad=True`` over a
:class:`~cropscale.data.sharding.PaddedEvalDataset`: every patch exactly once over the ranks, and
every rank the same number of steps, ``ceil(patches / world size)``, completed with placeholders
(``patch_id = -1``) that the task drops before counting (Lightning leaves a ``DistributedSampler``
subclass in place). Any world size works, also more ranks than patches.
"""

from __future__ import annotations

import random
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, get_worker_info
from typing_extensions import override

from cropscale.data.collate import collate
from cropscale.data.content import PatchScan, scale_warnings, zero_but_clear_warning
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.index import S1_ORBITS, orphan_warning
from cropscale.data.metadata import read_classes, read_metadata
from cropscale.data.sharding import EvalShardSampler, PaddedEvalDataset, TrainShardSampler
from cropscale.data.stats import NormStats, compute_norm_stats
from cropscale.errors import CropScaleError
from cropscale.files import check_writable_folder

# The training position is restored by PastisHDDataModule.load_state_dict (TrainShardSampler.resume_at), which
# Lightning's check for a resumable DataLoader does not see: its warning about a mid-epoch checkpoint does not apply.
warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")

#: ``format`` of :meth:`PastisHDDataModule.state_dict`.
STATE_FORMAT = "cropscale-data-position/1"


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed Python's and NumPy's global generators from the torch worker seed.

    The torch worker seed is ``base_seed + worker_id``, where ``base_seed`` comes from the loader's generator
    (re-seeded per epoch and rank by :class:`~cropscale.data.sharding.TrainShardSampler`). The dataset's own
    draws do not use these generators (they are seeded per sample).
    """
    info = get_worker_info()
    seed = int(info.seed) if info is not None else int(torch.initial_seed())
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _check_stats_path(path: str | None) -> str | None:
    """``data.stats_path``, refused at once when it is a folder, or absent and not creatable.

    Raises:
        CropScaleError: naming the path.
    """
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        raise CropScaleError(f"data.stats_path: {path} is a folder; give a JSON file path such as {target}/stats.json")
    if not target.exists():
        check_writable_folder(target.parent, what="data.stats_path: folder")
    return path


class PastisHDDataModule(LightningDataModule):
    """LightningDataModule for PASTIS-HD (PASTIS + PASTIS-R + SPOT-6/7) and datasets in its layout.

    An example of the layout is the bundled ``worldcereal-flanders`` sample.

    Args:
        root: dataset root (``metadata.geojson``, ``classes.json``, ``DATA_S2`` ...).
        train_folds, val_folds: folds (``Fold`` in the metadata) for training and validation.
        test_folds: folds for ``test`` and ``predict``; None = no test set.
        batch_size: training batch (local, per rank).
        val_batch_size: validation/test batch of whole patches (local, per rank).
        crop_size: training crop side (10 m pixels); the high-grid crop is 10x that.
        t2: Sentinel-2 dates per sample.
        t1: dates per Sentinel-1 orbit per sample.
        samples_per_patch: random training crops per patch per epoch (epoch length = training
            patches x this).
        num_workers, pin_memory, persistent_workers, prefetch_factor: DataLoader settings
            (``persistent_workers`` and ``prefetch_factor`` only apply with workers).
        seed: seed of the training sampling (crops, dates, augmentation, order).
        stats_path: normalisation statistics JSON: loaded if it exists (and refused if computed on
            other folds), else computed over ``train_folds`` at setup and saved there (atomically);
            None = computed at setup and kept in memory. A folder, or a new file whose folder cannot be
            written, is refused at construction.
        hr_dir, hr_pattern: high-grid GeoTIFF directory (relative to root) and file name pattern
            (``{patch_id}``); a missing directory means no high-grid target.
        ignore_index: class id to ignore in loss and metrics (PASTIS void 19); None = none.
        hr_bands: 1-based band indices of R, G, B in the high-grid files.
        hr_max: digital number mapped to 1.0 in ``hr`` (255 for 8-bit images).
        s1_orbits: Sentinel-1 orbits to read where present.
        min_clear_fraction: fraction of clear pixels for a date to count as valid.
        augment: random flips and 90-degree rotations of training crops.
        allow_fold_overlap: accept training folds that are also validation or test folds (scores on
            patches the model trained on); refused by default.

    Attributes:
        data_warnings: what the checks found that is not an error, one line each (also issued as
            ``UserWarning``, or logged for an allowed fold overlap): overlapping folds allowed, files
            without a metadata entry, the documented fallbacks, patches on another scale than the
            training statistics, masks that mark no-data pixels clear. ``ProvenanceCallback`` writes
            them to ``run.json``.

    Raises:
        CropScaleError: missing root, ``metadata.geojson`` or ``classes.json``, or overlapping folds (at
            construction); empty folds, bad patch files and bad values (at :meth:`setup`, for every fold
            the stage reads, before the first step).
    """

    def __init__(
        self,
        root: str,
        train_folds: list[int] = [1],  # noqa: B006 - jsonargparse needs the literal default
        val_folds: list[int] = [2],  # noqa: B006
        test_folds: list[int] | None = None,
        batch_size: int = 4,
        val_batch_size: int = 1,
        crop_size: int = 32,
        t2: int = 16,
        t1: int = 4,
        samples_per_patch: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        seed: int = 0,
        stats_path: str | None = None,
        hr_dir: str = "DATA_SPOT",
        hr_pattern: str = "SPOT_{patch_id}.tif",
        ignore_index: int | None = None,
        hr_bands: list[int] = [1, 2, 3],  # noqa: B006
        hr_max: float = 255.0,
        s1_orbits: list[str] = ["S1A", "S1D"],  # noqa: B006
        min_clear_fraction: float = 0.5,
        augment: bool = True,
        allow_fold_overlap: bool = False,
    ) -> None:
        super().__init__()
        self.root = Path(root)
        if not self.root.is_dir():
            raise CropScaleError(f"data.root: dataset root not found: {self.root}")
        self.metadata_path = self.root / "metadata.geojson"
        if not self.metadata_path.is_file():
            raise CropScaleError(f"data.root: metadata file not found: {self.metadata_path}")
        self._class_names = read_classes(self.root / "classes.json")
        for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size), ("crop_size", crop_size),
                            ("t2", t2), ("t1", t1), ("samples_per_patch", samples_per_patch)):
            if int(value) < 1:
                raise CropScaleError(f"data.{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise CropScaleError(f"data.num_workers must be >= 0, got {num_workers}")
        bad = [o for o in s1_orbits if o not in S1_ORBITS]
        if bad:
            raise CropScaleError(f"data.s1_orbits: unknown orbit(s) {bad}; expected a subset of {list(S1_ORBITS)}")
        self.train_folds = list(train_folds)
        self.val_folds = list(val_folds)
        self.test_folds = list(test_folds) if test_folds is not None else None
        self.data_warnings: list[str] = []
        self._scans: dict[int, PatchScan] = {}
        self._check_folds(bool(allow_fold_overlap))
        self.batch_size = int(batch_size)
        self.val_batch_size = int(val_batch_size)
        self.crop_size, self.t2, self.t1 = int(crop_size), int(t2), int(t1)
        self.samples_per_patch = int(samples_per_patch)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = prefetch_factor
        self.seed = int(seed)
        self.stats_path = _check_stats_path(stats_path)
        self.hr_dir, self.hr_pattern = hr_dir, hr_pattern
        self.ignore_index = ignore_index
        self.hr_bands, self.hr_max = list(hr_bands), float(hr_max)
        self.s1_orbits = list(s1_orbits)
        self.min_clear_fraction = float(min_clear_fraction)
        self.augment = bool(augment)
        self.stats: NormStats | None = None
        self.train_dataset: PastisHDDataset | None = None
        self.val_dataset: PastisHDDataset | None = None
        self.test_dataset: PastisHDDataset | None = None
        self._records = None
        self._resume: dict | None = None

    # ---------------------------------------------------------------- classes
    @property
    def num_classes(self) -> int:
        """Number of semantic classes ``C`` (entries of ``classes.json``)."""
        return len(self._class_names)

    @property
    def class_names(self) -> list[str]:
        """Class names, index = class id."""
        return list(self._class_names)

    # ------------------------------------------------------------------ checks
    def _note(self, message: str | None, *, warn: bool = True) -> None:
        """Record ``message`` once in :attr:`data_warnings` (and issue it as a ``UserWarning``)."""
        if not message or message in self.data_warnings:
            return
        self.data_warnings.append(message)
        if warn:
            warnings.warn(message, stacklevel=2)

    def _check_shards(self, samples: int, world: int) -> None:
        """Refuse a global batch larger than an epoch; note an epoch padded with repeated samples to equal shards.

        Raises:
            CropScaleError: with several ranks, ``data.batch_size`` x world size exceeds the training samples
                of one epoch (one process simply trains one short batch).
        """
        if world > 1 and self.batch_size * world > samples:
            raise CropScaleError(
                f"global batch {self.batch_size * world} (data.batch_size {self.batch_size} x world size {world}) is"
                f" larger than the {samples} training samples of one epoch: lower data.batch_size or the world size"
            )
        if samples % world:
            padded = -(-samples // world) * world
            self._note(f"the {samples} training samples do not split evenly over {world} ranks: each epoch trains"
                       f" {padded} entries, {padded - samples} of them repeated samples (equal shards per rank)",
                       warn=False)
            rank_zero_info(f"cropscale: {self.data_warnings[-1]}")

    def _check_folds(self, allow_overlap: bool) -> None:
        """Refuse training folds that are also validation or test folds, unless ``allow_overlap``."""
        for name, folds in (("val_folds", self.val_folds), ("test_folds", self.test_folds or [])):
            shared = sorted(set(self.train_folds) & set(folds))
            if not shared:
                continue
            what = f"data.train_folds {self.train_folds} and data.{name} {folds} share fold(s) {shared}"
            if not allow_overlap:
                raise CropScaleError(
                    f"{what}: {'validation' if name == 'val_folds' else 'test'} would score patches the model"
                    " trained on; use disjoint folds, or set data.allow_fold_overlap=true if that is intended"
                )
            self._note(f"{what} (allowed by data.allow_fold_overlap)", warn=False)
            rank_zero_info(f"cropscale: {self.data_warnings[-1]}")

    def _check_values(self, datasets: list[PastisHDDataset]) -> list[PatchScan]:
        """Scan every patch of ``datasets`` not scanned before (:meth:`PastisHDDataset.check_content`)."""
        for dataset in datasets:
            for message in dataset.data_warnings:
                self._note(message, warn=False)  # already issued by the index
            todo = [p for p in dataset.patches if p.patch_id not in self._scans]
            if todo:
                self._scans.update((s.patch_id, s) for s in dataset.check_content())
        return [self._scans[p.patch_id] for d in datasets for p in d.patches]

    def _note_values(self, scans: list[PatchScan], stats: NormStats) -> None:
        """Record the scale and mask findings of ``scans`` against the training statistics."""
        for message in scale_warnings(scans, stats):
            self._note(message)
        self._note(zero_but_clear_warning(list({s.patch_id: s for s in scans}.values())))

    # ------------------------------------------------------------------ stats
    def compute_stats(self, path: str | None = None) -> NormStats:
        """Compute per-band statistics over ``train_folds``, keep them for the datasets and save them as JSON.

        The statistics come from :func:`~cropscale.data.stats.compute_norm_stats`; they are saved to ``path``
        (default ``stats_path``; None = not saved).
        """
        stats = compute_norm_stats(self.root, self.train_folds, s1_orbits=self.s1_orbits)
        target = path if path is not None else self.stats_path
        if target is not None:
            stats.save(target)
            rank_zero_info(f"cropscale: normalisation statistics of folds {self.train_folds} saved to {target}")
        self.stats = stats
        return stats

    def load_stats(self, path: str | None = None) -> NormStats:
        """Load statistics saved by :meth:`compute_stats` (default ``stats_path``) and keep them.

        Raises:
            CropScaleError: missing or malformed file, or statistics of other folds than ``train_folds``.
        """
        target = path if path is not None else self.stats_path
        if target is None:
            raise CropScaleError("data.stats_path: no statistics file given")
        stats = NormStats.load(target)
        if sorted(stats.folds) != sorted(self.train_folds):
            raise CropScaleError(
                f"data.stats_path: {target} holds statistics of folds {stats.folds}, but train_folds are "
                f"{self.train_folds}; normalisation must use the training folds only (delete it or point elsewhere)"
            )
        self.stats = stats
        return stats

    def _ensure_stats(self) -> NormStats:
        if self.stats is not None:
            return self.stats
        if self.stats_path is not None and Path(self.stats_path).is_file():
            return self.load_stats()
        return self.compute_stats()

    # ------------------------------------------------------------------ setup
    def _dataset(self, folds: list[int], train: bool) -> PastisHDDataset:
        return PastisHDDataset(
            self.root, folds, train=train, crop_size=self.crop_size, t2=self.t2, t1=self.t1,
            samples_per_patch=self.samples_per_patch, stats=None, augment=self.augment and train,
            num_classes=self.num_classes, ignore_index=self.ignore_index, hr_dir=self.hr_dir,
            hr_pattern=self.hr_pattern, hr_bands=self.hr_bands, hr_max=self.hr_max, s1_orbits=self.s1_orbits,
            min_clear_fraction=self.min_clear_fraction, seed=self.seed, records=self._records,
        )

    @override
    def setup(self, stage: str | None = None) -> None:
        """Check the files of the folds the stage needs, get the statistics, build the datasets.

        ``stage``: ``fit`` (train + val), ``validate`` (val), ``test``/``predict`` (test), None (all).
        """
        if self._records is None:
            self._records = read_metadata(self.metadata_path)
            self._note(orphan_warning(self.root, self._records))
        if stage in ("test", "predict") and self.test_folds is None:
            raise CropScaleError(
                f"data.test_folds: no test folds given; the '{getattr(stage, 'value', stage)}' stage reads the"
                " test folds (e.g. --data.test_folds=[5])"
            )
        # datasets first: their file checks fail fast, before statistics are computed
        built = []
        if stage in ("fit", None):
            self.train_dataset = self._dataset(self.train_folds, train=True)
            built.append(self.train_dataset)
        if stage in ("fit", "validate", None):
            self.val_dataset = self._dataset(self.val_folds, train=False)
            built.append(self.val_dataset)
        if stage in ("test", "predict") or (stage is None and self.test_folds):
            self.test_dataset = self._dataset(self.test_folds, train=False)
            built.append(self.test_dataset)
        scans = self._check_values(built)
        stats = self._ensure_stats()
        for dataset in built:
            dataset.stats = stats
        self._note_values(scans, stats)

    # ------------------------------------------------------------ dataloaders
    def _loader_kwargs(self) -> dict:
        kwargs = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "collate_fn": partial(collate, t1=self.t1),
            "worker_init_fn": seed_worker,
        }
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = int(self.prefetch_factor)
        return kwargs

    def _world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 1, 0
        return int(self.trainer.world_size), int(self.trainer.global_rank)

    @override
    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        world, rank = self._world()
        self._check_shards(len(self.train_dataset), world)
        generator = torch.Generator()
        sampler = TrainShardSampler(self.train_dataset, num_replicas=world, rank=rank, seed=self.seed,
                                    generator=generator)
        if self._resume is not None:
            sampler.resume_at(*self._resume_position(world))
            self._resume = None
        return DataLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, drop_last=False,
                          generator=generator, **self._loader_kwargs())

    # ----------------------------------------------------------------- resume
    @override
    def state_dict(self) -> dict:
        """The training position, saved in every checkpoint: ``{format, seed, world_size, batch_size, epoch, batches}``.

        ``epoch`` is the epoch being trained and ``batches`` the training batches of it this rank has
        done (all of them at an end-of-epoch checkpoint). Empty outside ``fit``.
        """
        trainer = self.trainer
        if trainer is None or not _fitting(trainer):
            return {}
        loop = trainer.fit_loop
        return {"format": STATE_FORMAT, "seed": self.seed, "world_size": int(trainer.world_size),
                "batch_size": self.batch_size, "epoch": int(trainer.current_epoch),
                "batches": int(loop.epoch_loop.batch_progress.current.processed)}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        """Keep the training position of a checkpoint for the next :meth:`train_dataloader` (see :meth:`state_dict`).

        Raises:
            CropScaleError: a checkpoint stopped in the middle of an epoch, resumed with another world size,
                batch size or seed (its remaining samples cannot be known then).
        """
        if state_dict.get("format") != STATE_FORMAT:
            return
        self._resume = dict(state_dict)

    def _resume_position(self, world: int) -> tuple[int, int]:
        """``(epoch, first sample of this rank)`` where the resumed training continues."""
        state = self._resume
        epoch, batches = int(state["epoch"]), int(state["batches"])
        per_rank = -(-len(self.train_dataset) // world)
        if batches * int(state["batch_size"]) >= per_rank:
            return epoch + 1, 0  # the checkpoint's epoch was trained to its end
        if batches and (world, self.batch_size, self.seed) != (state["world_size"], state["batch_size"], state["seed"]):
            raise CropScaleError(
                f"--ckpt_path: the checkpoint stopped after {batches} batches of epoch {epoch} with world size"
                f" {state['world_size']}, data.batch_size {state['batch_size']}, data.seed {state['seed']}; resume it"
                f" with the same (here {world}, {self.batch_size}, {self.seed}), or from an end-of-epoch checkpoint"
            )
        return epoch, batches * self.batch_size

    def _eval_loader(self, dataset: PastisHDDataset) -> DataLoader:
        world, rank = self._world()
        if world == 1:
            return DataLoader(dataset, batch_size=self.val_batch_size, shuffle=False, **self._loader_kwargs())
        sampler = EvalShardSampler(len(dataset), num_replicas=world, rank=rank, pad=True)
        return DataLoader(PaddedEvalDataset(dataset), batch_size=self.val_batch_size, shuffle=False, sampler=sampler,
                          **self._loader_kwargs())

    @override
    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return self._eval_loader(self.val_dataset)

    @override
    def test_dataloader(self) -> DataLoader:
        if self.test_dataset is None:
            self.setup("test")
        return self._eval_loader(self.test_dataset)

    @override
    def predict_dataloader(self) -> DataLoader:
        if self.test_dataset is None:
            self.setup("predict")
        return self._eval_loader(self.test_dataset)


def _fitting(trainer) -> bool:
    state = getattr(trainer, "state", None)
    return getattr(getattr(state, "fn", None), "value", None) == "fit"
