"""The end-of-fit summary: a few lines a person reads in ten seconds, from a :class:`~cropscale.runs.record.RunRecord`.

``python -m cropscale fit`` prints it on global rank 0 when ``fit`` returns. Every figure is the
record's, so it follows the same rule (:mod:`cropscale.runs.rules`) as the report: a number printed
here and the same number in ``python -m cropscale report`` agree. Every figure is ``measured-run``
(the header says so); a figure that is n/a says why.

Lines: ``NOT TRAINED`` first (only when :func:`~cropscale.runs.rules.trained` says so: more than
:data:`~cropscale.runs.rules.MAX_SKIPPED_SHARE` of the optimizer steps skipped, or no weight changed);
the header; what ran; ``DIVERGED`` (only when :func:`~cropscale.runs.rules.divergence` says so); quality
(best ``val/mIoU`` and its epoch); speed (the two throughputs named apart: training-loop samples/s and epoch-clock
samples/s; median step); epoch (training-only, validation-only and end-to-end epoch time); step (the decomposition in
percent of the step); memory; energy (GPU board energy per training sample, labelled as such, or why there is none);
numerics
(non-finite batches, skipped steps); data (the data checks' warnings: count and first); the run folder;
the report command.
"""

from __future__ import annotations

from cropscale.evidence import MEASURED_RUN
from cropscale.runs.figures import FIGURES
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import BOARD_ENERGY, NOT_TRAINED, Figure, trained
from cropscale.runs.schema import STEP_WINDOWS

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


def divergence_line(record: RunRecord, stopped_at_step: int | None = None) -> str | None:
    """``DIVERGED ...`` when the run diverged, else None."""
    verdict = record.divergence
    if verdict is None or not verdict.diverged:
        return None
    stop = (f"; DivergenceCallback stopped the run at step {stopped_at_step}" if stopped_at_step is not None
            else "; nothing stopped the run")
    return (f"DIVERGED    {verdict.why}{stop}. The figures below describe a diverged run: lower --model.lr"
            " or check the data")


def not_trained_reason(record: RunRecord) -> str | None:
    """Why the run did not train (:func:`~cropscale.runs.rules.trained`), or None when it trained or cannot tell."""
    if record.run_json is None:
        return None
    verdict = trained(record.run_json.summary, record.run_json.global_step)
    return verdict.why if verdict.trained is False else None


def not_trained_line(record: RunRecord) -> str | None:
    """``NOT TRAINED ...`` when :func:`~cropscale.runs.rules.trained` says the run did not train, else None."""
    why = not_trained_reason(record)
    if why is None:
        return None
    return (f"NOT TRAINED  {why}: the figures below describe a model that did not learn (run.json status"
            f" {NOT_TRAINED!r}; it forms no pair in the report)")


def fit_summary(record: RunRecord, report_command: str, stopped_at_step: int | None = None) -> str:
    """The end-of-fit summary of ``record`` as text (a dozen lines, no trailing newline).

    Args:
        record: the run, read by :func:`~cropscale.runs.record.load_run`.
        report_command: the command that turns the run folder into a report.
        stopped_at_step: the step at which a :class:`~cropscale.callbacks.DivergenceCallback` stopped the run.
    """
    f = record.figures
    head = f"cropscale fit summary [{MEASURED_RUN}: every figure recorded by this run; {_warmup(record)}]"
    lines = [head, "-" * len(head), f"ran         {_what_ran(record)}"]
    untrained = not_trained_line(record)
    if untrained:
        lines.insert(0, untrained)
    diverged = divergence_line(record, stopped_at_step)
    if diverged:
        lines.append(diverged)
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
        f"run folder  {record.path}",
        f"report      {report_command}",
    ]
    return "\n".join(lines)


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
    verdict = record.divergence
    if verdict is None or verdict.diverged is None:
        return "training loss not logged"
    if verdict.diverged:
        return "the training loss ended non-finite"
    return "the last logged training loss is finite"
