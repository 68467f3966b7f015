"""Scoring a segmentation network or deployed file on a dataset: per-image prediction (:mod:`.inference`), one
confusion matrix summed over images and ranks (:mod:`.metrics`), and the predicted label maps as indexed PNGs.

Saved predictions hold the dataset's own label values (ADE20K's 1–150, Cityscapes' label ids, ...), with the
dataset's palette, one ``<image stem>.png`` per image: the form benchmark servers and users' scripts read.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Subset

from ..utils.io import atomic_write_bytes
from .inference import predict
from .metrics import all_reduce_confusion, confusion_matrix, scores

__all__ = ["evaluate_segmentation", "save_prediction", "indexed_palette"]


def indexed_palette(dataset) -> list:
    """A 768-entry PNG palette that colours each of the dataset's own label values with its class colour."""
    flat = [0] * 768
    for train_id, label in enumerate(dataset.label_ids):
        if 0 <= int(label) < 256:
            flat[3 * int(label):3 * int(label) + 3] = [int(c) for c in dataset.palette[train_id]]
    return flat


def save_prediction(pred: np.ndarray, dataset, stem: str, folder: Path, palette: Optional[list] = None) -> Path:
    """Write one label map (train ids) as ``folder/<stem>.png`` in the dataset's ids, atomically."""
    from PIL import Image
    image = Image.fromarray(np.asarray(dataset.encode_prediction(pred), dtype=np.uint8), mode="P")
    image.putpalette(palette if palette is not None else indexed_palette(dataset))
    path = folder / f"{stem}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    atomic_write_bytes(buffer.getvalue(), path)
    return path


def evaluate_segmentation(fn: Callable[[torch.Tensor], torch.Tensor], dataset, *, device: torch.device,
                          mode: str = "whole", crop: Optional[Tuple[int, int]] = None,
                          stride: Optional[Tuple[int, int]] = None, flip: bool = False,
                          scales: Sequence[float] = (1.0,), input_size: Optional[Tuple[int, int]] = None,
                          rank: int = 0, world_size: int = 1, workers: int = 0,
                          save_dir: Optional[Path] = None, show_progress: bool = False) -> Dict[str, Any]:
    """mIoU, mAcc, aAcc and per-class scores of ``fn`` (eval mode, no grad) on ``dataset``.

    Each rank predicts every ``world_size``-th image from ``rank``; the confusion matrices are summed over the
    process group, so every rank returns the scores of the whole set. ``save_dir`` writes this rank's predictions.
    """
    from ..utils.runlog import progress
    if isinstance(dataset, IterableDataset):  # shards: each read by one rank and worker, samples carry their index
        from ..engine.data import _usable_workers
        dataset.configure(rank, world_size)
        dataset.with_index = True
        workers = _usable_workers(len(dataset.urls), world_size, workers)
        loader = DataLoader(dataset, batch_size=1, num_workers=workers)
        total = None
    else:
        shard = list(range(rank, len(dataset), world_size))
        loader = DataLoader(Subset(dataset, shard), batch_size=1, shuffle=False, num_workers=workers)
        total = len(shard)
    n = dataset.num_classes
    matrix = torch.zeros((n, n), dtype=torch.int64)
    palette = indexed_palette(dataset) if save_dir is not None else None
    with torch.inference_mode():
        for k, item in enumerate(progress(loader, "eval", total=total, enabled=show_progress)):
            image, mask = item[0], item[1]
            pred = predict(fn, image.to(device), n, out_size=tuple(mask.shape[-2:]), mode=mode, crop=crop,
                           stride=stride, flip=flip, scales=scales, input_size=input_size).cpu()
            matrix += confusion_matrix(pred, mask, n, dataset.ignore_index)
            if save_dir is not None:
                index = int(item[2][0]) if total is None else shard[k]
                save_prediction(pred[0].numpy(), dataset, dataset.stems[index], Path(save_dir), palette)
    matrix = all_reduce_confusion(matrix, device if device.type == "cuda" else None)
    result = scores(matrix, dataset.classes)
    result["images"] = len(dataset)
    return result
