"""Mask R-CNN training and COCO evaluation on COCO-layout data (the SimA paper's Table 4 setting).

The recipe (:class:`simattn.detect.config.DetectConfig`): AdamW lr 1e-4, weight decay 0.05, 36 epochs with ×0.1
steps after epochs 27 and 33 and a linear warm-up (the "3×" schedule XCiT used), multi-scale training via
torchvision's resize. The run is a task of the training engine (:class:`DetectionTrainer`,
:mod:`simattn.engine.core`: DDP via torchrun, SyncBatchNorm, AMP, exact resume, the run folder and logs); evaluation
runs on the main process.

Outputs in ``output``: the engine's ``last.pth`` (``model`` is the detector's state dict; the COCO categories in
label order are in its ``task_state``), ``metrics.jsonl``, ``summary.json`` (per-epoch losses and box/mask AP, the
last evaluation under ``eval``), ``summary.csv``, ``config.yaml``, and ``curves.png``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from ..engine.core import Engine, run
from ..engine.dist import DistInfo, init_distributed
from ..engine.log import plot_history
from ..utils.io import load_weights
from ..utils.recipe import recipe_to_save
from .config import DetectConfig
from .data import CocoInstances, collate_detection
from .evaluate import evaluate_coco
from .model import build_mask_rcnn

__all__ = ["DetectionTrainer", "train", "load_datasets", "evaluate_checkpoint"]

_LOSS_KEYS = ("loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg")


def load_datasets(data: Mapping[str, Any], need_train: bool = True) -> Dict[str, CocoInstances]:
    """The recipe's train (if ``need_train``) and val :class:`CocoInstances`; their categories must agree."""
    out = {}
    for split in (("train", "val") if need_train else ("val",)):
        images, ann = data[f"{split}_images"], data[f"{split}_annotations"]
        if not images or not ann:
            raise ValueError(f"data.{split}_images and data.{split}_annotations are required")
        out[split] = CocoInstances(images, ann, train=split == "train", hflip_prob=data["hflip_prob"])
    if need_train and out["train"].cat_ids != out["val"].cat_ids:
        raise ValueError("train and val annotation files declare different categories")
    return out


class DetectionTrainer(Engine):
    """Mask R-CNN on a registered backbone as a task of the engine."""

    producer = "simattn detect"
    task_name = "detect"
    task_files = ("curves.png", "eval.json")  # eval.json: `detect eval` of this run's weights
    csv_columns = {"bbox_AP": "bbox_AP", "segm_AP": "segm_AP"}
    scheduler_metric = "bbox_AP"
    collate_fn = staticmethod(collate_detection)

    model_option = "model.backbone"
    input_options = ("model.backbone_weights",)
    same_run_options = ("model.backbone", "model.backbone_kwargs", "model.out_indices", "model.min_size",
                        "model.max_size", "data.train_images", "data.train_annotations")

    def __init__(self, cfg: DetectConfig, dist: Optional[DistInfo] = None) -> None:
        super().__init__(cfg, dist)
        self.last_ap: Optional[Dict[str, Any]] = None

    def setup(self) -> None:
        self.datasets = load_datasets(dataclasses.asdict(self.cfg.data))
        self.categories = [dict(self.datasets["train"].coco.cats[c]) for c in self.datasets["train"].cat_ids]

    def create_model(self):
        model = dataclasses.asdict(self.cfg.model)  # recorded as the network's kwargs
        return build_mask_rcnn(model, self.datasets["train"].num_classes), model

    def train_dataset(self):
        return self.datasets["train"]

    def build_scheduler(self):
        from timm.scheduler import MultiStepLRScheduler
        s, steps = self.cfg.schedule, self.updates_per_epoch
        scheduler = MultiStepLRScheduler(self.optimizer, decay_t=[e * steps for e in s.lr_decay_epochs],
                                         decay_rate=s.lr_decay_rate, warmup_t=s.warmup_steps,
                                         warmup_lr_init=self.cfg.lr * s.warmup_ratio, warmup_prefix=False,
                                         t_in_epochs=False)
        return scheduler, self.cfg.epochs

    def batch_loss(self, batch):
        images, targets = batch
        losses = self.forward_model(images, targets)
        return sum(losses.values()), {k: losses[k] for k in _LOSS_KEYS}

    def evaluate(self) -> Dict[str, Any]:
        if not self.dist.is_main:
            return {}
        ap = evaluate_coco(self.model, self.datasets["val"], self.device, self.cfg.eval.batch_size, self.cfg.workers)
        self.last_ap = {"epoch": self.epoch + 1, **ap}
        return {"bbox_AP": ap["bbox"]["AP"], "segm_AP": ap["segm"]["AP"]}

    def describe_eval(self, record: Dict[str, Any]) -> str:
        if record.get("bbox_AP") is None:
            return ""
        return f", box AP {record['bbox_AP']:.2f}, mask AP {record['segm_AP']:.2f}"

    def task_state(self) -> Dict[str, Any]:
        return {"categories": self.categories, "eval": self.last_ap}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        self.last_ap = state.get("eval")

    def summary_extra(self) -> Dict[str, Any]:
        return {"recipe": recipe_to_save(self.cfg), "categories": self.datasets["train"].category_names,
                "eval": self.last_ap}

    def finish(self, summary: Dict[str, Any]) -> None:
        plot_history(self.history, ["train_loss", "loss_classifier", "loss_mask", "bbox_AP", "segm_AP"],
                     self.out / "curves.png", title=f"Mask R-CNN {self.cfg.model.backbone}")


def train(cfg: DetectConfig) -> Dict[str, Any]:
    """Train Mask R-CNN as ``cfg`` says, evaluating box/mask AP; returns the summary (``history``, ``eval``,
    ``output``) on the main process, ``{}`` on the others.

    ``resume`` continues a checkpoint (``auto``: ``<output>/last.pth``); the run folder follows
    :mod:`simattn.utils.runs` (``runs/<recipe>/<date-time>`` by default, another run's folder only with
    ``overwrite``). Epochs count from 1.
    """
    result = run(cfg, DetectionTrainer)
    return result.summary if result.is_main else {}


def evaluate_checkpoint(cfg: DetectConfig, weights: str, dist: Optional[DistInfo] = None) -> Dict[str, Any]:
    """Box and mask AP of a trained detector checkpoint on the recipe's val data."""
    from ..models.sources import resolve_source
    device = (dist or init_distributed(cfg.device, cfg.dist_timeout)).device
    val = load_datasets(dataclasses.asdict(cfg.data), need_train=False)["val"]
    source = resolve_source(weights)  # once: a local-dir: or hf-hub: folder's model.safetensors, a tag's file
    weights = source.path
    if weights.suffix == ".safetensors":  # a detector saved by simattn hub save: its record names the categories
        record = source.record
        saved = (record.extra.get("category_ids") if record is not None else None) or []
    else:
        checkpoint = source.checkpoint()
        saved = [c.get("id") for c in (checkpoint.get("task_state") or checkpoint).get("categories", [])]
    if saved and saved != val.cat_ids:
        raise ValueError(f"checkpoint categories {saved} differ from the val annotation categories {val.cat_ids}")
    # The detector's weights replace everything, so the backbone's own initial weights are not loaded.
    model = build_mask_rcnn(dict(dataclasses.asdict(cfg.model), backbone_weights=None), val.num_classes)
    load_weights(model, weights, checkpoint=source.checkpoint())
    model.to(device)
    return evaluate_coco(model, val, device, cfg.eval.batch_size, cfg.workers)
