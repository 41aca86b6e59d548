"""Provenance record: ``run.json`` in the run folder, written at fit start and completed at fit end.

At ``on_fit_start`` global rank 0 writes the record (``status: "running"``): git commit and dirty
flag, dataset revision (SHA-256 of the sorted file list with sizes, or of the file contents), the
full resolved configuration (from LightningCLI's ``SaveConfigCallback``, else ``config.yaml`` in the
run folder, else the module's and datamodule's hyper-parameters), host name, Python / torch /
Lightning / CUDA / cuDNN / NCCL versions, every rank's device (name, UUID) and, from NVML, driver,
power limit and persistence mode, ``nvidia-smi topo -m`` where available, world size, seeds,
precision and strategy, and what the data module's checks found (its ``data_warnings`` attribute, read,
not imported). At ``on_fit_end`` it adds the ``summary`` section: one entry per scaling callback (their
:meth:`~cropscale.callbacks.base.ScalingCallback.summary`, each labelled ``measured-run``), the run's
``validity`` (:func:`cropscale.runs.validity.validity`, judged on every rank:
:attr:`ProvenanceCallback.validity`) and its ``status``: ``"finished"`` for a valid run, else ``"not-trained"``,
``"diverged"`` or ``"not-validated"``; on an exception ``status: "failed"`` with the error's one-line message (a
DataLoader worker's error unwrapped, :func:`cropscale.errors.user_error_text`).
With a :class:`~cropscale.hangs.HangWatch` in the run, ``hang_watch`` records how it watched; when it names a
hanging rank it finishes the record (``failed``, the hang in ``hang_watch.hang``) before it ends the run.
With the summary complete it adds the run's diagnosis (``run.json["diagnosis"]``, :func:`cropscale.diagnosis.diagnose`:
what limits the run, the culprit rank, the bound, what to try) and writes it as the TensorBoard text ``diagnosis``.
A fit that fails before
``on_fit_start`` (a data check at setup) still gets a ``failed`` record in the logger's run folder (``validate``,
``test`` and ``predict`` get none), with the configuration, precision, world size and error but no provenance
probes, unless that folder already holds a ``run.json`` (a resumed run whose attempt failed before restoring):
that record is kept as it is. The schema is documented in ``docs/run_json.md``.

The run folder is ``trainer.log_dir`` (the TensorBoardLogger version folder), else
``trainer.default_root_dir``.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from cropscale.callbacks._dist import gather_objects
from cropscale.callbacks.base import ScalingCallback, fit_validity, iter_callbacks, run_summary
from cropscale.diagnosis import diagnose, markdown
from cropscale.env import nvml
from cropscale.env.host import (
    dataset_revision,
    git_info,
    gpu_topology,
    host_record,
    library_versions,
    utc_now,
)
from cropscale.errors import CropScaleError, user_error_text
from cropscale.evidence import MEASURED_RUN
from cropscale.files import atomic_write_json
from cropscale.hangs import RankHang, watch_of
from cropscale.precision import PrecisionDecision, decide, requested_in
from cropscale.runs.describe import accelerator_name
from cropscale.runs.schema import RUN_SCHEMA, Diagnosis, HangWatchRecord, RunJson, ValidityRecord

SCHEMA = RUN_SCHEMA
_DATA_ATTRS = ("data_root", "root", "data_dir", "root_dir", "dataset_root")
RUN_JSON_LIBRARIES = ("cropscale", "torch", "lightning", "torchmetrics", "numpy", "jsonargparse", "nvidia-ml-py")
"""The libraries ``run.json["versions"]`` lists (with python, cuda, cudnn and nccl)."""


def _local_device(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    dev = pl_module.device
    info: dict[str, Any] = {
        "global_rank": trainer.global_rank, "local_rank": trainer.local_rank, "node_rank": trainer.node_rank,
        "hostname": socket.gethostname(), "device": str(dev),
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        info["name"] = torch.cuda.get_device_name(dev)
        info["uuid"] = nvml.cuda_uuid(dev)
        nv, reason = nvml.open_device_for(dev)
        info["nvml"] = nv.info() if nv is not None else {"available": False, "reason": reason}
    else:
        info["name"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info


def _config(trainer: Trainer, pl_module: LightningModule, log_dir: str | None) -> tuple[Any, str | None]:
    """The resolved configuration and where it came from."""
    import yaml

    try:
        from lightning.pytorch.cli import SaveConfigCallback
    except ImportError:  # jsonargparse missing: no LightningCLI
        SaveConfigCallback = ()  # type: ignore[assignment,misc]  # noqa: N806
    for cb in iter_callbacks(trainer):
        parser, config = getattr(cb, "parser", None), getattr(cb, "config", None)
        if isinstance(cb, SaveConfigCallback) and parser is not None and config is not None:
            try:
                with warnings.catch_warnings():  # skip_none is deprecated in newer jsonargparse; Lightning uses it too
                    warnings.simplefilter("ignore")
                    text = parser.dump(config, skip_none=False)
                return yaml.safe_load(text), "SaveConfigCallback"
            except Exception:
                break
    if log_dir:
        path = Path(log_dir) / "config.yaml"
        if path.is_file():
            try:
                return yaml.safe_load(path.read_text(encoding="utf-8")), str(path)
            except Exception:
                pass
    hp: dict[str, Any] = {}
    try:
        hp["model"] = dict(pl_module.hparams)  # made JSON-ready once, when run.json is written
        if trainer.datamodule is not None:
            hp["data"] = dict(trainer.datamodule.hparams)
    except Exception:
        pass
    return (hp or None), ("hparams" if hp else None)


def precision_decision(trainer: Trainer, config: Any) -> PrecisionDecision:
    """The run's precision decision, made once here: what ``config`` requested, what the Trainer runs, by whom.

    ``config`` is the resolved configuration (:func:`_config`); without a ``trainer`` section (a Trainer built in
    Python) what was requested is :data:`~cropscale.precision.NOT_RECORDED`.
    """
    return decide(*requested_in(config), str(trainer.precision), accelerator_name(type(trainer.accelerator).__name__))


def _data_root(trainer: Trainer, explicit: str | None) -> str | None:
    if explicit:
        return explicit
    dm = trainer.datamodule
    for attr in _DATA_ATTRS:
        value = getattr(dm, attr, None) if dm is not None else None
        if isinstance(value, (str, os.PathLike)) and Path(value).is_dir():
            return str(value)
    return None


def _data_warnings(trainer: Trainer) -> list[str]:
    """What the data module's checks found: its ``data_warnings`` attribute (a list of lines), else ``[]``."""
    found = getattr(trainer.datamodule, "data_warnings", None)
    return [str(w) for w in found] if isinstance(found, (list, tuple)) else []


