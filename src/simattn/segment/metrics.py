"""Semantic-segmentation scores from one confusion matrix summed over the whole set (mmseg's definitions).

- IoU of a class: TP / (TP + FP + FN); a class absent from both the ground truth and the predictions (0/0) is left
  out of the mean (nanmean), one that is predicted but absent scores 0;
- mAcc: the mean over classes of TP / (TP + FN) (recall), classes absent from the ground truth left out;
- aAcc: correct pixels / labelled pixels.

Pixels labelled ``ignore_index`` (255) count nowhere. Under DDP each rank counts its shard and the matrices are
summed (:func:`all_reduce_confusion`), so the result is that of one process on the whole set, not a mean of means.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

__all__ = ["confusion_matrix", "scores", "all_reduce_confusion", "class_table", "IGNORE_INDEX"]

IGNORE_INDEX = 255


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
                     ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """(num_classes, num_classes) int64 counts, rows = ground truth, columns = prediction, ignored pixels dropped.

    A ground-truth label outside [0, num_classes) that is not ``ignore_index`` is an error, not a silent drop."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and mask {tuple(target.shape)} differ in size")
    target = target.reshape(-1).long()
    pred = pred.reshape(-1).long()
    keep = target != ignore_index
    target, pred = target[keep], pred[keep]
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        bad = int(target[(target < 0) | (target >= num_classes)][0])
        raise ValueError(f"mask label {bad} is outside the {num_classes} classes and is not the ignore label "
                         f"{ignore_index}")
    if pred.numel() and (int(pred.min()) < 0 or int(pred.max()) >= num_classes):
        raise ValueError(f"predicted labels must lie in [0, {num_classes})")
    counts = torch.bincount(target * num_classes + pred, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def all_reduce_confusion(matrix: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
    """The sum of every rank's matrix (the matrix itself without a process group)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return matrix
    summed = matrix.to(device or matrix.device, torch.int64).clone()
    dist.all_reduce(summed)
    return summed.cpu()


def scores(matrix: torch.Tensor, classes: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """``{'miou', 'macc', 'aacc'}`` in percent, ``per_class`` (name → IoU and accuracy in percent, None where 0/0)
    and ``pixels`` (labelled pixels counted)."""
    m = matrix.double()
    tp = m.diag()
    gt = m.sum(1)
    predicted = m.sum(0)
    union = gt + predicted - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    acc = torch.where(gt > 0, tp / gt.clamp(min=1), torch.full_like(tp, float("nan")))
    total = m.sum()
    names = list(classes) if classes is not None else [str(i) for i in range(len(tp))]

    def pct(x: torch.Tensor) -> Optional[float]:
        return None if torch.isnan(x) else round(float(x) * 100, 4)

    return {
        "miou": pct(torch.nanmean(iou)) if bool((union > 0).any()) else None,
        "macc": pct(torch.nanmean(acc)) if bool((gt > 0).any()) else None,
        "aacc": pct(tp.sum() / total) if total > 0 else None,
        "per_class": {name: {"iou": pct(iou[i]), "acc": pct(acc[i])} for i, name in enumerate(names)},
        "pixels": int(total),
    }


def class_table(result: Dict[str, Any]) -> List[List[str]]:
    """Rows (class, IoU, Acc) for a printed table; '-' where a class was never seen nor predicted."""
    def shown(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.2f}"
    return [[name, shown(v["iou"]), shown(v["acc"])] for name, v in result["per_class"].items()]
