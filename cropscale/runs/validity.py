"""The one validity rule of a fit that ran to its end: a valid result, or why not.

A finished fit is *valid* only if

1. it took optimizer steps that trained the model: at least one step, no more than
   :data:`~cropscale.runs.rules.MAX_SKIPPED_SHARE` of them skipped, and (where recorded) some weight changed
   (:func:`cropscale.runs.rules.trained`); otherwise ``not-trained``;
2. its final weights are finite on every rank (``summary.trained.weights_finite``) and its training loss did
   not stay non-finite to the end (``summary.divergence``: the last ``window`` optimizer steps, every step
   counted); otherwise ``diverged``;
3. it validated at least once when validation was configured (``summary.quality``); otherwise
   ``not-validated``.

:func:`validity` is applied once, at the end of every fit, by :class:`~cropscale.callbacks.ProvenanceCallback`
(``run.json`` ``status`` and ``validity``, on every rank so that every rank ends alike) and read by everything
that shows a status: the end-of-fit summary's first line, ``fit``'s exit status (1, ``cropscale: error: ...``),
the report's Status column, and the comparisons (an invalid run forms no precision pair, no verdict and no
study row; :func:`excluded` says why). Runs recorded before the rule existed are judged by the same function
when they are read (:func:`of_run`).
"""

from __future__ import annotations

from cropscale.runs import rules
from cropscale.runs.schema import RunJson, RunSummary, ValidityRecord

VALID = "finished"
"""``run.json`` status of a valid fit."""
NOT_TRAINED = rules.NOT_TRAINED
"""The fit took no optimizer step, skipped most of them, or changed no weight."""
DIVERGED = "diverged"
"""The fit ended with non-finite weights, or its training loss stayed non-finite to the end."""
NOT_VALIDATED = "not-validated"
"""Validation was configured but never ran."""
INVALID: tuple[str, ...] = (NOT_TRAINED, DIVERGED, NOT_VALIDATED)
"""The statuses of a fit that ran to its end but is no valid result."""
UNFINISHED: tuple[str, ...] = ("failed", "running")
"""``run.json`` statuses of a fit that did not run to its end (no validity verdict)."""
NO_STEP = ("took no optimizer step (global step 0; trainer.max_epochs, max_steps or limit_train_batches left"
           " nothing to train)")


def _invalid(status: str, reason: str) -> ValidityRecord:
    return ValidityRecord(valid=False, status=status, reason=reason)


def _steps(summary: RunSummary, global_step: int | None) -> int | None:
    """Optimizer steps of the whole fit (a resumed one included): ``global_step``, else ``summary.trained``'s."""
    if global_step is not None:
        return global_step
    return summary.trained.optimizer_steps if summary.trained is not None else None


def _counted(steps: int | None) -> str:
    """``"N optimizer step(s)"``, or ``"optimizer steps not recorded"`` for a run.json that holds no count."""
    return f"{steps} optimizer step(s)" if steps is not None else "optimizer steps not recorded"


def _diverged(summary: RunSummary) -> str | None:
    """Why the fit diverged (non-finite final weights, or a training loss non-finite to the end), else None."""
    parts = []
    record = summary.trained
    if record is not None and record.weights_finite is False:
        parts.append(f"{record.nonfinite_parameters} of {record.parameters} parameter tensor(s) hold NaN or inf at the"
                     " end of training (summed over ranks)")
    loss = summary.divergence
    if loss is not None and loss.diverged:
        stop = f"; DivergenceCallback stopped the run at step {loss.stopped_at_step}" if loss.stopped_at_step else ""
        parts.append(f"{loss.why}{stop}")
    return "; ".join(parts) or None


def _valid_reason(summary: RunSummary, steps: int | None, why_trained: str) -> str:
    """The facts a valid verdict rests on, the unchecked ones named."""
    record, quality = summary.trained, summary.quality
    weights = {True: "final weights finite", False: "final weights non-finite", None: "final weights not checked"}[
        record.weights_finite if record is not None else None]
    if quality is None:
        validated = "validations not recorded"
    elif quality.validation_configured is False:
        validated = "no validation configured"
    else:
        validated = f"validated {quality.validations} time(s)"
    return f"{_counted(steps)} ({why_trained}); {weights}; {validated}"


def validity(summary: RunSummary, global_step: int | None) -> ValidityRecord:
    """The verdict on a fit that ran to its end (module docstring): the first of the three rules it fails.

    Args:
        summary: ``run.json["summary"]`` (the records of the scaling callbacks; absent sections are facts not
            recorded, which fail no rule).
        global_step: ``run.json["global_step"]`` (``trainer.global_step`` at the end of the fit).

    Returns:
        ``valid``, ``status`` (:data:`VALID` or one of :data:`INVALID`) and the one-sentence ``reason``.
    """
    steps = _steps(summary, global_step)
    if steps == 0:
        return _invalid(NOT_TRAINED, NO_STEP)
    trained = rules.trained(summary, global_step)
    if trained.trained is False:
        return _invalid(NOT_TRAINED, trained.why)
    diverged = _diverged(summary)
    if diverged is not None:
        return _invalid(DIVERGED, diverged)
    quality = summary.quality
    if quality is not None and quality.validation_configured and quality.validations == 0:
        ran = f"in {steps} optimizer step(s)" if steps is not None else "(optimizer steps not recorded)"
        return _invalid(NOT_VALIDATED, f"validation was configured but never ran {ran}: check"
                                       " trainer.check_val_every_n_epoch and val_check_interval against the epochs"
                                       " trained")
    return ValidityRecord(valid=True, status=VALID, reason=_valid_reason(summary, steps, trained.why))


def of_run(run_json: RunJson | None, logged_loss: rules.Divergence | None = None) -> ValidityRecord | None:
    """The validity of a run as read back: its recorded verdict, else :func:`validity` of what it recorded.

    A ``run.json`` written before the verdict was recorded is judged by the same rule; for such a run, and for a
    folder without ``run.json``, a logged training loss that ended non-finite
    (:func:`cropscale.runs.rules.divergence` over TensorBoard ``train/loss_step``) makes it ``diverged``.

    Returns:
        None for a fit that did not finish (status ``failed`` / ``running``) and for a folder without ``run.json``
        whose logged loss did not diverge: there is no verdict.
    """
    if run_json is not None and run_json.validity is not None and run_json.validity.status is not None:
        return run_json.validity
    if run_json is not None and run_json.status in UNFINISHED:
        return None
    verdict = validity(run_json.summary, run_json.global_step) if run_json is not None else None
    if (verdict is None or verdict.valid) and logged_loss is not None and logged_loss.diverged:
        return _invalid(DIVERGED, logged_loss.why)
    return verdict


def excluded(status: str | None, verdict: ValidityRecord | None) -> str | None:
    """Why a run takes part in no comparison (precision pair, verdict, study row), or None when it may.

    Args:
        status: the run's status (``run.json`` status, or a benchmark row's).
        verdict: its validity (:func:`of_run`), None when there is none.
    """
    if verdict is not None and not verdict.valid:
        return f"{verdict.status}: {verdict.reason}"
    if status in UNFINISHED:
        return f"{status}: the fit did not run to its end"
    return None
