"""The multimodal crop-mapping network of the scaling study (plain ``nn.Module``, no Lightning).

Data flow (shapes for one batch of ``B`` samples, ``H x W`` pixels at 10 m)::

    S2  [B, T2, 10, H, W] --stem per date--> [B, T2, D2, H, W] --+ day-of-year encoding
        --temporal Transformer per pixel (learned aggregation token, masked SDPA)--> [B, D2, H, W]
    S1A [B, T1, 2, H, W]  --same, own weights---------------------------------> [B, D1, H, W] | missing
    S1D [B, T1, 2, H, W]  --same, own weights---------------------------------> [B, D1, H, W] | missing
    concat -> 1x1 fusion -> encoder at strides 1, 2, 4 -> FPN top-down (Lin et al., CVPR 2017)
        -> P1 [B, F, H, W] -> semantic head   [B, C, H, W]      (crop-type logits)
                           -> parcel head     [B, K, H, W]      (extent, boundary, distance logits)
                           -> detail decoder  [B, 3, sH, sW]    (high-grid RGB in [0, 1], s = hr_scale)

The temporal encoder follows the attention-over-dates design of U-TAE / L-TAE (Sainte Fare Garnot
and Landrieu, ICCV 2021 and ECCV-W 2020): sinusoidal encoding of the day of year (base 1000), one
attention sequence per pixel, so per-date *and* per-pixel cloud masks apply. A learned aggregation
token (as the ViT class token, Dosovitskiy et al., ICLR 2021) is prepended to every sequence and is
always a valid key: invalid dates are masked out of the attention, and a pixel with no valid date
still has one key to attend, so its feature is the learned "no observation" state (finite, never
NaN). The aggregation token's output is the per-pixel temporal summary.

Masked values never reach a feature: before the per-date stem, every masked value (a cloudy pixel of a
per-pixel mask, every pixel of a masked date, padding dates) is replaced by 0, the mean of the
normalised data, so values under a mask (NaN and Inf included) cannot leak into clear neighbours
through the 3x3 convolution; the stem's GroupNorm takes its mean and variance over the clear
pixels of each image only (:func:`masked_group_norm`), so the statistics do not depend on how much
of the image is cloud; masked dates are excluded from the temporal attention. The outputs at every
pixel are therefore independent of the values under the mask.

A Sentinel-1 orbit absent for the whole batch (tensor ``None``) or for one sample (date mask all
False) is replaced by that orbit's learned missing-modality embedding, not by zeros pretending to
be data. The parcel outputs follow the extent / boundary / distance-to-boundary target set of
ResUNet-a (Diakogiannis et al., ISPRS J. 2020; Waldner and Diakogiannis, RSE 2020): channel 0 is
the extent logit, channel 1 the boundary logit, channel 2 the distance logit, the normalised
distance to the parcel boundary in [0, 1] being ``sigmoid(channel 2)``
(see :class:`cropscale.model.losses.MultiTaskLoss`).

Only GroupNorm and LayerNorm are used (no BatchNorm statistics that differ per rank under DDP or
FSDP); there is no Python loop over dates or pixels; any ``T >= 1``; ``H`` and ``W`` must be
multiples of :attr:`CropMappingNet.stride` = 4 (two stride-2 stages).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cropscale.errors import CropScaleError

__all__ = ["CropMappingNet", "TemporalEncoder", "count_parameters", "doy_encoding"]


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``module`` (only those with ``requires_grad`` if ``trainable_only``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def _groups(channels: int) -> int:
    """GroupNorm group count: 8 where it divides ``channels``, else the largest of 4, 2, 1 that does."""
    for g in (8, 4, 2, 1):
        if channels % g == 0:
            return g
    return 1


def _conv_gn_act(cin: int, cout: int, kernel: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.GroupNorm(_groups(cout), cout),
        nn.GELU(),
    )


def masked_group_norm(x: Tensor, valid: Tensor | None, norm: nn.GroupNorm) -> Tensor:
    """GroupNorm of ``x`` whose mean and variance come from the valid pixels only (``norm``'s affine parameters).

    Args:
        x: ``[N, C, H, W]`` features.
        valid: ``[N, 1, H, W]`` bool (True = clear pixel), or None for :class:`torch.nn.GroupNorm` itself.
        norm: the GroupNorm whose ``num_groups``, ``eps``, ``weight`` and ``bias`` are used.

    Returns:
        ``[N, C, H, W]`` in ``x``'s dtype: ``(x - mean) / sqrt(var + eps) * weight + bias`` per sample and
        group, the moments (population variance) taken over the group's channels at the valid pixels. An
        image without a valid pixel gets mean 0 and variance 0 (finite outputs, ignored downstream).

    The statistics, the normalisation and their backward run in float32 whatever ``x``'s dtype (as
    :func:`torch.nn.functional.group_norm` does under autocast): in fp16 the backward of
    ``rsqrt(var + eps)`` at variance 0, ``-0.5 eps^-1.5`` (1.6e7 at eps 1e-5), is beyond fp16's largest
    value 65,504, and ``inf x 0`` at the masked pixels gave NaN gradients in the convolution before it.
    A float32 ``x`` is computed exactly as before.
    """
    if valid is None:
        return norm(x)
    n, c, h, w = x.shape
    g = norm.num_groups
    xg = x.reshape(n, g, c // g, h, w).float()
    m = valid.reshape(n, 1, 1, h, w).float()
    count = (m.sum(dim=(2, 3, 4)) * (c // g)).clamp_min(1.0)[:, :, None, None, None]     # [N, G, 1, 1, 1]
    mean = (xg * m).sum(dim=(2, 3, 4), keepdim=True) / count
    var = (((xg - mean) * m) ** 2).sum(dim=(2, 3, 4), keepdim=True) / count
    y = ((xg - mean) * torch.rsqrt(var + norm.eps)).reshape(n, c, h, w)
    if norm.affine:
        y = y * norm.weight.float()[None, :, None, None] + norm.bias.float()[None, :, None, None]
    return y.to(x.dtype)


class _MaskedStem(nn.Sequential):
    """Per-date stem ``conv3x3 -> GroupNorm -> GELU -> conv1x1`` that ignores masked pixels.

    Masked input values are replaced by 0 before the 3x3 convolution and the GroupNorm statistics are
    taken over clear pixels only (:func:`masked_group_norm`). Its parameters and their names are those of
    ``nn.Sequential(_conv_gn_act(cin, dim, 3), nn.Conv2d(dim, dim, 1))``, so checkpoints keep loading.
    """

    def __init__(self, cin: int, dim: int) -> None:
        super().__init__(_conv_gn_act(cin, dim, 3), nn.Conv2d(dim, dim, 1))

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        """``x`` ``[N, C, H, W]``, ``valid`` ``[N, 1, H, W]`` bool or None -> ``[N, D, H, W]``."""
        conv, norm, act = self[0]
        if valid is not None:
            x = torch.where(valid, x, x.new_zeros(()))
        return self[1](act(masked_group_norm(conv(x), valid, norm)))


def doy_encoding(doy: Tensor, dim: int, base: float = 1000.0) -> Tensor:
    """Sinusoidal encoding of the acquisition day of year (Vaswani et al. 2017; positions = days, as in L-TAE).

    Args:
        doy: ``[B, T]`` day of year (1..366), any numeric dtype.
        dim: encoding width (even).
        base: period base; 1000 > 366 keeps the slowest component monotonic over a year.

    Returns:
        ``[B, T, dim]`` float32: ``sin(doy / base^(2i/dim))`` then ``cos(...)`` for ``i < dim/2``.
    """
    half = dim // 2
    freq = base ** (-torch.arange(half, device=doy.device, dtype=torch.float32) * 2.0 / dim)
    angle = doy.to(torch.float32).unsqueeze(-1) * freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class _TemporalBlock(nn.Module):
    """Pre-norm Transformer layer over the dates of each pixel.

    Attention goes through ``F.scaled_dot_product_attention`` so fused kernels are used where available.
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        if dim % heads:
            raise CropScaleError(f"temporal width {dim} is not divisible by its number of heads {heads}")
        self.heads = heads
        hidden = int(round(dim * mlp_ratio))
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, key_mask: Tensor | None, token_only: bool = False) -> Tensor:
        """Update ``x [N, L, D]`` with ``key_mask [N, 1, 1, L]`` bool (True = attend) or None.

        With ``token_only`` only the first (aggregation) token is updated and returned ``[N, 1, D]``.
        """
        n, length, dim = x.shape
        hd = dim // self.heads
        h = self.norm1(x)
        if token_only:
            kv = F.linear(h, self.qkv.weight[dim:], self.qkv.bias[dim:])
            k, v = kv.reshape(n, length, 2, self.heads, hd).permute(2, 0, 3, 1, 4)
            q = F.linear(h[:, :1], self.qkv.weight[:dim], self.qkv.bias[:dim])
            q = q.reshape(n, 1, self.heads, hd).transpose(1, 2)
            x = x[:, :1]
        else:
            q, k, v = self.qkv(h).reshape(n, length, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        x = x + self.proj(a.transpose(1, 2).reshape(n, x.shape[1], dim))
        return x + self.mlp(self.norm2(x))


class TemporalEncoder(nn.Module):
    """Encoder of one modality: a time series of images -> one feature vector per pixel.

    Per-date spatial stem -> day-of-year encoding -> temporal Transformer per pixel -> the aggregation
    token's output as the per-pixel summary.

    Args:
        in_bands: input channels per date (10 for Sentinel-2, 2 for Sentinel-1 VV, VH).
        dim: token width ``D``.
        depth: number of Transformer layers (>= 1).
        heads: attention heads (divide ``dim``).
        mlp_ratio: MLP hidden width / ``dim``.
        doy_base: base of the sinusoidal day-of-year encoding.
    """

    def __init__(self, in_bands: int, dim: int, depth: int, heads: int, mlp_ratio: float,
                 doy_base: float = 1000.0) -> None:
        super().__init__()
        if depth < 1 or dim % 2:
            raise CropScaleError(f"temporal encoder needs depth >= 1 and an even width, got {depth=}, {dim=}")
        self.dim = dim
        self.doy_base = doy_base
        self.stem = _MaskedStem(in_bands, dim)
        self.token = nn.Parameter(torch.empty(dim).normal_(0.0, 0.02))
        self.blocks = nn.ModuleList(_TemporalBlock(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, doy: Tensor, valid: Tensor | None) -> Tensor:
        """Encode ``x [B, T, C, H, W]`` with ``doy [B, T]`` into ``[B, D, H, W]``.

        ``valid`` is None (all valid), ``[B, T]`` or ``[B, T, H, W]`` bool (True = valid). Values where
        ``valid`` is False (NaN and Inf included) do not influence the output (module docstring).
        """
        b, t, c, h, w = x.shape
        d = self.dim
        pixel_valid = None
        if valid is not None:
            pixel_valid = (valid[:, :, None, None] if valid.dim() == 2 else valid).expand(b, t, h, w)
            pixel_valid = pixel_valid.reshape(b * t, 1, h, w)
        f = self.stem(x.reshape(b * t, c, h, w), pixel_valid)               # [B*T, D, H, W]
        f = f.reshape(b, t, d, h, w).permute(0, 3, 4, 1, 2)              # [B, H, W, T, D]
        pe = doy_encoding(doy, d, self.doy_base).to(f.dtype)             # [B, T, D]
        f = (f + pe[:, None, None]).reshape(b * h * w, t, d)
        # expanded before the cast: the backward's sum over the B*H*W copies runs in float32 (fp16 overflowed)
        tokens = torch.cat([self.token.expand(b * h * w, 1, d).to(f.dtype), f], dim=1)
        key_mask = None
        if valid is not None:
            if valid.dim() == 2:
                valid = valid[:, :, None, None]
            valid = valid.expand(b, t, h, w).permute(0, 2, 3, 1).reshape(b * h * w, t)
            key_mask = torch.cat([valid.new_ones(b * h * w, 1), valid], dim=1)[:, None, None, :]
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, key_mask, token_only=(i == last))
        out = self.norm(tokens[:, 0])                                    # [B*H*W, D]
        return out.reshape(b, h, w, d).permute(0, 3, 1, 2)


class _ResBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and an identity shortcut (He et al., CVPR 2016)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.GroupNorm(_groups(channels), channels),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.GroupNorm(_groups(channels), channels),
        )
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x + self.body(x))