def _diagnosis(record: RunJson) -> Diagnosis:
    """The run's diagnosis; a rule that fails leaves the record intact and says so (``Diagnosis.error``)."""
    try:
        return diagnose(record)
    except Exception as err:  # a broken rule must not lose run.json
        return Diagnosis(error=f"{type(err).__name__}: {err}")


def _write_text(trainer: Trainer, tag: str, text: str) -> None:
    """``text`` (Markdown) as TensorBoard text ``tag`` at the current step, in every logger that takes text.

    run.json is written first: a logger that cannot take the text (closed by a failing fit) only loses the text.
    """
    for logger in trainer.loggers:
        add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
        if callable(add_text):
            try:
                add_text(tag, text, global_step=trainer.global_step)
            except Exception as err:  # the record is on disk already
                rank_zero_info(f"ProvenanceCallback: the {tag} text was not written to {type(logger).__name__}: {err}")


class ProvenanceCallback(ScalingCallback):
    """Writes ``run.json`` (provenance at fit start, summaries of every scaling callback at fit end).

    Args:
        filename: name of the record inside the run folder.
        data_root: dataset folder to hash; ``None`` looks for a folder in the datamodule attributes
            ``data_root``, ``root``, ``data_dir``, ``root_dir``, ``dataset_root``.
        data_hash: ``"listing"`` (file names and sizes) or ``"content"`` (also every byte).
        topology: record ``nvidia-smi topo -m``.
        extra: more JSON-ready fields stored under ``extra``.

    Rank behaviour: the device list is gathered from every rank at fit start (a collective); only
    global rank 0 writes the file. Nothing runs per step.

    Raises:
        CropScaleError: for an unknown ``data_hash`` or a ``data_root`` that is not a folder.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import GradNormCallback, ProvenanceCallback

        # last, so that run.json holds the summaries of the scaling callbacks before it
        trainer = Trainer(callbacks=[GradNormCallback(), ProvenanceCallback(data_hash="listing")])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/provenance.yaml
    """

    summary_key = "provenance"

    def __init__(self, filename: str = "run.json", data_root: str | None = None,
                 data_hash: Literal["listing", "content"] = "listing", topology: bool = True,
                 extra: dict[str, Any] | None = None) -> None:
        if data_hash not in ("listing", "content"):
            raise CropScaleError(f"ProvenanceCallback(data_hash={data_hash!r}): use 'listing' or 'content'")
        if data_root is not None and not Path(data_root).is_dir():
            raise CropScaleError(f"ProvenanceCallback(data_root={data_root!r}): not a folder")
        self.filename = filename
        self.data_root = data_root
        self.data_hash = data_hash
        self.topology = topology
        self.extra = dict(extra or {})
        self.path: str | None = None
        self.record: RunJson | None = None
        self.validity: ValidityRecord | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"path": self.path}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.path = state_dict.get("path")

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # a collective: every rank calls it
        devices = gather_objects(trainer, _local_device(trainer, pl_module))
        self.path = os.path.join(log_dir, self.filename)
        if not trainer.is_global_zero:
            return
        root = _data_root(trainer, self.data_root)
        if root is None:
            dataset: dict[str, Any] = {"available": False,
                                       "reason": "no data folder: pass ProvenanceCallback(data_root=...)"}
        else:
            try:
                dataset = {"available": True, **dataset_revision(root, self.data_hash)}
            except (CropScaleError, OSError) as err:
                dataset = {"available": False, "reason": str(err)}
        config, source = _config(trainer, pl_module, log_dir)
        strategy = trainer.strategy
        self.record = RunJson(
            status="running",
            started_utc=utc_now(),
            finished_utc=None,
            run_dir=os.path.abspath(log_dir),
            command=list(sys.argv),
            git=git_info(),
            dataset=dataset,
            config=config,
            config_source=source,
            host=host_record(),
            versions=library_versions(RUN_JSON_LIBRARIES),
            devices=devices,
            topology=gpu_topology() if self.topology else {"available": False, "reason": "topology=False"},
            distributed={
                "world_size": trainer.world_size,
                "num_nodes": trainer.num_nodes,
                "devices_per_node": trainer.num_devices,
                "strategy": type(strategy).__name__,
                "process_group_backend": getattr(strategy, "process_group_backend", None)
                or getattr(strategy, "_process_group_backend", None),
                "accelerator": type(trainer.accelerator).__name__,
            },
            precision=str(trainer.precision),
            precision_decision=precision_decision(trainer, config),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            seeds={
                "PL_GLOBAL_SEED": os.environ.get("PL_GLOBAL_SEED"),
                "PL_SEED_WORKERS": os.environ.get("PL_SEED_WORKERS"),
                "torch_initial_seed": int(torch.initial_seed()),
            },
            trainer={
                "max_epochs": trainer.max_epochs,
                "max_steps": trainer.max_steps,
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": trainer.gradient_clip_val,
                "gradient_clip_algorithm": None if trainer.gradient_clip_algorithm is None
                else str(getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm)),
                "log_every_n_steps": trainer.log_every_n_steps,
                "val_check_interval": trainer.val_check_interval,
                "deterministic": torch.are_deterministic_algorithms_enabled(),
            },
            callbacks=[type(cb).__name__ for cb in iter_callbacks(trainer)],
            extra=dict(self.extra),
            data_warnings=_data_warnings(trainer),
        )
        self._watch_hangs(trainer)
        self._write()
        rank_zero_info(f"ProvenanceCallback: wrote {self.path}")

    def _watch_hangs(self, trainer: Trainer) -> None:
        """``hang_watch`` from the run's :class:`~cropscale.hangs.HangWatch`, and its listener.

        When the watch names a hang, the listener finishes the record as failed with the hang (from the watch's
        thread: the main thread may be stuck in a collective).
        """
        watch = watch_of(trainer)
        if watch is None or self.record is None:
            return
        self.record.hang_watch = watch.record()

        def on_hang(record: HangWatchRecord, line: str) -> None:
            if self.record is not None:
                self.record.hang_watch = record
                self._finish(trainer, "failed", RankHang(line))

        watch.add_listener(on_hang)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, "finished", None)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.record is not None and self.record.hang_watch is not None and self.record.hang_watch.hang is not None:
            return  # the hang watch finished the record: this error is the other ranks' end
        if self.record is None and trainer.is_global_zero and trainer.state.fn == "fit":
            self._before_start(trainer, pl_module)  # validate / test / predict write no run.json
        self._finish(trainer, "failed", exception)

    def _before_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the record of a fit that failed before ``on_fit_start`` (a data check at setup refused the data).

        Global rank 0 only and no collective (the other ranks may not have failed): the run folder is the
        logger's own (the logger made it before the data module's setup ran), the devices are not gathered.
        """
        logger = trainer.logger
        log_dir = getattr(logger, "log_dir", None) or trainer.default_root_dir
        self.path = os.path.join(log_dir, self.filename)
        if os.path.isfile(self.path):
            # a resumed run's folder: this attempt failed before restoring; its record would replace the run's
            rank_zero_info(f"ProvenanceCallback: {self.path} kept: this attempt failed before its fit started")
            return
        config, source = _config(trainer, pl_module, log_dir)
        self.record = RunJson(
            status="running", started_utc=utc_now(), run_dir=os.path.abspath(log_dir), command=list(sys.argv),
            config=config, config_source=source, precision=str(trainer.precision),
            precision_decision=precision_decision(trainer, config),
            distributed={"world_size": trainer.world_size, "strategy": type(trainer.strategy).__name__,
                         "accelerator": type(trainer.accelerator).__name__},
            callbacks=[type(cb).__name__ for cb in iter_callbacks(trainer)],
        )

    def _finish(self, trainer: Trainer, status: str, exception: BaseException | None) -> None:
        writes = trainer.is_global_zero and self.record is not None
        summary = run_summary(trainer, exclude=self) if writes or status == "finished" else None
        if summary is not None and status == "finished":  # every rank: the same verdict (its inputs are reduced)
            self.validity = fit_validity(trainer, summary)
        if not writes or summary is None or self.record is None:
            return
        record = self.record
        record.summary = summary
        record.data_warnings = _data_warnings(trainer)
        record.status = status
        if self.validity is not None and status == "finished":
            record.status, record.validity = self.validity.status, self.validity  # no pair, exit status 1 if invalid
        record.finished_utc = utc_now()
        record.global_step = trainer.global_step
        record.epochs_completed = trainer.current_epoch
        if exception is not None:
            record.error = {"type": type(exception).__name__, "message": user_error_text(exception)}
        record.diagnosis = _diagnosis(record)
        self._write()
        _write_text(trainer, "diagnosis", markdown(record.diagnosis))

    def _write(self) -> None:
        assert self.path is not None and self.record is not None
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        atomic_write_json(self.path, self.record.to_json())  # to_json: the one JSON-ready pass

    @override
    def summary(self) -> dict[str, Any]:
        return {"evidence": MEASURED_RUN, "path": self.path}
