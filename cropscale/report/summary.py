"""The end-of-fit summary: a few lines a person reads in ten seconds, from a :class:`~cropscale.runs.record.RunRecord`.

``python -m cropscale fit`` prints it on global rank 0 when ``fit`` returns. Every figure is the
record's, so it follows the same rule (:mod:`cropscale.runs.rules`) as the report: a number printed
here and the same number in ``python -m cropscale report`` agree. Every figure is ``measured-run``
(the header says so); a figure that is n/a says why.

Lines: the run's validity first when it is no valid result (:mod:`cropscale.runs.validity`: ``NOT TRAINED``,
``DIVERGED`` or ``NOT VALIDATED`` with the reason); the header; what ran; quality (best ``val/mIoU`` and its
epoch); speed (the two throughputs named apart: training-loop samples/s and epoch-clock samples/s; median step);
epoch (training-only, validation-only and end-to-end epoch time); step (the decomposition in percent of the step);
memory; energy (GPU board energy per training sample, labelled as such, or why there is none); numerics
(non-finite batches, skipped steps); data (the data checks' warnings: count and first); limit (the run's
diagnosis, ``run.json["diagnosis"]``: what limits it, the bound, what to try, then up to two more findings,
:func:`cropscale.diagnosis.summary_lines`); the run folder; the report command.
"""

from __future__ import annotations

from cropscale.diagnosis import diagnosis_of, summary_lines
from cropscale.evidence import MEASURED_RUN
from cropscale.runs.figures import FIGURES
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import BOARD_ENERGY, Figure
from cropscale.runs.schema import STEP_WINDOWS
from cropscale.runs.validity import DIVERGED, NOT_TRAINED, NOT_VALIDATED

WINDOW_NAMES = {"data_wait": "data wait", "transfer": "transfer", "forward": "forward", "backward": "backward",
                "optimizer": "optimizer", "remainder": "remainder"}
"""How the summary names the step windows."""


def _num(f: dict[str, Figure], key: str, unit: str | None = None) -> str:
    """Figure ``key`` of ``f`` as ``value unit`` in its registry format (:mod:`cropscale.runs.figures`), or n/a."""
    return FIGURES[key].text(f[key], unit)


def _warmup(record: RunRecord) -> str:
    w = record.warmup_epochs
    if w == 0:
        return "all epochs measured"
    return "epoch 0 left out as warm-up" if w == 1 else f"epochs 0-{w - 1} left out as warm-up"


def _what_ran(record: RunRecord) -> str:
    devices = record.devices if record.devices is not None else "?"
    batch = f"global batch {record.global_batch}" if record.global_batch is not None else "global batch n/a"
    steps = record.run_json.global_step if record.run_json is not None else None
    return (f"{record.precision_label} on {devices} device(s) ({record.strategy or 'strategy n/a'}), {batch}"
            + (f", {steps} optimizer steps" if steps is not None else ""))


def step_line(record: RunRecord) -> str:
    """The step decomposition in percent of the median step, or why there is none."""
    if not record.step_shares:
        if record.figures["median_step_ms"].value is None:
            return "n/a (no median step, see the line above)"
        return "n/a (no step decomposition: StepTimingCallback did not run)"
    parts = [f"{WINDOW_NAMES.get(w, w)} {100 * record.step_shares[w]:.0f} %" for w in STEP_WINDOWS
             if w in record.step_shares]
    total = 100 * sum(record.step_shares.values())
    return ", ".join(parts) + f" of the median step (window medians; sum {total:.0f} %)"


INVALID_LINES: dict[str, tuple[str, str]] = {
    NOT_TRAINED: ("NOT TRAINED", "the figures below describe a model that did not learn"),
    DIVERGED: ("DIVERGED", "the figures below describe a diverged model: lower --model.lr or check the data"),
    NOT_VALIDATED: ("NOT VALIDATED", "the run has no quality figure"),
}
"""The first line's label of each invalid status, and what it means for the figures below it."""


def validity_line(record: RunRecord) -> str | None:
    """The summary's first line for a run that is no valid result (:attr:`RunRecord.validity`), else None."""
    verdict = record.validity
    if verdict is None or verdict.valid:
        return None
    label, meaning = INVALID_LINES.get(verdict.status or "", (str(verdict.status).upper(), "no valid result"))
    return (f"{label}  {verdict.reason}: {meaning} (run.json status {verdict.status!r}; it forms no pair or verdict"
            " in the report)")


