"""A plain (single-stride) transformer backbone as a 4-level feature pyramid for torchvision's detectors.

As in XCiT's detection code: the token maps of four blocks (the paper: blocks 4, 6, 8, 12, 1-based) all have the
patch stride; each is resampled to one pyramid level (strides 4, 8, 16, 32 by default) by 2× transposed
convolutions (upsampling), identity, or max pooling (downsampling). For patch 16 that is deconv-BN-GELU-deconv,
deconv, identity, 2× max-pool; for patch 8: deconv, identity, 2× pool, 4× pool. torchvision's
``FeaturePyramidNetwork`` (with its extra max-pooled level) then gives the five maps Mask R-CNN expects.

Works for any timm model with ``forward_intermediates`` and ``feature_info`` (the SimA DeiTs, XCiT-SimA, ...).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Dict, Sequence

import torch
from torch import nn

__all__ = ["scale_adapter", "PyramidBackbone"]


def scale_adapter(channels: int, in_stride: int, out_stride: int,
                  norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d) -> nn.Module:
    """Resample a (B, C, H, W) map from ``in_stride`` to ``out_stride`` (their ratio must be a power of 2):
    chained 2× transposed convs with norm + GELU between them to go finer, max pooling to go coarser."""
    ratio = in_stride / out_stride
    steps = math.log2(ratio)
    if steps != int(steps):
        raise ValueError(f"pyramid stride {out_stride} is not a power-of-2 rescale of the backbone stride {in_stride}")
    steps = int(steps)
    if steps == 0:
        return nn.Identity()
    if steps < 0:
        return nn.MaxPool2d(kernel_size=2 ** -steps, stride=2 ** -steps)
    layers = []
    for i in range(steps):
        if i:
            layers += [norm_layer(channels), nn.GELU()]
        layers.append(nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2))
    return nn.Sequential(*layers)


class PyramidBackbone(nn.Module):
    """timm backbone → per-level scale adapters → torchvision FPN; ``out_channels`` as torchvision requires.

    Args:
        body: a timm model (built with ``num_classes=0``); blocks after the last used one, its final norm and head
            are pruned (they would get no gradient, which DDP rejects).
        out_indices: 0-based block indices to tap, increasing, one per stride.
        strides: output stride of each pyramid level.
        out_channels: FPN width.
        norm_layer: the norm between transposed convs (BatchNorm2d; converted to SyncBatchNorm under DDP).
    """

    def __init__(self, body: nn.Module, out_indices: Sequence[int] = (3, 5, 7, 11),
                 strides: Sequence[int] = (4, 8, 16, 32), out_channels: int = 256,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d) -> None:
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork
        from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
        if not hasattr(body, "forward_intermediates") or not getattr(body, "feature_info", None):
            raise ValueError(f"{type(body).__name__} has no forward_intermediates/feature_info; "
                             "a detection backbone must be a timm model that supports features")
        out_indices = [int(i) for i in out_indices]
        if len(out_indices) != len(strides):
            raise ValueError(f"{len(out_indices)} out_indices for {len(strides)} pyramid strides")
        depth = len(body.feature_info)
        if sorted(set(out_indices)) != out_indices or out_indices[0] < 0 or out_indices[-1] >= depth:
            raise ValueError(f"out_indices {out_indices} must be increasing block indices in [0, {depth})")
        info = [body.feature_info[i] for i in out_indices]
        if hasattr(body, "prune_intermediate_layers"):
            body.prune_intermediate_layers(out_indices, prune_norm=True, prune_head=True)
        self.body = body
        self.out_indices = out_indices
        self.strides = [int(s) for s in strides]
        self.adapters = nn.ModuleList(scale_adapter(f["num_chs"], f["reduction"], s, norm_layer)
                                      for f, s in zip(info, self.strides))
        self.fpn = FeaturePyramidNetwork([f["num_chs"] for f in info], out_channels, extra_blocks=LastLevelMaxPool())
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        feats = self.body.forward_intermediates(x, indices=self.out_indices, intermediates_only=True,
                                                output_fmt="NCHW")
        levels = OrderedDict((str(i), adapt(f)) for i, (adapt, f) in enumerate(zip(self.adapters, feats)))
        return self.fpn(levels)
