"""Mask R-CNN training and COCO evaluation on COCO-layout data (the SimA paper's Table 4 setting).

The recipe (see :data:`DEFAULTS`): AdamW lr 1e-4, weight decay 0.05, 36 epochs with ×0.1 steps after epochs 27
and 33 and a linear warm-up (the "3×" schedule XCiT used), multi-scale training via torchvision's resize. DDP via
torchrun (:mod:`simattn.utils.distributed`); evaluation runs on the main process.

Outputs in ``output``: ``checkpoint.pth`` (atomic; ``model`` is the detector's state dict, ``categories`` the COCO
categories in label order), ``results.json`` (per-epoch losses and box/mask AP) and ``curves.png``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Mapping

import torch
from torch import nn

from ..utils.runlog import RunLog, progress
from ..utils.distributed import DistInfo, all_reduce_mean, barrier, cleanup_distributed, init_distributed
from ..utils.io import atomic_torch_save, extract_state_dict, load_checkpoint, load_weights
from ..utils.recipe import DETECT_SCHEMA, defaults_of
from ..utils.timing import set_threads
from .data import CocoInstances, collate_detection
from .evaluate import evaluate_coco
from .model import build_mask_rcnn

__all__ = ["DEFAULTS", "train", "load_datasets"]

#: Every recipe key with its default (XCiT-S12/16 → SimA with Mask R-CNN on COCO, the paper's Table 4); types, ranges and help texts are in
#: :data:`simattn.utils.recipe.DETECT_SCHEMA`.
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


def _checkpoint(model: nn.Module, dataset: CocoInstances, **extra) -> Dict[str, Any]:
    cats = [dict(dataset.coco.cats[c]) for c in dataset.cat_ids]
    return {"model": model.state_dict(), "categories": cats, **extra}


def train(recipe: Mapping[str, Any], resume: bool = False) -> Dict[str, Any]:
    """Train Mask R-CNN as the recipe says, evaluating box/mask AP; returns the results (main process) or {}."""
    from timm.optim import create_optimizer_v2
    from timm.scheduler import MultiStepLRScheduler
    from timm.utils import random_seed
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    dist = init_distributed(recipe["train"]["device"])
    try:
        t = recipe["train"]
        if t["batch_size"] % dist.world_size:
            raise ValueError(f"train.batch_size {t['batch_size']} is not divisible by the {dist.world_size} processes")
        set_threads(t["threads"])
        random_seed(t["seed"], dist.rank)
        datasets = load_datasets(recipe["data"])
        train_set = datasets["train"]
        out_dir = Path(recipe["output"])
        model = build_mask_rcnn(recipe["model"], train_set.num_classes)
        if dist.distributed and dist.device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model.to(dist.device)
        ddp = DistributedDataParallel(model) if dist.distributed else model

        sampler = DistributedSampler(train_set, dist.world_size, dist.rank, shuffle=True,
                                     seed=t["seed"]) if dist.distributed else None
        loader = DataLoader(train_set, batch_size=t["batch_size"] // dist.world_size, shuffle=sampler is None,
                            sampler=sampler, num_workers=recipe["data"]["workers"], collate_fn=collate_detection,
                            drop_last=len(train_set) >= t["batch_size"])
        steps_per_epoch = len(loader)
        optimizer = create_optimizer_v2(model, opt=t["optimizer"], lr=t["lr"], weight_decay=t["weight_decay"])
        scheduler = MultiStepLRScheduler(optimizer, decay_t=[e * steps_per_epoch for e in t["lr_decay_epochs"]],
                                         decay_rate=t["lr_decay_rate"], warmup_t=t["warmup_steps"],
                                         warmup_lr_init=t["lr"] * t["warmup_ratio"], warmup_prefix=False,
                                         t_in_epochs=False)
        use_amp = bool(t["amp"]) and dist.device.type == "cuda"
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
        log = RunLog(out_dir, enabled=dist.is_main, results={"recipe": dict(recipe), "world_size": dist.world_size,
                                                             "categories": train_set.category_names})
        ckpt_path = out_dir / "checkpoint.pth"
        start_epoch, step = 0, 0
        if resume and ckpt_path.is_file():
            ckpt = load_checkpoint(ckpt_path, map_location=dist.device)
            model.load_state_dict(extract_state_dict(ckpt))
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            start_epoch, step = int(ckpt["epoch"]) + 1, int(ckpt["step"])
            log.history = [dict(r) for r in ckpt.get("history", [])]
            if dist.is_main:
                print(f"resumed from {ckpt_path} at epoch {start_epoch}", flush=True)

        max_steps = t["max_steps"] or math.inf
        for epoch in range(start_epoch, t["epochs"]):
            if step >= max_steps:
                break
            if sampler is not None:
                sampler.set_epoch(epoch)
            ddp.train()
            sums = torch.zeros(len(_LOSS_KEYS) + 1, device=dist.device)
            count = 0
            for images, targets in progress(loader, f"epoch {epoch}", steps_per_epoch, dist.is_main):
                scheduler.step_update(step)
                images = [img.to(dist.device, non_blocking=True) for img in images]
                targets = [{k: (v.to(dist.device) if torch.is_tensor(v) else v) for k, v in tgt.items()}
                           for tgt in targets]
                with torch.autocast(dist.device.type, dtype=torch.float16, enabled=use_amp):
                    losses = ddp(images, targets)
                    loss = sum(losses.values())
                if not math.isfinite(loss.item()):
                    raise FloatingPointError(f"detection loss is {loss.item()} at epoch {epoch} step {step}; "
                                             f"parts: { {k: v.item() for k, v in losses.items()} }")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if t["clip_grad"]:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), t["clip_grad"])
                scaler.step(optimizer)
                scaler.update()
                sums += torch.stack([loss.detach()] + [losses[k].detach() for k in _LOSS_KEYS])
                count += 1
                step += 1
                if step >= max_steps:
                    break

            means = all_reduce_mean(sums / max(count, 1)).tolist()
            record: Dict[str, Any] = {"epoch": epoch, "step": step, "loss": means[0],
                                      **dict(zip(_LOSS_KEYS, means[1:])), "lr": optimizer.param_groups[0]["lr"]}
            last = epoch == t["epochs"] - 1 or step >= max_steps
            every = recipe["eval"]["every"]
            if dist.is_main and (last or (every and (epoch + 1) % every == 0)):
                ap = evaluate_coco(model, datasets["val"], dist.device, recipe["eval"]["batch_size"],
                                   recipe["data"]["workers"])
                record.update({"bbox_AP": ap["bbox"]["AP"], "segm_AP": ap["segm"]["AP"]})
                log.results["eval"] = {"epoch": epoch, **ap}
            log.log_epoch(record)
            if dist.is_main and (last or (epoch + 1) % max(1, t["save_every"]) == 0):
                atomic_torch_save(_checkpoint(model, train_set, optimizer=optimizer.state_dict(),
                                              scaler=scaler.state_dict(), epoch=epoch, step=step,
                                              history=log.history), ckpt_path)
            barrier()

        if dist.is_main:
            log.save()
            log.plot(["loss", "loss_classifier", "loss_mask", "bbox_AP", "segm_AP"],
                     title=f"Mask R-CNN {recipe['model']['backbone']}")
            return {**log.results, "history": log.history}
        return {}
    finally:
        cleanup_distributed()


def evaluate_checkpoint(recipe: Mapping[str, Any], weights: str, dist: DistInfo | None = None) -> Dict[str, Any]:
    """Box and mask AP of a trained detector checkpoint on the recipe's val data."""
    device = (dist or init_distributed(recipe["train"]["device"])).device
    val = load_datasets(recipe["data"], need_train=False)["val"]
    saved = [c.get("id") for c in load_checkpoint(weights).get("categories", [])]
    if saved and saved != val.cat_ids:
        raise ValueError(f"checkpoint categories {saved} differ from the val annotation categories {val.cat_ids}")
    # The detector's weights replace everything, so the backbone's own initial weights are not loaded.
    model = build_mask_rcnn(dict(recipe["model"], backbone_weights=None), val.num_classes)
    load_weights(model, weights)
    model.to(device)
    return evaluate_coco(model, val, device, recipe["eval"]["batch_size"], recipe["data"]["workers"])
