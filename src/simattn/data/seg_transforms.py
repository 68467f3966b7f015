"""Joint image + mask transforms for semantic segmentation, with mmsegmentation's ADE20K pipeline semantics.

Training (:class:`SegTrainTransform`): random rescale (``scale`` × a ratio drawn from ``ratio_range``, aspect ratio
kept; image bilinear, mask nearest), random crop of ``crop_size`` that is redrawn (up to 10 times) while one class
covers more than ``cat_max_ratio`` of the crop's labelled pixels, horizontal flip, photometric distortion
(brightness, contrast, saturation, hue, each applied with probability 1/2), normalisation, and padding to
``crop_size`` (image 0 after normalisation, mask ``ignore_index``).

Evaluation (:class:`SegEvalTransform`): the image resized keeping its aspect ratio to fit ``scale`` (mmseg's test
``Resize(keep_ratio=True)``), normalised; the mask is kept at its original size (predictions are resized to it).

Images are uint8 (H, W, 3) arrays, masks integer (H, W) arrays of train ids (``ignore_index`` for unlabelled pixels).
Random draws come from a numpy Generator seeded by one draw of torch's default generator, so the engine's per-sample
seeding of torch makes every crop reproducible; the global numpy RNG is never used.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "SegTrainTransform", "SegEvalTransform", "rescale_size", "resize_pair",
           "random_crop_box", "photometric_distortion", "to_tensors", "torch_seeded_generator"]

#: timm's IMAGENET_DEFAULT_MEAN / _STD (images in [0, 1])
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def torch_seeded_generator() -> np.random.Generator:
    """A numpy Generator seeded from torch's default generator (one draw), so torch's seeding governs it."""
    return np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,)).item()))


def _pair(value, option: str, integer: bool = True) -> Tuple:
    kind = int if integer else float
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value, value)
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        a, b = value
        out = (kind(a), kind(b))
        ok = all(not isinstance(v, bool) and (float(v) == kind(v)) for v in (a, b)) if integer else True
    except (TypeError, ValueError):
        ok, out = False, None
    if not ok or not all(math.isfinite(v) and v > 0 for v in out):
        from ..utils.values import quoted
        raise ValueError(f"{option}={quoted(value)}: expected one or two positive "
                         f"{'integers' if integer else 'numbers'}")
    return out


def _mean_std(mean, std) -> Tuple[np.ndarray, np.ndarray]:
    from ..utils.values import quoted
    out = []
    for option, value in (("mean", mean), ("std", std)):
        try:
            arr = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            arr = np.zeros(0)
        if arr.size == 1:
            arr = np.repeat(arr, 3)
        if arr.size != 3 or not np.all(np.isfinite(arr)) or (option == "std" and not np.all(arr > 0)):
            raise ValueError(f"{option}={quoted(value)}: expected 3 finite numbers (per RGB channel, images in "
                             f"[0, 1]){', all > 0' if option == 'std' else ''}")
        out.append(arr.astype(np.float32))
    return out[0], out[1]


def rescale_size(height: int, width: int, scale: Sequence[float]) -> Tuple[int, int]:
    """(new height, new width) of an image fitted into ``scale`` keeping its aspect ratio: the long side at most
    ``max(scale)`` and the short side at most ``min(scale)``, whichever binds (mmcv's ``rescale_size``); images may
    grow as well as shrink."""
    factor = min(max(scale) / max(height, width), min(scale) / min(height, width))
    return max(1, int(height * factor + 0.5)), max(1, int(width * factor + 0.5))


def resize_pair(image: np.ndarray, mask: Optional[np.ndarray], size: Tuple[int, int]
                ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """``image`` (bilinear) and ``mask`` (nearest, or None) resized to ``size`` = (height, width)."""
    from PIL import Image
    h, w = size
    if image.shape[:2] != (h, w):
        image = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))
        if mask is not None:
            mask = np.asarray(Image.fromarray(mask.astype(np.uint8)).resize((w, h), Image.NEAREST))
    return image, mask


def random_crop_box(mask: np.ndarray, crop_size: Tuple[int, int], rng: np.random.Generator,
                    cat_max_ratio: float = 1.0, ignore_index: int = 255, tries: int = 10) -> Tuple[int, int, int, int]:
    """(top, left, height, width) of a random crop of at most ``crop_size`` = (height, width); redrawn up to ``tries``
    times while a single class covers ``cat_max_ratio`` or more of its labelled pixels (the last draw is kept)."""
    h, w = mask.shape[:2]
    ch, cw = min(crop_size[0], h), min(crop_size[1], w)

    def draw():
        return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))

    top, left = draw()
    if cat_max_ratio < 1.0:
        for _ in range(tries):
            counts = np.bincount(mask[top:top + ch, left:left + cw].reshape(-1), minlength=256)
            if ignore_index < counts.size:
                counts[ignore_index] = 0
            counts = counts[counts > 0]
            if counts.size > 1 and counts.max() / counts.sum() < cat_max_ratio:
                break
            top, left = draw()
    return top, left, ch, cw


def photometric_distortion(image: np.ndarray, rng: np.random.Generator, brightness_delta: float = 32.0,
                           contrast_range: Tuple[float, float] = (0.5, 1.5),
                           saturation_range: Tuple[float, float] = (0.5, 1.5), hue_delta: int = 18) -> np.ndarray:
    """mmseg's PhotoMetricDistortion on a uint8 RGB image: brightness (± ``brightness_delta``), contrast (before or
    after the colour steps, at random), saturation, hue (± ``hue_delta`` on a 180-step circle), each with
    probability 1/2."""
    from PIL import Image
    img = image.astype(np.float32)
    if rng.integers(2):  # each step clips to the 8-bit range, as mmseg's does
        img = np.clip(img + rng.uniform(-brightness_delta, brightness_delta), 0, 255)
    contrast_first = bool(rng.integers(2))

    def contrast(x):
        return np.clip(x * rng.uniform(*contrast_range), 0, 255) if rng.integers(2) else x

    if contrast_first:
        img = contrast(img)
    do_saturation, do_hue = bool(rng.integers(2)), bool(rng.integers(2))
    if do_saturation or do_hue:
        hsv = np.asarray(Image.fromarray(img.round().astype(np.uint8)).convert("HSV")).astype(
            np.float32)
        if do_saturation:
            hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(*saturation_range), 0, 255)
        if do_hue:  # PIL's hue runs over 0..255 for the full circle
            hsv[..., 0] = np.mod(hsv[..., 0] + int(rng.integers(-hue_delta, hue_delta + 1)) * 256.0 / 180.0, 256.0)
        img = np.asarray(Image.fromarray(hsv.round().clip(0, 255).astype(np.uint8), mode="HSV").convert("RGB")
                         ).astype(np.float32)
    if not contrast_first:
        img = contrast(img)
    return np.clip(img, 0, 255).round().astype(np.uint8)


def to_tensors(image: np.ndarray, mask: Optional[np.ndarray], mean: np.ndarray, std: np.ndarray
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """uint8 (H, W, 3) → normalised float32 (3, H, W); mask → int64 (H, W)."""
    x = (image.astype(np.float32) / 255.0 - mean) / std
    x = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask).astype(np.int64))
    return x, m


class SegTrainTransform:
    """The training pipeline (see the module docstring). Sizes are (height, width); ``scale`` is (long, short) sides
    as in mmseg's ``scale=(2048, 512)``; an int means a square size."""

    def __init__(self, crop_size=(512, 512), scale=(2048, 512), ratio_range=(0.5, 2.0), cat_max_ratio: float = 0.75,
                 hflip_prob: float = 0.5, photometric: bool = True, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 ignore_index: int = 255) -> None:
        from ..utils.values import quoted
        self.crop_size = _pair(crop_size, "crop_size")
        self.scale = _pair(scale, "scale")
        lo, hi = _pair(ratio_range, "ratio_range", integer=False)
        if lo > hi:
            raise ValueError(f"ratio_range={quoted(ratio_range)}: expected (low, high) with 0 < low <= high")
        self.ratio_range = (lo, hi)
        if isinstance(cat_max_ratio, bool) or not isinstance(cat_max_ratio, (int, float)) \
                or not 0 < cat_max_ratio <= 1:
            raise ValueError(f"cat_max_ratio={quoted(cat_max_ratio)}: expected a number in (0, 1] (1 = no check)")
        if isinstance(hflip_prob, bool) or not isinstance(hflip_prob, (int, float)) or not 0 <= hflip_prob <= 1:
            raise ValueError(f"hflip_prob={quoted(hflip_prob)}: expected a probability in [0, 1]")
        self.cat_max_ratio, self.hflip_prob = float(cat_max_ratio), float(hflip_prob)
        self.photometric = bool(photometric)
        self.mean, self.std = _mean_std(mean, std)
        self.ignore_index = int(ignore_index)

    def __call__(self, image: np.ndarray, mask: np.ndarray, rng: Optional[np.random.Generator] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        rng = rng if rng is not None else torch_seeded_generator()
        ratio = rng.uniform(*self.ratio_range)
        h, w = image.shape[:2]
        image, mask = resize_pair(image, mask, rescale_size(h, w, [s * ratio for s in self.scale]))
        top, left, ch, cw = random_crop_box(mask, self.crop_size, rng, self.cat_max_ratio, self.ignore_index)
        image, mask = image[top:top + ch, left:left + cw], mask[top:top + ch, left:left + cw]
        if rng.random() < self.hflip_prob:
            image, mask = image[:, ::-1], mask[:, ::-1]
        if self.photometric:
            image = photometric_distortion(image, rng)
        x, m = to_tensors(image, mask, self.mean, self.std)
        H, W = self.crop_size
        if (ch, cw) != (H, W):  # the rescaled image is smaller than the crop: pad bottom and right
            x = torch.nn.functional.pad(x, (0, W - cw, 0, H - ch), value=0.0)
            m = torch.nn.functional.pad(m, (0, W - cw, 0, H - ch), value=self.ignore_index)
        return x, m


class SegEvalTransform:
    """The evaluation pipeline: the image resized keeping its aspect ratio to fit ``scale`` (None: kept as is) and
    normalised; the mask at its original size, as int64."""

    def __init__(self, scale=(2048, 512), mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:
        self.scale = None if scale is None else _pair(scale, "scale")
        self.mean, self.std = _mean_std(mean, std)

    def __call__(self, image: np.ndarray, mask: np.ndarray, rng: Optional[np.random.Generator] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.scale is not None:
            image, _ = resize_pair(image, None, rescale_size(*image.shape[:2], self.scale))
        return to_tensors(image, mask, self.mean, self.std)
