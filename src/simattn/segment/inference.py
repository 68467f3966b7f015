"""Per-pixel prediction of one image by a segmentation network or a deployed file: the whole image, or sliding
windows of ``crop`` and ``stride`` (logits of overlapping windows averaged), optionally with horizontal flips and
several scales (class probabilities averaged), as mmseg's ``whole`` / ``slide`` test modes do.

``fn`` maps a (B, 3, h, w) float batch to logits (B, classes, h, w); a network or a deployed program that takes one
fixed size gets exactly that size: ``input_size`` makes whole-image inference resize to it, and windows are padded
to ``crop`` (the padding's logits are cut away).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["predict_logits", "predict", "MODES"]

MODES = ("whole", "slide")
Size = Tuple[int, int]


def _whole(fn: Callable, image: torch.Tensor, input_size: Optional[Size]) -> torch.Tensor:
    h, w = image.shape[-2:]
    if input_size is not None and tuple(input_size) != (h, w):
        resized = F.interpolate(image, size=tuple(input_size), mode="bilinear", align_corners=False)
        return F.interpolate(fn(resized), size=(h, w), mode="bilinear", align_corners=False)
    return fn(image)


def _slide(fn: Callable, image: torch.Tensor, crop: Size, stride: Size, num_classes: int) -> torch.Tensor:
    b, _, h, w = image.shape
    (ch, cw), (sh, sw) = crop, stride
    rows = max(h - ch + sh - 1, 0) // sh + 1
    cols = max(w - cw + sw - 1, 0) // sw + 1
    logits = image.new_zeros((b, num_classes, h, w))
    count = image.new_zeros((1, 1, h, w))
    for r in range(rows):
        for c in range(cols):
            y1, x1 = r * sh, c * sw
            y2, x2 = min(y1 + ch, h), min(x1 + cw, w)
            y1, x1 = max(y2 - ch, 0), max(x2 - cw, 0)
            window = image[:, :, y1:y2, x1:x2]
            wh, ww = window.shape[-2:]
            if (wh, ww) != (ch, cw):  # an image smaller than the crop: pad it to the size the network takes
                window = F.pad(window, (0, cw - ww, 0, ch - wh))
            logits[:, :, y1:y2, x1:x2] += fn(window)[:, :, :wh, :ww].float()
            count[:, :, y1:y2, x1:x2] += 1
    return logits / count


def predict_logits(fn: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, num_classes: int, *,
                   out_size: Optional[Size] = None, mode: str = "whole", crop: Optional[Size] = None,
                   stride: Optional[Size] = None, flip: bool = False, scales: Sequence[float] = (1.0,),
                   input_size: Optional[Size] = None) -> torch.Tensor:
    """Class scores (B, classes, H, W) at ``out_size`` (default the image's size): logits for one view, the mean of
    softmax probabilities when several views (flips, scales) are combined."""
    if mode not in MODES:
        raise ValueError(f"unknown inference mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "slide" and (crop is None or stride is None):
        raise ValueError("slide inference needs crop and stride")
    out_size = tuple(out_size or image.shape[-2:])
    views = []
    for scale in scales:
        scaled = image
        if scale != 1.0:
            size = (max(1, round(image.shape[-2] * scale)), max(1, round(image.shape[-1] * scale)))
            scaled = F.interpolate(image, size=size, mode="bilinear", align_corners=False)
        for flipped in ((False, True) if flip else (False,)):
            x = scaled.flip(-1) if flipped else scaled
            out = _whole(fn, x, input_size) if mode == "whole" else _slide(fn, x, crop, stride, num_classes)
            out = out.float()
            if flipped:
                out = out.flip(-1)
            views.append(F.interpolate(out, size=out_size, mode="bilinear", align_corners=False)
                         if tuple(out.shape[-2:]) != out_size else out)
    if len(views) == 1:
        return views[0]
    return torch.stack([v.softmax(1) for v in views]).mean(0)


def predict(fn: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, num_classes: int,
            **options) -> torch.Tensor:
    """The label map(s) (B, H, W) int64: the argmax of :func:`predict_logits`."""
    return predict_logits(fn, image, num_classes, **options).argmax(1)
