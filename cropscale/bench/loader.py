"""Loader throughput: data-pipeline samples/s by DataLoader worker count, beside the model's training samples/s.

The data pipeline is timed alone; the model's training samples/s is measured on the same batches.

``python -m cropscale loader-bench [--root DIR] [--workers 0 2] [--batches 20] [--batch-size 4]
[--checks on off] [--rounds 5]``

For each worker count the training DataLoader of :class:`PastisHDDataModule` (random crops,
temporal sampling, augmentation, windowed high-grid reads, collate) is iterated: the first batch
(worker start-up and first prefetch) is timed apart, ``--warmup`` batches are skipped, then
``--batches`` batches are timed; samples/s = batches x batch size / elapsed seconds. With workers,
up to ``workers x prefetch_factor`` batches may already wait in the queue when timing starts, which
flatters a short run: keep ``--batches`` well above that (default 40 vs 4). Normalisation
statistics are computed once beforehand and not timed.

``--checks on off`` measures the data checks (``data.check_values``): "on" checks the values each sample
reads, and every value of every patch once at setup (cached); "off" does neither. The setup time of each arm
is printed too: the first "on" arm scans every value (a fresh cache, created for the command), the later ones
read the cache. ``--rounds N`` repeats every arm N times, interleaved (the arm order reversed every other
round), and prints the median and the spread (min..max) of each arm's samples/s and the on/off ratio of the
medians: on a shared machine one pair of runs differs by more than the checks cost. ``--clock cpu`` (with
``--workers 0``) times the process's CPU seconds instead of wall seconds, which other processes on the core
disturb less (they still share its caches).

When :class:`cropscale.model.network.CropMappingNet` and :class:`cropscale.model.losses.MultiTaskLoss`
are importable, one training step (forward, loss, backward, gradient clipping to 1.0, AdamW) is
timed on the batches of the first worker count, already in memory and on ``--device``; its
samples/s is printed beside (``--no-model`` skips it). All figures are ``measured-microbenchmark``.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Literal

import torch

from cropscale.batch import model_inputs
from cropscale.bench.interleave import CLOCKS
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.scans import compute_norm_stats
from cropscale.env.host import environment_record
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import SAMPLE_DATA, atomic_write_json, find_resource
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.options import CropSize, JsonOut, OptionError, SampleShape, Seed, Warmup, parse_options
from cropscale.progress import Progress


def default_root() -> str:
    """The bundled sample (:data:`~cropscale.files.SAMPLE_DATA`, :func:`~cropscale.files.find_resource`).

    Raises:
        CropScaleError: not found (every place tried is named).
    """
    return str(find_resource(SAMPLE_DATA, "data root", holding="metadata.geojson", hint="give it with --root"))


@dataclasses.dataclass(kw_only=True)
class LoaderOptions(SampleShape, CropSize, Warmup, Seed, JsonOut):
    """Data-pipeline throughput (samples/s) by DataLoader worker count, against the model's step."""

    root: str | None = None
    """dataset root (default: data/worldcereal-flanders, else ../shared/data/...)"""
    workers: list[int] = dataclasses.field(default_factory=lambda: [0, 2])
    """DataLoader worker counts to measure"""
    batches: int = 40
    """timed batches per worker count"""
    warmup: int = 4
    batch_size: int = 4
    """samples per batch"""
    train_folds: list[int] = dataclasses.field(default_factory=lambda: [1])
    """folds of the training loader"""
    ignore_index: int | None = None
    """label ignored by the loss (default: the dataset's)"""
    model: bool = True
    """also time the model's training step on the same batches"""
    model_steps: int | None = None
    """timed model steps (default: --batches)"""
    device: str = "cpu"
    """device of the model step (cpu, cuda)"""
    checks: list[Literal["on", "off"]] = dataclasses.field(default_factory=lambda: ["on"])
    """the data checks (data.check_values) of the arms to measure: on, off or both"""
    rounds: int = 1
    """times each arm runs, interleaved"""
    clock: Literal["wall", "cpu"] = "wall"
    """wall time, or this process's CPU time (steadier on a shared machine; --workers 0 only)"""

    AT_LEAST = {"batches": 1, "batch_size": 1, "workers": 0, "model_steps": 1, "rounds": 1}

    def check(self) -> None:
        """``--clock cpu`` times this process only: the workers' reads would not count."""
        if self.clock == "cpu" and any(self.workers):
            raise OptionError(f"--clock cpu: measures this process only; use it with --workers 0 (got {self.workers})")


