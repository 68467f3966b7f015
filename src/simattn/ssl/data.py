"""Image datasets for self-supervised pretraining and its evaluations.

A recipe's ``data`` section names any dataset :func:`simattn.data.create_dataset` reads (``name``) and its root
(``root``): ``digits`` is the embedded scikit-learn digits data (train/val split, no download), ``folder`` an
ImageNet-style layout ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``, ``wds`` webdataset shards (a
folder with ``_info.json``, a brace pattern or a ``pipe:`` URL). Labels are never used by pretraining, only by the
k-NN and linear evaluations.
"""
from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional

from torch.utils.data import Dataset

__all__ = ["build_image_dataset", "dataset_names"]


def dataset_names() -> List[str]:
    """The names a ``data.name`` may take: every dataset :func:`simattn.data.create_dataset` knows."""
    from ..data.factory import DATASETS
    return list(DATASETS)


def build_image_dataset(data: Mapping[str, Any], split: str, transform: Optional[Callable] = None) -> Dataset:
    """The ``split`` ('train' or 'val') of the dataset described by a recipe's ``data`` section."""
    from ..data.factory import DATASETS, create_dataset
    name = data.get("name")
    if DATASETS.get(str(name).lower()) not in (None, "digits") and not data.get("root"):
        raise ValueError(f"data.root is required for data.name {name!r} (the dataset's root or shards)")
    return create_dataset(name, data.get("root"), split, transform)
