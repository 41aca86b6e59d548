"""``PastisHDDataModule``: PASTIS-HD patches for training (random crops), validation and test (whole patches).

Every split is normalised with statistics of the training folds.

Built by LightningCLI from ``data:`` in ``configs/*.yaml``. As TorchGeo's data modules, it forwards the
dataset's options (``**kwargs``) to :class:`~cropscale.data.dataset.PastisHDDataset`, where each is declared
once; jsonargparse follows the forwarding, so they are ``data.<name>`` options with the dataset's types,
defaults and help. The root is resolved once, at construction (:func:`~cropscale.data.layout.resolve_layout`:
what the model is trained without is known before the trainer starts). ``num_classes`` and ``class_names``
come from ``classes.json`` (the CLI links them into the model), as ``t2``, ``t1``, ``crop_size`` and
``ignore_index`` are linked from ``data.*``.

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

import inspect
import random
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, get_worker_info
from typing_extensions import override

from cropscale.data.collate import collate
from cropscale.data.content import PatchScan, scale_warnings, zero_but_clear_warning
from cropscale.data.dataset import PastisHDDataset, check_options
from cropscale.data.index import orphan_warning
from cropscale.data.layout import ORBIT_NAMES, padding_warning, resolve_layout
from cropscale.data.metadata import read_classes
from cropscale.data.scans import ScanCache
from cropscale.data.sharding import EvalShardSampler, PaddedEvalDataset, TrainShardSampler
from cropscale.data.stats import NormStats, stats_from_moments
from cropscale.errors import CropScaleError, DataWarning
from cropscale.files import check_writable_folder

# The training position is restored by PastisHDDataModule.load_state_dict (TrainShardSampler.resume_at), which
# Lightning's check for a resumable DataLoader does not see: its warning about a mid-epoch checkpoint does not apply.
warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")

#: ``format`` of :meth:`PastisHDDataModule.state_dict`.
STATE_FORMAT = "cropscale-data-position/1"

_DATASET_PARAMETERS = inspect.signature(PastisHDDataset).parameters
_SET_BY_THE_MODULE = ("root", "folds", "train", "stats", "num_classes", "seed", "layout")
"""Dataset arguments the data module sets itself (not forwarded options)."""
_SAMPLE_OPTIONS = ("crop_size", "t2", "t1", "samples_per_patch", "min_clear_fraction", "hr_bands")
_LAYOUT_OPTIONS = ("s1_orbits", "s2_mask", "high_grid", "hr_dir", "hr_pattern")


def _check_forwarded(kwargs: dict) -> None:
    """Refuse a forwarded option the dataset does not have, or one the data module sets itself.

    Raises:
        CropScaleError: naming the option(s) and the dataset's options.
    """
    options = [n for n in _DATASET_PARAMETERS if n not in _SET_BY_THE_MODULE]
    bad = sorted(set(kwargs) - set(options))
    if bad:
        raise CropScaleError(f"data: unknown option(s) {bad}; the data module's own and the dataset's: {options}")


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

    An example of the layout is the bundled ``worldcereal-flanders`` sample. As TorchGeo's data modules, it
    holds the splits, the loaders and the statistics, and forwards every other option to each split's
    :class:`~cropscale.data.dataset.PastisHDDataset` (the command line lists them as ``data.<name>``).

    Args:
        root: dataset root (``metadata.geojson``, ``classes.json``, ``DATA_S2`` ...).
        train_folds: folds (``Fold`` in the metadata) for training.
        val_folds: folds for validation.
        test_folds: folds for ``test`` and ``predict``; None = no test set.
        batch_size: training batch (local, per rank).
        val_batch_size: validation/test batch of whole patches (local, per rank).
        num_workers: DataLoader worker processes.
        pin_memory: DataLoader ``pin_memory``.
        persistent_workers: keep the workers between epochs (only with workers).
        prefetch_factor: batches each worker prepares ahead (only with workers; None = PyTorch's default).
        seed: seed of the training sampling (crops, dates, augmentation, order).
        stats_path: normalisation statistics JSON: loaded if it exists (and refused if computed on
            other folds), else computed over ``train_folds`` at setup and saved there (atomically);
            None = computed at setup and kept in memory. A folder, or a new file whose folder cannot be
            written, is refused at construction.
        cache_dir: folder of the data checks' cache (:mod:`cropscale.data.scans`: a second run reads no value
            it has checked); None = ``$XDG_CACHE_HOME/cropscale/data-scans``. Given, it must be writable.
        allow_fold_overlap: accept training folds that are also validation or test folds (scores on
            patches the model trained on); refused by default.
        **kwargs: the dataset's options (:class:`~cropscale.data.dataset.PastisHDDataset`: ``crop_size``,
            ``t2``, ``t1``, ``samples_per_patch``, ``augment``, ``ignore_index``, ``high_grid``, ``hr_dir``,
            ``hr_pattern``, ``hr_bands``, ``hr_max``, ``s1_orbits``, ``s2_mask``, ``min_clear_fraction``,
            ``check_values``).

    Attributes:
        kwargs: the forwarded dataset options, as given.
        layout: the root resolved once (:func:`~cropscale.data.layout.resolve_layout`).
        data_warnings: what the checks found that is not an error, one line each (also issued as
            ``UserWarning``, or logged for an allowed fold overlap): what the model is trained without
            (modalities absent from the whole data set), ``t2`` / ``t1`` padding every sample, overlapping folds
            allowed, files without a metadata entry, the documented fallbacks, patches on another scale than the
            training statistics, masks that mark no-data pixels clear. ``ProvenanceCallback`` writes them to
            ``run.json``.

    Raises:
        CropScaleError: missing root, ``metadata.geojson`` or ``classes.json``, an option out of range, a modality
            the options ask for and the root lacks, or overlapping folds (at construction); empty folds, bad
            patch files and bad values (at :meth:`setup`, for every fold the stage reads, before the first step).
    """

    def __init__(
        self,
        root: str,
        train_folds: list[int] = [1],  # noqa: B006 - jsonargparse needs the literal default
        val_folds: list[int] = [2],  # noqa: B006
        test_folds: list[int] | None = None,
        batch_size: int = 4,
        val_batch_size: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        seed: int = 0,
        stats_path: str | None = None,
        cache_dir: str | None = None,
        allow_fold_overlap: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.kwargs = kwargs
        _check_forwarded(kwargs)
        check_options(**{name: self.option(name) for name in _SAMPLE_OPTIONS})
        self.layout = resolve_layout(root, **{name: self.option(name) for name in _LAYOUT_OPTIONS})
        self.root = self.layout.root
        self.metadata_path = self.layout.meta_path
        self._class_names = read_classes(self.root / "classes.json")
        for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size)):
            if int(value) < 1:
                raise CropScaleError(f"data.{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise CropScaleError(f"data.num_workers must be >= 0, got {num_workers}")
        self.train_folds = list(train_folds)
        self.val_folds = list(val_folds)
        self.test_folds = list(test_folds) if test_folds is not None else None
        self.data_warnings: list[str] = []
        for message in self.layout.warnings:
            self._note(message)
        self._check_folds(bool(allow_fold_overlap))
        self.batch_size = int(batch_size)
        self.val_batch_size = int(val_batch_size)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = prefetch_factor
        self.seed = int(seed)
        self.stats_path = _check_stats_path(stats_path)
        if cache_dir is not None:
            check_writable_folder(cache_dir, what="data.cache_dir: folder")
        self.scan_cache = ScanCache(cache_dir)
        self.stats: NormStats | None = None
        self.train_dataset: PastisHDDataset | None = None
        self.val_dataset: PastisHDDataset | None = None
        self.test_dataset: PastisHDDataset | None = None
        self._datasets: dict[tuple[tuple[int, ...], bool], PastisHDDataset] = {}
        self._scans: dict[int, PatchScan] = {}
        self._orphans_noted = False
        self._resume: dict | None = None

    # ---------------------------------------------------------------- options
    def option(self, name: str) -> Any:
        """The dataset option ``name`` as forwarded: given in :attr:`kwargs`, else the dataset's default."""
        if name in self.kwargs:
            return self.kwargs[name]
        return _DATASET_PARAMETERS[name].default

    @property
    def t2(self) -> int:
        """Sentinel-2 dates per sample (``data.t2``)."""
        return int(self.option("t2"))

    @property
    def t1(self) -> int:
        """Dates per Sentinel-1 orbit per sample (``data.t1``)."""
        return int(self.option("t1"))

    @property
    def crop_size(self) -> int:
        """Training crop side in 10 m pixels (``data.crop_size``)."""
        return int(self.option("crop_size"))

    @property
    def ignore_index(self) -> int | None:
        """Class id ignored in loss and metrics (``data.ignore_index``)."""
        return self.option("ignore_index")

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
            warnings.warn(message, DataWarning, stacklevel=2)

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

    def _note_padding(self, datasets: list[PastisHDDataset]) -> None:
        """Note ``t2`` / ``t1`` above every series' length of the patches ``datasets`` read."""
        patches = list({p.patch_id: p for d in datasets for p in d.patches}.values())
        self._note(padding_warning("t2", self.t2, [len(p.doy["S2"]) for p in patches], "Sentinel-2"))
        for orbit in self.layout.orbits:
            lengths = [len(p.doy[orbit]) for p in patches if orbit in p.doy]
            self._note(padding_warning("t1", self.t1, lengths, ORBIT_NAMES[orbit]))

    def _scan(self, datasets: list[PastisHDDataset]) -> None:
        """Scan every patch of ``datasets`` not scanned before (:meth:`PastisHDDataset.check_content`).

        ``data.num_workers`` threads (at least 1) scan at once: the cores meant for loading, idle at setup.
        """
        for dataset in datasets:
            if any(p.patch_id not in self._scans for p in dataset.patches):
                scans = dataset.check_content(self.scan_cache, threads=max(1, self.num_workers))
                self._scans.update((s.patch_id, s) for s in scans)

    def _note_values(self, datasets: list[PastisHDDataset], stats: NormStats) -> None:
        """Record the scale and mask findings of the checked scans of ``datasets`` against the training statistics."""
        scans = [self._scans[p.patch_id] for d in datasets for p in d.patches if p.patch_id in self._scans]
        scans = list({s.patch_id: s for s in scans if s.checked}.values())
        for message in scale_warnings(scans, stats):
            self._note(message)
        self._note(zero_but_clear_warning(scans))

    # ------------------------------------------------------------------ stats
    def compute_stats(self, path: str | None = None) -> NormStats:
        """Per-band statistics over ``train_folds``, kept for the datasets and saved as JSON.

        The moments come from the training patches' scans (:meth:`_scan`: the pass that checks their values, or a
        cached one); they are saved to ``path`` (default ``stats_path``; None = not saved).
        """
        dataset = self._dataset(self.train_folds, train=True)
        self._scan([dataset])
        stats = stats_from_moments([self._scans[p.patch_id].moments for p in dataset.patches], folds=self.train_folds,
                                   patch_ids=[p.patch_id for p in dataset.patches], root=str(self.root))
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
        """The dataset of ``folds`` (built once: the layout and the options do not change)."""
        key = (tuple(folds), train)
        if key not in self._datasets:
            self._datasets[key] = PastisHDDataset(self.root, folds, train=train, stats=None,
                                                  num_classes=self.num_classes, seed=self.seed, layout=self.layout,
                                                  **self.kwargs)
        return self._datasets[key]

    @override
    def setup(self, stage: str | None = None) -> None:
        """Check the files and values of the folds the stage needs, get the statistics, build the datasets.

        ``stage``: ``fit`` (train + val), ``validate`` (val), ``test``/``predict`` (test), None (all).
        """
        if not self._orphans_noted:
            self._orphans_noted = True
            self._note(orphan_warning(self.root, self.layout.records))
        if stage in ("test", "predict") and self.test_folds is None:
            raise CropScaleError(
                f"data.test_folds: no test folds given; the '{getattr(stage, 'value', stage)}' stage reads the"
                " test folds (e.g. --data.test_folds=[5])"
            )
        # datasets first: their file checks fail fast, before any value is read
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
        for dataset in built:
            for message in dataset.data_warnings:
                self._note(message, warn=False)  # already issued by the index
        self._note_padding(built)
        if self.option("check_values"):
            self._scan(built)
        stats = self._ensure_stats()
        for dataset in built:
            dataset.stats = stats
        self._note_values(built, stats)

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
