"""Measurement helpers: ``(x, repeated y)`` series from the real code, for PMNF fits, assertions and Extra-P.

The series are ready for PMNF fitting (:mod:`cropscale.scaling.pmnf`), performance assertions
(:mod:`cropscale.scaling.assertions`) and export to Extra-P (:mod:`cropscale.scaling.extrap`).

- :func:`step_time_vs_batch`: training step time (s) vs local batch size, ``measured-microbenchmark``;
- :func:`tiled_validation_time_vs_area`: tiled inference time of one patch (s) vs its area (10 m
  pixels), ``measured-microbenchmark``;
- :func:`loader_time_vs_dates`: training-loader time per batch (s) vs Sentinel-2 dates ``T2``,
  ``measured-microbenchmark``;
- :func:`allreduce_volume_vs_world_size`: per-rank ring all-reduce send volume (MiB) of a real
  module's gradients vs world size ``N``, ``analytical-scenario``.

The real modules (:class:`cropscale.model.network.CropMappingNet`,
:class:`cropscale.model.losses.MultiTaskLoss`, :func:`cropscale.model.synthetic.synthetic_batch`,
:func:`cropscale.tiling.sliding_window_inference`,
:class:`cropscale.data.datamodule.PastisHDDataModule`) are used unless a helper is given its
stand-in argument (``net``, ``loss``, ``make_batch``, ``make_loader`` ...).

Timing protocol: every ``x`` is warmed up first; then repetitions run round-robin over the ``x``
values (repetition 1 of every ``x``, then repetition 2 ...), so a slow drift of the machine
spreads over all points instead of bending the curve. Wall-clock ``time.perf_counter``; on CUDA
the device is synchronised after every timed call. Torch intra-op threads are fixed
(``threads``, default 1) for the duration of the measurement and restored afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from cropscale.batch import model_inputs
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.env.host import torch_threads
from cropscale.errors import CropScaleError
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_MICROBENCHMARK
from cropscale.files import SAMPLE_DATA, find_resource
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.synthetic import synthetic_batch
from cropscale.scaling.allreduce import MIB, gradient_payload, ring_allreduce_volume
from cropscale.scaling.amdahl import karp_flatt
from cropscale.scaling.series import ScalingSeries
from cropscale.tiling import sliding_window_inference


def _sync(device) -> None:
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _check_sizes(values: Iterable, name: str, minimum: int = 1) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or int(v) != v or int(v) < minimum:
            raise CropScaleError(f"{name} must be integers >= {minimum}, got {v!r}")
        out.append(int(v))
    if len(out) < 1:
        raise CropScaleError(f"{name} must not be empty")
    return out


def _check_reps(repetitions: int, warmup: int) -> None:
    if int(repetitions) < 1:
        raise CropScaleError(f"repetitions must be >= 1, got {repetitions}")
    if int(warmup) < 0:
        raise CropScaleError(f"warmup must be >= 0, got {warmup}")


def time_round_robin(
    calls: Sequence[Callable[[], object]], repetitions: int, warmup: int = 1, device="cpu"
) -> list[list[float]]:
    """Time each zero-argument call ``repetitions`` times (s), round-robin, after ``warmup`` calls each.

    Returns:
        ``times[k]`` = the repetitions of ``calls[k]``, in seconds.
    """
    _check_reps(repetitions, warmup)
    for call in calls:
        for _ in range(warmup):
            call()
        _sync(device)
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repetitions):
        for k, call in enumerate(calls):
            _sync(device)
            t0 = time.perf_counter()
            call()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


# --------------------------------------------------------------------------- step time vs batch


def _default_net(seed: int):
    """The default ``CropMappingNet()``, initialised under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return CropMappingNet()


def _synthetic_batches(t2: int, t1: int, crop_size: int, num_classes: int, device: str,
                       seed: int) -> Callable[..., dict]:
    """``(B, size=crop_size) -> synthetic_batch(B, t2, t1, size, size)`` on ``device``."""

    def make_batch(b: int, size: int = crop_size) -> dict:
        return synthetic_batch(b, t2, t1, size, size, num_classes=num_classes, device=device, seed=seed)

    return make_batch


def _train_steps(net, loss, batches: Sequence[dict], lr: float, clip_norm: float) -> list[Callable[[], None]]:
    """Build one zero-argument training step per batch, all sharing one ``AdamW(lr)`` over the trainable parameters.

    Each step runs zero_grad, forward, loss, backward, ``clip_grad_norm_(clip_norm)`` and the optimizer step.
    """
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)

    def step_for(batch: dict) -> Callable[[], None]:
        inputs = model_inputs(batch)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            total, _ = loss(net(**inputs), batch)
            total.backward()
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
            opt.step()

        return step

    return [step_for(batch) for batch in batches]


