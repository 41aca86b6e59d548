"""Count-based scaling series of the real code: exact counts instead of wall time.

Performance assertions on counts hold on a busy machine (:func:`cropscale.scaling.assertions.check_scaling`).

- :func:`flops_vs_batch`: FLOPs of one training step (forward, loss, backward) of
  :class:`~cropscale.model.network.CropMappingNet` vs the batch size, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per multiply-add; matrix products,
  convolutions, attention), and the same per sample;
- :func:`activation_bytes_vs_batch`: bytes of the tensors the forward pass and the loss save for
  backward (``torch.autograd.graph.saved_tensors_hooks``, each storage once) vs the batch size;
- :func:`allreduce_bytes_vs_world_size`: bytes rank 0 sends in the ring all-reduces of one step,
  for the real model's DDP buckets, vs the world size (the ring algorithm's chunks counted);
- :func:`tile_count_vs_area`: tiles :func:`cropscale.tiling.sliding_window_inference` runs through
  the network for one square patch, vs the patch area (a counting stand-in network);
- :func:`loader_bytes_vs_dates`: bytes the training dataset of
  :class:`~cropscale.data.datamodule.PastisHDDataModule` takes from its memory-mapped arrays per
  batch, vs the Sentinel-2 dates ``t2``.

Every series has one value per ``x`` (a count does not vary between repetitions) and the evidence
label ``count``, except the all-reduce bytes: ``analytical-scenario`` (what the ring algorithm
sends, not traffic observed on a network).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from cropscale.batch import model_inputs
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.env.host import torch_threads
from cropscale.errors import CropScaleError
from cropscale.evidence import ANALYTICAL_SCENARIO, COUNT
from cropscale.files import SAMPLE_DATA, find_resource
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.synthetic import synthetic_batch
from cropscale.scaling.allreduce import gradient_payload
from cropscale.scaling.series import ScalingSeries
from cropscale.tiling import TilingStats, sliding_window_inference

__all__ = [
    "FIGURES", "READ_METHODS", "HookCostCounter", "activation_bytes_vs_batch", "allreduce_bytes_vs_world_size",
    "flops_vs_batch", "loader_bytes_vs_dates",
    "step_counts", "tile_count_vs_area",
]


# ----------------------------------------------------------------------------- helpers


def _sizes(values: Sequence[int], name: str) -> list[int]:
    """``values`` as integers >= 1 (one clear error naming ``name`` otherwise)."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer)) or int(v) != v or int(v) < 1:
            raise CropScaleError(f"{name} must be integers >= 1, got {v!r}")
        out.append(int(v))
    if not out:
        raise CropScaleError(f"{name} must not be empty")
    return out


def _default_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return CropMappingNet()


def _bundled_root() -> Path:
    return find_resource(SAMPLE_DATA, "loader_bytes_vs_dates: the bundled sample", cwd=False,
                         holding="metadata.geojson", hint="pass root=...")


# ----------------------------------------------------------------------------- FLOPs and activations


