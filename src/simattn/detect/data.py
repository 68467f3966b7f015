"""COCO-layout instance data (an images folder + an ``instances_*.json``) in torchvision's detection format.

Annotations are read with pycocotools (polygon and RLE masks alike, via ``annToMask``); crowd regions and empty
boxes are skipped for training targets. Category ids (COCO's are sparse, 1..90) map to contiguous labels 1..K
(0 is background) in sorted id order; :attr:`CocoInstances.cat_ids` maps them back for evaluation.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["CocoInstances", "collate_detection"]


def collate_detection(batch):
    """Images and targets as tuples (detection models take lists of differently sized images)."""
    return tuple(zip(*batch))


class CocoInstances(Dataset):
    """(image float tensor (3, H, W) in [0, 1], target dict with ``boxes`` (N, 4) xyxy, ``labels`` (N,),
    ``masks`` (N, H, W) uint8, ``image_id``) for each image of a COCO-layout dataset.

    Args:
        images_dir: folder holding the ``file_name`` of every image entry.
        annotation_file: COCO instances json.
        train: drop images without a usable annotation and apply ``hflip_prob`` horizontal flips.
    """

    def __init__(self, images_dir: str | Path, annotation_file: str | Path, train: bool = False,
                 hflip_prob: float = 0.5) -> None:
        self.images_dir = Path(images_dir)
        annotation_file = Path(annotation_file)
        if not annotation_file.is_file():
            raise FileNotFoundError(f"COCO annotation file not found: {annotation_file}")
        if not self.images_dir.is_dir():
            raise FileNotFoundError(f"COCO image folder not found: {self.images_dir}")
        self.coco = _load_coco(annotation_file)
        self.cat_ids: List[int] = sorted(self.coco.getCatIds())
        if not self.cat_ids:
            raise ValueError(f"{annotation_file} defines no categories")
        self.label_of = {cat_id: i + 1 for i, cat_id in enumerate(self.cat_ids)}
        self.category_names = [self.coco.cats[c].get("name", str(c)) for c in self.cat_ids]
        ids = sorted(self.coco.imgs)
        if train:
            ids = [i for i in ids if any(self._usable(a) for a in self.coco.imgToAnns.get(i, []))]
        if not ids:
            raise ValueError(f"{annotation_file} has no {'annotated ' if train else ''}images")
        self.ids = ids
        self.train = train
        self.transform = self._make_transform(train, hflip_prob)

    @staticmethod
    def _usable(ann: Dict[str, Any]) -> bool:
        return not ann.get("iscrowd", 0) and ann["bbox"][2] > 1 and ann["bbox"][3] > 1

    @staticmethod
    def _make_transform(train: bool, hflip_prob: float):
        from torchvision.transforms import v2
        steps = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
        if train and hflip_prob > 0:
            steps.append(v2.RandomHorizontalFlip(hflip_prob))  # flips boxes and masks with the image
        return v2.Compose(steps)

    @property
    def num_classes(self) -> int:
        """Categories + background, as torchvision's detectors count them."""
        return len(self.cat_ids) + 1

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, Dict[str, Any]]:
        from PIL import Image
        from torchvision import tv_tensors
        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        path = self.images_dir / info["file_name"]
        if not path.is_file():
            raise FileNotFoundError(f"image {info['file_name']!r} (id {image_id}) not found in {self.images_dir}")
        image = Image.open(path).convert("RGB")
        w, h = image.size
        anns = [a for a in self.coco.imgToAnns.get(image_id, []) if self._usable(a)]
        unknown = {a["category_id"] for a in anns} - set(self.label_of)
        if unknown:
            raise ValueError(f"image id {image_id}: annotations use undeclared category ids {sorted(unknown)}")
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh → xyxy
        try:
            masks = np.stack([self.coco.annToMask(a) for a in anns]) if anns else np.zeros((0, h, w), np.uint8)
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"image id {image_id}: an annotation has no readable 'segmentation' ({e!r})") from None
        target = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)),
            "labels": torch.tensor([self.label_of[a["category_id"]] for a in anns], dtype=torch.int64),
            "masks": tv_tensors.Mask(torch.from_numpy(masks)),
            "image_id": image_id,
        }
        return self.transform(image, target)


def _load_coco(annotation_file: Path):
    from pycocotools.coco import COCO
    try:
        data = json.loads(annotation_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{annotation_file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{annotation_file} is not a COCO instances file (top level is not a mapping)")
    missing = [k for k in ("images", "annotations", "categories") if k not in data]
    if missing:
        raise ValueError(f"{annotation_file} is not a COCO instances file (missing {', '.join(missing)})")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco
