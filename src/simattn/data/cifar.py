"""CIFAR-10/100 from the standard python-pickle files already on disk (torchvision's readers, never a download)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from torch.utils.data import Dataset

__all__ = ["cifar_dataset", "CIFAR_FOLDERS"]

#: dataset name → the folder torchvision's archive unpacks to
CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def cifar_dataset(name: str, root: str | os.PathLike, split: str = "train",
                  transform: Optional[Callable] = None) -> Dataset:
    """``torchvision.datasets.CIFAR10/100(root, train=..., download=False)`` with a one-line error when the files
    are missing or fail torchvision's checksum test.

    ``root`` may be the folder that holds ``cifar-10-batches-py`` / ``cifar-100-python`` or that folder itself.
    ``split``: 'train' or 'val'/'test' (CIFAR's test set is its validation set).
    """
    from torchvision.datasets import CIFAR10, CIFAR100
    if name not in CIFAR_FOLDERS:
        raise ValueError(f"unknown CIFAR dataset {name!r}; expected one of {', '.join(CIFAR_FOLDERS)}")
    if split not in ("train", "val", "test"):
        raise ValueError(f"{name}: unknown split {split!r}; expected 'train', 'val' or 'test'")
    root = Path(root)
    folder = CIFAR_FOLDERS[name]
    if root.name == folder:  # pointed at the unpacked folder itself
        root = root.parent
    if not (root / folder).is_dir():
        raise FileNotFoundError(f"{name}: {root / folder} not found (unpack the python version of {name} there; "
                                "nothing is downloaded)")
    cls = CIFAR10 if name == "cifar10" else CIFAR100
    try:
        return cls(str(root), train=split == "train", transform=transform, download=False)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
        raise FileNotFoundError(f"{name}: files in {root / folder} are missing or corrupt ({e})") from None