def step_time_vs_batch(
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    repetitions: int = 5,
    warmup: int = 2,
    crop_size: int = 32,
    t2: int = 16,
    t1: int = 4,
    net=None,
    loss=None,
    make_batch: Callable[[int], dict] | None = None,
    device: str = "cpu",
    threads: int | None = 1,
    lr: float = 1e-3,
    clip_norm: float = 1.0,
    seed: int = 0,
) -> ScalingSeries:
    """Training step time (forward, loss, backward, gradient clipping, AdamW) vs batch size.

    The step is the study's compute-only step: inputs already on ``device``, ``MultiTaskLoss``,
    ``clip_grad_norm_(…, clip_norm)``, ``AdamW(lr)``; one optimizer for all batch sizes.

    Args:
        batch_sizes: local batch sizes ``B`` (the series' ``x``).
        repetitions: timed steps per batch size.
        warmup: untimed steps per batch size, run before the timed ones.
        crop_size: side ``crop`` of the synthetic batch ``[B, t2, 10, crop, crop]`` (+ S1
            ``[B, t1, 2, crop, crop]``, ``hr [B, 3, 10 crop, 10 crop]``); must be a multiple of 4.
        t2: Sentinel-2 dates of the synthetic batch.
        t1: Sentinel-1 dates per orbit of the synthetic batch.
        net: stand-in for ``CropMappingNet()``; ``net(**inputs)`` returns a dict.
        loss: stand-in for ``MultiTaskLoss()``; ``loss(outputs, batch) -> (total, terms)``.
        make_batch: ``B -> batch dict``; default ``synthetic_batch(B, t2, t1, crop, crop)``.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads during the measurement (None = leave as is).
        lr: learning rate of the ``AdamW`` optimizer.
        clip_norm: maximum gradient norm passed to ``clip_grad_norm_``.
        seed: seed of the default network's initialisation and of the synthetic batches.

    Returns:
        :class:`ScalingSeries` ``step_time_s`` vs ``batch_size``, ``measured-microbenchmark``.
    """
    sizes = _check_sizes(batch_sizes, "batch_sizes")
    if net is None:
        net = _default_net(seed)
    if loss is None:
        loss = MultiTaskLoss()
    if make_batch is None:
        make_batch = _synthetic_batches(t2, t1, crop_size, int(getattr(net, "num_classes", 10)), device, seed)
    net = net.to(device).train()
    batches = {b: make_batch(b) for b in sizes}
    steps = _train_steps(net, loss, [batches[b] for b in sizes], lr, clip_norm)
    with torch_threads(threads):
        times = time_round_robin(steps, repetitions, warmup, device)
    return ScalingSeries(
        parameter="batch_size",
        metric="step_time_s",
        unit="s",
        x=[float(b) for b in sizes],
        y=times,
        evidence=MEASURED_MICROBENCHMARK,
        callpath="train_step",
        settings={"crop_size": crop_size, "t2": t2, "t1": t1, "device": str(device), "threads": threads,
                  "net": type(net).__name__, "repetitions": repetitions, "warmup": warmup},
    )


# --------------------------------------------------------------------------- tiled validation vs area


def _inference_run(infer: Callable, net, inputs: dict, kwargs: dict) -> Callable[[], None]:
    """A zero-argument ``infer(net, inputs, **kwargs)`` under ``torch.no_grad``."""

    def run() -> None:
        with torch.no_grad():
            infer(net, inputs, **kwargs)

    return run


