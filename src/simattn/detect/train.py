"""Mask R-CNN training and COCO evaluation on COCO-layout data (the SimA paper's Table 4 setting).

The recipe (see :data:`DEFAULTS`): AdamW lr 1e-4, weight decay 0.05, 36 epochs with ×0.1 steps after epochs 27
and 33 and a linear warm-up (the "3×" schedule XCiT used), multi-scale training via torchvision's resize. DDP via
torchrun (:mod:`simattn.utils.distributed`); evaluation runs on the main process.

Outputs in ``output``: ``checkpoint.pth`` (atomic; ``model`` is the detector's state dict, ``categories`` the COCO
categories in label order), ``results.json`` (per-epoch losses and box/mask AP) and ``curves.png``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from ..utils.runlog import EpochResults, progress
from ..utils.distributed import (DistInfo, all_finite, all_reduce_mean, barrier, cleanup_distributed,
                                 init_distributed)
from ..utils.io import (atomic_torch_save, check_finite_weights,
                        extract_state_dict, load_checkpoint, load_weights)
from ..utils.runs import open_resumable_run, restore_progress, start_run_folder
from ..utils.recipe import DETECT_SCHEMA, defaults_of, recipe_to_save
from ..utils.timing import set_threads
from .data import CocoInstances, collate_detection
from .evaluate import evaluate_coco
from .model import build_mask_rcnn

__all__ = ["DEFAULTS", "train", "load_datasets"]

#: Every recipe key with its default (XCiT-S12/16 → SimA with Mask R-CNN on COCO, the paper's Table 4); types,
#: ranges and help texts are in :data:`simattn.utils.recipe.DETECT_SCHEMA`.
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


#: the files a detection run writes into its folder (``overwrite`` deletes them before a fresh run)
RUN_FILES = ("checkpoint.pth", "results.json", "curves.png", "config.yaml")
DETECT_STATE_FORMAT = "simattn-detect-state-v2"  # epochs counted from 1
#: recipe entries a resumed run must share with its checkpoint (the network and the data it learns from)
_SAME_RUN_KEYS = (("model", "backbone"), ("model", "backbone_kwargs"), ("model", "out_indices"),
                  ("model", "min_size"), ("model", "max_size"), ("data", "train_images"),
                  ("data", "train_annotations"))


def train(recipe: Mapping[str, Any], resume: bool = False, overwrite: bool = False,
          name: Optional[str] = None) -> Dict[str, Any]:
    """Train Mask R-CNN as the recipe says, evaluating box/mask AP; returns the results with the run folder as
    ``output`` (main process) or {}.

    ``resume`` continues from ``<output>/checkpoint.pth``; the run folder follows :mod:`simattn.utils.runs`
    (``runs/<name>/<date-time>`` by default, another run's folder only with ``overwrite``). Epochs count from 1.
    """
    from timm.optim import create_optimizer_v2
    from timm.scheduler import MultiStepLRScheduler
    from timm.utils import random_seed
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    dist = init_distributed(recipe["train"]["device"], recipe["train"]["dist_timeout"])
    try:
        t = recipe["train"]
        if t["batch_size"] % dist.world_size:
            raise ValueError(f"train.batch_size {t['batch_size']} is not divisible by the {dist.world_size} processes")
        out_dir, ckpt = open_resumable_run(recipe, name, "detect", resume=resume, overwrite=overwrite,
                                           map_location=dist.device, state_format=DETECT_STATE_FORMAT,
                                           keys=_SAME_RUN_KEYS, what="detection")
        set_threads(t["threads"])
        random_seed(t["seed"], dist.rank)
        datasets = load_datasets(recipe["data"])
        train_set = datasets["train"]
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
        log = EpochResults(out_dir, enabled=dist.is_main, results={"recipe": recipe_to_save(recipe),
                                                                  "world_size": dist.world_size,
                                                                  "categories": train_set.category_names})
        start_epoch, step, nonfinite, train_time = 0, 0, 0, 0.0  # start_epoch: epochs done
        if ckpt is not None:
            model.load_state_dict(extract_state_dict(ckpt))
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            start_epoch, nonfinite, train_time = restore_progress(ckpt, log, out_dir, dist.is_main)
            step = int(ckpt["step"])
        start_run_folder(out_dir, recipe, overwrite, () if resume else RUN_FILES, dist.is_main)
        segment_start = time.perf_counter()

        max_steps = t["max_steps"] or math.inf
        # ``epoch`` counts from 0 inside the loop (sampler); people see epoch + 1
        for epoch in range(start_epoch, t["epochs"]):
            if step >= max_steps:
                break
            if sampler is not None:
                sampler.set_epoch(epoch)
            ddp.train()
            sums = torch.zeros(len(_LOSS_KEYS) + 1, device=dist.device)
            count = 0
            for images, targets in progress(loader, f"epoch {epoch + 1}", steps_per_epoch, dist.is_main):
                scheduler.step_update(step)
                images = [img.to(dist.device, non_blocking=True) for img in images]
                targets = [{k: (v.to(dist.device) if torch.is_tensor(v) else v) for k, v in tgt.items()}
                           for tgt in targets]
                with torch.autocast(dist.device.type, dtype=torch.float16, enabled=use_amp):
                    losses = ddp(images, targets)
                    loss = sum(losses.values())
                if not all_finite(loss):
                    nonfinite += 1
                    parts = ", ".join(f"{k} {v.item():.4g}" for k, v in losses.items())
                    if nonfinite > t["max_nonfinite_steps"]:
                        raise FloatingPointError(
                            f"training diverged: the detection loss is {float(loss)} at epoch {epoch + 1} step "
                            f"{step + 1} ({parts}; {nonfinite} non-finite so far, train.max_nonfinite_steps="
                            f"{t['max_nonfinite_steps']}); no weights were written from this point. Lower train.lr, "
                            "set train.clip_grad, or resume from the last checkpoint")
                    if dist.is_main:
                        print(f"warning: non-finite detection loss at epoch {epoch + 1} step {step + 1} ({parts}): "
                              f"step skipped ({nonfinite} of at most {t['max_nonfinite_steps']})", flush=True)
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    continue
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
            record: Dict[str, Any] = {"epoch": epoch + 1, "step": step, "loss": means[0],
                                      **dict(zip(_LOSS_KEYS, means[1:])), "lr": optimizer.param_groups[0]["lr"],
                                      "nonfinite_skipped": nonfinite}
            last = epoch == t["epochs"] - 1 or step >= max_steps
            every = recipe["eval"]["every"]
            if dist.is_main and (last or (every and (epoch + 1) % every == 0)):
                ap = evaluate_coco(model, datasets["val"], dist.device, recipe["eval"]["batch_size"],
                                   recipe["data"]["workers"])
                record.update({"bbox_AP": ap["bbox"]["AP"], "segm_AP": ap["segm"]["AP"]})
                log.results["eval"] = {"epoch": epoch + 1, **ap}
            log.log_epoch(record)
            if dist.is_main and (last or (epoch + 1) % max(1, t["save_every"]) == 0):
                check_finite_weights(model, "the detector")
                atomic_torch_save(_checkpoint(model, train_set, format=DETECT_STATE_FORMAT,
                                              recipe=recipe_to_save(recipe), optimizer=optimizer.state_dict(),
                                              scaler=scaler.state_dict(), epoch=epoch + 1, step=step,
                                              nonfinite_skipped=nonfinite,
                                              train_time_s=train_time + time.perf_counter() - segment_start,
                                              history=log.history), out_dir / "checkpoint.pth")
            barrier()

        if dist.is_main:
            log.results["output"] = str(out_dir)
            log.results["train_time_s"] = train_time + time.perf_counter() - segment_start
            log.save()
            log.plot(["loss", "loss_classifier", "loss_mask", "bbox_AP", "segm_AP"],
                     title=f"Mask R-CNN {recipe['model']['backbone']}")
            return {**log.results, "history": log.history}
        return {}
    finally:
        cleanup_distributed()


def evaluate_checkpoint(recipe: Mapping[str, Any], weights: str, dist: DistInfo | None = None) -> Dict[str, Any]:
    """Box and mask AP of a trained detector checkpoint on the recipe's val data."""
    device = (dist or init_distributed(recipe["train"]["device"], recipe["train"]["dist_timeout"])).device
    val = load_datasets(recipe["data"], need_train=False)["val"]
    saved = [c.get("id") for c in load_checkpoint(weights).get("categories", [])]
    if saved and saved != val.cat_ids:
        raise ValueError(f"checkpoint categories {saved} differ from the val annotation categories {val.cat_ids}")
    # The detector's weights replace everything, so the backbone's own initial weights are not loaded.
    model = build_mask_rcnn(dict(recipe["model"], backbone_weights=None), val.num_classes)
    load_weights(model, weights)
    model.to(device)
    return evaluate_coco(model, val, device, recipe["eval"]["batch_size"], recipe["data"]["workers"])
