"""COCO box and mask AP of a torchvision detector on a :class:`~simattn.detect.data.CocoInstances` set (pycocotools)."""
from __future__ import annotations

import contextlib
import io
from typing import Any, Dict, List

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ..utils.runlog import progress
from .data import CocoInstances, collate_detection

__all__ = ["predictions_to_coco", "coco_ap", "evaluate_coco", "AP_NAMES"]

#: The first six numbers of ``COCOeval.stats``, in percent.
AP_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def predictions_to_coco(output: Dict[str, torch.Tensor], image_id: int, cat_ids: List[int],
                        mask_threshold: float = 0.5) -> tuple[list, list]:
    """One image's Mask R-CNN output → COCO result entries for boxes (xywh) and masks (compressed RLE)."""
    from pycocotools import mask as mask_utils
    boxes = output["boxes"].float().cpu().numpy()
    scores = output["scores"].float().cpu().tolist()
    cats = [cat_ids[int(label) - 1] for label in output["labels"].cpu()]
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1).tolist() if len(boxes) else []
    box_results = [{"image_id": image_id, "category_id": c, "bbox": b, "score": s}
                   for c, b, s in zip(cats, xywh, scores)]
    mask_results = []
    if "masks" in output and len(boxes):
        binary = (output["masks"][:, 0] > mask_threshold).cpu().numpy().astype(np.uint8)
        rles = mask_utils.encode(np.asfortranarray(binary.transpose(1, 2, 0)))
        for rle, c, s in zip(rles, cats, scores):
            rle["counts"] = rle["counts"].decode("ascii")  # JSON-friendly
            mask_results.append({"image_id": image_id, "category_id": c, "segmentation": rle, "score": s})
    return box_results, mask_results


def coco_ap(coco_gt, results: list, iou_type: str, image_ids: List[int]) -> Dict[str, Any]:
    """``COCOeval`` of ``results`` ('bbox' or 'segm') → {AP, AP50, ..., summary}; AP is 0 when nothing was detected;
    a metric without ground truth in its size range is None."""
    from pycocotools.cocoeval import COCOeval
    if not results:
        return {**{name: 0.0 for name in AP_NAMES}, "detections": 0}
    with contextlib.redirect_stdout(io.StringIO()) as text:
        coco_dt = coco_gt.loadRes(results)
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = {name: (100.0 * float(v) if v >= 0 else None) for name, v in zip(AP_NAMES, evaluator.stats)}
    summary = [line for line in text.getvalue().splitlines() if line.startswith(" Average")]
    return {**stats, "detections": len(results), "summary": summary}


@torch.no_grad()
def evaluate_coco(model: nn.Module, dataset: CocoInstances, device: torch.device | str = "cpu",
                  batch_size: int = 2, workers: int = 0, show_progress: bool = True) -> Dict[str, Any]:
    """Run ``model`` (eval mode) over ``dataset`` and return {'bbox': {...}, 'segm': {...}, 'images': N}."""
    was_training = model.training
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=collate_detection)
    boxes, masks = [], []
    for images, targets in progress(loader, "evaluate", enabled=show_progress):
        outputs = model([img.to(device) for img in images])
        for out, target in zip(outputs, targets):
            b, m = predictions_to_coco(out, int(target["image_id"]), dataset.cat_ids)
            boxes += b
            masks += m
    model.train(was_training)
    image_ids = list(dataset.ids)
    return {"bbox": coco_ap(dataset.coco, boxes, "bbox", image_ids),
            "segm": coco_ap(dataset.coco, masks, "segm", image_ids), "images": len(image_ids)}