def step_counts(net: torch.nn.Module, batch_size: int, *, t2: int = 4, t1: int = 2, crop_size: int = 8) -> dict:
    """FLOPs and saved-activation bytes of one training step at ``batch_size``.

    Runs ``net`` and :class:`~cropscale.model.losses.MultiTaskLoss` on
    :func:`cropscale.model.synthetic.synthetic_batch` (both Sentinel-1 orbits) on the device of
    its parameters, then the backward of the loss with ``torch.autograd.grad`` (``.grad`` is left
    untouched). Attention runs with the math SDPA backend so that its products are counted.

    Returns:
        ``{"flops": int (forward + backward), "forward_flops": int, "saved_bytes": int}``; saved
        bytes count every storage packed for backward once (parameters saved by layers included).
    """
    param = next(net.parameters())
    batch = synthetic_batch(batch_size, t2=t2, t1=t1, height=crop_size, width=crop_size,
                            num_classes=int(getattr(net, "num_classes", 10)),
                            hr_scale=int(getattr(net, "hr_scale", 10)), device=param.device)
    batch = {k: (v.to(param.dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    params = [p for p in net.parameters() if p.requires_grad]
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = MultiTaskLoss()(net(**model_inputs(batch)), batch)
        with FlopCounterMode(display=False) as bwd:
            torch.autograd.grad(loss, params, allow_unused=True)
    forward = int(fwd.get_total_flops())
    return {"flops": forward + int(bwd.get_total_flops()), "forward_flops": forward,
            "saved_bytes": int(sum(storages.values()))}


def _per_batch(batch_sizes, net, t2, t1, crop_size, threads) -> tuple[list[int], list[dict], torch.nn.Module]:
    bs = _sizes(batch_sizes, "batch_sizes")
    net = net if net is not None else _default_net()
    with torch_threads(threads):
        counts = [step_counts(net, b, t2=t2, t1=t1, crop_size=crop_size) for b in bs]
    return bs, counts, net


def flops_vs_batch(
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    net: torch.nn.Module | None = None,
    t2: int = 4,
    t1: int = 2,
    crop_size: int = 8,
    per_sample: bool = False,
    threads: int | None = 1,
) -> ScalingSeries:
    """FLOPs of one training step (or per sample, ``per_sample=True``) vs the batch size.

    Args:
        batch_sizes: the ``x`` values (>= 1).
        net: the network (default ``CropMappingNet()`` seeded with 0).
        t2: Sentinel-2 dates of the synthetic batch.
        t1: dates per Sentinel-1 orbit of the synthetic batch.
        crop_size: 10 m crop side of the synthetic batch (pixels).
        per_sample: divide each step's FLOPs by the batch size.
        threads: torch intra-op threads while counting.

    Returns:
        :class:`ScalingSeries` ``train_step_flops`` (or ``train_flops_per_sample``) vs
        ``batch_size``, evidence ``count``.

    Raises:
        CropScaleError: a batch size < 1.
    """
    bs, counts, net = _per_batch(batch_sizes, net, t2, t1, crop_size, threads)
    metric = "train_flops_per_sample" if per_sample else "train_step_flops"
    ys = [[c["flops"] / b if per_sample else float(c["flops"])] for b, c in zip(bs, counts, strict=True)]
    return ScalingSeries("batch_size", metric, "FLOP", [float(b) for b in bs], ys, COUNT, "train_step",
                         {"net": type(net).__name__, "t2": t2, "t1": t1, "crop_size": crop_size})


def activation_bytes_vs_batch(
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    net: torch.nn.Module | None = None,
    t2: int = 4,
    t1: int = 2,
    crop_size: int = 8,
    threads: int | None = 1,
) -> ScalingSeries:
    """Bytes saved for backward by one training step's forward and loss vs the batch size.

    Returns:
        :class:`ScalingSeries` ``saved_activation_bytes`` vs ``batch_size``, evidence ``count``.

    Raises:
        CropScaleError: a batch size < 1.
    """
    bs, counts, net = _per_batch(batch_sizes, net, t2, t1, crop_size, threads)
    return ScalingSeries("batch_size", "saved_activation_bytes", "B", [float(b) for b in bs],
                         [[float(c["saved_bytes"])] for c in counts], COUNT, "train_step",
                         {"net": type(net).__name__, "t2": t2, "t1": t1, "crop_size": crop_size})


# ----------------------------------------------------------------------------- all-reduce


def ring_send_bytes(elements: int, element_size: int, world_size: int, rank: int = 0) -> int:
    """Bytes ``rank`` sends in one ring all-reduce of ``elements`` values over ``world_size`` ranks.

    The buffer is cut into ``world_size`` chunks whose sizes differ by at most one element (the
    first ``elements mod N`` chunks one larger). In reduce-scatter step ``s = 0 .. N-2`` rank ``r``
    sends chunk ``(r - s) mod N``, in all-gather step ``s`` chunk ``(r + 1 - s) mod N``: every chunk
    but ``(r + 1) mod N``, then every chunk but ``(r + 2) mod N``.

    Raises:
        CropScaleError: a negative size, ``world_size < 1`` or a rank outside ``0 .. N-1``.
    """
    if elements < 0 or element_size < 0 or world_size < 1 or not (0 <= rank < world_size):
        raise CropScaleError(f"ring_send_bytes: bad sizes elements={elements}, element_size={element_size}, "
                             f"world_size={world_size}, rank={rank}")
    if world_size == 1:
        return 0
    base, extra = divmod(elements, world_size)
    chunk = [base + (1 if k < extra else 0) for k in range(world_size)]
    total = sum(chunk)
    sent = (total - chunk[(rank + 1) % world_size]) + (total - chunk[(rank + 2) % world_size])
    return sent * element_size


def allreduce_bytes_vs_world_size(
    world_sizes: Sequence[int] = (2, 4, 8, 16, 32, 64),
    *,
    module: torch.nn.Module | None = None,
) -> ScalingSeries:
    """Bytes rank 0 sends in one step's ring all-reduces of the DDP buckets vs the world size.

    The buckets are those of :meth:`cropscale.scaling.allreduce.GradientPayload.buckets` for
    ``module`` (default ``CropMappingNet()``); each bucket is one ring all-reduce
    (:func:`ring_send_bytes`).

    Returns:
        :class:`ScalingSeries` ``allreduce_send_bytes`` vs ``world_size``, ``analytical-scenario``.

    Raises:
        CropScaleError: a world size < 1, a module without trainable parameters.
    """
    ns = _sizes(world_sizes, "world_sizes")
    module = module if module is not None else _default_net()
    payload = gradient_payload(module)
    buckets = payload.buckets()
    sizes = {dt: torch.empty(0, dtype=getattr(torch, dt)).element_size() for dt in payload.grad_dtypes}
    ys = [[float(sum(ring_send_bytes(b.nbytes // sizes[b.dtype], sizes[b.dtype], n) for b in buckets))] for n in ns]
    return ScalingSeries("world_size", "allreduce_send_bytes", "B", [float(n) for n in ns], ys, ANALYTICAL_SCENARIO,
                         "ddp_gradient_allreduce",
                         {"module": payload.source, "buckets": len(buckets), "payload_bytes": payload.payload_bytes})


# ----------------------------------------------------------------------------- tiling


class _TileCounter(torch.nn.Module):
    """Stand-in network returning zeros of the right shapes and counting the tiles it receives."""

    def __init__(self, num_classes: int, hr_scale: int) -> None:
        super().__init__()
        self.num_classes, self.hr_scale, self.tiles = num_classes, hr_scale, 0

    def forward(self, s2: torch.Tensor, **_) -> dict[str, torch.Tensor]:
        n, h, w = s2.shape[0], s2.shape[-2], s2.shape[-1]
        self.tiles += n
        return {"semantic": s2.new_zeros(n, self.num_classes, h, w), "parcel": s2.new_zeros(n, 3, h, w),
                "hr": s2.new_zeros(n, 3, self.hr_scale * h, self.hr_scale * w)}


def tile_count_vs_area(
    sides: Sequence[int] = (16, 32, 64, 128, 256),
    *,
    window: int = 8,
    stride: int | None = None,
    padding: str = "reflect",
) -> ScalingSeries:
    """Tiles the tiled validation runs through the network for one square patch vs its area.

    Each patch is a synthetic batch of one ``side x side`` patch (2 Sentinel-2 and 2 Sentinel-1
    dates) given to :func:`cropscale.tiling.sliding_window_inference` with a stand-in network that
    counts the tiles it is called on (high grid at scale 1, to keep the blending cheap); the count
    is checked against :class:`cropscale.tiling.TilingStats`.

    Returns:
        :class:`ScalingSeries` ``tiles`` vs ``area_px`` (10 m pixels), evidence ``count``.

    Raises:
        CropScaleError: a side < 1, or a count that disagrees with the tiler's own statistics.
    """
    ss = _sizes(sides, "sides")
    ys = []
    for s in ss:
        batch = synthetic_batch(1, t2=2, t1=2, height=s, width=s, num_classes=4, hr_scale=1)
        net, stats = _TileCounter(4, 1), TilingStats()
        with torch.no_grad():
            sliding_window_inference(net, model_inputs(batch), window=window, stride=stride, hr_scale=1,
                                     tile_batch_size=64, padding=padding, stats=stats)
        if net.tiles != stats.num_tiles:
            raise CropScaleError(f"tile_count_vs_area: the network saw {net.tiles} tiles, the tiler reports "
                                 f"{stats.num_tiles} (side {s})")
        ys.append([float(net.tiles)])
    return ScalingSeries("area_px", "tiles", "tiles", [float(s * s) for s in ss], ys, COUNT, "tiled_validation",
                         {"window": window, "stride": stride if stride is not None else window // 2,
                          "padding": padding, "sides": list(ss)})


# ----------------------------------------------------------------------------- loader bytes


class _CountingArray:
    """Wraps a memory-mapped array: every slice taken (or the whole array) adds its bytes to ``counter``."""

    def __init__(self, array, counter: list[int]) -> None:
        self._array, self._counter = array, counter

    def __getitem__(self, index):
        out = self._array[index]
        self._counter[0] += int(getattr(out, "nbytes", 0))
        return out

    def __array__(self, dtype=None, copy=None):
        self._counter[0] += int(self._array.nbytes)
        return np.asarray(self._array, dtype=dtype)

    def __getattr__(self, name):
        return getattr(self._array, name)


def _count_reads(dataset, counter: list[int]) -> None:
    """Route the dataset's array accessor through :class:`_CountingArray` (this instance only)."""
    accessor = dataset._array

    def counted(path: Path, patch_id: int, what: str):
        return _CountingArray(accessor(path, patch_id, what), counter)

    dataset._array = counted


def loader_bytes_vs_dates(
    dates: Sequence[int] = (4, 8, 16, 32, 64),
    *,
    root: str | Path | None = None,
    batches: int = 2,
    batch_size: int = 2,
    crop_size: int = 16,
    train_folds: Sequence[int] = (1,),
) -> ScalingSeries:
    """Bytes the training loader takes from its memory-mapped arrays per batch vs the S2 dates ``t2``.

    For each ``t2`` a :class:`~cropscale.data.datamodule.PastisHDDataModule` (``num_workers=0``,
    seed 0) is set up on ``root`` (default: the bundled worldcereal-flanders sample) and
    ``batches`` batches are drawn from its training loader while every slice its dataset takes from
    the ``.npy`` arrays (Sentinel-2 and its mask, Sentinel-1, labels, instances) is counted; the
    high-resolution image (read through rasterio, independent of ``t2``) is not counted.

    Returns:
        :class:`ScalingSeries` ``loader_bytes_per_batch`` vs ``t2``, evidence ``count``.

    Raises:
        CropScaleError: a ``t2`` < 1, a missing dataset root, a loader with fewer than ``batches``.
    """
    ts = _sizes(dates, "dates")
    data_root = Path(root) if root is not None else _bundled_root()
    stats = None
    ys = []
    for t in ts:
        dm = PastisHDDataModule(root=str(data_root), train_folds=list(train_folds), val_folds=list(train_folds),
                                batch_size=batch_size, crop_size=crop_size, t2=t,
                                samples_per_patch=batches * batch_size, num_workers=0, seed=0,
                                allow_fold_overlap=True)  # only the training loader is counted
        dm.stats = stats
        dm.setup("fit")
        stats = dm.stats
        counter = [0]
        _count_reads(dm.train_dataset, counter)
        it = iter(dm.train_dataloader())
        for k in range(batches):
            if next(it, None) is None:
                raise CropScaleError(f"loader_bytes_vs_dates: the loader for t2={t} has only {k} batches")
        ys.append([counter[0] / batches])
    return ScalingSeries("t2", "loader_bytes_per_batch", "B", [float(t) for t in ts], ys, COUNT, "train_dataloader",
                         {"root": str(data_root), "batch_size": batch_size, "crop_size": crop_size,
                          "batches": batches})


# ----------------------------------------------------------------------------- callback hook costs


READ_METHODS: tuple[str, ...] = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
"""``torch.Tensor`` methods counted as device-to-host reads (each blocks on a GPU until the value is there)."""

FIGURES: tuple[str, ...] = ("python_calls", "c_calls", "torch_ops", "reads")


_DISPATCH_RULES = str(Path(torch._library.__file__).parent)
"""``torch._library``: with a Python dispatch mode active, each op first looks up dispatch rules there (Python
calls that exist only because the counter is on; left out)."""


class HookCostCounter(TorchDispatchMode):
    """Per owner: Python calls, C calls, torch ops dispatched and device-to-host reads, on this thread.

    Python and C calls are the ``call`` and ``c_call`` events of :func:`sys.setprofile`; torch ops are the
    ATen ops reaching ``__torch_dispatch__`` (this mode); reads are calls of the :data:`READ_METHODS` of
    ``torch.Tensor`` (wrapped while counting; each counts as one C call too, as unwrapped it would be).

    Attribution: an event belongs to the owner whose frame is *outermost*: a call from a frame whose
    ``self`` is one of ``owners`` (keyed by ``id``) opens that owner's region, and everything until that
    frame returns is the owner's. Owners listed in ``transparent`` (a
    :class:`~cropscale.callbacks.CallbackGroup`) keep only their own frames: a member called from them opens
    the member's region. Frames are looked at only when their code comes from one of ``files``. The
    counter's own frames (dispatch, read wrappers) and the dispatch-rule lookups a Python mode adds to every op
    are not counted. ``totals`` maps owner -> the four
    :data:`FIGURES` so far.
    """

    def __init__(self, owners: dict[int, str], files: set[str], transparent: set[int] | None = None) -> None:
        super().__init__()
        self.owners, self.files, self.transparent = owners, files, set(transparent or ())
        self.totals: dict[str, list[int]] = {name: [0, 0, 0, 0] for name in owners.values()}
        self._stack: list[tuple[Any, str, bool]] = []  # (frame, owner, transparent) of the open regions
        self._skip: Any = None  # the counter's own frame being run
        self._own_codes: set[Any] = {HookCostCounter.__torch_dispatch__.__code__}
        self._saved: dict[str, Any] = {}

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if self._skip is not None:
            if event == "return" and frame is self._skip:
                self._skip = None
            return
        if event == "call":
            code = frame.f_code
            if code in self._own_codes or code.co_filename.startswith(_DISPATCH_RULES):
                self._skip = frame  # the counter's code, or torch's rule lookup that a Python mode brings
                return
            stack = self._stack
            if (not stack or stack[-1][2]) and code.co_filename in self.files:
                obj = frame.f_locals.get("self")
                name = self.owners.get(id(obj)) if obj is not None else None
                if name is not None and not (stack and stack[-1][1] == name):
                    stack.append((frame, name, id(obj) in self.transparent))
            if stack:
                self.totals[stack[-1][1]][0] += 1
        elif event == "return":
            if self._stack and frame is self._stack[-1][0]:
                self._stack.pop()
        elif event == "c_call" and self._stack:
            self.totals[self._stack[-1][1]][1] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self._stack:
            self.totals[self._stack[-1][1]][2] += 1
        return func(*args, **(kwargs or {}))

    def _wrap_read(self, name: str) -> Any:
        original = getattr(torch.Tensor, name)
        counter = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            stack = counter._stack
            if stack:
                counter.totals[stack[-1][1]][1] += 1
                counter.totals[stack[-1][1]][3] += 1
            return original(tensor, *args, **kwargs)

        self._own_codes.add(read.__code__)
        return original, read

    def __enter__(self) -> HookCostCounter:
        for name in READ_METHODS:
            self._saved[name], wrapper = self._wrap_read(name)
            setattr(torch.Tensor, name, wrapper)
        super().__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved = {}

    def snapshot(self) -> dict[str, tuple[int, ...]]:
        """The totals so far, owner -> (python_calls, c_calls, torch_ops, reads)."""
        return {name: tuple(v) for name, v in self.totals.items()}
