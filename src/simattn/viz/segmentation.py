"""Segmentation panels: per image, the image, the predicted label map and the ground truth overlaid on it in the
dataset's palette, side by side, for a segmentation weights or exported file (:mod:`simattn.segment.validation`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["colorize", "blend", "render_segmentation", "visualize_segmentation"]


def colorize(labels: np.ndarray, palette: Sequence[Sequence[int]], ignore_index: int = 255) -> Tuple[np.ndarray,
                                                                                                       np.ndarray]:
    """(H, W, 3) uint8 colours of train-id ``labels`` and the (H, W) mask of coloured pixels (``ignore_index`` and
    ids outside the palette stay uncoloured)."""
    table = np.zeros((256, 3), np.uint8)
    table[:len(palette)] = np.asarray(palette, np.uint8).reshape(-1, 3)
    labels = np.asarray(labels)
    valid = (labels >= 0) & (labels < len(palette)) & (labels != ignore_index)
    return table[np.where(valid, labels, 0)], valid


def blend(image: np.ndarray, labels: np.ndarray, palette, alpha: float, ignore_index: int = 255) -> np.ndarray:
    """``image`` (H, W, 3 uint8) with ``labels`` painted over it at opacity ``alpha`` (ignored pixels unpainted)."""
    colours, valid = colorize(labels, palette, ignore_index)
    out = image.astype(np.float32)
    out[valid] = (1.0 - alpha) * out[valid] + alpha * colours[valid]
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def render_segmentation(image: np.ndarray, pred: np.ndarray, truth: np.ndarray, path: Path, *, classes, palette,
                        ignore_index: int = 255, alpha: float = 0.6, title: str = "",
                        panel_inches: float = 3.0, dpi: int = 100) -> Dict[str, Any]:
    """One PNG: the image, the prediction overlaid, the ground truth overlaid (pixel accuracy in its title), with a
    legend of the classes either shows. Returns the panel's size, the classes shown and the pixel accuracy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from ..utils.io import save_figure

    labelled = truth != ignore_index
    accuracy = float((pred[labelled] == truth[labelled]).mean() * 100) if labelled.any() else None
    shown = sorted(set(np.unique(pred).tolist()) | set(np.unique(truth[labelled]).tolist()))
    shown = [int(c) for c in shown if 0 <= c < len(classes)]
    fig = Figure(figsize=(3 * panel_inches, panel_inches + 0.9), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    acc = f" (pixel acc. {accuracy:.1f}%)" if accuracy is not None else ""
    for ax, picture, name in zip(axes, (image, blend(image, pred, palette, alpha, ignore_index),
                                        blend(image, truth, palette, alpha, ignore_index)),
                                 ("image", f"prediction{acc}", "ground truth")):
        ax.imshow(picture, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.axis("off")
    handles = [Patch(facecolor=np.asarray(palette[c]) / 255.0, edgecolor="k", linewidth=0.3, label=str(classes[c]))
               for c in shown[:24]]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), fontsize=7,
                   frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(fig, path, dpi=dpi, close=False)
    width, height = fig.canvas.get_width_height()
    return {"panel_size": [width, height], "classes_shown": [str(classes[c]) for c in shown],
            "pixel_accuracy": None if accuracy is None else round(accuracy, 3)}


def visualize_segmentation(source, out_dir: Path, *, data_dir: Optional[str] = None, split: Optional[str] = None,
                           count: int = 4, alpha: float = 0.6, threads: Optional[int] = None,
                           use_ema: bool = False) -> Dict[str, Any]:
    """Panels of the first ``count`` images of the dataset ``source`` records (``data_dir``/``split`` replace the
    recorded ones), predicted as its run evaluated; written under ``out_dir``. Returns what ``viz.json`` lists."""
    from ..segment.inference import predict
    from ..segment.validation import eval_settings, open_predictor, open_segmentation_dataset

    predictor = open_predictor(source, threads=threads, use_ema=use_ema)
    settings = eval_settings(source, predictor, {})
    data = open_segmentation_dataset(source, data_dir=data_dir, split=split)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: List[Dict[str, Any]] = []
    for index in range(min(count, len(data))):
        image, mask = data[index]
        with torch.inference_mode():
            pred = predict(predictor.fn, image[None].to(predictor.device), data.num_classes,
                           out_size=tuple(mask.shape[-2:]), mode=settings["mode"],
                           crop=tuple(settings["crop_size"]) if settings["crop_size"] else None,
                           stride=tuple(settings["stride"]), flip=bool(settings["flip"]),
                           scales=tuple(settings["scales"]),
                           input_size=predictor.input_size if settings["mode"] == "whole" else None)[0].cpu().numpy()
        raw, truth = data.read(index)
        stem = data.stems[index]
        panel = out_dir / f"{predictor.model}_{stem}.png"
        info = render_segmentation(raw, pred, truth, panel, classes=data.classes, palette=data.palette,
                                   ignore_index=data.ignore_index, alpha=alpha,
                                   title=f"{predictor.model} ({predictor.runtime}) on {source.dataset or data.name} "
                                         f"{split or source.val_split}: {stem}")
        records.append({"image": stem, "index": index, "panel": str(panel), **info})
        print(f"{stem}: {', '.join(info['classes_shown'])} -> {panel}")
    return {"model": predictor.model, "runtime": predictor.runtime, "weights": str(source.path),
            "task": "semantic_segmentation", "dataset": source.dataset, "split": split or source.val_split,
            "mode": settings["mode"], "alpha": alpha, "images": records}
