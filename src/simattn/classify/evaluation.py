"""The classification evaluation pass (top-1/top-5, loss) shared by training and ``simattn validate``."""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..engine.dist import all_reduce_mean
from ..engine.amp import autocast
from ..utils.runlog import progress

__all__ = ["evaluate"]


def _topk_correct(logits: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    return (top == target[:, None]).any(dim=-1).sum()


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, *, amp: bool = False,
             amp_dtype: str = "float16", channels_last: bool = False, show_progress: bool = False,
             desc: str = "eval") -> Dict[str, float]:
    """Top-1/top-5 accuracy (%) and mean cross-entropy over every readable image of ``loader`` (summed exactly over
    ranks when distributed), plus ``samples`` and ``skipped`` (unreadable images) counts."""
    was_training = model.training
    model.eval()
    # sums: correct@1, correct@5, loss, samples, skipped (float64 so large counts stay exact)
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    for images, target, skipped in progress(loader, desc, len(loader), show_progress):
        sums[4] += skipped
        if len(target) == 0:
            continue
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(device, amp, amp_dtype):
            logits = model(images)
        logits = logits.float()
        sums[0] += _topk_correct(logits, target, 1)
        sums[1] += _topk_correct(logits, target, 5)
        sums[2] += nn.functional.cross_entropy(logits, target, reduction="sum").double()
        sums[3] += len(target)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        sums = all_reduce_mean(sums) * torch.distributed.get_world_size()
    model.train(was_training)
    correct1, correct5, loss, n, skipped = sums.tolist()
    if n == 0:
        raise ValueError("evaluation saw no readable images")
    return {"top1": 100.0 * correct1 / n, "top5": 100.0 * correct5 / n, "loss": loss / n, "samples": int(n),
            "skipped": int(skipped)}
