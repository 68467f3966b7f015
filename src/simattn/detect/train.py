"""Mask R-CNN training and COCO evaluation on COCO-layout data (the SimA paper's Table 4 setting).

The recipe (see :data:`DEFAULTS`): AdamW lr 1e-4, weight decay 0.05, 36 epochs with ×0.1 steps after epochs 27
and 33 and a linear warm-up (the "3×" schedule XCiT used), multi-scale training via torchvision's resize. The run is
a task of the training engine (:class:`DetectionTrainer`, :mod:`simattn.engine.core`: DDP via torchrun, AMP, exact
resume, the run folder and logs); evaluation runs on the main process.

Outputs in ``output``: the engine's ``last.pth`` (``model`` is the detector's state dict; the COCO categories in
label order are in its ``task_state``), ``metrics.jsonl``, ``summary.json`` (per-epoch losses and box/mask AP, the
last evaluation under ``eval``), ``summary.csv``, ``config.yaml``, and ``curves.png``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import torch

from ..engine.core import Engine, run
from ..engine.log import plot_history
from ..utils.distributed import DistInfo, init_distributed
from ..utils.io import load_checkpoint, load_weights
from ..engine.config import EngineConfig
from ..utils.recipe import defaults_of, recipe_to_save
from .schema import DETECT_SCHEMA
from .data import CocoInstances, collate_detection
from .evaluate import evaluate_coco
from .model import build_mask_rcnn

__all__ = ["DEFAULTS", "DetectionTrainer", "engine_config", "train", "load_datasets", "evaluate_checkpoint"]

#: Every recipe key with its default (XCiT-S12/16 → SimA with Mask R-CNN on COCO, the paper's Table 4); types,
#: ranges and help texts are in :data:`simattn.detect.schema.DETECT_SCHEMA`.
DEFAULTS = defaults_of(DETECT_SCHEMA)

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


#: recipe entries a resumed run must share with its checkpoint (the network and the data it learns from)
_SAME_RUN_KEYS = (("model", "backbone"), ("model", "backbone_kwargs"), ("model", "out_indices"),
                  ("model", "min_size"), ("model", "max_size"), ("data", "train_images"),
                  ("data", "train_annotations"))


def engine_config(recipe: Mapping[str, Any], world_size: int, resume: bool, overwrite: bool,
                  name: Optional[str]) -> EngineConfig:
    """The engine's options for a detection recipe (its step schedule is :class:`DetectionTrainer`'s own)."""
    t, m = recipe["train"], recipe["model"]
    cuda = (t["device"] or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    return EngineConfig(
        model=m["backbone"], model_kwargs=dict(m["backbone_kwargs"]), recipe=name, epochs=t["epochs"],
        batch_size=t["batch_size"] // world_size, workers=recipe["data"]["workers"], pin_memory=cuda,
        opt=t["optimizer"], lr=t["lr"], weight_decay=t["weight_decay"], clip_grad=t["clip_grad"],
        amp=bool(t["amp"]) and cuda, amp_dtype="float16", sync_bn=world_size > 1 and cuda, seed=t["seed"],
        max_updates=t["max_steps"], device=t["device"], threads=t["threads"], dist_timeout=t["dist_timeout"],
        max_nonfinite_steps=t["max_nonfinite_steps"], output=recipe["output"], resume="auto" if resume else None,
        overwrite=overwrite, log_interval=10 ** 9,
        checkpoint_every_steps=t["checkpoint_every_steps"]).validate()


class DetectionTrainer(Engine):
    """Mask R-CNN on a registered backbone as a task of the engine."""

    producer = "simattn detect"
    task_name = "detect"
    task_files = ("curves.png",)
    csv_columns = {"bbox_AP": "bbox_AP", "segm_AP": "segm_AP"}
    scheduler_metric = "bbox_AP"
    collate_fn = staticmethod(collate_detection)

    def __init__(self, cfg: EngineConfig, dist: DistInfo, recipe: Mapping[str, Any]) -> None:
        self.recipe = recipe
        self.t = recipe["train"]
        self.last_ap: Optional[Dict[str, Any]] = None
        super().__init__(cfg, dist)

    def check_options(self) -> None:
        if self.t["batch_size"] % self.dist.world_size:
            raise ValueError(f"train.batch_size {self.t['batch_size']} is not divisible by the {self.dist.world_size} "
                             "processes")

    def inputs(self) -> Dict[str, Any]:
        return {"model.backbone_weights": self.recipe["model"].get("backbone_weights")}

    def prepare_data(self) -> None:
        self.datasets = load_datasets(self.recipe["data"])
        self.categories = [dict(self.datasets["train"].coco.cats[c]) for c in self.datasets["train"].cat_ids]

    def create_model(self):
        model = build_mask_rcnn(self.recipe["model"], self.datasets["train"].num_classes)
        return model, recipe_to_save(self.recipe["model"])

    def train_dataset(self):
        return self.datasets["train"]

    def build_scheduler(self):
        from timm.scheduler import MultiStepLRScheduler
        t, steps = self.t, self.updates_per_epoch
        scheduler = MultiStepLRScheduler(self.optimizer, decay_t=[e * steps for e in t["lr_decay_epochs"]],
                                         decay_rate=t["lr_decay_rate"], warmup_t=t["warmup_steps"],
                                         warmup_lr_init=t["lr"] * t["warmup_ratio"], warmup_prefix=False,
                                         t_in_epochs=False)
        return scheduler, t["epochs"]

    def to_device(self, batch):
        images, targets = batch
        images = [img.to(self.device, non_blocking=True) for img in images]
        targets = [{k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in tgt.items()} for tgt in targets]
        return (images, targets), len(images)

    def batch_loss(self, batch):
        images, targets = batch
        losses = self.forward_model(images, targets)
        return sum(losses.values()), {k: losses[k] for k in _LOSS_KEYS}

    def should_evaluate(self) -> bool:
        every = self.recipe["eval"]["every"]
        return self.is_last_epoch() or bool(every and (self.epoch + 1) % every == 0)

    def evaluate(self) -> Dict[str, Any]:
        if not self.dist.is_main:
            return {}
        ap = evaluate_coco(self.model, self.datasets["val"], self.device, self.recipe["eval"]["batch_size"],
                           self.recipe["data"]["workers"])
        self.last_ap = {"epoch": self.epoch + 1, **ap}
        return {"bbox_AP": ap["bbox"]["AP"], "segm_AP": ap["segm"]["AP"]}

    def describe_eval(self, record: Dict[str, Any]) -> str:
        if record.get("bbox_AP") is None:
            return ""
        return f", box AP {record['bbox_AP']:.2f}, mask AP {record['segm_AP']:.2f}"

    def checkpoint_this_epoch(self) -> bool:
        return self.epoch % max(1, self.t["save_every"]) == 0

    def same_run(self) -> Dict[str, Any]:
        return {f"{a}.{b}": self.recipe[a].get(b) for a, b in _SAME_RUN_KEYS}

    def task_state(self) -> Dict[str, Any]:
        return {"categories": self.categories, "eval": self.last_ap}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        self.last_ap = state.get("eval")

    def saved_recipe(self) -> Dict[str, Any]:
        return recipe_to_save(self.recipe)

    def summary_extra(self) -> Dict[str, Any]:
        return {"recipe": recipe_to_save(self.recipe), "categories": self.datasets["train"].category_names,
                "eval": self.last_ap}

    def finish(self, summary: Dict[str, Any]) -> None:
        plot_history(self.history, ["train_loss", "loss_classifier", "loss_mask", "bbox_AP", "segm_AP"],
                     self.out / "curves.png", title=f"Mask R-CNN {self.recipe['model']['backbone']}")


def train(recipe: Mapping[str, Any], resume: bool = False, overwrite: bool = False,
          name: Optional[str] = None) -> Dict[str, Any]:
    """Train Mask R-CNN as the recipe says, evaluating box/mask AP; returns the summary (``history``, ``eval``,
    ``output``) on the main process, ``{}`` on the others.

    ``resume`` continues from ``<output>/last.pth``; the run folder follows :mod:`simattn.utils.runs`
    (``runs/<name>/<date-time>`` by default, another run's folder only with ``overwrite``). Epochs count from 1.
    """
    if resume and not recipe["output"]:
        raise ValueError("--resume continues the run in --output: give its folder")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; the engine joins the group
    result = run(engine_config(recipe, world_size, resume, overwrite, name), DetectionTrainer, recipe=recipe)
    return result.summary if result.is_main else {}


def evaluate_checkpoint(recipe: Mapping[str, Any], weights: str, dist: DistInfo | None = None) -> Dict[str, Any]:
    """Box and mask AP of a trained detector checkpoint on the recipe's val data."""
    device = (dist or init_distributed(recipe["train"]["device"], recipe["train"]["dist_timeout"])).device
    val = load_datasets(recipe["data"], need_train=False)["val"]
    checkpoint = load_checkpoint(weights)
    saved = [c.get("id") for c in (checkpoint.get("task_state") or checkpoint).get("categories", [])]
    if saved and saved != val.cat_ids:
        raise ValueError(f"checkpoint categories {saved} differ from the val annotation categories {val.cat_ids}")
    # The detector's weights replace everything, so the backbone's own initial weights are not loaded.
    model = build_mask_rcnn(dict(recipe["model"], backbone_weights=None), val.num_classes)
    load_weights(model, weights)
    model.to(device)
    return evaluate_coco(model, val, device, recipe["eval"]["batch_size"], recipe["data"]["workers"])
