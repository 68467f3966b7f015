"""One entry point for every dataset the tools read: ``create_dataset(name, root, split, transform)``.

Every dataset returned yields ``(image, label)`` (``None`` for an unreadable image file) and has a ``classes``
list, so callers can check a model's class count against it.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from torch.utils.data import Dataset

__all__ = ["DATASETS", "create_dataset", "dataset_classes"]

#: accepted names → canonical name ('folder': ImageNet-style ``root/<split>/<class>/<image>``)
DATASETS = {
    "digits": "digits",
    "folder": "folder", "imagefolder": "folder", "imagenet": "folder",
    "cifar10": "cifar10", "cifar100": "cifar100",
    "wds": "wds",
    "hfds": "hfds",
}


def create_dataset(name: str, root: Optional[str | os.PathLike] = None, split: str = "train",
                   transform: Optional[Callable] = None) -> Dataset:
    """Open dataset ``name`` ('digits' (embedded, no root), 'folder'/'imagenet', 'cifar10', 'cifar100', 'wds'
    (webdataset shards: a folder with ``_info.json``, a brace pattern or a ``pipe:`` URL; an IterableDataset),
    'hfds' (a folder written by Hugging Face datasets' ``save_to_disk``)).

    Unknown names, a missing root, and missing or empty folders raise a one-line ValueError/FileNotFoundError.
    """
    kind = DATASETS.get(str(name).lower())
    if kind is None:
        from ..utils.recipe import quoted
        raise ValueError(f"unknown dataset {quoted(name)}; known: {', '.join(DATASETS)}")
    if kind == "digits":
        from .digits import DigitsDataset
        return DigitsDataset(split, transform=transform)
    if root is None:
        raise ValueError(f"dataset {name!r} needs a data directory (data_dir / --data-dir)")
    if kind == "wds":
        from .shards import open_shards
        return open_shards(root, split, transform)
    if kind == "folder":
        from .folder import image_folder
        return image_folder(root, split, transform=transform)
    if kind == "hfds":
        from .hfds import hfds_dataset
        return hfds_dataset(root, split, transform=transform)
    from .cifar import cifar_dataset
    return cifar_dataset(kind, root, split, transform=transform)


def dataset_classes(dataset: Dataset) -> Sequence[str]:
    """The class names of a dataset made by :func:`create_dataset` (or any dataset with ``classes``)."""
    classes = getattr(dataset, "classes", None)
    if classes is None:
        raise ValueError(f"{type(dataset).__name__} does not list its classes")
    return list(classes)