def fit_summary(record: RunRecord, report_command: str) -> str:
    """The end-of-fit summary of ``record`` as text (a dozen lines, no trailing newline).

    Args:
        record: the run, read by :func:`~cropscale.runs.record.load_run`.
        report_command: the command that turns the run folder into a report.
    """
    f = record.figures
    head = f"cropscale fit summary [{MEASURED_RUN}: every figure recorded by this run; {_warmup(record)}]"
    lines = [head, "-" * len(head), f"ran         {_what_ran(record)}"]
    invalid = validity_line(record)
    if invalid:
        lines.insert(0, invalid)
    best = f["best_miou"]
    quality = _num(f, "best_miou")
    if best.value is not None:
        quality = (f"best val/mIoU {quality} at epoch {_num(f, 'best_epoch')}"
                   f" (final {_num(f, 'final_miou')})")
    else:
        quality = f"best val/mIoU {quality}"
    lines += [
        f"quality     {quality}",
        f"speed       {_num(f, 'samples_per_s')}, {_num(f, 'samples_per_s_epoch_clock')} (end-to-end epoch);"
        f" median step {_num(f, 'median_step_ms')}{_over(record)}",
        f"epoch       training-only {_num(f, 'train_epoch_s')}, validation-only {_num(f, 'val_epoch_s')},"
        f" end-to-end {_num(f, 'epoch_s')}{_over_epochs(record)}",
        f"step        {step_line(record)}",
        f"memory      peak {_num(f, 'peak_memory_gib')}"
        + (f" ({f['peak_memory_gib'].note})" if f["peak_memory_gib"].value is not None else ""),
        f"energy      {_num(f, 'energy_j_per_sample', 'J per training sample')} ({BOARD_ENERGY})",
        f"numerics    {_num(f, 'nonfinite')} non-finite batch(es){_first_nonfinite(record)},"
        f" {_num(f, 'skipped_steps')} skipped step(s); {_loss_end(record)}",
        f"data        {data_line(record)}",
        *diagnosis_lines(record),
        f"run folder  {record.path}",
        f"report      {report_command}",
    ]
    return "\n".join(lines)


def diagnosis_lines(record: RunRecord) -> list[str]:
    """``limit ...``: the run's diagnosis (what limits it, the bound, what to try), continued on a few lines."""
    diag = diagnosis_of(record)
    if diag is None:
        return ["limit       n/a (no run.json: the diagnosis reads the scaling callbacks' records)"]
    first, *rest = summary_lines(diag, " " * 12)
    return [f"limit       {first}", *rest]


def data_line(record: RunRecord) -> str:
    """What the data checks found (``run.json`` ``data_warnings``): their count and the first of them."""
    warnings = record.data_warnings
    if not warnings:
        return "no data warning"
    more = "; ..." if len(warnings) > 1 else ""
    return f"{len(warnings)} data warning(s) (run.json data_warnings; the report lists them): {warnings[0]}{more}"


def _over(record: RunRecord) -> str:
    """`` (median over the measured epochs)`` where the step figure is one (several epochs measured)."""
    several = len(record.epoch_seconds.get("train_s", [])) > 1
    shown = several and record.figures["median_step_ms"].value is not None
    return " (median over the measured epochs)" if shown else ""


def _over_epochs(record: RunRecord) -> str:
    """`` (median over the measured epochs)`` when several epochs were measured."""
    return " (median over the measured epochs)" if len(record.epoch_seconds.get("wall_s", [])) > 1 else ""


def _first_nonfinite(record: RunRecord) -> str:
    """`` (first at step S, rank R: <part>, patch_id ...)`` for the earliest recorded non-finite batch, else ``""``."""
    section = record.run_json.summary.nonfinite if record.run_json is not None else None
    if section is None or not section.records:
        return ""
    rec = min(section.records, key=lambda x: (x.global_step, x.rank))
    ids = ", ".join(str(i) for i in rec.nonfinite_input_patch_id or rec.patch_id or []) or "n/a"
    return f" (first at step {rec.global_step}, rank {rec.rank}: {rec.part}, patch_id {ids}; the report lists all)"


def _loss_end(record: RunRecord) -> str:
    """What the logged training loss (TensorBoard ``train/loss_step``) shows at its end."""
    logged = record.divergence
    if logged is None or logged.diverged is None:
        return "training loss not logged"
    if logged.trailing == 0:
        return "the last logged training loss is finite"
    if logged.trailing == 1:
        return f"the last logged training loss is non-finite (step {logged.since_step})"
    return f"the last {logged.trailing} logged training losses are non-finite (from step {logged.since_step})"
