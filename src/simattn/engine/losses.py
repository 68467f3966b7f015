"""Losses that tasks and benchmarks share where torch's own need care: a per-pixel cross-entropy over more logits than
one of CUDA's loss kernels can index.

CUDA's log-softmax and NLL kernels index with 32-bit integers: a call over more than :data:`MAX_LOSS_ELEMENTS`
logits (150 classes at 1024×2048 px, batch 8, holds 2.5·10⁹) trips a device-side assertion that ends the process.
:func:`pixel_cross_entropy` takes such logits in chunks of whole images, or of rows of one image when one image is
too large, each chunk under the limit, and gives the value and gradient of the one call: the sum over chunks divided
by the weight of every counted pixel.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MAX_LOSS_ELEMENTS", "PixelCrossEntropy", "check_loss_size", "pixel_cross_entropy"]

#: the most logits one cross-entropy call takes (32-bit indexing in CUDA's loss kernels)
MAX_LOSS_ELEMENTS = 2 ** 31 - 1


def check_loss_size(num_classes: int, width: int) -> None:
    """A one-line ValueError when one row of logits (``num_classes`` × ``width``, the smallest chunk
    :func:`pixel_cross_entropy` takes) is over :data:`MAX_LOSS_ELEMENTS`."""
    if num_classes * width > MAX_LOSS_ELEMENTS:
        raise ValueError(f"a row of {num_classes} classes × {width} px holds {num_classes * width} logits, over the "
                         f"{MAX_LOSS_ELEMENTS} one cross-entropy call can take; use narrower crops or inputs")


def loss_chunks(shape: Tuple[int, ...]) -> List[Tuple[slice, slice]]:
    """(images, rows) slices of logits of ``shape`` (B, C, H, W), each under :data:`MAX_LOSS_ELEMENTS`: whole images
    while one fits, else blocks of rows of one image."""
    batch, classes, height, width = shape
    per_image = classes * height * width
    if batch * per_image <= MAX_LOSS_ELEMENTS:
        return [(slice(0, batch), slice(0, height))]
    if per_image <= MAX_LOSS_ELEMENTS:
        step = MAX_LOSS_ELEMENTS // per_image
        return [(slice(b, min(b + step, batch)), slice(0, height)) for b in range(0, batch, step)]
    check_loss_size(classes, width)
    rows = MAX_LOSS_ELEMENTS // (classes * width)
    return [(slice(b, b + 1), slice(r, min(r + rows, height))) for b in range(batch) for r in range(0, height, rows)]


def pixel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                        ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), target, weight, ignore_index=..., label_smoothing=...)`` (mean over the
    pixels not ignored, each counted with its class's weight) for logits (B, C, H, W) and targets (B, H, W) of any
    size: in fp32 chunks under :data:`MAX_LOSS_ELEMENTS` when the logits are over it (:func:`loss_chunks`); a
    one-line ValueError before any work when one row of logits is over it too."""
    if logits.dim() != 4 or target.shape != (logits.shape[0], *logits.shape[2:]):
        raise ValueError(f"pixel_cross_entropy takes logits (B, C, H, W) and targets (B, H, W), got "
                         f"{tuple(logits.shape)} and {tuple(target.shape)}")
    options = {"weight": weight, "ignore_index": ignore_index, "label_smoothing": label_smoothing}
    chunks = loss_chunks(tuple(logits.shape))
    if len(chunks) == 1:
        return F.cross_entropy(logits.float(), target, **options)
    total = sum(F.cross_entropy(logits[b, :, r].float(), target[b, r], reduction="sum", **options)
                for b, r in chunks)
    # torch's mean divides by the summed weight of the counted pixels (their count without class weights)
    counted = target != ignore_index
    if weight is None:
        return total / counted.sum()
    return total / (weight[target.masked_fill(~counted, 0)] * counted).sum()


class PixelCrossEntropy(nn.Module):
    """:func:`pixel_cross_entropy` as a criterion module (``nn.CrossEntropyLoss``'s options, mean reduction)."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return pixel_cross_entropy(logits, target, self.weight, self.ignore_index, self.label_smoothing)
