"""Overlap-weighted sliding-window inference over whole patches (validation and test).

The network is trained on ``window x window`` crops (32 x 32 at 10 m in the study) and validated on
whole patches (PASTIS: 128 x 128; the bundled Flanders sample: 64 x 32). :func:`sliding_window_inference`
cuts every patch of a batch into overlapping tiles, runs the network on batches of tiles, and blends
the tile outputs back into patch-sized maps with a smooth window (Hann by default), on the 10 m grid
and on the ``hr_scale`` times finer high grid alike. Nothing is normalised per tile: the inputs are
the batch's already-normalised tensors, cut and padded, never re-scaled.

Plan, then run
    :func:`plan_tiles` decides everything as data before the network runs (:class:`TilePlan`: the
    :class:`Tile` records with their patch row and corner, the padding, the grouping of tiles into
    network calls, the window weights and their per-pixel sums, and the coverage check);
    :func:`sliding_window_inference` pads the inputs once, runs the plan's batches in order and
    blends each output into a padded canvas.

Which inputs are tiled
    Every tensor with ``ndim >= 3`` whose last two dims equal the spatial size ``(H, W)`` of
    ``inputs["s2"]`` (``s2``, ``s2_mask [B,T,H,W]``, ``s1a``, ``s1d`` ...) is cut into tiles. Every
    other tensor (``s2_doy [B,T]``, ``s1a_mask [B,T]``, ...) is repeated for each tile of its patch
    (indexed by the patch's row ``b``). ``None`` values (an absent orbit) are passed through. Every
    tensor must have the batch size ``B`` as its first dim.

Border handling
    With a padding mode (``"reflect"``, default; ``"replicate"``; ``"zeros"``) the patch is padded so
    that the tile grid ``0, stride, 2 stride, ...`` ends exactly on the padded border (the extra
    pixels are split evenly before and after), and the padded band is cropped off the result. Reflect
    mirrors the patch without repeating the edge pixel (numpy's ``"reflect"``) and also works when the
    patch is smaller than the window; zero padding marks padded pixels as not observed (masks False).
    With ``padding="shift"`` nothing is padded: the last window of each row/column is shifted back so
    that it ends on the patch border (needs ``H, W >= window``).

Blending
    The tile weight is the outer product of two 1-D windows. ``"hann"``: ``w[i] = f + (1 - f)
    sin^2(pi (i + 0.5) / L)`` with ``f = blend_floor``, ``L`` the window length: a Hann window sampled
    at pixel centres, positive at the tile edge, so edge pixels (the ones whose receptive field was
    zero-padded by the network) count little, and at ``stride = window / 2`` the unfloored weights of
    overlapping tiles sum to exactly 1 (sin^2 + cos^2). ``"uniform"``: all ones (plain averaging).
    The high-grid window is the same function sampled at ``hr_scale * window`` points, i.e. the 10 m
    window scaled x ``hr_scale``. Per pixel the weights are normalised to sum to 1 over the tiles
    covering it; a pixel covered by no tile raises :class:`~cropscale.CropScaleError` (checked before
    the network runs).

Logits, not probabilities
    The raw network outputs are blended: semantic and parcel *logits*, and the high-grid RGB (already
    in [0, 1], a convex combination stays in [0, 1]). Reasons: (1) this is the study's protocol
    (overlap-weighted tiled inference with logit blending); (2) blending is then linear in
    the network output, so the stitched logits are exactly what the losses and metrics of the training
    step consume (cross-entropy on logits, no log of an averaged probability); (3) a weighted mean of
    logits is a weighted geometric mean of the class probabilities (log-linear pooling), which keeps a
    confident tile from being diluted by a tile that sees the pixel at its zero-padded edge only as
    much as the window weight says. Averaged probabilities would be a linear pool instead; the two
    argmaxes differ only where tiles disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from cropscale.errors import CropScaleError

PADDING_MODES: tuple[str, ...] = ("reflect", "replicate", "zeros", "shift")
BLEND_WINDOWS: tuple[str, ...] = ("hann", "uniform")


@dataclass
class TilingStats:
    """What one :func:`sliding_window_inference` call did (filled in when passed as ``stats``).

    Attributes:
        num_patches: patches ``B`` in the batch.
        tiles_per_patch: tiles cut from each patch (``len(starts_y) * len(starts_x)``).
        num_tiles: tiles run through the network (``num_patches * tiles_per_patch``).
        num_net_calls: network calls made (``ceil(num_tiles / tile_batch_size)``).
        padded_size: ``(H', W')`` of the padded 10 m canvas (``(H, W)`` for ``padding="shift"``).
        pad_before: ``(top, left)`` padding in 10 m pixels.
        starts_y, starts_x: top rows / left columns of the tiles on the padded canvas (10 m pixels).
    """

    num_patches: int = 0
    tiles_per_patch: int = 0
    num_tiles: int = 0
    num_net_calls: int = 0
    padded_size: tuple[int, int] = (0, 0)
    pad_before: tuple[int, int] = (0, 0)
    starts_y: tuple[int, ...] = field(default_factory=tuple)
    starts_x: tuple[int, ...] = field(default_factory=tuple)


def tile_starts(size: int, window: int, stride: int, padding: str = "reflect") -> tuple[int, int, list[int]]:
    """Tile grid along one axis.

    Args:
        size: patch length along the axis (pixels).
        window: tile length (pixels).
        stride: distance between tile starts (pixels).
        padding: one of :data:`PADDING_MODES`.

    Returns:
        ``(pad_before, pad_after, starts)``: padding added before and after the patch, and the tile
        starts on the padded axis. With a padding mode the grid is ``0, stride, ..., (n-1) stride``
        with ``n = 1 + ceil(max(size - window, 0) / stride)``; with ``"shift"`` it is ``0, stride, ...``
        plus ``size - window`` if the regular grid stops short of the border.

    Raises:
        CropScaleError: ``padding="shift"`` with ``size < window``.
    """
    if padding == "shift":
        if size < window:
            raise CropScaleError(
                f"sliding_window_inference: padding='shift' needs a patch at least as large as the window, "
                f"got size {size} < window {window}; use padding='reflect'"
            )
        starts = list(range(0, size - window + 1, stride))
        if starts[-1] + window < size:
            starts.append(size - window)
        return 0, 0, starts
    n = 1 + math.ceil(max(size - window, 0) / stride)
    extra = window + (n - 1) * stride - size
    before = extra // 2
    return before, extra - before, [i * stride for i in range(n)]


def blend_window_1d(length: int, blend: str = "hann", floor: float = 1e-3,
                    device: torch.device | None = None) -> Tensor:
    """1-D blending weights ``[length]`` float32 (see the module docstring for the formula)."""
    if blend == "uniform":
        return torch.ones(length, device=device)
    i = torch.arange(length, device=device, dtype=torch.float64)
    hann = torch.sin(math.pi * (i + 0.5) / length) ** 2
    return (floor + (1.0 - floor) * hann).to(torch.float32)


def _pad_index(size: int, before: int, after: int, mode: str, device: torch.device) -> Tensor:
    """Source indices ``[before + size + after]`` into an axis of length ``size`` (-1 = zero pad)."""
    i = torch.arange(-before, size + after, device=device)
    if mode == "zeros":
        return torch.where((i >= 0) & (i < size), i, torch.full_like(i, -1))
    if mode == "replicate" or size == 1:
        return i.clamp(0, size - 1)
    period = 2 * (size - 1)  # reflect without repeating the edge pixel, any pad width
    j = torch.remainder(i, period)
    return torch.where(j >= size, period - j, j)


def _pad_spatial(x: Tensor, idx_y: Tensor, idx_x: Tensor) -> Tensor:
    """Pad the last two dims of ``x`` by gathering ``idx_y``, ``idx_x`` (-1 = zero / False)."""
    zero_y, zero_x = idx_y < 0, idx_x < 0
    out = x.index_select(-2, idx_y.clamp(min=0)).index_select(-1, idx_x.clamp(min=0))
    if bool(zero_y.any()) or bool(zero_x.any()):
        keep = ~(zero_y[:, None] | zero_x[None, :])
        out = out * keep if out.dtype != torch.bool else out & keep
    return out


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CropScaleError(f"sliding_window_inference: {name} must be an int >= {minimum}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class Tile:
    """One tile: the batch row ``patch`` of its patch and its top-left corner ``(y, x)`` on the padded 10 m canvas.

    The corner is in pixels; on the high grid it is ``(y, x) * hr_scale``.
    """

    patch: int
    y: int
    x: int


@dataclass
class TilePlan:
    """Everything :func:`sliding_window_inference` decides before the network runs (see :func:`plan_tiles`).

    Attributes:
        num_patches: patches ``B``.
        size: patch ``(H, W)`` in 10 m pixels.
        window, stride, hr_scale, padding: as passed to :func:`plan_tiles`.
        pad: ``(top, bottom, left, right)`` padding in 10 m pixels.
        starts_y, starts_x: tile rows / columns on the padded canvas (10 m pixels).
        tiles: every tile, patch-major then row-major (``B * len(starts_y) * len(starts_x)``).
        batches: ``tiles`` cut into network calls of at most ``tile_batch_size`` tiles, in order.
        weights: grid scale (1 = 10 m, ``hr_scale`` = high grid) -> the tile window weights
            ``[window * s, window * s]`` (outer product of :func:`blend_window_1d`).
        weight_sums: grid scale -> the per-pixel sum of the weights of the tiles covering it, over
            the padded canvas ``[H' * s, W' * s]``.
    """

    num_patches: int
    size: tuple[int, int]
    window: int
    stride: int
    hr_scale: int
    padding: str
    pad: tuple[int, int, int, int]
    starts_y: list[int]
    starts_x: list[int]
    tiles: list[Tile]
    batches: list[list[Tile]]
    weights: dict[int, Tensor]
    weight_sums: dict[int, Tensor]

    @property
    def padded_size(self) -> tuple[int, int]:
        """``(H', W')`` of the padded 10 m canvas."""
        top, bottom, left, right = self.pad
        return self.size[0] + top + bottom, self.size[1] + left + right

    def window_slices(self, tile: Tile, scale: int) -> tuple[slice, slice]:
        """Rows and columns of ``tile`` on the padded canvas of grid ``scale``."""
        return (slice(tile.y * scale, (tile.y + self.window) * scale),
                slice(tile.x * scale, (tile.x + self.window) * scale))

    def tile_weight(self, tile: Tile, scale: int) -> Tensor:
        """Normalised blending weights of ``tile`` on grid ``scale``: window weight / per-pixel sum."""
        ys, xs = self.window_slices(tile, scale)
        return self.weights[scale] / self.weight_sums[scale][ys, xs]

    def crop(self, canvas: Tensor, scale: int) -> Tensor:
        """The patch area ``[..., H * s, W * s]`` of a padded canvas of grid ``scale``."""
        (h, w), (top, _, left, _) = self.size, self.pad
        return canvas[..., top * scale:(top + h) * scale, left * scale:(left + w) * scale]

    def pad_inputs(self, inputs: dict[str, Tensor | None],
                   device: torch.device) -> tuple[dict[str, Tensor], dict[str, Tensor | None]]:
        """Split ``inputs`` into the spatial tensors, padded once, and the others, passed per tile by batch row.

        Spatial tensors are those whose last two dims are ``(H, W)``; they are padded with gather indices on
        ``device``.
        """
        h, w = self.size
        top, bottom, left, right = self.pad
        mode = "zeros" if self.padding == "shift" else self.padding
        spatial: dict[str, Tensor] = {}
        other: dict[str, Tensor | None] = {}
        idx_y = idx_x = None
        for key, value in inputs.items():
            if isinstance(value, Tensor) and value.dim() >= 3 and tuple(value.shape[-2:]) == (h, w):
                if self.padded_size == (h, w):
                    spatial[key] = value
                    continue
                if idx_y is None:
                    idx_y = _pad_index(h, top, bottom, mode, device)
                    idx_x = _pad_index(w, left, right, mode, device)
                spatial[key] = _pad_spatial(value, idx_y, idx_x)
            else:
                other[key] = value
        return spatial, other

    def fill_stats(self, stats: TilingStats, net_calls: int) -> None:
        """Fill ``stats`` in place with this plan's counts and ``net_calls`` network calls."""
        stats.num_patches = self.num_patches
        stats.tiles_per_patch = len(self.starts_y) * len(self.starts_x)
        stats.num_tiles = len(self.tiles)
        stats.num_net_calls = net_calls
        stats.padded_size = self.padded_size
        stats.pad_before = (self.pad[0], self.pad[2])
        stats.starts_y, stats.starts_x = tuple(self.starts_y), tuple(self.starts_x)


