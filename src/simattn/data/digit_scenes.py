"""The embedded segmentation dataset: scenes of scikit-learn's handwritten digits, made on the fly (no download).

Each scene is a square canvas with a background of random colour, gradient and noise, on which a few digits
(``digits_per_scene``) are pasted at random sizes (``digit_size`` pixels) and places, each in its own brighter,
tinted colour at a random contrast. Pixels where a digit's stroke is drawn (its upscaled intensity above a
threshold) are labelled with that digit's class (1..10 for the digits 0..9); everything else is background (0).
Train scenes use only the train digits of :mod:`simattn.data.digits`' deterministic split, val scenes only its val
digits, so the validation measures generalisation to unseen handwriting.

Scene ``i`` of a split is drawn from its own RNG seeded by (seed, split, i): the same in every process and
independent of how many scenes are made. A split's scenes are generated once per process (about 0.2 ms per 64-pixel
scene) and cached.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Tuple

import numpy as np

__all__ = ["DIGIT_SCENE_CLASSES", "SPLITS", "digit_scenes", "default_digit_size"]

DIGIT_SCENE_CLASSES = ("background",) + tuple(str(d) for d in range(10))
#: split name → its code in the scene seeds
SPLITS = {"train": 0, "val": 1}
#: an upscaled digit pixel brighter than this (of 255) is stroke, i.e. labelled with the digit
STROKE_THRESHOLD = 100.0


@lru_cache(maxsize=None)
def _upscale_matrix(size: int, source: int = 8) -> np.ndarray:
    """(size, source) bilinear interpolation weights (pixel centres aligned, edges clamped): ``M @ d @ M.T``
    resizes a (source, source) image to (size, size)."""
    pos = np.clip((np.arange(size) + 0.5) * source / size - 0.5, 0, source - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, source - 1)
    frac = pos - lo
    m = np.zeros((size, source), np.float32)
    m[np.arange(size), lo] += 1 - frac
    m[np.arange(size), hi] += frac
    return m


@lru_cache(maxsize=None)
def _noise_field(canvas: int) -> np.ndarray:
    return np.random.default_rng(12345).standard_normal((4 * canvas, 4 * canvas, 3), dtype=np.float32)


def _scene(rng: np.random.Generator, digits: np.ndarray, labels: np.ndarray, canvas: int,
           per_scene: Tuple[int, int], sizes: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    c = canvas
    base = rng.uniform(0, 110, size=3).astype(np.float32)
    ramp = np.linspace(-0.5, 0.5, c, dtype=np.float32)
    gx, gy = rng.uniform(-50, 50, size=2)
    image = (base + (gx * ramp[None, :] + gy * ramp[:, None])[..., None]).astype(np.float32)
    mask = np.zeros((c, c), np.uint8)
    occupied = np.zeros((c, c), bool)
    for _ in range(int(rng.integers(per_scene[0], per_scene[1] + 1))):
        j = int(rng.integers(len(labels)))
        s = int(rng.integers(sizes[0], sizes[1] + 1))
        for _try in range(10):  # prefer free space, accept some overlap after 10 tries
            y, x = (int(v) for v in rng.integers(0, c - s + 1, size=2))
            if np.count_nonzero(occupied[y:y + s, x:x + s]) < 0.15 * s * s:
                break
        m = _upscale_matrix(s)
        up = m @ digits[j] @ m.T
        alpha = np.clip(up * (rng.uniform(0.8, 1.2) / 255.0), 0, 1)[..., None]
        colour = np.clip(base + rng.uniform(80, 170) + rng.uniform(-35, 35, size=3), 0, 255).astype(np.float32)
        patch = image[y:y + s, x:x + s]
        patch *= 1 - alpha
        patch += alpha * colour
        mask[y:y + s, x:x + s][up > STROKE_THRESHOLD] = labels[j] + 1
        occupied[y:y + s, x:x + s] = True
    # pixel noise: a random window of a fixed noise field, far cheaper than drawing c*c*3 normals per scene
    noise = _noise_field(c)
    y, x = (int(v) for v in rng.integers(0, noise.shape[0] - c + 1, size=2))
    image += noise[y:y + c, x:x + c] * np.float32(rng.uniform(3, 12))
    return np.clip(image, 0, 255).round().astype(np.uint8), mask


@lru_cache(maxsize=8)
def digit_scenes(split: str, count: int, canvas: int = 64, digits_per_scene: Tuple[int, int] = (2, 4),
                 digit_size: Tuple[int, int] = (12, 40), seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The first ``count`` scenes of ``split``: uint8 images (count, canvas, canvas, 3) and masks (count, canvas,
    canvas) of class ids (read-only; cached per process)."""
    from .digits import _split_indices
    images, labels, train, val = _split_indices(0.2, 0)
    pool = train if split == "train" else val
    digits = images[pool].astype(np.float32)
    pool_labels = labels[pool]
    out_images = np.empty((count, canvas, canvas, 3), np.uint8)
    out_masks = np.empty((count, canvas, canvas), np.uint8)
    for i in range(count):
        rng = np.random.default_rng([seed, SPLITS[split], i])
        out_images[i], out_masks[i] = _scene(rng, digits, pool_labels, canvas, digits_per_scene, digit_size)
    out_images.flags.writeable = False
    out_masks.flags.writeable = False
    return out_images, out_masks


def default_digit_size(canvas: int) -> Tuple[int, int]:
    """Digit sides from 3/16 to 5/8 of the canvas (12..40 pixels on 64)."""
    return canvas * 3 // 16, canvas * 5 // 8