def tiled_validation_time_vs_area(
    patch_sizes: Sequence[int] = (32, 48, 64, 80, 96, 128),
    *,
    window: int = 32,
    stride: int | None = None,
    repetitions: int = 5,
    warmup: int = 1,
    t2: int = 16,
    t1: int = 4,
    net=None,
    make_inputs: Callable[[int], dict] | None = None,
    infer: Callable | None = None,
    tile_batch_size: int = 16,
    device: str = "cpu",
    threads: int | None = 1,
    seed: int = 0,
) -> ScalingSeries:
    """Overlap-weighted tiled inference time of one square patch vs its area.

    Args:
        patch_sizes: patch sides ``S`` in 10 m pixels; ``x`` is the area ``S^2`` (pixels).
        window: tile size of :func:`cropscale.tiling.sliding_window_inference`.
        stride: tile stride (default ``window // 2``).
        repetitions: timed inferences per patch size.
        warmup: untimed inferences per patch size, run before the timed ones.
        t2: Sentinel-2 dates of the synthetic patch.
        t1: Sentinel-1 dates per orbit of the synthetic patch.
        net: stand-in for ``CropMappingNet()`` (put in eval mode; run under ``torch.no_grad``).
        make_inputs: ``S -> model inputs of one patch``; default from ``synthetic_batch(1, t2, t1, S, S)``.
        infer: stand-in for ``sliding_window_inference(net, inputs, window=, stride=, ...)``.
        tile_batch_size: tiles per network call.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads during the measurement (None = leave as is).
        seed: seed of the default network's initialisation and of the synthetic patches.

    Returns:
        :class:`ScalingSeries` ``tiled_validation_time_s`` vs ``area_px``, ``measured-microbenchmark``.
    """
    sizes = _check_sizes(patch_sizes, "patch_sizes")
    if net is None:
        net = _default_net(seed)
    if make_inputs is None:
        make_batch = _synthetic_batches(t2, t1, window, int(getattr(net, "num_classes", 10)), device, seed)

        def make_inputs(s: int) -> dict:
            return model_inputs(make_batch(1, size=s))

    hr_scale = int(getattr(net, "hr_scale", 10))
    net = net.to(device).eval()
    patches = {s: make_inputs(s) for s in sizes}
    infer = infer or sliding_window_inference
    kwargs = {"window": window, "stride": stride, "hr_scale": hr_scale, "tile_batch_size": tile_batch_size}
    runs = [_inference_run(infer, net, patches[s], kwargs) for s in sizes]
    with torch_threads(threads):
        times = time_round_robin(runs, repetitions, warmup, device)
    return ScalingSeries(
        parameter="area_px",
        metric="tiled_validation_time_s",
        unit="s",
        x=[float(s * s) for s in sizes],
        y=times,
        evidence=MEASURED_MICROBENCHMARK,
        callpath="tiled_validation",
        settings={"patch_sizes": sizes, "window": window, "stride": stride if stride else max(window // 2, 1),
                  "t2": t2, "t1": t1, "device": str(device), "threads": threads, "net": type(net).__name__,
                  "tile_batch_size": tile_batch_size},
    )


# --------------------------------------------------------------------------- loader vs dates


def _default_data_root() -> Path:
    return find_resource(SAMPLE_DATA, "loader_time_vs_dates: the bundled sample", cwd=False,
                         holding="metadata.geojson", hint="pass root=...")


def _datamodule_loaders(data_root: Path, train_folds: Sequence[int], batch_size: int, crop_size: int,
                        samples_per_patch: int) -> Callable[[int], Iterable]:
    """Return ``T2 -> the training DataLoader`` of a :class:`PastisHDDataModule` (``num_workers=0``, seed 0).

    The normalisation statistics of the first data module are reused by the others.
    """
    shared_stats = {}

    def make_loader(t: int) -> Iterable:
        dm = PastisHDDataModule(
            root=str(data_root), train_folds=list(train_folds), val_folds=list(train_folds),
            batch_size=batch_size, crop_size=crop_size, t2=t, samples_per_patch=samples_per_patch,
            num_workers=0, seed=0, allow_fold_overlap=True,  # only the training loader is timed
        )
        if "stats" in shared_stats:
            dm.stats = shared_stats["stats"]
        dm.setup("fit")
        shared_stats.setdefault("stats", dm.stats)
        return dm.train_dataloader()

    return make_loader


def _loader_pass(loader: Iterable, t: int, batches: int) -> Callable[[], None]:
    """Return a zero-argument pass over the first ``batches`` batches of a fresh iterator of ``loader``.

    The pass raises :class:`CropScaleError` when called on a loader with fewer batches.
    """

    def run() -> None:
        it = iter(loader)
        for k in range(batches):
            try:
                next(it)
            except StopIteration:
                raise CropScaleError(
                    f"loader_time_vs_dates: the loader for t2={t} has only {k} batches, {batches} needed"
                ) from None

    return run


def loader_time_vs_dates(
    dates: Sequence[int] = (4, 8, 16, 24, 32, 48),
    *,
    root: str | Path | None = None,
    batches: int = 4,
    repetitions: int = 3,
    warmup: int = 1,
    batch_size: int = 2,
    crop_size: int = 32,
    train_folds: Sequence[int] = (1,),
    make_loader: Callable[[int], Iterable] | None = None,
    threads: int | None = 1,
) -> ScalingSeries:
    """Training-loader time per batch vs the number of sampled Sentinel-2 dates ``T2``.

    Each repetition iterates ``batches`` batches of a fresh iterator over the training DataLoader
    of :class:`cropscale.data.datamodule.PastisHDDataModule` (``num_workers=0``: reads, temporal
    sampling, crops, augmentation and collate run in this process) with ``t2 = T2``; ``y`` is the
    elapsed time divided by ``batches``. Normalisation statistics are computed once, untimed.

    Args:
        dates: ``T2`` values (the series' ``x``).
        root: dataset root in the PASTIS-HD layout (default: the bundled worldcereal-flanders sample).
        batches: timed batches per repetition.
        repetitions: timed passes per ``T2``.
        warmup: untimed passes per ``T2``, run before the timed ones.
        batch_size: batch size of the data module.
        crop_size: crop side of the data module (10 m pixels).
        train_folds: training folds of the data module.
        make_loader: stand-in ``T2 -> iterable of batches`` (must yield at least ``batches``).
        threads: torch intra-op threads during the measurement (None = leave as is).

    Returns:
        :class:`ScalingSeries` ``loader_time_per_batch_s`` vs ``t2``, ``measured-microbenchmark``.

    Raises:
        CropScaleError: a loader with fewer than ``batches`` batches, or a missing dataset root.
    """
    ts = _check_sizes(dates, "dates")
    if int(batches) < 1:
        raise CropScaleError(f"batches must be >= 1, got {batches}")
    settings = {"batches": batches, "batch_size": batch_size, "crop_size": crop_size, "threads": threads}
    if make_loader is None:
        data_root = Path(root) if root is not None else _default_data_root()
        settings["root"] = str(data_root)
        make_loader = _datamodule_loaders(data_root, train_folds, batch_size, crop_size, batches * batch_size)
    loaders = {t: make_loader(t) for t in ts}
    passes = [_loader_pass(loaders[t], t, batches) for t in ts]
    with torch_threads(threads):
        times = time_round_robin(passes, repetitions, warmup)
    per_batch = [[v / batches for v in row] for row in times]
    return ScalingSeries(
        parameter="t2",
        metric="loader_time_per_batch_s",
        unit="s",
        x=[float(t) for t in ts],
        y=per_batch,
        evidence=MEASURED_MICROBENCHMARK,
        callpath="train_dataloader",
        settings=settings,
    )


# --------------------------------------------------------------------------- all-reduce volume


def allreduce_volume_vs_world_size(
    world_sizes: Sequence[int] = (2, 4, 8, 16, 32, 64),
    *,
    module=None,
    grad_dtype=None,
) -> ScalingSeries:
    """Per-rank ring all-reduce send volume of a real model's gradients vs world size.

    ``V(N) = 2 (N - 1) M / N`` with ``M`` from :func:`cropscale.scaling.allreduce.gradient_payload`
    (trainable parameters x gradient element size) of ``module`` (default ``CropMappingNet()``).
    One value per ``N`` (the formula is deterministic).

    Returns:
        :class:`ScalingSeries` ``allreduce_send_mib`` vs ``world_size``, ``analytical-scenario``.
    """
    ns = _check_sizes(world_sizes, "world_sizes")
    if module is None:
        module = CropMappingNet()
    payload = gradient_payload(module, grad_dtype=grad_dtype)
    m = payload.payload_bytes
    ys = [[ring_allreduce_volume(m, n) / MIB] for n in ns]
    return ScalingSeries(
        parameter="world_size",
        metric="allreduce_send_mib",
        unit="MiB",
        x=[float(n) for n in ns],
        y=ys,
        evidence=ANALYTICAL_SCENARIO,
        callpath="ddp_gradient_allreduce",
        settings={"module": payload.source, "num_params": payload.num_params,
                  "grad_dtypes": list(payload.grad_dtypes), "payload_mib": m / MIB},
    )


def speedup_and_karp_flatt(t1_s: float, tn_s: float, n: int) -> dict[str, float]:
    """Speed-up ``S = T_1 / T_N`` (``speedup_vs_1_device``), efficiency ``S / N``, the Karp-Flatt serial fraction.

    Args:
        t1_s: time of the work on 1 device (s, > 0).
        tn_s: time of the same work on ``n`` devices (s, > 0).
        n: number of devices (> 1).
    """
    for name, v in (("t1_s", t1_s), ("tn_s", tn_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise CropScaleError(f"{name} must be a positive time in seconds, got {v!r}")
    s = t1_s / tn_s
    return {"speedup_vs_1_device": s, "efficiency": s / n, "karp_flatt": karp_flatt(s, n)}
