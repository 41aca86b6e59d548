"""The scaling-study runner: ``python -m cropscale study --config configs/study/<name>.yaml``.

A study spec (:mod:`cropscale.study.spec`) lists device counts, precisions, batch protocols
(``equal-global`` / ``equal-local``, :mod:`cropscale.study.protocol`), seeds, warm-up and measured
epochs, the strategy, base ``fit`` configs and overrides, and the accelerator. The runner

1. plans every configuration (protocol x precision x world size) with the exact batch arithmetic
   (:mod:`cropscale.study.plan`);
2. launches one ``python -m cropscale fit ...`` process per configuration and seed
   (:mod:`cropscale.study.launch`; Lightning's own launchers start the DDP ranks), each with the
   scaling callbacks on, all landing in one study folder;
3. does **not** run configurations that need more devices than exist: they appear as
   ``analytical-scenario`` rows (:mod:`cropscale.study.predict`), never as measurements; a batch
   sweep's points that do not fit the machine are listed as not run, without figures;
4. reads every run with the one run reader (:func:`cropscale.runs.record.load_run`), aggregates the
   seeds (:mod:`cropscale.study.aggregate`) and writes the table and figures
   (:mod:`cropscale.study.outputs`).

Study folder layout (``--output``, default ``runs/study/<name>``)::

    study.json                 spec, plan, commands, exit codes, environment, git commit
    runs/<config>/seed<k>/     the fit run (Lightning log dir: run.json, events, config.yaml)
    logs/<config>_seed<k>.log  stdout + stderr of the fit process
    study_table.md / .csv      one row per configuration, measured-run rows first
    batch_sweep.csv            the batch sweep (when the spec has one); its table, verdicts and the points
                               not run are a section of study_table.md
    figures/*.png

Several nodes: the ``launcher`` spec field replaces ``python -m cropscale`` by a launcher prefix
(``srun ...`` inside a SLURM allocation, ``torchrun ...``); Lightning's environment detection
(SLURMEnvironment, TorchElasticEnvironment) then sets the ranks. See ``docs/03_scaling_studies.md``, "On several nodes".
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cropscale.env.host import PACKAGE_DIR, environment_record, git_info, gpu_topology, sha256_file
from cropscale.errors import CropScaleError
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.files import atomic_write_json, find_resource
from cropscale.options import Options, parse_options
from cropscale.progress import Progress
from cropscale.runs.record import RunRecord, load_run
from cropscale.study import protocol as P
from cropscale.study.aggregate import (
    StudyRow,
    add_speedup_intervals,
    add_speedups,
    base_row,
    measured_row,
    sweep_summary,
)
from cropscale.study.check import prediction_checks
from cropscale.study.launch import (
    Launcher,
    check_batch_line,
    child_env,
    cpu_sample,
    cpu_usage,
    fit_command,
    subprocess_launcher,
)
from cropscale.study.outputs import write_outputs
from cropscale.study.plan import (
    Configuration,
    available_devices,
    configured_data_root,
    node_layout,
    plan_study,
    resolve_accelerator,
)
from cropscale.study.predict import analytical_rows
from cropscale.study.spec import BatchSweepSpec, StudySpec, load_spec
from cropscale.study.verdicts import study_comparisons


def _data_record(data_root: str | None) -> dict[str, Any]:
    """The data revision: SHA-256 of ``metadata.geojson`` under the root (when there is one)."""
    if data_root is None:
        return {"root": None}
    meta = Path(data_root) / "metadata.geojson"
    return {"root": data_root, "metadata_sha256": sha256_file(meta) if meta.is_file() else None}


def _environment(accelerator: str) -> dict[str, Any]:
    import torch

    try:
        device = torch.device("cuda" if accelerator == "gpu" and torch.cuda.is_available() else "cpu")
        return environment_record(__file__, None, device)
    except Exception as err:  # noqa: BLE001 - provenance must not stop a study
        return {"reason": f"environment record failed: {err}"}


def _previous_runs(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    path = out / "study.json"
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return {(r["config"], int(r["seed"])): r for r in doc.get("runs", [])}


def _data_root(spec: StudySpec, data_root: str | None, dry_run: bool, echo: Callable[[str], None]) -> str | None:
    """The ``--data.root`` of every run (resolved), or None to keep the fit configs' root.

    Raises:
        CropScaleError: the root does not exist, or no root is configured anywhere (not in a dry run).
    """
    root = data_root if data_root is not None else spec.data_root
    if root is not None:
        return str(find_resource(root, "data root", hint="give it with --data-root, or run `make data`"))
    if configured_data_root(spec) is None:
        message = (f"{spec.source}: no data root: the spec's data_root and the fit configs' data.root are"
                   " empty; give it with --data-root /path/to/PASTIS-HD")
        if not dry_run:
            raise CropScaleError(message)
        echo(f"warning: {message}")
    return None


@dataclass
class _Study:
    """What one call of :func:`run_study` works with."""

    spec: StudySpec
    out: Path
    accelerator: str
    root: str | None
    configs: list[Configuration]
    launcher: Launcher
    node_rank: int
    echo: Callable[[str], None]
    doc: dict[str, Any] = field(default_factory=dict)
    records: dict[str, list[RunRecord]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def run_root(self) -> Path:
        return self.out / "runs"

    def write_doc(self) -> None:
        name = "study.json" if self.node_rank == 0 else f"study_node{self.node_rank}.json"
        atomic_write_json(self.out / name, self.doc, default=str, allow_nan=True)


def _print_plan(study: _Study, available: int, why: str) -> None:
    spec = study.spec
    study.echo(f"study {spec.name}: {len(study.configs)} configurations x {len(spec.seeds)} seed(s); {available}"
               f" rank(s) available ({why}); folder {study.out}")
    for config in study.configs:
        plan = config.plan
        realised = f"L={plan.local_batch} A={plan.accumulation}" if config.world_size else "not realised"
        head = (f"  {config.key:<24} {realised} G={plan.global_batch}"
                f" lr={plan.lr:.6g} updates/epoch={config.updates_per_epoch}")
        if config.runs_as:
            tail = f"  -> the runs of {config.runs_as}"
        elif config.runnable:
            tail = ""
        elif config.protocol == P.BATCH_SWEEP:
            tail = f"  -> not run ({config.reason})"
        else:
            tail = f"  -> {ANALYTICAL_SCENARIO} ({config.reason})"
        study.echo(head + tail)


def _run_one(study: _Study, config: Configuration, seed: int, env: dict[str, str],
             previous: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """Launch (or keep, under ``--resume``) one configuration and seed; return its ``study.json`` entry."""
    cmd = fit_command(study.spec, config, seed, study.run_root, study.accelerator, study.root, study.node_rank)
    run_dir = study.run_root / config.key / f"seed{seed}"
    log_path = study.out / "logs" / f"{config.key}_seed{seed}.log"
    record = {"config": config.key, "seed": seed, "command": cmd, "run_dir": str(run_dir), "log": str(log_path),
              "plan": config.plan.as_dict()}
    old = previous.get((config.key, seed))
    if old and old.get("returncode") == 0 and (run_dir / "run.json").is_file():
        record.update({k: old[k] for k in ("returncode", "wall_s", "batch_check", "cpu") if k in old})
        record["resumed"] = True
        study.echo(f"  {config.key} seed {seed}: kept from an earlier call")
        return record
    if run_dir.exists():
        shutil.rmtree(run_dir)
    study.echo(f"  {config.key} seed {seed}: running ...")
    before = cpu_sample()
    result = study.launcher(cmd, env, log_path, study.spec.run_timeout_s)
    record.update(returncode=result.returncode, wall_s=result.wall_s, cpu=cpu_usage(before, cpu_sample()))
    log_text = Path(result.log_path).read_text(errors="replace") if Path(result.log_path).is_file() else ""
    ok, detail = check_batch_line(log_text, config.plan)
    record["batch_check"] = {"ok": ok, "detail": detail}
    study.echo(f"  {config.key} seed {seed}: exit {result.returncode} after {result.wall_s:.1f} s"
               + ("" if ok is not False else f"; BATCH MISMATCH {detail}"))
    return record


def _collect(study: _Study, config: Configuration, record: dict[str, Any]) -> None:
    """Read a finished run with the run reader, or count it as failed."""
    if record["returncode"] != 0:
        study.failures[config.key] = study.failures.get(config.key, 0) + 1
        return
    run_dir = Path(record["run_dir"])
    try:
        run = load_run(run_dir, study.spec.warmup_epochs)
    except CropScaleError as err:
        study.notes.setdefault(config.key, []).append(str(err))
        return
    study.records.setdefault(config.key, []).append(run)
    if record["batch_check"]["ok"] is False:
        study.notes.setdefault(config.key, []).append(
            f"batch/LR differs from the plan: {record['batch_check']['detail']}")


def _launch_all(study: _Study, resume: bool) -> None:
    """Run every runnable configuration and seed in order; progress (run i of n, time left) on stderr."""
    env = child_env(study.spec, study.accelerator)
    previous = _previous_runs(study.out) if resume else {}
    todo = [config for config in study.configs
            if config.runnable and not config.runs_as and not (
                study.node_rank > 0 and node_layout(study.spec, config.world_size, study.accelerator)[0] == 1)]
    progress = Progress(len(todo) * len(study.spec.seeds), "study")
    for config in todo:
        for seed in study.spec.seeds:
            progress.start(f"{config.key} seed {seed}")
            record = _run_one(study, config, seed, env, previous)
            progress.finish()
            study.doc["runs"].append(record)
            study.write_doc()  # progress: --resume can pick up from here
            if study.node_rank == 0:
                _collect(study, config, record)


def _rows(study: _Study) -> list[StudyRow]:
    rows = []
    for config in study.configs:
        if not config.runnable:
            continue
        source = config.runs_as or config.key  # a batch-sweep point may share an identical point's runs
        notes = [*config.notes, *study.notes.get(source, ())]
        if config.runs_as:
            notes.append(f"the runs of {config.runs_as} (same optimizer, batch plan and LR)")
        if study.records.get(source):
            row = measured_row(config, study.records[source], study.spec.train_samples_per_epoch, notes)
        else:
            row = base_row(config, MEASURED_RUN)
            row.notes.append("every run of this configuration failed: see logs/")
            row.notes.extend(notes)
        if study.failures.get(source) and study.records.get(source):
            failed = study.failures[source]
            row.notes.append(f"{failed} of {len(study.spec.seeds)} runs failed (see logs/): left out")
        rows.append(row)
    add_speedups(rows)
    add_speedup_intervals(rows, {c.key: study.records.get(c.runs_as or c.key, []) for c in study.configs})
    scaling = [c for c in study.configs if c.protocol != P.BATCH_SWEEP]
    return rows + analytical_rows(study.spec, scaling, rows)


def run_study(
    spec: StudySpec,
    out: Path,
    *,
    data_root: str | None = None,
    launcher: Launcher = subprocess_launcher,
    available: int | None = None,
    dry_run: bool = False,
    resume: bool = False,
    node_rank: int = 0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Plan, launch and analyse a study; returns the ``study.json`` document.

    Args:
        spec: the study.
        out: the study folder.
        data_root: ``--data.root`` for every run (default: the spec's ``data_root``).
        launcher: runs one fit command (tests pass a fake; default :func:`~cropscale.study.launch.subprocess_launcher`).
        available: ranks that can run at once (default :func:`~cropscale.study.plan.available_devices`).
        dry_run: plan and print the commands, launch nothing, write nothing.
        resume: keep runs of an earlier call that finished (exit 0 and a ``run.json``).
        node_rank: 0 on the node that runs every configuration and writes the study; ``R > 0`` on
            the other nodes of a multi-node torchrun study: launch only the configurations that
            span several nodes (same order, ``{node_rank}`` = R in the launcher), analyse nothing,
            record the runs in ``study_node<R>.json``.
        echo: progress printer.

    Raises:
        CropScaleError: the data root does not exist; bad spec values.
    """
    accelerator = resolve_accelerator(spec)
    available, why = available_devices(spec, accelerator) if available is None else (available, "--max-devices")
    root = _data_root(spec, data_root, dry_run, echo)
    study = _Study(spec, Path(out).resolve(), accelerator, root, plan_study(spec, available, why), launcher,
                   node_rank, echo)
    study.doc = {
        "study": spec.name, "spec": asdict(spec), "accelerator": accelerator, "available_devices": available,
        "available_reason": why, "data": _data_record(root), "git": git_info(PACKAGE_DIR),
        "topology": gpu_topology().get("nvidia_smi_topo_m") if accelerator == "gpu" else None, "runs": [], "rows": [],
    }
    _print_plan(study, available, why)
    if dry_run:
        for config in (c for c in study.configs if c.runnable and not c.runs_as):
            for seed in spec.seeds:
                echo(" ".join(fit_command(spec, config, seed, study.run_root, accelerator, root, node_rank)))
        return study.doc
    study.out.mkdir(parents=True, exist_ok=True)
    study.doc["environment"] = _environment(accelerator)
    _launch_all(study, resume)
    if node_rank > 0:
        study.write_doc()
        return study.doc
    rows = _rows(study)
    study.doc["rows"] = [r.to_json() for r in rows]
    study.doc["failed_runs"] = sum(study.failures.values())
    found = study_comparisons(spec, study.configs, study.records)
    study.doc["verdicts"] = [c.line() for c in found]
    sweep = next((p for p in spec.protocols if isinstance(p, BatchSweepSpec)), None)
    summary = None
    if sweep is not None:
        summary = sweep_summary(rows, study.configs, sweep.baseline, sweep.tolerance, found)
        study.doc["batch_sweep"] = asdict(summary)
    study.write_doc()
    runs = [r for records in study.records.values() for r in records]
    cpu: dict[str, list[dict]] = {}
    for entry in study.doc["runs"]:
        if entry.get("cpu") and entry.get("returncode") == 0:
            cpu.setdefault(entry["config"], []).append(entry["cpu"])
    checks = prediction_checks(spec, rows, study.records, cpu, accelerator)
    study.doc["prediction_checks"] = [c.line() for c in checks]
    paths = write_outputs(rows, study.out, spec, runs, summary, found, [c.line() for c in checks])
    sweep_lines = [f"batch sweep {c.optimizer}, {c.lr_scaling}, {c.precision}: {c.verdict}"
                   for c in (summary.curves if summary is not None else ())]
    for line in [c.line() for c in found] + sweep_lines + study.doc["prediction_checks"]:
        study.echo(line)
    study.doc["outputs"] = {k: str(v) for k, v in paths.items()}
    study.write_doc()
    return study.doc


