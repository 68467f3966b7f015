"""A transformer backbone as a 4-level feature pyramid for torchvision's detectors.

The four maps (strides 4, 8, 16, 32 by default) are the dense-prediction features every task shares
(:class:`simattn.models.segmentation.FeaturePyramid`: XCiT's resampled block maps for a plain transformer, the stages
of a pyramid); torchvision's ``FeaturePyramidNetwork`` (with its extra max-pooled level) then gives the five maps
Mask R-CNN expects.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Sequence

import torch
from torch import nn

from ..models.segmentation import FeaturePyramid, scale_adapter

__all__ = ["scale_adapter", "PyramidBackbone"]


class PyramidBackbone(FeaturePyramid):
    """timm backbone → per-level scale adapters → torchvision FPN; ``out_channels`` as torchvision requires.

    Args:
        body: a timm model (built with ``num_classes=0``), see :class:`FeaturePyramid`.
        out_indices: 0-based block indices to tap, increasing, one per stride (XCiT: blocks 4, 6, 8, 12, 1-based).
        strides: output stride of each pyramid level.
        out_channels: FPN width.
        norm_layer: the norm between transposed convs (BatchNorm2d; converted to SyncBatchNorm under DDP).
    """

    def __init__(self, body: nn.Module, out_indices: Sequence[int] = (3, 5, 7, 11),
                 strides: Sequence[int] = (4, 8, 16, 32), out_channels: int = 256,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d) -> None:
        super().__init__(body, out_indices, strides, norm_layer)
        from torchvision.ops import FeaturePyramidNetwork
        from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
        self.fpn = FeaturePyramidNetwork(self.channels, out_channels, extra_blocks=LastLevelMaxPool())
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        levels = super().forward(x)
        return self.fpn(OrderedDict((str(i), level) for i, level in enumerate(levels)))
