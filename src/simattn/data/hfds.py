"""Hugging Face datasets saved with ``save_to_disk`` (``--dataset hfds --data-dir FOLDER``), as map-style datasets.

The folder is what ``datasets.load_from_disk`` reads: a ``DatasetDict`` (``dataset_dict.json`` and one folder per
split) or a single ``Dataset`` (``state.json``). Split names: a ``DatasetDict``'s own keys, with ``val`` and
``validation`` standing in for each other; a single ``Dataset`` is the split ``all`` (or the split name it was
saved with, when it has one).

Columns are found by their features:

* the image: a column of the ``Image`` feature (preferably one named ``image``/``img``/...), else a binary column
  (encoded image bytes) or a string column of image paths with such a name; images are decoded here (the column is
  read with ``Image(decode=False)``), as :func:`simattn.data.images.read_image` decodes files, and an unreadable
  image becomes ``None`` with a warning, as in image folders;
* classification: the label, a ``ClassLabel`` column (its names are the classes); an integer column without names
  is refused, since the class names are what weights and validation compare;
* segmentation: a second image column holding the mask (``mask``/``annotation``/``label``/...: class indices,
  255 = ignore), class names from a classes file as for segmentation folders.

Every label is checked against the classes when the split is opened, so a bad row stops the run before training.
Being map-style, these datasets go through the engine's samplers (shuffling, resume, DDP) like folders do.
"""
from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import Dataset

from ..utils.values import first_line
from .segmentation import (IGNORE_INDEX, STORED_READERS, FileSegmentationDataset, _lut, read_classes_file,
                           read_index_mask)

__all__ = ["HFImageDataset", "hfds_dataset", "hfds_segmentation_dataset", "open_hfds_split", "ALL_SPLIT"]

_logger = logging.getLogger(__name__)

#: the split name of a saved ``Dataset`` that has none
ALL_SPLIT = "all"
_SPLIT_ALIASES = {"val": "validation", "validation": "val"}
#: column names taken for the image (in this order) when several columns could hold one
IMAGE_NAMES = ("image", "img", "images", "jpg", "jpeg", "png", "webp", "picture", "photo")
LABEL_NAMES = ("label", "labels", "cls", "class", "target", "fine_label")
MASK_NAMES = ("mask", "annotation", "label", "segmentation", "semantic_mask", "segmentation_mask", "label_mask",
              "gt", "seg")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ValueError("dataset 'hfds' needs the Hugging Face datasets package: pip install 'simattn[hfds]'") \
            from None
    return datasets


