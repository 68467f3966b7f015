"""The embedded default dataset: scikit-learn's 1,797 real 8×8 handwritten digits (10 classes), no download.

The split is deterministic and stratified (a fixed seed), so every run and every process sees the same images.
Images are returned as RGB PIL images so timm's transforms (resize, augment, normalize) apply unchanged.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["DigitsDataset", "digits_tensors", "DIGITS_CLASSES"]

DIGITS_CLASSES = tuple(str(i) for i in range(10))
_SPLITS = ("train", "val", "all")


@lru_cache(maxsize=None)
def _split_indices(val_fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    data = load_digits()
    images = (data.images * (255.0 / 16.0)).round().clip(0, 255).astype(np.uint8)  # (1797, 8, 8)
    labels = data.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    val = []
    for c in range(10):  # stratified: the same fraction of every class
        idx = np.flatnonzero(labels == c)
        val.extend(rng.permutation(idx)[: int(round(len(idx) * val_fraction))])
    val = np.sort(np.asarray(val))
    train = np.setdiff1d(np.arange(len(labels)), val)
    return images, labels, train, val


class DigitsDataset(Dataset):
    """scikit-learn's digits as a map-style dataset of (RGB PIL image, label).

    Args:
        split: 'train' (80%), 'val' (20%) or 'all'.
        transform: applied to the PIL image (e.g. a timm transform); None returns the PIL image.
        val_fraction, seed: the deterministic stratified split.
    """

    classes = DIGITS_CLASSES

    def __init__(self, split: str = "train", transform: Optional[Callable] = None, val_fraction: float = 0.2,
                 seed: int = 0) -> None:
        if split not in _SPLITS:
            raise ValueError(f"digits: unknown split {split!r}; expected one of {', '.join(_SPLITS)}")
        images, labels, train, val = _split_indices(val_fraction, seed)
        idx = {"train": train, "val": val, "all": np.arange(len(labels))}[split]
        self.images, self.targets = images[idx], labels[idx]
        self.transform = transform
        self.split = split

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        from PIL import Image
        img = Image.fromarray(self.images[i], mode="L").convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[i])


def digits_tensors(split: str = "val", img_size: int = 32, normalize: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """The whole split as a float tensor (N, 3, img_size, img_size) (bilinear resize, ImageNet normalization when
    ``normalize``) and labels (N,): for quick evaluations (k-NN, export accuracy) without a DataLoader."""
    ds = DigitsDataset(split)
    x = torch.from_numpy(ds.images).float().div_(255.0)[:, None].expand(-1, 3, -1, -1)
    x = torch.nn.functional.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    if normalize:
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
        x = (x - mean) / std
    return x.contiguous(), torch.from_numpy(ds.targets)