class CropMappingNet(nn.Module):
    """The "Sentinel-first" crop-mapping model of the scaling study (see module docstring).

    Sentinel-2 temporal Transformer + Sentinel-1 ascending/descending encoders + FPN + 10 m heads +
    x``hr_scale`` detail decoder.

    Outputs, for ``H x W`` inputs (``H``, ``W`` multiples of :attr:`stride` = 4):

    - ``semantic`` ``[B, num_classes, H, W]``: crop-type logits at 10 m.
    - ``parcel`` ``[B, num_parcel_outputs, H, W]``: parcel logits at 10 m; with the default
      ``num_parcel_outputs = 3``: extent (channel 0), boundary (1), distance to the boundary (2,
      normalised distance = ``sigmoid``), the ResUNet-a target set (Diakogiannis et al. 2020).
    - ``hr`` ``[B, 3, hr_scale*H, hr_scale*W]``: RGB on the high grid (1 m for the default
      ``hr_scale = 10``), in [0, 1] (sigmoid output).

    Args:
        num_classes: semantic classes ``C`` (10 for the bundled worldcereal-flanders sample, 20 for PASTIS).
        num_parcel_outputs: parcel channels ``K``.
        s2_bands: Sentinel-2 bands per date (B02 B03 B04 B05 B06 B07 B08 B8A B11 B12).
        s1_bands: Sentinel-1 channels per date (VV, VH in dB).
        s2_dim, s2_depth, s2_heads: width, layers and heads of the Sentinel-2 temporal Transformer.
        s1_dim, s1_depth, s1_heads: the same for each Sentinel-1 orbit (one encoder per orbit).
        mlp_ratio: Transformer MLP hidden width / token width.
        width: encoder channels at stride 1; strides 2 and 4 use ``2*width`` and ``4*width``.
        fpn_dim: FPN channels ``F`` (lateral 1x1 projections, top-down sum, 3x3 smoothing at stride 1).
        head_dim: hidden channels of the semantic and parcel heads.
        decoder_dim: channels of the detail decoder at the intermediate scale.
        hr_dim: channels of the detail decoder on the high grid (these activations dominate memory).
        hr_scale: high-grid / 10 m grid ratio (10: 1 m SPOT-6/7 grid).
        doy_base: base of the sinusoidal day-of-year encoding.

    Under DDP, pass an absent orbit as zeros with an all-False date mask (as the collate function
    does): its encoder then runs and every parameter takes part in the backward. ``None`` skips the
    encoder (cheaper; for benchmarks and inference), which DDP only accepts with
    ``find_unused_parameters=True``.

    Raises:
        CropScaleError: bad hyper-parameters here; bad input shapes in :meth:`forward`.
    """

    stride: int = 4
    """Total down-sampling of the FPN: ``H`` and ``W`` must be multiples of it."""

    def __init__(
        self,
        num_classes: int = 10,
        num_parcel_outputs: int = 3,
        s2_bands: int = 10,
        s1_bands: int = 2,
        s2_dim: int = 64,
        s2_depth: int = 2,
        s2_heads: int = 4,
        s1_dim: int = 32,
        s1_depth: int = 1,
        s1_heads: int = 2,
        mlp_ratio: float = 4.0,
        width: int = 56,
        fpn_dim: int = 128,
        head_dim: int = 32,
        decoder_dim: int = 48,
        hr_dim: int = 16,
        hr_scale: int = 10,
        doy_base: float = 1000.0,
    ) -> None:
        super().__init__()
        for name, value in [("num_classes", num_classes), ("num_parcel_outputs", num_parcel_outputs),
                            ("s2_bands", s2_bands), ("s1_bands", s1_bands), ("width", width),
                            ("fpn_dim", fpn_dim), ("head_dim", head_dim), ("decoder_dim", decoder_dim),
                            ("hr_dim", hr_dim), ("hr_scale", hr_scale)]:
            if int(value) < 1:
                raise CropScaleError(f"CropMappingNet: {name} must be >= 1, got {value}")
        self.num_classes = num_classes
        self.num_parcel_outputs = num_parcel_outputs
        self.s2_bands = s2_bands
        self.s1_bands = s1_bands
        self.hr_scale = hr_scale

        self.s2_encoder = TemporalEncoder(s2_bands, s2_dim, s2_depth, s2_heads, mlp_ratio, doy_base)
        self.s1a_encoder = TemporalEncoder(s1_bands, s1_dim, s1_depth, s1_heads, mlp_ratio, doy_base)
        self.s1d_encoder = TemporalEncoder(s1_bands, s1_dim, s1_depth, s1_heads, mlp_ratio, doy_base)
        self.s1a_missing = nn.Parameter(torch.empty(s1_dim).normal_(0.0, 0.02))
        self.s1d_missing = nn.Parameter(torch.empty(s1_dim).normal_(0.0, 0.02))

        c1, c2, c3 = width, 2 * width, 4 * width
        self.fuse = _conv_gn_act(s2_dim + 2 * s1_dim, c1, 1)
        self.level1 = _ResBlock(c1)
        self.level2 = nn.Sequential(_conv_gn_act(c1, c2, 3, stride=2), _ResBlock(c2))
        self.level3 = nn.Sequential(_conv_gn_act(c2, c3, 3, stride=2), _ResBlock(c3))
        self.lateral1 = nn.Conv2d(c1, fpn_dim, 1)
        self.lateral2 = nn.Conv2d(c2, fpn_dim, 1)
        self.lateral3 = nn.Conv2d(c3, fpn_dim, 1)
        self.smooth = _conv_gn_act(fpn_dim, fpn_dim, 3)

        self.semantic_head = nn.Sequential(_conv_gn_act(fpn_dim, head_dim, 3), nn.Conv2d(head_dim, num_classes, 1))
        self.parcel_head = nn.Sequential(_conv_gn_act(fpn_dim, head_dim, 3),
                                         nn.Conv2d(head_dim, num_parcel_outputs, 1))

        # Detail decoder: x up1 (2 when hr_scale is even) then x up2 on the high grid.
        self.hr_up1 = 2 if hr_scale % 2 == 0 else 1
        self.hr_up2 = hr_scale // self.hr_up1
        self.decoder_mid = nn.Sequential(_conv_gn_act(fpn_dim, decoder_dim, 3), nn.Conv2d(decoder_dim, hr_dim, 1))
        self.decoder_hr = nn.Sequential(_conv_gn_act(hr_dim, hr_dim, 3), nn.Conv2d(hr_dim, 3, 3, padding=1))

    # ------------------------------------------------------------------ input checks
    def _check_orbit(self, name: str, x: Tensor | None, doy: Tensor | None, mask: Tensor | None,
                     b: int, h: int, w: int) -> Tensor | None:
        if x is None:
            return None
        if x.dim() != 5 or x.shape[0] != b or x.shape[2] != self.s1_bands or tuple(x.shape[3:]) != (h, w):
            raise CropScaleError(
                f"{name} must be [B={b}, T1, {self.s1_bands}, H={h}, W={w}], got {list(x.shape)}")
        if doy is None or tuple(doy.shape) != tuple(x.shape[:2]):
            raise CropScaleError(f"{name}_doy must be [B, T1] = {list(x.shape[:2])}, got "
                                 f"{None if doy is None else list(doy.shape)}")
        if mask is None:
            return None
        if tuple(mask.shape) not in (tuple(x.shape[:2]), (*x.shape[:2], h, w)):
            raise CropScaleError(f"{name}_mask must be [B, T1] = {list(x.shape[:2])} or [B, T1, H, W], got"
                                 f" {list(mask.shape)}")
        return mask.bool()

    def _orbit_feature(self, encoder: TemporalEncoder, missing: Tensor, x: Tensor | None, doy: Tensor | None,
                       mask: Tensor | None, ref: Tensor) -> Tensor:
        b, _, h, w = ref.shape
        if x is None:  # absent for the whole batch: the encoder does not run
            return missing[None, :, None, None].expand(b, -1, h, w).to(ref.dtype)
        f = encoder(x, doy, mask)
        if mask is None:
            return f
        present = mask.any(dim=1)                                         # [B] or [B, H, W]
        present = present[:, None, None, None] if present.dim() == 1 else present[:, None]
        # expanded before the cast, as the aggregation token: the backward's sum runs in float32
        return torch.where(present, f, missing[None, :, None, None].expand_as(f).to(f.dtype))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        s2: Tensor,
        s2_doy: Tensor,
        s2_mask: Tensor | None = None,
        s1a: Tensor | None = None,
        s1a_doy: Tensor | None = None,
        s1a_mask: Tensor | None = None,
        s1d: Tensor | None = None,
        s1d_doy: Tensor | None = None,
        s1d_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Run the network on one batch (keys and shapes of :mod:`cropscale.batch`).

        Args:
            s2: ``[B, T2, s2_bands, H, W]`` normalised Sentinel-2 reflectance, ``T2 >= 1``.
            s2_doy: ``[B, T2]`` day of year.
            s2_mask: None (all valid), ``[B, T2]`` or ``[B, T2, H, W]`` bool, True = clear observation;
                the values under False (NaN and Inf included) do not influence any output.
            s1a: ascending orbit, ``[B, T1, s1_bands, H, W]`` normalised VV, VH (dB), or None (orbit absent
                for the batch).
            s1a_doy: ``[B, T1]`` day of year of ``s1a`` (required with ``s1a``).
            s1a_mask: ``[B, T1]`` bool, True = real date of ``s1a``; all False = orbit absent for the sample
                (``[B, T1, H, W]`` per pixel is accepted too: a pixel with no valid date gets the missing
                embedding).
            s1d: descending orbit, as ``s1a``.
            s1d_doy: ``[B, T1]`` day of year of ``s1d`` (required with ``s1d``).
            s1d_mask: as ``s1a_mask``, for ``s1d``.

        Returns:
            ``{"semantic": [B, C, H, W], "parcel": [B, K, H, W], "hr": [B, 3, sH, sW]}``.

        Raises:
            CropScaleError: a tensor of the wrong rank, shape or kind (integer images), or ``H``/``W``
                not a multiple of 4. Floating-point images are cast to the parameters' dtype.
        """
        if s2.dim() != 5 or s2.shape[2] != self.s2_bands or s2.shape[1] < 1:
            raise CropScaleError(f"s2 must be [B, T2 >= 1, {self.s2_bands}, H, W], got {list(s2.shape)}")
        b, t2, _, h, w = s2.shape
        dtype = self.s2_encoder.token.dtype
        for name, x in (("s2", s2), ("s1a", s1a), ("s1d", s1d)):
            if x is not None and not x.is_floating_point():
                raise CropScaleError(f"{name} must be a floating-point tensor of normalised values, got {x.dtype}")
        s2 = s2.to(dtype)
        s1a = None if s1a is None else s1a.to(dtype)
        s1d = None if s1d is None else s1d.to(dtype)
        if h % self.stride or w % self.stride or h == 0 or w == 0:
            raise CropScaleError(
                f"CropMappingNet: H and W must be positive multiples of the FPN stride {self.stride}, "
                f"got H={h}, W={w} (crop or pad the input)")
        if tuple(s2_doy.shape) != (b, t2):
            raise CropScaleError(f"s2_doy must be [B, T2] = {[b, t2]}, got {list(s2_doy.shape)}")
        if s2_mask is not None:
            if tuple(s2_mask.shape) not in ((b, t2), (b, t2, h, w)):
                raise CropScaleError(
                    f"s2_mask must be [B, T2] or [B, T2, H, W] = {[b, t2, h, w]}, got {list(s2_mask.shape)}")
            s2_mask = s2_mask.bool()
        s1a_mask = self._check_orbit("s1a", s1a, s1a_doy, s1a_mask, b, h, w)
        s1d_mask = self._check_orbit("s1d", s1d, s1d_doy, s1d_mask, b, h, w)

        f2 = self.s2_encoder(s2, s2_doy, s2_mask)                                     # [B, D2, H, W]
        fa = self._orbit_feature(self.s1a_encoder, self.s1a_missing, s1a, s1a_doy, s1a_mask, f2)
        fd = self._orbit_feature(self.s1d_encoder, self.s1d_missing, s1d, s1d_doy, s1d_mask, f2)
        x = self.fuse(torch.cat([f2, fa.to(f2.dtype), fd.to(f2.dtype)], dim=1))      # [B, c1, H, W]

        x1 = self.level1(x)                                                            # stride 1
        x2 = self.level2(x1)                                                           # stride 2
        x3 = self.level3(x2)                                                           # stride 4
        p3 = self.lateral3(x3)
        p2 = self.lateral2(x2) + F.interpolate(p3, scale_factor=2.0, mode="nearest")
        p1 = self.lateral1(x1) + F.interpolate(p2, scale_factor=2.0, mode="nearest")
        p1 = self.smooth(p1)                                                           # [B, F, H, W]

        y = p1
        if self.hr_up1 > 1:
            y = F.interpolate(y, scale_factor=float(self.hr_up1), mode="bilinear", align_corners=False)
        y = self.decoder_mid(y)
        if self.hr_up2 > 1:
            y = F.interpolate(y, scale_factor=float(self.hr_up2), mode="bilinear", align_corners=False)
        hr = torch.sigmoid(self.decoder_hr(y))
        return {"semantic": self.semantic_head(p1), "parcel": self.parcel_head(p1), "hr": hr}

