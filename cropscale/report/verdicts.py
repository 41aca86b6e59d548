"""The comparisons the report leads with: configurations over their seeds, each pair with its verdict.

A *configuration* is the runs whose configuration is the same but for the seed (``seed_everything``) and
what changes nothing computed (logger, output folder, progress bar, checkpoint path). Three kinds of
comparison, each of a base against another configuration that differs in one thing only
(:func:`comparisons`):

- ``precision``: FP32 (``32-true``) against each other precision at the same devices and batches;
- ``devices``: 1 device against N devices of the same device series (:mod:`cropscale.report.scaling`:
  equal-global or equal-local batch);
- ``global batch``: the smallest global batch against each larger one at the same precision and devices.

Statistics, verdicts and time to target: :mod:`cropscale.report.equivalence`. Runs that diverged, failed,
did not finish or did not train take part in no comparison (the statuses of :mod:`cropscale.report.pairs`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cropscale.report.equivalence import DEFAULT_MARGIN, TARGET_FRACTION, Comparison, compare_runs
from cropscale.report.pairs import FAILED
from cropscale.report.scaling import DEVICE_KNOBS, series_key
from cropscale.runs.record import RunRecord, flatten_config

SEED = "seed_everything"
NOTHING_COMPUTED = ("trainer.logger", "trainer.default_root_dir", "trainer.enable_progress_bar",
                    "trainer.enable_model_summary", "ckpt_path", "config")
"""Configuration keys that change nothing computed (they may differ within a configuration)."""
PRECISION_KEYS = ("trainer.precision", "model.allow_tf32", "trainer.plugins")
BATCH_KEYS = ("data.batch_size", "trainer.accumulate_grad_batches", "model.lr")


def usable(record: RunRecord) -> bool:
    """A finished training run that is a valid result (``excluded`` is None: :mod:`cropscale.runs.validity`)."""
    return (record.kind == "run" and record.config is not None and record.status not in FAILED
            and record.status in (None, "finished") and record.excluded is None)


def _key(record: RunRecord, drop: tuple[str, ...], extra: dict | None = None) -> str:
    flat = {k: v for k, v in flatten_config(record.config, split_lists=False).items()
            if not k.startswith((SEED, *NOTHING_COMPUTED, *drop))}
    return json.dumps({"config": flat, **(extra or {})}, sort_keys=True, default=str)


def _seed(record: RunRecord) -> object:
    return (record.config or {}).get(SEED)


def _sides(runs: Sequence[RunRecord]) -> list[tuple[object, RunRecord]]:
    return sorted(((_seed(r), r) for r in runs), key=lambda sr: str(sr[0]))


def _group(records: Sequence[RunRecord], outer, inner) -> dict[str, dict[object, list[RunRecord]]]:
    groups: dict[str, dict[object, list[RunRecord]]] = {}
    for r in records:
        key = outer(r)
        if key is not None:
            groups.setdefault(key, {}).setdefault(inner(r), []).append(r)
    return groups


def _precision(records, margin, fraction) -> list[Comparison]:
    out = []
    groups = _group(records, lambda r: _key(r, PRECISION_KEYS, {"devices": r.devices}), lambda r: r.precision)
    for by_precision in groups.values():
        base = by_precision.get("32-true")
        if not base:
            continue
        for precision, runs in sorted(by_precision.items(), key=lambda kv: str(kv[0])):
            if precision == "32-true":
                continue
            b, o = base[0], runs[0]
            out.append(compare_runs("precision", f"{b.precision_label} (G {b.global_batch}, N {b.devices})",
                                    f"{o.precision_label}", _sides(base), _sides(runs), margin, fraction))
    return out


def _local_batch(record: RunRecord) -> object:
    return (record.config or {}).get("data", {}).get("batch_size")


def _devices(records, margin, fraction) -> list[Comparison]:
    out, seen = [], set()
    for protocol, batch_of in (("equal-global", lambda r: r.global_batch), ("equal-local", _local_batch)):
        groups = _group(records, lambda r, f=batch_of: None if series_key(r) is None or f(r) is None
                        else f"{series_key(r)}|{f(r)}", lambda r: r.devices)
        for by_n in groups.values():
            base = by_n.get(1)
            if not base:
                continue
            for n, runs in sorted((kv for kv in by_n.items() if kv[0] != 1), key=lambda kv: kv[0]):
                names = frozenset(r.name for r in base + runs)
                if names in seen:
                    continue  # equal-global and equal-local can be the same runs (accumulation 1)
                seen.add(names)
                b = base[0]
                label = f"{b.precision_label} {protocol} (G {b.global_batch}, L {_local_batch(b)})"
                out.append(compare_runs("devices", f"{label} on 1", f"{n} devices", _sides(base), _sides(runs),
                                        margin, fraction, devices=int(n)))
    return out


def _batches(records, margin, fraction) -> list[Comparison]:
    out = []
    groups = _group(records, lambda r: _key(r, (*BATCH_KEYS, *DEVICE_KNOBS),
                                            {"precision": r.precision, "devices": r.devices}),
                    lambda r: r.global_batch)
    for by_g in groups.values():
        gs = sorted(g for g in by_g if g is not None)
        if len(gs) < 2:
            continue
        base = by_g[gs[0]]
        for g in gs[1:]:
            b = base[0]
            out.append(compare_runs("global batch", f"{b.precision_label} G {gs[0]} (N {b.devices})", f"G {g}",
                                    _sides(base), _sides(by_g[g]), margin, fraction))
    return out


def comparisons(records: Sequence[RunRecord], margin: float = DEFAULT_MARGIN,
                target_fraction: float = TARGET_FRACTION) -> list[Comparison]:
    """Every precision, device and global-batch comparison among the usable runs of ``records``.

    Raises:
        CropScaleError: a margin or target fraction out of range (:func:`~cropscale.report.equivalence.compare_runs`).
    """
    runs = [r for r in records if usable(r)]
    return (_precision(runs, margin, target_fraction) + _devices(runs, margin, target_fraction)
            + _batches(runs, margin, target_fraction))