# ------------------------------------------------------------------------------------------ command
@dataclasses.dataclass(kw_only=True)
class StudyOptions(Options):
    """Run a scaling study: one `fit` process per configuration and seed.

    Configurations needing more devices than exist become analytical-scenario rows.
    """

    config: str
    """study spec YAML, e.g. configs/study/cpu.yaml"""
    output: str | None = None
    """study folder (default runs/study/<name>)"""
    data_root: str | None = None
    """data root for every run (overrides the spec's data_root)"""
    dry_run: bool = False
    """print the plan and the fit commands, run nothing"""
    resume: bool = False
    """keep runs of an earlier call that finished"""
    node_rank: int = 0
    """multi-node torchrun studies: this node's rank (> 0: run only the multi-node configurations, in step with
    node 0)"""
    max_devices: int | None = None
    """ranks that may run at once (default: GPUs visible, or max_cpu_processes / cpu count)"""

    AT_LEAST = {"node_rank": 0, "max_devices": 1}
    RENAMED = {"--out": "output"}


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale study --config configs/study/<name>.yaml [--output DIR] [--dry-run]``.

    Returns 0 when every launched run finished, 1 when one failed (its row says so).

    Raises:
        CropScaleError: a bad spec (named).
        OptionError: a bad option, e.g. ``--max-devices 0`` or ``--node-rank -1`` (named).
    """
    args = parse_options(StudyOptions, argv, "python -m cropscale study")
    spec = load_spec(args.config)
    out = Path(args.output) if args.output else Path("runs") / "study" / spec.name
    doc = run_study(spec, out, data_root=args.data_root, available=args.max_devices, dry_run=args.dry_run,
                    resume=args.resume, node_rank=args.node_rank)
    if args.dry_run or args.node_rank > 0:
        return 0
    print((out / "study_table.md").read_text())
    return 1 if doc.get("failed_runs") else 0