def measure_loader(dm, batches: int, warmup: int, keep: bool = False, progress: Progress | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> dict:
    """Iterate ``dm.train_dataloader()``: first batch, ``warmup`` skipped, ``batches`` timed.

    Returns ``{"first_batch_s", "samples_per_s", "median_batch_ms", "samples", "elapsed_s"}`` and,
    with ``keep``, the timed batches under ``"batches"``; seconds of ``clock`` (wall, or this process's CPU time).

    Raises:
        CropScaleError: the loader has fewer than ``1 + warmup + batches`` batches.
    """
    loader = dm.train_dataloader()
    needed = 1 + warmup + batches
    if len(loader) < needed:
        raise CropScaleError(f"loader-bench: the training loader has {len(loader)} batches, {needed} needed; "
                             "raise --samples-per-patch or lower --batches/--warmup")
    t0 = clock()
    it = iter(loader)
    next(it)
    first = clock() - t0
    for i in range(warmup):
        next(it)
        if progress is not None:
            progress.step(2 + i)
    kept, times, samples = [], [], 0
    start = clock()
    last = start
    for _ in range(batches):
        batch = next(it)
        now = clock()
        times.append(now - last)
        last = now
        samples += int(batch["s2"].shape[0])
        if keep:
            kept.append(batch)
        if progress is not None:
            progress.step(1 + warmup + len(times))
    elapsed = last - start
    del it
    out = {"first_batch_s": first, "samples_per_s": samples / elapsed,
           "median_batch_ms": 1e3 * statistics.median(times), "samples": samples, "elapsed_s": elapsed}
    if keep:
        out["batches"] = kept
    return out


def measure_model(batches: list[dict], num_classes: int, ignore_index: int | None, device: str, steps: int,
                  progress: Progress | None = None) -> dict:
    """Time ``steps`` training steps of ``CropMappingNet`` on ``batches`` (cycled), moved to ``device`` beforehand.

    Each step is forward, loss, backward, gradient clipping to 1.0 and AdamW. One untimed warm-up step runs
    first; on CUDA every step is synchronised. Returns ``{"samples_per_s", "median_step_ms", "steps",
    "batch_size"}``.
    """
    dev = torch.device(device)
    net = CropMappingNet(num_classes=num_classes).to(dev)
    loss_fn = MultiTaskLoss(ignore_index=ignore_index)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    on_dev = [{k: v.to(dev, non_blocking=True) for k, v in b.items()} for b in batches]

    def step(batch):
        opt.zero_grad(set_to_none=True)
        outputs = net(**model_inputs(batch))
        loss, _ = loss_fn(outputs, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    step(on_dev[0])
    sync()
    times, samples = [], 0
    for i in range(steps):
        batch = on_dev[i % len(on_dev)]
        t0 = time.perf_counter()
        step(batch)
        sync()
        times.append(time.perf_counter() - t0)
        samples += int(batch["s2"].shape[0])
        if progress is not None:
            progress.step(2 + i)
    return {"samples_per_s": samples / sum(times), "median_step_ms": 1e3 * statistics.median(times), "steps": steps,
            "batch_size": int(on_dev[0]["s2"].shape[0])}


def _arms(args: LoaderOptions) -> list[tuple[int, int, str]]:
    """``(round, workers, checks)`` in the order they run: every arm once per round, reversed every other round."""
    arms = [(w, c) for w in args.workers for c in args.checks]
    return [(r, w, c) for r in range(args.rounds) for w, c in (arms if r % 2 == 0 else arms[::-1])]


def summarise(rows: list[dict]) -> dict:
    """The figures of ``rows`` per arm and per worker count.

    Per ``workers/checks`` arm: the median, least and most samples/s over the rounds and each run's setup seconds;
    per worker count, the ratio of the medians with the checks on and off.
    """
    out: dict = {"arms": {}, "on_vs_off": {}}
    for key in dict.fromkeys((r["workers"], r["checks"]) for r in rows):
        rates = [r["samples_per_s"] for r in rows if (r["workers"], r["checks"]) == key]
        setups = [r["setup_s"] for r in rows if (r["workers"], r["checks"]) == key]
        scanned = [r.get("scanned_mb", 0.0) for r in rows if (r["workers"], r["checks"]) == key]
        out["arms"][f"{key[0]}/{key[1]}"] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                                            "runs": len(rates), "setup_s": setups, "scanned_mb": scanned}
    for w in dict.fromkeys(r["workers"] for r in rows):
        on, off = out["arms"].get(f"{w}/on"), out["arms"].get(f"{w}/off")
        if on and off:
            out["on_vs_off"][str(w)] = on["median"] / off["median"]
    return out


def _print_summary(summary: dict) -> None:
    for arm, s in summary["arms"].items():
        setups, scanned = s["setup_s"], s["scanned_mb"][0]
        read = f" (a scan of {scanned:.1f} MB: {scanned / setups[0]:.0f} MB/s)" if scanned else ""
        cold = f", setup {setups[0]:.2f} s first{read}, median {statistics.median(setups[1:]):.2f} s after" \
            if len(setups) > 1 else f", setup {setups[0]:.2f} s{read}"
        print(f"workers/checks {arm}: median {s['median']:.1f} samples/s over {s['runs']} run(s) (min {s['min']:.1f},"
              f" max {s['max']:.1f}){cold}  [{MEASURED_MICROBENCHMARK}]")
    for w, ratio in summary["on_vs_off"].items():
        print(f"{w} worker(s): checks on / off = {ratio:.3f} ({100 * (ratio - 1):+.1f} % samples/s, medians)"
              f"  [{MEASURED_MICROBENCHMARK}]")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale loader-bench``; prints a table, returns 0.

    Raises:
        OptionError: a bad option (named).
    """
    args = parse_options(LoaderOptions, argv, "python -m cropscale loader-bench", __doc__.split("\n\n")[0])
    root = args.root or default_root()
    needed = (1 + args.warmup + args.batches) * args.batch_size
    stats = compute_norm_stats(root, args.train_folds)
    n_patches = len(stats.patch_ids)
    spp = -(-needed // n_patches)
    cache = tempfile.TemporaryDirectory(prefix="cropscale-loader-bench-")  # a cold scan for the first "on" arm

    def datamodule(workers: int, checks: str) -> PastisHDDataModule:
        return PastisHDDataModule(root, train_folds=args.train_folds, batch_size=args.batch_size,
                                  crop_size=args.crop_size, t2=args.t2, t1=args.t1, samples_per_patch=spp,
                                  num_workers=workers, seed=args.seed, ignore_index=args.ignore_index,
                                  check_values=checks == "on", cache_dir=cache.name,
                                  allow_fold_overlap=True)  # only the training loader is timed

    print(f"loader-bench: {root}, folds {args.train_folds} ({n_patches} patches x {spp} crops), "
          f"batch {args.batch_size}, crop {args.crop_size}, T2 {args.t2}, T1 {args.t1}, "
          f"torch threads {torch.get_num_threads()}, {args.clock} clock  [{MEASURED_MICROBENCHMARK}]")
    print(f"{'round':>5}  {'workers':>7}  {'checks':>6}  {'setup s':>7}  {'first batch s':>13}  {'timed batches':>13}  "
          f"{'samples/s':>9}  {'median ms/batch':>15}")
    rows, kept, num_classes = [], None, None
    arms = _arms(args)
    progress = Progress(len(arms) + int(bool(args.model)), "loader-bench")
    with cache:
        for i, (rnd, workers, checks) in enumerate(arms):
            progress.start(f"{workers} worker(s), checks {checks}", steps=1 + args.warmup + args.batches)
            dm = datamodule(workers, checks)
            dm.stats = stats
            t0 = time.perf_counter()
            dm.setup("fit")
            setup_s = time.perf_counter() - t0
            r = measure_loader(dm, args.batches, args.warmup, keep=(i == 0 and args.model), progress=progress,
                               clock=CLOCKS[args.clock])
            progress.finish()
            kept, num_classes = r.pop("batches", kept), dm.num_classes
            rows.append({"round": rnd, "workers": workers, "checks": checks, "setup_s": setup_s,
                         "scanned_mb": dm.scan_cache.scanned_bytes / 1e6, **r})
            print(f"{rnd:>5}  {workers:>7}  {checks:>6}  {setup_s:>7.2f}  {r['first_batch_s']:>13.3f}  "
                  f"{args.batches:>13}  {r['samples_per_s']:>9.1f}  {r['median_batch_ms']:>15.1f}")
    summary = summarise(rows)
    if args.rounds > 1 or len(args.checks) > 1:
        _print_summary(summary)
    result = {"label": MEASURED_MICROBENCHMARK, "root": str(root), "batch_size": args.batch_size,
              "crop_size": args.crop_size, "t2": args.t2, "t1": args.t1, "loader": rows, "summary": summary,
              "model": None}
    if args.model:
        steps = args.model_steps or args.batches
        progress.start(f"model training step on {args.device}", steps=steps + 1)
        m = measure_model(kept, num_classes, args.ignore_index, args.device, steps, progress=progress)
        progress.finish()
        result["model"] = {"device": args.device, **m}
        print(f"model training step (forward + loss + backward + clip + AdamW) on {steps} of the same batches, "
              f"{args.device}: {m['samples_per_s']:.1f} samples/s, median {m['median_step_ms']:.1f} ms/step  "
              f"[{MEASURED_MICROBENCHMARK}]")
    if args.json:
        result["environment"] = environment_record(__file__, argv, torch.device(args.device))
        atomic_write_json(args.json, result, indent=1, default=str)
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
