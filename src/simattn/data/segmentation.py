"""Semantic segmentation datasets: ADE20K, Pascal VOC 2012, Cityscapes and a generic image/mask folder read in the
layouts they are distributed in, plus the embedded digit scenes (:mod:`simattn.data.digit_scenes`).

Every dataset yields ``(image, mask)``: a normalised float32 (3, H, W) tensor and an int64 (H, W) tensor of train ids
(0..num_classes-1, ``ignore_index`` = 255 for unlabelled pixels), made by the joint transforms of
:mod:`simattn.data.seg_transforms`. Each dataset's own label values are mapped to train ids when a mask is read
(ADE20K: 0 → 255, k → k-1; Cityscapes: labelId → trainId by the official table; VOC and folders: as stored) and
mapped back by :meth:`SegmentationDataset.encode_prediction` for saved predictions.

Bad data stops with a one-line error naming the file and what is allowed: an image without a mask (found when the
dataset is opened, by comparing the file stems of both folders), and, when a sample is read, a mask whose size
differs from its image's, a mask value outside the dataset's labels, or a colour (RGB/RGBA) mask where an index mask
(PIL mode 'P', 'L' or 'I') is expected.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..utils.values import first_line
from .digit_scenes import DIGIT_SCENE_CLASSES, SPLITS, default_digit_size, digit_scenes
from .seg_transforms import IMAGENET_MEAN, IMAGENET_STD, SegEvalTransform, SegTrainTransform

__all__ = ["SEG_DATASETS", "IGNORE_INDEX", "ADE20K_CLASSES", "VOC_CLASSES", "SegmentationDataset",
           "FileSegmentationDataset", "DigitScenes", "DIGIT_SCENE_OPTIONS", "create_segmentation_dataset",
           "ade20k_dataset", "voc_dataset", "cityscapes_dataset", "folder_dataset", "read_classes_file",
           "color_palette", "cityscapes_table"]

_logger = logging.getLogger(__name__)

IGNORE_INDEX = 255

#: accepted names → canonical name
SEG_DATASETS = {
    "digits": "digits", "digit_scenes": "digits",
    "ade20k": "ade20k", "ade": "ade20k",
    "voc": "voc", "voc2012": "voc", "pascal_voc": "voc",
    "cityscapes": "cityscapes",
    "folder": "folder",
    "wds": "wds",
    "hfds": "hfds",
}

#: the 150 classes of the ADE20K scene-parsing benchmark (SceneParsing / ADEChallengeData2016), in label order 1..150
ADE20K_CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path",
    "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase",
    "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm",
    "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light",
    "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver", "airplane", "dirt track",
    "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet", "poster", "stage", "van",
    "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool", "barrel",
    "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank", "trade name",
    "microwave", "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce",
    "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board",
    "shower", "radiator", "glass", "clock", "flag",
)

#: Pascal VOC 2012 segmentation classes: background + 20 objects, in label order 0..20
VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)

_IMAGE_EXTS = (".jpg", ".jpeg", ".png")
#: PIL modes whose pixel values are the labels (a palette PNG's indices, grey levels, 16/32-bit integers, bits)
_INDEX_MODES = ("P", "L", "1", "I", "I;16", "I;16L", "I;16B", "I;16N")


def color_palette(n: int) -> List[Tuple[int, int, int]]:
    """``n`` distinct RGB colours: Pascal VOC's colour map (entry 0 is black), the bits of each index spread over the
    three channels from the most significant bit down."""
    out = []
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out.append((r, g, b))
    return out


def cityscapes_table() -> Tuple[List[str], List[Tuple[int, int, int]], List[int], np.ndarray]:
    """The official Cityscapes label table (as torchvision ships it): the 19 train-id class names, their colours,
    their labelIds, and a 256-entry lookup labelId → trainId (255 for void labels, -1 for values that are no
    labelId)."""
    from torchvision.datasets import Cityscapes
    train = sorted((c for c in Cityscapes.classes if 0 <= c.train_id < IGNORE_INDEX), key=lambda c: c.train_id)
    lut = np.full(256, -1, np.int16)
    for c in Cityscapes.classes:
        if 0 <= c.id < 256:
            lut[c.id] = c.train_id if 0 <= c.train_id < IGNORE_INDEX else IGNORE_INDEX
    lut[IGNORE_INDEX] = IGNORE_INDEX
    return [c.name for c in train], [tuple(c.color) for c in train], [c.id for c in train], lut


def read_index_mask(open_mask: Callable[[], Any], where: str, image_hw: Tuple[int, int],
                    image: str = "its image") -> np.ndarray:
    """The stored values of the index mask ``open_mask()`` opens (a PIL image) for an image of ``image_hw`` (H, W);
    an unreadable mask, a colour one or one of another size is a one-line ValueError naming ``where``."""
    try:
        with open_mask() as img:
            mode = img.mode
            raw = np.asarray(img) if mode in _INDEX_MODES else None
    except Exception as e:  # PIL: UnidentifiedImageError, OSError (truncated), SyntaxError, ...
        raise ValueError(f"cannot read mask {where}: {type(e).__name__}: {first_line(e)}") from None
    if raw is None:
        raise ValueError(f"mask {where} is a colour image (PIL mode {mode}); expected an index mask whose pixel "
                         "values are the labels: a mode 'P' (palette) or 'L' (grey) PNG")
    if raw.shape[:2] != tuple(image_hw):
        raise ValueError(f"mask {where} is {raw.shape[1]}x{raw.shape[0]} but {image} is {image_hw[1]}x{image_hw[0]}: "
                         "a mask must have its image's size")
    return raw


def check_train_ids(mask: np.ndarray, num_classes: int, where: str, ignore_index: int = IGNORE_INDEX) -> None:
    """A mask of train ids holds 0..num_classes-1 and ``ignore_index`` only; anything else is a one-line ValueError
    naming ``where``."""
    bad = (mask < 0) | ((mask >= num_classes) & (mask != ignore_index))
    if bad.any():
        values = np.unique(mask[bad])[:8].tolist()
        raise ValueError(f"{where}: mask holds train ids {values} outside the {num_classes} classes "
                         f"(0..{num_classes - 1}) and {ignore_index} (ignored)")


class SegmentationDataset(Dataset):
    """Base of every segmentation dataset (see the module docstring).

    Subclasses implement :meth:`read` and set ``stems``. ``transform(image, mask)`` maps the raw uint8 image and the
    train-id mask to tensors (a :class:`~simattn.data.seg_transforms.SegTrainTransform` or ``SegEvalTransform``; by
    default normalisation only).

    Attributes:
        classes: class names, index = train id. palette: one RGB colour per train id.
        label_ids: train id → the dataset's own label value. stems: per sample, the file stem for saved predictions.
        void_label: the dataset's own value for unlabelled pixels (what ``ignore_index`` encodes back to).
    """

    ignore_index: int = IGNORE_INDEX

    def __init__(self, name: str, classes: Sequence[str], stems: Sequence[str], *,
                 palette: Optional[Sequence[Tuple[int, int, int]]] = None, label_ids: Optional[Sequence[int]] = None,
                 transform: Optional[Callable] = None, void_label: int = IGNORE_INDEX) -> None:
        self.name = name
        self.classes: List[str] = list(classes)
        self.stems: List[str] = list(stems)
        self.palette: List[Tuple[int, int, int]] = [tuple(int(v) for v in c)
                                                    for c in (palette or color_palette(len(self.classes)))]
        self.label_ids: List[int] = list(label_ids) if label_ids is not None else list(range(len(self.classes)))
        self.void_label = int(void_label)
        self.transform = transform if transform is not None else SegEvalTransform(scale=None)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.stems)

    def read(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        """The raw sample at original size: RGB uint8 (H, W, 3) and int64 (H, W) train ids / ``ignore_index``."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.read(index)
        return self.transform(image, mask)

    def encode_prediction(self, pred: np.ndarray) -> np.ndarray:
        """Train ids (H, W) → uint8 (H, W) of the dataset's own label values (``label_ids``; ``ignore_index`` →
        ``void_label``), as the dataset's masks store them."""
        pred = np.asarray(pred)
        if pred.dtype.kind not in "iub":
            raise ValueError(f"prediction of dtype {pred.dtype}: expected integer train ids")
        table = np.full(256, -1, np.int16)
        table[:self.num_classes] = self.label_ids
        table[self.ignore_index] = self.void_label
        bad = (pred < 0) | (pred > 255)
        out = table[np.where(bad, 0, pred)]
        bad |= out < 0
        if bad.any():
            values = np.unique(pred[bad])[:8].tolist()
            raise ValueError(f"prediction holds ids {values}: expected train ids 0..{self.num_classes - 1} or "
                             f"{self.ignore_index} (ignore)")
        return out.astype(np.uint8)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self)} samples, {self.num_classes} classes)"