def _check_arguments(window: object, stride: object, hr_scale: object, tile_batch_size: object, padding: str,
                     blend: str, blend_floor: float) -> tuple[int, int, int, int]:
    """``(window, stride, hr_scale, tile_batch_size)`` checked, ``stride`` defaulted to ``window // 2``."""
    window = _check_int("window", window)
    stride = _check_int("stride", max(window // 2, 1) if stride is None else stride)
    hr_scale = _check_int("hr_scale", hr_scale)
    tile_batch_size = _check_int("tile_batch_size", tile_batch_size)
    if padding not in PADDING_MODES:
        raise CropScaleError(f"sliding_window_inference: padding must be one of {PADDING_MODES}, got {padding!r}")
    if blend not in BLEND_WINDOWS:
        raise CropScaleError(f"sliding_window_inference: blend must be one of {BLEND_WINDOWS}, got {blend!r}")
    if not 0.0 <= float(blend_floor) <= 1.0:
        raise CropScaleError(f"sliding_window_inference: blend_floor must be in [0, 1], got {blend_floor!r}")
    return window, stride, hr_scale, tile_batch_size


def plan_tiles(
    num_patches: int,
    size: tuple[int, int],
    window: int = 32,
    stride: int | None = None,
    hr_scale: int = 10,
    blend: str = "hann",
    blend_floor: float = 1e-3,
    tile_batch_size: int = 16,
    padding: str = "reflect",
    device: torch.device | None = None,
) -> TilePlan:
    """Plan the tiles of ``num_patches`` patches of ``size = (H, W)`` 10 m pixels, without running anything.

    The grid and padding along each axis come from :func:`tile_starts`; the weights from
    :func:`blend_window_1d` on both grids (the high grid's window is the 10 m window sampled at
    ``hr_scale * window`` points). Arguments as in :func:`sliding_window_inference`; ``device`` is
    where the weight tensors live.

    Returns:
        The :class:`TilePlan` (tiles, network-call grouping, padding, weights and their per-pixel sums).

    Raises:
        CropScaleError: a bad argument, or a pixel of either grid that no tile covers (e.g.
            ``stride > window``).
    """
    window, stride, hr_scale, tile_batch_size = _check_arguments(
        window, stride, hr_scale, tile_batch_size, padding, blend, blend_floor)
    h, w = size
    top, bottom, starts_y = tile_starts(h, window, stride, padding)
    left, right, starts_x = tile_starts(w, window, stride, padding)
    tiles = [Tile(i, y, x) for i in range(num_patches) for y in starts_y for x in starts_x]
    plan = TilePlan(
        num_patches=num_patches, size=(h, w), window=window, stride=stride, hr_scale=hr_scale, padding=padding,
        pad=(top, bottom, left, right), starts_y=starts_y, starts_x=starts_x, tiles=tiles,
        batches=[tiles[c0:c0 + tile_batch_size] for c0 in range(0, len(tiles), tile_batch_size)],
        weights={}, weight_sums={},
    )
    _plan_weights(plan, blend, float(blend_floor), device)
    _check_coverage(plan)
    return plan


def _plan_weights(plan: TilePlan, blend: str, floor: float, device: torch.device | None) -> None:
    """Tile window weights and their per-pixel sums over the padded canvas, on both grids."""
    hp, wp = plan.padded_size
    for scale in dict.fromkeys((1, plan.hr_scale)):  # hr_scale == 1: one grid
        win = blend_window_1d(plan.window * scale, blend, floor, device)
        weight = win[:, None] * win[None, :]
        total = torch.zeros(hp * scale, wp * scale, device=device)
        for y in plan.starts_y:
            for x in plan.starts_x:
                ys, xs = plan.window_slices(Tile(0, y, x), scale)
                total[ys, xs] += weight
        plan.weights[scale], plan.weight_sums[scale] = weight, total


def _check_coverage(plan: TilePlan) -> None:
    """Raise if a pixel of the patch, on either grid, is covered by no tile."""
    (h, w), window = plan.size, plan.window
    for grid, scale in (("10 m", 1), ("high", plan.hr_scale)):
        uncovered = int((plan.crop(plan.weight_sums[scale], scale) <= 0).sum())
        if uncovered:
            raise CropScaleError(
                f"sliding_window_inference: {uncovered} pixels of the {grid} grid are covered by no tile "
                f"(patch {h}x{w}, window {window}, stride {plan.stride}, padding {plan.padding!r}); "
                f"use stride <= window")


# ------------------------------------------------------------------------------------------- run
def _check_inputs(inputs: dict[str, Tensor]) -> Tensor:
    """``inputs["s2"]``, after checking that every input has its batch size first."""
    s2 = inputs.get("s2") if isinstance(inputs, dict) else None
    if not isinstance(s2, Tensor) or s2.dim() < 3:
        raise CropScaleError("sliding_window_inference: inputs must hold a tensor 's2' [B, T2, bands, H, W]")
    b = s2.shape[0]
    for key, value in inputs.items():
        if value is not None and (not isinstance(value, Tensor) or value.dim() < 1 or value.shape[0] != b):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise CropScaleError(
                f"sliding_window_inference: input {key!r} must be a tensor with batch size {b} first, got {shape}")
    return s2


def _tile_inputs(spatial: dict[str, Tensor], other: dict[str, Tensor | None], tiles: list[Tile], window: int,
                 device: torch.device) -> dict[str, Tensor | None]:
    """The network inputs of one batch of tiles: spatial inputs cut, the others indexed by patch row."""
    rows = torch.tensor([t.patch for t in tiles], device=device)
    out: dict[str, Tensor | None] = {
        k: torch.stack([v[t.patch, ..., t.y:t.y + window, t.x:t.x + window] for t in tiles])
        for k, v in spatial.items()
    }
    out.update({k: (None if v is None else v.index_select(0, rows)) for k, v in other.items()})
    return out


def _output_scale(key: str, out: object, plan: TilePlan, n: int) -> int:
    """Grid scale of a first-seen network output (1 = 10 m, ``hr_scale`` = high grid)."""
    window, ws = plan.window, plan.window * plan.hr_scale
    if not isinstance(out, Tensor) or out.dim() < 3 or out.shape[0] != n:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise CropScaleError(f"sliding_window_inference: output {key!r} must be [n, ..., h, w] with "
                             f"n = {n} tiles, got {shape}")
    if tuple(out.shape[-2:]) == (window, window):
        return 1
    if tuple(out.shape[-2:]) == (ws, ws):
        return plan.hr_scale
    raise CropScaleError(
        f"sliding_window_inference: output {key!r} has spatial size {tuple(out.shape[-2:])}, "
        f"neither the tile ({window}x{window}) nor the high grid ({ws}x{ws}, hr_scale {plan.hr_scale})")


def _new_canvas(out: Tensor, plan: TilePlan, scale: int, device: torch.device) -> Tensor:
    """Zeros ``[B, ..., H' * s, W' * s]`` for one output key (float32, float64 if the output is)."""
    dtype = torch.promote_types(out.dtype, torch.float32) if out.is_floating_point() else torch.float32
    hp, wp = plan.padded_size
    return torch.zeros((plan.num_patches, *out.shape[1:-2], hp * scale, wp * scale), dtype=dtype, device=device)


class _Blender:
    """Weighted sums of the tile outputs, one padded canvas per output key."""

    def __init__(self, plan: TilePlan, device: torch.device) -> None:
        self.plan, self.device = plan, device
        self.canvases: dict[str, Tensor] = {}
        self.scales: dict[str, int] = {}

    def add(self, outputs: object, tiles: list[Tile]) -> None:
        """Blend one network call's outputs (``[n, ..., h, w]`` per key, ``n = len(tiles)``)."""
        canvases, plan = self.canvases, self.plan
        if not isinstance(outputs, dict) or (canvases and set(outputs) != set(canvases)):
            raise CropScaleError(
                f"sliding_window_inference: the network must return the same dict of tensors for every tile "
                f"batch, got {type(outputs).__name__} with keys "
                f"{sorted(outputs) if isinstance(outputs, dict) else '-'}")
        for key, out in outputs.items():
            if key not in canvases:
                self.scales[key] = _output_scale(key, out, plan, len(tiles))
                canvases[key] = _new_canvas(out, plan, self.scales[key], self.device)
            elif tuple(out.shape[1:]) != tuple(canvases[key].shape[1:-2]) + (plan.window * self.scales[key],) * 2:
                raise CropScaleError(f"sliding_window_inference: output {key!r} changed shape between tile "
                                     f"batches: {tuple(out.shape)}")
            scale, canvas = self.scales[key], canvases[key]
            for n, tile in enumerate(tiles):
                ys, xs = plan.window_slices(tile, scale)
                canvas[tile.patch, ..., ys, xs] += (out[n].to(canvas.dtype)
                                                    * plan.tile_weight(tile, scale).to(canvas.dtype))

    def result(self) -> dict[str, Tensor]:
        """The blended outputs, cropped to the patch (``[B, ..., H * s, W * s]``)."""
        return {key: self.plan.crop(canvas, self.scales[key]) for key, canvas in self.canvases.items()}


def sliding_window_inference(
    net: Callable[..., dict[str, Tensor]],
    inputs: dict[str, Tensor],
    window: int = 32,
    stride: int | None = None,
    hr_scale: int = 10,
    blend: str = "hann",
    blend_floor: float = 1e-3,
    tile_batch_size: int = 16,
    padding: str = "reflect",
    stats: TilingStats | None = None,
) -> dict[str, Tensor]:
    """Run ``net`` on overlapping tiles of whole patches and blend the outputs (see module docstring).

    Plans the tiles first (:func:`plan_tiles`: grid, padding, network-call grouping, weights, and the
    coverage check, all before the network runs), then runs the plan's batches and blends.

    Args:
        net: called as ``net(**tile_inputs)`` on a batch of ``n <= tile_batch_size`` tiles; returns a
            dict of tensors ``[n, ..., window, window]`` (10 m grid) or
            ``[n, ..., hr_scale*window, hr_scale*window]`` (high grid), e.g. ``CropMappingNet``'s
            ``{"semantic": [n,C,w,w], "parcel": [n,3,w,w], "hr": [n,3,10w,10w]}``.
        inputs: the model inputs of a batch of ``B`` whole patches (:func:`cropscale.batch.model_inputs`);
            ``inputs["s2"]`` is ``[B, T2, 10, H, W]`` and fixes ``(H, W)``.
        window: tile size in 10 m pixels (the training crop size).
        stride: tile stride in 10 m pixels; default ``window // 2`` (1 for ``window = 1``).
        hr_scale: high-grid pixels per 10 m pixel along each axis.
        blend: ``"hann"`` or ``"uniform"``.
        blend_floor: floor ``f`` in [0, 1] mixed into the Hann window.
        tile_batch_size: tiles per network call; tiles of all ``B`` patches are batched together.
        padding: ``"reflect"``, ``"replicate"``, ``"zeros"`` or ``"shift"`` (see module docstring).
        stats: if given, filled in with the tile and call counts (:class:`TilingStats`).

    Returns:
        The blended outputs, same keys as ``net``'s: ``[B, ..., H, W]`` on the 10 m grid and
        ``[B, ..., hr_scale*H, hr_scale*W]`` on the high grid, float32 (float64 if the network returns
        float64), on the device of ``inputs["s2"]``. Runs in the caller's grad mode (Lightning's
        validation and test steps already disable gradients).

    Raises:
        CropScaleError: a bad argument, ``inputs`` without ``"s2"`` or with a tensor whose first dim is
            not ``B``, a pixel that no tile covers (e.g. ``stride > window``), or a network output that
            is not a tensor on one of the two grids.
    """
    _check_arguments(window, stride, hr_scale, tile_batch_size, padding, blend, blend_floor)
    s2 = _check_inputs(inputs)
    device = s2.device
    plan = plan_tiles(s2.shape[0], tuple(s2.shape[-2:]), window, stride, hr_scale, blend, blend_floor,
                      tile_batch_size, padding, device)
    spatial, other = plan.pad_inputs(inputs, device)
    blender = _Blender(plan, device)
    for tiles in plan.batches:
        blender.add(net(**_tile_inputs(spatial, other, tiles, plan.window, device)), tiles)
    if stats is not None:
        plan.fill_stats(stats, len(plan.batches))
    return blender.result()