def open_hfds_split(root, split: str):
    """``(dataset, root, split name used)``: split ``split`` of the dataset saved in ``root``, with one-line errors
    for a missing folder, a folder that is no saved dataset, and a missing split (naming the splits there)."""
    if root is None:
        raise ValueError("dataset 'hfds' needs a data directory (data_dir / --data-dir): a folder written by "
                         "datasets' save_to_disk")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"hfds folder not found: {root}")
    if not (root / "dataset_dict.json").is_file() and not (root / "state.json").is_file():
        raise ValueError(f"hfds folder {root} is not a dataset saved by datasets' save_to_disk (it has no "
                         "dataset_dict.json or state.json)")
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(root))
    except Exception as e:  # corrupt json, missing arrow files: datasets raises many kinds
        raise ValueError(f"hfds folder {root} cannot be loaded: {type(e).__name__}: "
                         f"{first_line(e, limit=300)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        key = split if split in loaded else _SPLIT_ALIASES.get(split)
        if key not in loaded:
            raise ValueError(f"hfds dataset {root} has no split {split!r} (splits there: {', '.join(loaded)})")
        return loaded[key], root, key
    own = str(loaded.split) if loaded.split else None
    if split not in (ALL_SPLIT, own):
        names = " or ".join(repr(s) for s in (ALL_SPLIT, own) if s)
        raise ValueError(f"hfds dataset {root} is one Dataset without splits, so split {split!r} is not there: use "
                         f"split {names} (or save a DatasetDict with the splits)")
    return loaded, root, split


def _kind(feature) -> str:
    """What a column can hold: 'image' (an Image feature), 'bytes', 'string', 'class' (ClassLabel), 'int', or ''."""
    datasets = _datasets()
    if isinstance(feature, datasets.Image):
        return "image"
    if isinstance(feature, datasets.ClassLabel):
        return "class"
    if isinstance(feature, datasets.Value):
        dtype = feature.dtype
        if dtype in ("binary", "large_binary"):
            return "bytes"
        if dtype in ("string", "large_string"):
            return "string"
        if dtype.startswith(("int", "uint")):
            return "int"
    if isinstance(feature, dict) and getattr(feature.get("bytes"), "dtype", None) in ("binary", "large_binary"):
        return "bytes"  # an Image column saved without its feature: {'bytes', 'path'} structs
    return ""


def _describe_columns(features) -> str:
    parts = []
    for name, feature in features.items():
        kind = type(feature).__name__
        if kind == "Value":
            kind = f"Value {feature.dtype}"
        elif isinstance(feature, dict):
            kind = "struct"
        parts.append(f"{name} ({kind})")
    return ", ".join(parts) or "none"


def _pick(candidates: Sequence[str], preferred: Sequence[str]) -> Optional[str]:
    lower = {c.lower(): c for c in candidates}
    for name in preferred:
        if name in lower:
            return lower[name]
    return None


def _image_column(features, exclude: Sequence[str] = (), prefer: Sequence[str] = IMAGE_NAMES) -> Optional[str]:
    """An Image column (preferably with a name of ``prefer``), else a bytes or path column with such a name."""
    names = [n for n in features if n not in exclude]
    images = [n for n in names if _kind(features[n]) == "image"]
    if images:
        return _pick(images, prefer) or images[0]
    encoded = [n for n in names if _kind(features[n]) in ("bytes", "string")]
    return _pick(encoded, prefer)


def _where(root: Path, split: str) -> str:
    return f"hfds dataset {root} (split {split!r})"


def open_stored_image(value, root: Path):
    """A stored image value (``{'bytes', 'path'}``, bytes, or a path) → an open PIL image; relative paths are tried
    as they are, then under ``root``."""
    from PIL import Image

    data, path = value, None
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
    elif isinstance(value, str):
        data, path = None, value
    if data is not None:
        return Image.open(io.BytesIO(data))
    if not path:
        raise ValueError("the row holds no image (neither bytes nor a path)")
    if not os.path.isabs(path) and not os.path.exists(path) and (root / path).exists():
        path = str(root / path)
    return Image.open(path)


def _rgb(img) -> Any:
    """An open PIL image decoded now, as 8-bit RGB (:func:`simattn.data.images.to_rgb`)."""
    from .images import to_rgb
    with img:
        img.load()
        return to_rgb(img)


class HFImageDataset(Dataset):
    """One split of a saved Hugging Face dataset as ``(image, label)`` items (``None`` for an unreadable image).

    Attributes: ``classes`` (the ClassLabel names), ``targets`` (every row's label), ``image_column``,
    ``label_column``, ``root``, ``split``; ``transform`` applies to the RGB PIL image.
    """

    def __init__(self, root, split: str = "train", transform: Optional[Callable] = None) -> None:
        datasets = _datasets()
        ds, self.root, self.split = open_hfds_split(root, split)
        where = _where(self.root, self.split)
        features = ds.features
        self.image_column = _image_column(features)
        if self.image_column is None:
            raise ValueError(f"{where} has no image column (an Image feature, or bytes/paths named "
                             f"{'/'.join(IMAGE_NAMES[:3])}); columns there: {_describe_columns(features)}")
        others = [n for n in features if n != self.image_column]
        labels = [n for n in others if _kind(features[n]) == "class"]
        self.label_column = _pick(labels, LABEL_NAMES) or (labels[0] if labels else None)
        if self.label_column is None:
            ints = [n for n in others if _kind(features[n]) == "int"]
            named = _pick(ints, LABEL_NAMES) or (ints[0] if ints else None)
            if named is not None:
                raise ValueError(f"{where}: label column {named!r} is a plain integer, so the class names are unknown; "
                                 f"give it names and save again: ds.cast_column({named!r}, ClassLabel(names=[...]))"
                                 ".save_to_disk(...)")
            raise ValueError(f"{where} has no label column (a ClassLabel feature); columns there: "
                             f"{_describe_columns(features)}")
        self.classes: List[str] = list(features[self.label_column].names)
        self.targets = self._read_labels(ds, where)
        images = ds.select_columns([self.image_column])
        if _kind(features[self.image_column]) == "image":
            images = images.cast_column(self.image_column, datasets.Image(decode=False))  # decoded here, see _rgb
        self._images = images
        self.transform = transform

    def _read_labels(self, ds, where: str) -> np.ndarray:
        column = ds.select_columns([self.label_column]).with_format("arrow")[self.label_column]
        if column.null_count:
            row = int(np.flatnonzero(np.asarray(column.is_null()))[0])
            raise ValueError(f"{where}: row {row} has no label in column {self.label_column!r}")
        targets = np.asarray(column, dtype=np.int64)
        bad = np.flatnonzero((targets < 0) | (targets >= len(self.classes)))
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"{where}: row {row} has label {int(targets[row])} in column {self.label_column!r}, "
                             f"outside its {len(self.classes)} classes 0..{len(self.classes) - 1}"
                             + (" (-1: ClassLabel's 'no label')" if targets[row] == -1 else "")
                             + (f" ({bad.size} rows in all)" if bad.size > 1 else ""))
        return targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        value = self._images[int(index)][self.image_column]
        try:
            img = _rgb(open_stored_image(value, self.root))
        except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError, SyntaxError
            _logger.warning("skipping unreadable image at row %d of %s: %s: %s", index,
                            _where(self.root, self.split), type(e).__name__, first_line(e, limit=300))
            return None
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])

    def __repr__(self) -> str:
        return f"HFImageDataset({str(self.root)!r}, split={self.split!r}, {len(self)} images, {len(self.classes)} " \
               "classes)"