class FileSegmentationDataset(SegmentationDataset):
    """Image and mask files paired by stem. ``lut`` maps the mask's stored values (index = value) to train ids
    (``ignore_index`` for unlabelled, -1 for values that are not allowed; ``allowed`` says which are, for errors)."""

    def __init__(self, name: str, classes: Sequence[str], images: Sequence[str], masks: Sequence[str],
                 stems: Sequence[str], lut: np.ndarray, allowed: str, **kwargs) -> None:
        super().__init__(name, classes, stems, **kwargs)
        self.images, self.masks = list(images), list(masks)
        self.lut = np.asarray(lut, np.int16)
        self.allowed = allowed

    def read(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        from PIL import Image, UnidentifiedImageError

        from .images import read_image
        image_path, mask_path = self.images[index], self.masks[index]
        try:
            image = np.array(read_image(image_path))
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise ValueError(f"cannot read image {image_path}: {type(e).__name__}: {first_line(e)}") from None
        raw = read_index_mask(lambda: Image.open(mask_path), mask_path, image.shape[:2], f"its image {image_path}")
        return image, self.map_labels(raw, mask_path)

    def map_labels(self, raw: np.ndarray, path: str = "mask") -> np.ndarray:
        """Stored mask values → int64 train ids; a value the dataset does not allow is a one-line ValueError."""
        raw = raw.astype(np.int64) if raw.dtype == bool else raw
        out_of_table = (raw < 0) | (raw >= self.lut.size)
        mapped = self.lut[np.where(out_of_table, 0, raw)]
        bad = out_of_table | (mapped < 0)
        if bad.any():
            values = np.unique(raw[bad])
            shown = ", ".join(str(v) for v in values[:8].tolist()) + (", ..." if values.size > 8 else "")
            raise ValueError(f"mask {path} holds values {shown} that are no {self.name} label: allowed {self.allowed}")
        return mapped.astype(np.int64)


# ------------------------------------------------------------------------------------------------ file listing
def _check_split(split, dataset: str) -> str:
    if not isinstance(split, str) or not split or split in (".", "..") or "/" in split or os.sep in split:
        from ..utils.values import quoted
        raise ValueError(f"{dataset} split {quoted(split)}: expected a split name such as 'train' or 'val'")
    return split


def _root(root, dataset: str) -> Path:
    if root is None:
        raise ValueError(f"dataset {dataset!r} needs a data directory (data_dir / --data-dir)")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{dataset} root not found: {path}")
    return path


def _need_dir(folder: Path, dataset: str, root: Path, layout: str) -> Path:
    if not folder.is_dir():
        raise FileNotFoundError(f"{dataset} root {root} has no folder {folder.relative_to(root)} (expected {layout})")
    return folder


def _files_by_stem(folder: Path, suffixes: Tuple[str, ...], recursive: bool = False) -> Dict[str, str]:
    """Regular, non-hidden files of ``folder`` ending (case-insensitively) in one of ``suffixes``, by stem (the name
    without that suffix); two files with one stem are a one-line ValueError."""
    found: Dict[str, str] = {}
    folders = [folder]
    while folders:
        current = folders.pop()
        for entry in sorted(os.scandir(current), key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                if recursive:
                    folders.append(Path(entry.path))
                continue
            lower = entry.name.lower()
            suffix = next((s for s in suffixes if lower.endswith(s.lower())), None)
            if suffix is None or not entry.is_file():
                continue
            stem = entry.name[:len(entry.name) - len(suffix)]
            if stem in found:
                raise ValueError(f"two files for sample {stem!r}: {found[stem]} and {entry.path}; keep one")
            found[stem] = entry.path
    return found


def _pairs(image_dir: Path, mask_dir: Path, image_suffixes: Tuple[str, ...], mask_suffix: str,
           recursive: bool = False) -> Tuple[List[str], List[str], List[str]]:
    """(stems, image paths, mask paths) sorted by stem; an image without a mask is a one-line ValueError."""
    images = _files_by_stem(image_dir, image_suffixes, recursive)
    if not images:
        raise FileNotFoundError(f"no images in {image_dir} (expected files ending in {', '.join(image_suffixes)})")
    masks = _files_by_stem(mask_dir, (mask_suffix,), recursive)
    missing = [s for s in images if s not in masks]
    if missing:
        raise ValueError(f"{len(missing)} image(s) in {image_dir} have no mask in {mask_dir} (first: "
                         f"{images[missing[0]]}); every image needs a mask <stem>{mask_suffix}")
    orphans = len(masks) - (len(images) - len(missing))
    if orphans:
        _logger.warning("%d mask(s) in %s have no image in %s; they are not used", orphans, mask_dir, image_dir)
    stems = sorted(images)
    return stems, [images[s] for s in stems], [masks[s] for s in stems]


def _lut(values: Dict[int, int]) -> np.ndarray:
    lut = np.full(256, -1, np.int16)
    for raw, train_id in values.items():
        lut[raw] = train_id
    return lut


# ------------------------------------------------------------------------------------------------ readers
def ade20k_dataset(root, split: str = "train", transform: Optional[Callable] = None) -> FileSegmentationDataset:
    """ADE20K (``ADEChallengeData2016``: ``images/{training,validation}/*.jpg``, ``annotations/.../*.png``); split
    'train' or 'val'. Label 0 (other) is ignored and k = 1..150 becomes train id k-1."""
    root = _root(root, "ADE20K")
    if not (root / "images").is_dir() and (root / "ADEChallengeData2016").is_dir():
        root = root / "ADEChallengeData2016"
    folder = {"train": "training", "training": "training", "val": "validation", "validation": "validation"}.get(
        _check_split(split, "ADE20K"))
    if folder is None:
        raise ValueError(f"ADE20K split {split!r}: expected 'train' (training) or 'val' (validation)")
    layout = "ADEChallengeData2016/images/{training,validation}/*.jpg and annotations/{training,validation}/*.png"
    stems, images, masks = _pairs(_need_dir(root / "images" / folder, "ADE20K", root, layout),
                                  _need_dir(root / "annotations" / folder, "ADE20K", root, layout),
                                  _IMAGE_EXTS, ".png")
    lut = _lut({0: IGNORE_INDEX, **{k: k - 1 for k in range(1, 151)}, IGNORE_INDEX: IGNORE_INDEX})
    return FileSegmentationDataset(
        "ADE20K", ADE20K_CLASSES, images, masks, stems, lut, "0 (other, ignored), 1..150 (classes) and 255 (ignored)",
        palette=color_palette(len(ADE20K_CLASSES) + 1)[1:], label_ids=list(range(1, 151)), transform=transform,
        void_label=0)


def voc_dataset(root, split: str = "train", transform: Optional[Callable] = None) -> FileSegmentationDataset:
    """Pascal VOC 2012 (``VOCdevkit/VOC2012``, or ``VOCdevkit`` itself): the ids of
    ``ImageSets/Segmentation/<split>.txt``, ``JPEGImages/<id>.jpg`` and the palette PNGs
    ``SegmentationClass/<id>.png`` (indices 0..20 are the labels, 255 the ignored object borders)."""
    root = _root(root, "VOC")
    if not (root / "ImageSets").is_dir() and (root / "VOC2012").is_dir():
        root = root / "VOC2012"
    layout = "VOC2012/JPEGImages/*.jpg, SegmentationClass/*.png and ImageSets/Segmentation/<split>.txt"
    sets = _need_dir(root / "ImageSets" / "Segmentation", "VOC", root, layout)
    split_file = sets / f"{_check_split(split, 'VOC')}.txt"
    if not split_file.is_file():
        known = sorted(p.stem for p in sets.glob("*.txt"))
        raise FileNotFoundError(f"VOC split file not found: {split_file} (splits there: {', '.join(known) or 'none'})")
    ids = [line.split()[0] for line in split_file.read_text().splitlines() if line.strip()]
    if not ids:
        raise ValueError(f"VOC split file {split_file} lists no image ids")
    image_dir = _need_dir(root / "JPEGImages", "VOC", root, layout)
    mask_dir = _need_dir(root / "SegmentationClass", "VOC", root, layout)
    images, masks = _files_by_stem(image_dir, (".jpg", ".jpeg")), _files_by_stem(mask_dir, (".png",))
    no_image = [i for i in ids if i not in images]
    if no_image:
        raise FileNotFoundError(f"{len(no_image)} id(s) of {split_file} have no image in {image_dir} (first: "
                                f"{no_image[0]!r}); expected JPEGImages/<id>.jpg")
    no_mask = [i for i in ids if i not in masks]
    if no_mask:
        raise ValueError(f"{len(no_mask)} image(s) of {split_file} have no mask in {mask_dir} (first: "
                         f"{images[no_mask[0]]}); every image needs SegmentationClass/<id>.png")
    lut = _lut({**{k: k for k in range(len(VOC_CLASSES))}, IGNORE_INDEX: IGNORE_INDEX})
    return FileSegmentationDataset("VOC", VOC_CLASSES, [images[i] for i in ids], [masks[i] for i in ids], ids, lut,
                                   "0..20 (classes) and 255 (ignored border)", transform=transform)


def cityscapes_dataset(root, split: str = "train", transform: Optional[Callable] = None) -> FileSegmentationDataset:
    """Cityscapes fine annotations: ``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` and
    ``gtFine/<split>/<city>/*_gtFine_labelIds.png``; labelIds become the 19 train ids by the official table, void
    labels 255."""
    root = _root(root, "Cityscapes")
    split = _check_split(split, "Cityscapes")
    layout = "leftImg8bit/<split>/<city>/*_leftImg8bit.png and gtFine/<split>/<city>/*_gtFine_labelIds.png"
    stems, images, masks = _pairs(_need_dir(root / "leftImg8bit" / split, "Cityscapes", root, layout),
                                  _need_dir(root / "gtFine" / split, "Cityscapes", root, layout),
                                  ("_leftImg8bit.png",), "_gtFine_labelIds.png", recursive=True)
    names, colours, label_ids, lut = cityscapes_table()
    return FileSegmentationDataset("Cityscapes", names, images, masks, stems, lut,
                                   "the labelIds 0..33 and 255", palette=colours, label_ids=label_ids,
                                   transform=transform, void_label=0)


def read_classes_file(path) -> List[str]:
    """Class names, one per line (blank lines skipped); at most 255 (value 255 is the ignore label)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"classes file not found: {path} (expected one class name per line)")
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read classes file {path}: {type(e).__name__}: {first_line(e)}") from None
    if not names:
        raise ValueError(f"classes file {path} lists no class names (expected one name per line)")
    if len(names) > IGNORE_INDEX:
        raise ValueError(f"classes file {path} lists {len(names)} classes: at most {IGNORE_INDEX} (mask value "
                         f"{IGNORE_INDEX} is the ignore label)")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise ValueError(f"classes file {path} lists {dup!r} twice; class names must be unique")
    return names


def folder_dataset(root, split: str = "train", classes_file=None,
                   transform: Optional[Callable] = None) -> FileSegmentationDataset:
    """A generic folder: ``images/<split>/`` (jpg/png) and ``masks/<split>/<stem>.png`` (index masks: value = class
    index, 255 ignored), class names from ``classes_file`` (default ``<root>/classes.txt``)."""
    root = _root(root, "folder")
    split = _check_split(split, "folder")
    names = read_classes_file(Path(classes_file) if classes_file is not None else root / "classes.txt")
    layout = "images/<split>/*.jpg|png, masks/<split>/*.png and classes.txt"
    stems, images, masks = _pairs(_need_dir(root / "images" / split, "folder", root, layout),
                                  _need_dir(root / "masks" / split, "folder", root, layout), _IMAGE_EXTS, ".png")
    lut = _lut({**{k: k for k in range(len(names))}, IGNORE_INDEX: IGNORE_INDEX})
    return FileSegmentationDataset("folder", names, images, masks, stems, lut,
                                   f"0..{len(names) - 1} (the classes of the classes file) and 255 (ignored)",
                                   transform=transform)


# ------------------------------------------------------------------------------------------------ digit scenes
#: the keyword options of :class:`DigitScenes` that :func:`create_segmentation_dataset` passes on
DIGIT_SCENE_OPTIONS = ("num_train", "num_val", "canvas", "digits_per_scene", "digit_size", "seed")


def _int_option(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        from ..utils.values import quoted
        raise ValueError(f"digits option {name}={quoted(value)}: expected an integer in {low}..{high}")
    return int(value)


def _range_option(name: str, value, low: int, high: int) -> Tuple[int, int]:
    from ..utils.values import quoted
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    try:
        a, b = value
        a, b = _int_option(name, a, low, high), _int_option(name, b, low, high)
    except (TypeError, ValueError):
        a = b = None
    if a is None or a > b:
        raise ValueError(f"digits option {name}={quoted(value)}: expected (low, high) integers with "
                         f"{low} <= low <= high <= {high}")
    return a, b


class DigitScenes(SegmentationDataset):
    """Digit scenes (:mod:`simattn.data.digit_scenes`) as a segmentation dataset of 11 classes: 'background', '0'..'9'.

    Args:
        split: 'train' (``num_train`` scenes, train digits) or 'val' (``num_val`` scenes, val digits).
        transform: joint transform (default: normalisation only).
        canvas: scene side in pixels (16..1024). digits_per_scene: (min, max) digits per scene.
        digit_size: (min, max) digit side in pixels; default 3/16 .. 5/8 of the canvas (12..40 at 64).
        seed: changes every scene.
    """

    def __init__(self, split: str = "train", transform: Optional[Callable] = None, num_train: int = 2000,
                 num_val: int = 400, canvas: int = 64, digits_per_scene=(2, 4), digit_size=None,
                 seed: int = 0) -> None:
        if split not in SPLITS:
            from ..utils.values import quoted
            raise ValueError(f"digits split {quoted(split)}: expected 'train' or 'val'")
        counts = {"train": _int_option("num_train", num_train, 1, 1_000_000),
                  "val": _int_option("num_val", num_val, 1, 1_000_000)}
        count = counts[split]
        canvas = _int_option("canvas", canvas, 16, 1024)
        per_scene = _range_option("digits_per_scene", digits_per_scene, 1, 16)
        sizes = _range_option("digit_size", digit_size if digit_size is not None
                              else default_digit_size(canvas), 4, canvas)
        seed = _int_option("seed", seed, 0, 2 ** 32 - 1)
        from ..utils.memory import check_memory
        check_memory(4.0 * count * canvas * canvas, f"{count} digit scenes of {canvas}x{canvas} pixels")
        self.scene_images, self.scene_masks = digit_scenes(split, count, canvas, per_scene, sizes, seed)
        super().__init__("digits", DIGIT_SCENE_CLASSES, [f"{split}_{i:05d}" for i in range(count)],
                         palette=color_palette(len(DIGIT_SCENE_CLASSES)), transform=transform)
        self.split = split

    def read(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        return self.scene_images[index].copy(), self.scene_masks[index].astype(np.int64)


# ------------------------------------------------------------------------------------------------ entry point
#: 'wds' and 'hfds' → reader(root, split, classes_file, transform); filled in by :mod:`simattn.data.shards` and
#: :mod:`simattn.data.hfds`, which import this module (the package imports both)
STORED_READERS: Dict[str, Callable[..., Any]] = {}


def create_segmentation_dataset(name: str, root=None, split: str = "train", *, train: Optional[bool] = None,
                                crop_size=(512, 512), scale=(2048, 512), ratio_range=(0.5, 2.0),
                                cat_max_ratio: float = 0.75, hflip_prob: float = 0.5, photometric: bool = True,
                                mean=IMAGENET_MEAN, std=IMAGENET_STD, classes_file=None,
                                **options) -> SegmentationDataset:
    """Open segmentation dataset ``name`` ('digits' (embedded, ``root`` ignored), 'ade20k', 'voc', 'cityscapes',
    'folder', 'wds': shards, 'hfds': a saved Hugging Face dataset with image and mask columns,
    :mod:`simattn.data.hfds`) with the training (``train=True``; default: ``split == 'train'``) or evaluation
    transforms.

    ``options`` are the digit scenes' (``num_train``, ``num_val``, ``canvas``, ``digits_per_scene``,
    ``digit_size``, ``seed``: see :class:`simattn.data.digit_scenes.DigitScenes`). Errors are one line.
    """
    from ..utils.values import quoted
    kind = SEG_DATASETS.get(str(name).lower())
    if kind is None:
        raise ValueError(f"unknown segmentation dataset {quoted(name)}; known: {', '.join(SEG_DATASETS)}")
    if options and kind != "digits":
        raise ValueError(f"option {next(iter(options))!r} applies only to the 'digits' dataset, not {name!r}")
    unknown = sorted(set(options) - set(DIGIT_SCENE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown digits option {unknown[0]!r}; known: {', '.join(DIGIT_SCENE_OPTIONS)}")
    if classes_file is not None and kind not in ("folder", "hfds"):
        raise ValueError(f"classes_file applies only to the 'folder' and 'hfds' datasets, not {name!r}")
    train = (split == "train") if train is None else bool(train)
    if train:
        transform = SegTrainTransform(crop_size, scale, ratio_range, cat_max_ratio, hflip_prob, photometric, mean,
                                      std, IGNORE_INDEX)
    else:
        transform = SegEvalTransform(scale, mean, std)
    if kind == "digits":
        return DigitScenes(split, transform=transform, **options)
    if kind in STORED_READERS:  # shards and saved Hugging Face datasets: their modules build on this one
        return STORED_READERS[kind](root, split, classes_file, transform)
    if kind == "ade20k":
        return ade20k_dataset(root, split, transform)
    if kind == "voc":
        return voc_dataset(root, split, transform)
    if kind == "cityscapes":
        return cityscapes_dataset(root, split, transform)
    return folder_dataset(root, split, classes_file, transform)
