"""Image datasets for self-supervised pretraining and its evaluations.

``name: digits`` is the embedded scikit-learn digits data (train/val split, no download); ``name: folder`` reads an
ImageNet-style layout ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg`` with torchvision's ImageFolder.
Labels are never used by pretraining, only by the k-NN and linear evaluations.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from torch.utils.data import Dataset

__all__ = ["build_image_dataset", "DATASET_NAMES"]

DATASET_NAMES = ("digits", "folder")


def build_image_dataset(data: Mapping[str, Any], split: str, transform: Optional[Callable] = None) -> Dataset:
    """The ``split`` ('train' or 'val') of the dataset described by a recipe's ``data`` section."""
    name = data.get("name")
    if name == "digits":
        from ..data import DigitsDataset
        return DigitsDataset(split, transform=transform)
    if name == "folder":
        if not data.get("root"):
            raise ValueError("data.root is required for data.name 'folder' (a folder with train/ and val/)")
        from ..data.folder import image_folder
        return image_folder(data["root"], split, transform=transform)
    from ..utils.recipe import quoted
    raise ValueError(f"unknown data.name {quoted(name)}; expected one of {', '.join(DATASET_NAMES)}")