def hfds_dataset(root, split: str = "train", transform: Optional[Callable] = None) -> HFImageDataset:
    """Classification split ``split`` of the dataset saved in ``root`` (see the module docstring)."""
    return HFImageDataset(root, split, transform)


def hfds_segmentation_dataset(root, split: str = "train", classes_file=None, transform: Optional[Callable] = None):
    """Segmentation split ``split`` of the dataset saved in ``root``: an image and a mask column (class indices 0..K-1,
    255 ignored), class names from ``classes_file`` (default ``<root>/classes.txt``, one name per line)."""
    datasets = _datasets()
    ds, root, split = open_hfds_split(root, split)
    where = _where(root, split)
    features = ds.features
    mask = _image_column(features, prefer=MASK_NAMES)
    mask = mask if mask is not None and mask.lower() in MASK_NAMES else None
    image = _image_column(features, exclude=[mask] if mask else [])
    if image is None or mask is None:
        missing = "image column" if image is None else f"mask column (an image column named {'/'.join(MASK_NAMES[:4])})"
        raise ValueError(f"{where} has no {missing}: segmentation needs an image and a mask column; columns there: "
                         f"{_describe_columns(features)}")
    if classes_file is None:
        classes_file = root / "classes.txt"
        if not classes_file.is_file():
            raise FileNotFoundError(f"{where}: no class names: give classes_file (--dataset-kwargs "
                                    f"classes_file=FILE, one name per line) or put classes.txt in {root}")
    names = read_classes_file(classes_file)
    lut = _lut({**{k: k for k in range(len(names))}, IGNORE_INDEX: IGNORE_INDEX})
    columns = ds.select_columns([image, mask])
    for name in (image, mask):
        if _kind(features[name]) == "image":
            columns = columns.cast_column(name, datasets.Image(decode=False))
    rows = [f"{root}[{split}][{i}]" for i in range(len(ds))]
    return _HFSegmentation(columns, image, mask, root, "hfds", names, rows, [f"{r}.{mask}" for r in rows],
                           [f"{split}_{i:06d}" for i in range(len(ds))], lut,
                           f"0..{len(names) - 1} (the classes of the classes file) and 255 (ignored)",
                           transform=transform)


class _HFSegmentation(FileSegmentationDataset):
    """Image and mask columns of a saved Hugging Face dataset; ``images``/``masks`` name the rows in errors."""

    def __init__(self, columns, image_column: str, mask_column: str, root: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._columns, self.image_column, self.mask_column, self.root = columns, image_column, mask_column, root

    def read(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        row = self._columns[int(index)]
        image_name, mask_name = self.images[index], self.masks[index]
        try:
            image = np.array(_rgb(open_stored_image(row[self.image_column], self.root)))
        except Exception as e:
            raise ValueError(f"cannot read image {image_name}: {type(e).__name__}: "
                             f"{first_line(e, limit=300)}") from None
        raw = read_index_mask(lambda: open_stored_image(row[self.mask_column], self.root), mask_name,
                              image.shape[:2])
        return image, self.map_labels(raw, mask_name)


STORED_READERS["hfds"] = hfds_segmentation_dataset
