"""ImageNet-style image folders (``root/<split>/<class>/<image>``) that skip unreadable images instead of crashing.

A large folder almost always holds a few broken files (truncated downloads, HTML saved as .jpg). Decoding happens
lazily in loader workers, so an unreadable image is replaced by ``None`` with a warning, and
:func:`collate_skipping_unreadable` drops it from the batch and reports how many it dropped; the training and
validation loops add those counts up for their summaries.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

__all__ = ["SkippingImageFolder", "image_folder", "collate_skipping_unreadable"]

_logger = logging.getLogger(__name__)


class SkippingImageFolder(ImageFolder):
    """``torchvision.datasets.ImageFolder`` whose items are ``None`` (with a warning) for files PIL cannot decode."""

    def __getitem__(self, index: int) -> Optional[Tuple[Any, int]]:
        path, target = self.samples[index]
        try:
            sample = self.loader(path)
        except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError, SyntaxError
            _logger.warning("skipping unreadable image %s: %s: %s", path, type(e).__name__, e)
            return None
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


def image_folder(root: str | os.PathLike, split: Optional[str] = None,
                 transform: Optional[Callable] = None) -> SkippingImageFolder:
    """Open ``root/split`` (``root`` itself when ``split`` is None) with one-line errors for a missing folder, a folder
    without class sub-folders, or class folders without images."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    folder = root / split if split else root
    if split and not folder.is_dir():
        raise FileNotFoundError(f"image folder {root} has no '{split}' split folder (expected {folder}/<class>/<image>)")
    class_dirs = sorted(d.name for d in os.scandir(folder) if d.is_dir() and not d.name.startswith("."))
    if not class_dirs:
        raise FileNotFoundError(f"image folder {folder} is empty: expected one sub-folder per class")
    try:
        return SkippingImageFolder(str(folder), transform=transform)
    except FileNotFoundError as e:  # class folders without any file that has an image extension
        raise FileNotFoundError(
            f"image folder {folder} holds no images with a known extension ({', '.join(IMG_EXTENSIONS)}): "
            f"{str(e).splitlines()[0]}") from None


def collate_skipping_unreadable(batch: Sequence[Optional[Tuple[Any, Any]]]) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """``default_collate`` over the readable samples: ``(images, targets, skipped)`` where ``skipped`` counts the
    ``None`` items (unreadable images) that were dropped."""
    kept: List[Tuple[Any, Any]] = [item for item in batch if item is not None]
    skipped = len(batch) - len(kept)
    if not kept:  # every image of the batch was unreadable: evaluation skips it, training stops with an error
        return torch.empty(0), torch.empty(0, dtype=torch.long), skipped
    images, targets = default_collate(kept)
    return images, targets, skipped
