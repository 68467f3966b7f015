"""``simattn segment``: semantic segmentation as a task of the engine (:mod:`simattn.engine.core`).

The task supplies the datasets (:mod:`simattn.data.segmentation`), the segmenter (:mod:`simattn.models.segmentation`,
its backbone optionally started from classification or DINO weights), cross-entropy with the ignore label (plus the
weighted auxiliary head's; in chunks where the logits are more than one CUDA loss call takes,
:mod:`simattn.engine.losses`), and mIoU evaluation (:mod:`.evaluate`); the schedule is the engine's (``sched: poly``
with a warm-up). Everything else (DDP, AMP, the non-finite guard, the checkpoint and resume, the run folder, logs,
progress) is the engine's.

Outputs in the run folder: the engine's files, ``best.safetensors`` (best val mIoU) and ``final.safetensors`` with the
weights record (the dataset's classes, label ids and palette ride along, so ``validate`` and ``export`` know them),
``per_class.csv`` and ``per_class_iou.png`` (the last evaluation's IoU per class) and ``curves.png``.
"""
from __future__ import annotations

import csv
import io
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

from ..engine.core import Engine, RunResult, run
from ..engine.dist import DistInfo
from ..engine.log import format_table, plot_history
from ..engine.losses import PixelCrossEntropy, check_loss_size
from ..engine.state import export_weights, weights_metadata
from ..models.factory import attention_kind, create_model
from ..utils.io import atomic_write_text, check_finite_weights
from .config import SegmentConfig
from .evaluate import evaluate_segmentation
from .metrics import IGNORE_INDEX, class_table
from .report import plot_class_iou

__all__ = ["SegmentationTrainer", "segment", "open_segmentation_data", "backbone_norm", "dataset_record"]


def backbone_norm(backbone: str) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """The input mean and std the backbone was made for (ImageNet's unless its config says otherwise)."""
    import timm
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    try:
        cfg = timm.models.get_pretrained_cfg(backbone)
    except Exception:  # a name without a config
        cfg = None
    mean = tuple(getattr(cfg, "mean", None) or IMAGENET_DEFAULT_MEAN)
    std = tuple(getattr(cfg, "std", None) or IMAGENET_DEFAULT_STD)
    return mean, std


def open_segmentation_data(cfg: SegmentConfig, split: str, train: bool):
    """The dataset of ``split`` with the recipe's transforms (training: random; evaluation: resize only)."""
    from ..data.segmentation import create_segmentation_dataset
    mean, std = backbone_norm(cfg.model_kwargs["backbone"])
    return create_segmentation_dataset(
        cfg.dataset, cfg.data_dir, split, train=train, crop_size=tuple(cfg.crop_size), scale=tuple(cfg.img_scale),
        ratio_range=tuple(cfg.ratio_range), cat_max_ratio=cfg.cat_max_ratio, hflip_prob=cfg.hflip,
        photometric=cfg.photometric, mean=mean, std=std, **cfg.dataset_kwargs)


def dataset_record(dataset, cfg: SegmentConfig) -> Dict[str, Any]:
    """What a weights file says about the data it segments: the dataset and how to open it again (root, the
    reader's options, the test-time resize bound, the training crop, the evaluation settings), its classes, label
    values and palette; ``simattn validate``, ``export`` and ``viz`` rebuild the dataset from it."""
    from dataclasses import asdict
    from ..utils.io import recorded_location
    return {"task": "semantic_segmentation", "dataset": cfg.dataset,
            "data_dir": recorded_location(cfg.data_dir) if cfg.data_dir else cfg.data_dir,
            "dataset_kwargs": dict(cfg.dataset_kwargs), "img_scale": [int(v) for v in cfg.img_scale],
            "crop_size": [int(v) for v in cfg.crop_size], "eval": asdict(cfg.eval),
            "classes": [str(c) for c in dataset.classes],
            "label_ids": [int(v) for v in dataset.label_ids], "palette": [list(map(int, c)) for c in dataset.palette],
            "ignore_index": int(dataset.ignore_index)}


