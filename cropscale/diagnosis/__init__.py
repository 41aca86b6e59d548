"""What limits a run: rules over the figures a run recorded, with the culprit rank, the bound and what to try.

Layer 1 (it reads ``run.json``'s typed records, :mod:`cropscale.runs`, and nothing above), so that the callbacks,
the end-of-fit summary and the report all use it:

- :func:`diagnose` (:mod:`~cropscale.diagnosis.diagnose`): one run's :class:`~cropscale.runs.schema.Diagnosis`,
  kept in ``run.json["diagnosis"]`` by :class:`~cropscale.callbacks.ProvenanceCallback` at fit end;
- the rules: the step's removable terms and compute (:mod:`~cropscale.diagnosis.steps`), the culprit rank and a
  rank slowing over the run (:mod:`~cropscale.diagnosis.ranks`), validation and checkpoint writes
  (:mod:`~cropscale.diagnosis.epochs`), their thresholds in one place (:mod:`~cropscale.diagnosis.thresholds`,
  documented in ``docs/measuring.md``), what to try (:mod:`~cropscale.diagnosis.advice`);
- :func:`limit_change` (:mod:`~cropscale.diagnosis.compare`): what changed the limit between 1 and N devices;
- :func:`summary_lines` and :func:`markdown` (:mod:`~cropscale.diagnosis.text`): the diagnosis as text.
"""

from cropscale.diagnosis.compare import limit_change
from cropscale.diagnosis.diagnose import diagnose, diagnosis_of
from cropscale.diagnosis.text import markdown, summary_lines

__all__ = ["diagnose", "diagnosis_of", "limit_change", "markdown", "summary_lines"]
