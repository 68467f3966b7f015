"""Calibration images for static int8 quantization: real images of any dataset the tools read, preprocessed as the
model is evaluated (a segmentation dataset's: resized and normalised as its run did, at the program's input
size)."""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import torch

__all__ = ["open_calibration_dataset", "calibration_images", "segmentation_calibration_images"]


def open_calibration_dataset(name: str = "digits", root: Optional[str | os.PathLike] = None, split: str = "train"):
    """The dataset calibration reads (:func:`~simattn.data.factory.create_dataset`); one-line errors when it cannot
    be opened or is empty, so a command can check it before any work."""
    from .factory import create_dataset

    data = create_dataset(name, root, split)
    if len(data) == 0:
        raise ValueError(f"calibration data {name!r}{f' in {root}' if root else ''} ({split}) has no images")
    return data


def calibration_images(dataset, data_config: Mapping[str, Any], count: int, seed: int = 0) -> torch.Tensor:
    """``count`` images (fewer if the dataset is smaller) drawn at random (``seed``) from ``dataset``, through the
    evaluation transform of ``data_config`` (resize, center crop, normalize): a (N, C, H, W) tensor. Unreadable
    images are skipped; a ValueError when none can be read."""
    from timm.data import create_transform

    if count < 1:
        raise ValueError(f"calibration needs at least 1 image, got {count}")
    transform = create_transform(input_size=tuple(data_config["input_size"]),
                                 interpolation=data_config.get("interpolation", "bicubic"),
                                 mean=tuple(data_config["mean"]), std=tuple(data_config["std"]),
                                 crop_pct=data_config.get("crop_pct", 0.875), is_training=False)
    old = getattr(dataset, "transform", None)
    dataset.transform = transform
    try:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
        images = []
        for i in order:
            item = dataset[i]  # None (or a None image) for a file that cannot be decoded
            if item is not None and item[0] is not None:
                images.append(item[0])
            if len(images) == count:
                break
    finally:
        dataset.transform = old
    if not images:
        raise ValueError("calibration data: none of its images could be read")
    return torch.stack(images)


def segmentation_calibration_images(dataset, input_size, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` images (fewer if the dataset is smaller) drawn at random (``seed``) from a segmentation dataset
    opened with its evaluation transform (resized as the run resized them, normalised as it normalised them), each
    cut to the centre ``input_size`` (C, H, W) or padded there with zeros, as training crops and pads: a
    (N, C, H, W) tensor for a program that takes one input size."""
    import torch.nn.functional as F

    if count < 1:
        raise ValueError(f"calibration needs at least 1 image, got {count}")
    if len(dataset) == 0:
        raise ValueError("calibration data has no images")
    _, h, w = (int(v) for v in input_size)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()[:count]
    images = []
    for i in order:
        image = dataset[i][0]
        ih, iw = image.shape[-2:]
        top, left = max(ih - h, 0) // 2, max(iw - w, 0) // 2
        image = image[:, top:top + h, left:left + w]
        images.append(F.pad(image, (0, w - image.shape[-1], 0, h - image.shape[-2])))
    return torch.stack(images)