class SegmentationTrainer(Engine):
    """A segmenter on a registered backbone as a task of the engine."""

    producer = "simattn segment"
    task_name = "segment"
    task_files = ("best.safetensors", "final.safetensors", "per_class.csv", "per_class_iou.png", "curves.png")
    csv_columns = {"val_miou": "val_miou", "val_macc": "val_macc", "val_aacc": "val_aacc"}
    scheduler_metric = "val_miou"
    collate_fn = staticmethod(default_collate)  # (image, mask) pairs of one crop size
    input_options = ("initial_checkpoint",)
    same_run_options = ("model", "model_kwargs", "dataset", "data_dir", "train_split", "dataset_kwargs", "crop_size")

    def __init__(self, cfg: SegmentConfig, dist: Optional[DistInfo] = None) -> None:
        super().__init__(cfg, dist)
        self.best: Dict[str, Any] = {"miou": -1.0, "epoch": -1}
        self.last_scores: Optional[Dict[str, Any]] = None
        self.initial_weights: Optional[str] = None

    def setup(self) -> None:
        cfg = self.cfg
        self.train_set = open_segmentation_data(cfg, cfg.train_split, train=True)
        self.val_set = open_segmentation_data(cfg, cfg.val_split, train=False)
        if list(self.train_set.classes) != list(self.val_set.classes):
            raise ValueError(f"the {cfg.train_split!r} and {cfg.val_split!r} splits of {cfg.dataset} have different "
                             "classes")
        self.num_classes = self.train_set.num_classes
        given = cfg.model_kwargs.get("num_classes")
        if given is not None and given != self.num_classes:
            raise ValueError(f"model kwarg num_classes={given} does not match dataset {cfg.dataset!r}, which has "
                             f"{self.num_classes} classes")
        check_loss_size(self.num_classes, cfg.crop_size[1])  # the logits are at the crop's size
        self.criterion = PixelCrossEntropy(ignore_index=IGNORE_INDEX)
        mean, std = backbone_norm(cfg.model_kwargs["backbone"])
        self.data_config = {"input_size": [3, *cfg.crop_size], "mean": list(mean), "std": list(std),
                            "interpolation": "bilinear", "crop_pct": 1.0}

    def create_model(self) -> Tuple[nn.Module, Dict[str, Any]]:
        cfg = self.cfg
        kwargs = {**cfg.model_kwargs, "num_classes": self.num_classes}
        kwargs.setdefault("drop_path_rate", cfg.drop_path)
        model = create_model(cfg.model, **kwargs)
        if cfg.initial_checkpoint and not self.resuming:  # a resumed run's weights come from its checkpoint
            from ..models.factory import load_initial_weights
            report = load_initial_weights(model.backbone, cfg.initial_checkpoint, model_name=kwargs["backbone"],
                                          partial=cfg.initial_checkpoint_partial, use_ema=cfg.initial_checkpoint_ema,
                                          partial_option="--initial-checkpoint-partial")
            self.initial_weights = report.summary()
            if self.dist.is_main:
                print(f"backbone initial weights: {self.initial_weights}", flush=True)
        return model, kwargs

    def train_dataset(self):
        return self.train_set

    def batch_loss(self, batch):
        images, masks = batch
        out = self.forward_model(images)
        if isinstance(out, tuple):  # the auxiliary head's logits come along while training
            logits, aux = out
            main = self.criterion(logits, masks)
            aux_loss = self.criterion(aux, masks)
            return main + self.cfg.aux_loss_weight * aux_loss, {"loss_seg": main, "loss_aux": aux_loss}
        return self.criterion(out, masks)

    def _scores(self, model: nn.Module) -> Dict[str, Any]:
        e = self.cfg.eval
        crop = tuple(e.crop_size or self.cfg.crop_size)
        was_training = model.training
        model.eval()
        try:
            return evaluate_segmentation(
                model, self.val_set, device=self.device, mode=e.mode, crop=crop, stride=tuple(e.stride),
                flip=e.flip, scales=tuple(e.scales), rank=self.dist.rank, world_size=self.dist.world_size,
                workers=self.cfg.workers, show_progress=self.show_bars)
        finally:
            model.train(was_training)

    def evaluate(self) -> Dict[str, Any]:
        result = self._scores(self.model)
        self.last_scores = {"epoch": self.epoch + 1, **result}
        record = {f"val_{k}": result[k] for k in ("miou", "macc", "aacc")}
        if self.ema is not None:
            record["ema_val_miou"] = self._scores(self.ema.module)["miou"]
        if (result["miou"] or 0.0) > self.best["miou"] and self.dist.is_main:
            self.best = {"miou": result["miou"], "epoch": self.epoch + 1}
            self._export(self.model, "best.safetensors", epoch=self.epoch + 1, miou=result["miou"])
        return record

    def describe_eval(self, record: Dict[str, Any]) -> str:
        if record.get("val_miou") is None:
            return ""
        return f", val mIoU {record['val_miou']:.2f} mAcc {record['val_macc']:.2f} aAcc {record['val_aacc']:.2f}"

    def task_state(self) -> Dict[str, Any]:
        return {"best": self.best, "scores": self.last_scores}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        self.best = dict(state.get("best", self.best))
        self.last_scores = state.get("scores")

    def summary_extra(self) -> Dict[str, Any]:
        final = self.last_scores or {}
        return {"final": {"val_miou": final.get("miou"), "val_macc": final.get("macc"), "val_aacc": final.get("aacc"),
                          "per_class": final.get("per_class")},
                "best": self.best, "classes": list(self.train_set.classes), "data_config": self.data_config,
                "initial_weights": self.initial_weights,
                "files": {n: str(self.out / n) for n in ("last.pth", "best.safetensors", "final.safetensors",
                                                         "per_class.csv", "per_class_iou.png")}}

    def finish(self, summary: Dict[str, Any]) -> None:
        final = self.last_scores or {}
        if final:
            self.log.info(format_table(["class", "IoU", "Acc"], class_table(final)))
            self.log.info(f"val mIoU {final['miou']}, mAcc {final['macc']}, aAcc {final['aacc']}")
        self._export(self.model, "final.safetensors", epoch=self.num_epochs, miou=final.get("miou"))
        if final:
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            writer.writerow(["class", "iou", "acc"])
            writer.writerows([name, v["iou"], v["acc"]] for name, v in final["per_class"].items())
            atomic_write_text(buffer.getvalue(), self.out / "per_class.csv")
            title = f"{self.cfg.model} on {self.cfg.model_kwargs['backbone']}: mIoU {final['miou']:.2f}"
            plot_class_iou(final["per_class"], self.out / "per_class_iou.png", title=title, miou=final["miou"])
        plot_history(self.history, ["train_loss", "val_miou", "val_aacc"], self.out / "curves.png",
                     title=f"{self.cfg.model} {self.cfg.model_kwargs['backbone']}")

    def _export(self, module: nn.Module, name: str, **extra: Any) -> None:
        check_finite_weights(module, name)
        meta = weights_metadata(self.cfg.model, self.model_kwargs, self.data_config, producer=self.producer,
                                recipe=self.cfg.recipe or "", attention=attention_kind(module) or "",
                                **dataset_record(self.train_set, self.cfg), **extra)
        export_weights(module, self.out / name, meta)


def segment(cfg: SegmentConfig) -> RunResult:
    """Train ``cfg`` (one process, or DDP under torchrun), evaluating mIoU; returns the run's result."""
    return run(cfg, SegmentationTrainer)
