"""DINO self-distillation (Caron et al. 2021) for any registered backbone, as in the SimA paper's Table 5.

A student (backbone + DINO head) learns to match a teacher on multi-crop views; the teacher is an exponential
moving average of the student whose momentum follows a cosine schedule to 1; the teacher's outputs are centered
(a running mean) and sharpened (a low temperature) so that neither collapse mode wins. Weight decay follows a cosine
schedule 0.04 → 0.4, the learning rate a warm-up then cosine decay (timm's scheduler).

Library pieces: lightly's ``DINOProjectionHead``, ``DINOLoss`` (centering with a DDP all-reduce, sharpening,
cross-view cross-entropy), ``DINOTransform`` (multi-crop), ``cosine_schedule`` and ``update_momentum``; timm's
``create_optimizer_v2`` and ``CosineLRScheduler``; models come from :mod:`simattn.models.factory`. DDP comes from
torchrun via :mod:`simattn.utils.distributed`.

Outputs in ``output``: ``checkpoint.pth`` (atomically rewritten; ``model`` holds the teacher backbone, so
``simattn.utils.io.load_weights(backbone, path)`` loads it), ``backbone.safetensors`` (the teacher backbone with its
``simattn-weights-v1`` record, ``num_classes`` 0, so ``simattn export``/``viz`` open it), ``results.json`` (per-epoch
history, k-NN / linear top-1) and ``curves.png``.
"""
from __future__ import annotations

import itertools
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ..utils.distributed import (DistInfo, all_finite, all_reduce_mean, barrier, cleanup_distributed,
                                 init_distributed)
from ..utils.io import atomic_torch_save, check_finite_weights, extract_state_dict
from ..utils.recipe import SSL_SCHEMA, defaults_of, recipe_to_save
from ..utils.runlog import EpochResults, progress
from ..utils.runs import open_resumable_run, restore_progress, start_run_folder
from ..utils.timing import set_threads
from .data import build_image_dataset
from .evaluate import evaluate_backbone

__all__ = ["DEFAULTS", "DinoNetwork", "build_backbone", "save_backbone", "build_dino_networks",
           "build_multicrop_transform", "pretrain"]

#: Every recipe key with its default (the ImageNet recipe of the SimA paper's DINO experiment, Table 5); types,
#: ranges and help texts are in :data:`simattn.utils.recipe.SSL_SCHEMA`.
DEFAULTS = defaults_of(SSL_SCHEMA)


def build_backbone(model: Mapping[str, Any], drop_path_rate: float = 0.0, load_weights: bool = True) -> nn.Module:
    """A registered model without classifier (``num_classes=0``): ``backbone(x)`` gives the CLS/pooled features.

    With ``load_weights`` and a recipe ``weights`` path, the backbone starts from those weights
    (:func:`~simattn.models.factory.load_initial_weights`: a classification checkpoint, official/timm weights or a
    DINO backbone; its classifier is dropped, position embeddings resized) and the report is printed.
    """
    from ..models.factory import create_model, load_initial_weights
    backbone = create_model(model["name"], num_classes=0, drop_path_rate=drop_path_rate, **model["kwargs"])
    if load_weights and model.get("weights"):
        report = load_initial_weights(backbone, model["weights"], model_name=model["name"])
        print(f"backbone initial weights: {report.summary()}", flush=True)
    return backbone


def save_backbone(backbone: nn.Module, path: str | Path, model: Mapping[str, Any],
                  evaluation: Optional[Mapping[str, Any]] = None, **extra: Any) -> None:
    """Write ``backbone`` as ``simattn-weights-v1`` safetensors (``num_classes`` 0, producer ``simattn ssl``), so
    ``simattn export``/``viz``, :func:`~simattn.models.factory.load_model` and initial-weights options open it.
    ``evaluation`` (the recipe's ``eval`` section) gives the recorded preprocessing: its ``img_size``/``crop_pct``
    with the backbone's mean, std and interpolation."""
    from timm.data import resolve_data_config

    from ..models.weights import save_weights, weights_metadata
    data_config = None
    if evaluation is not None:
        data_config = dict(resolve_data_config({}, model=backbone), crop_pct=float(evaluation["crop_pct"]),
                           input_size=(3, int(evaluation["img_size"]), int(evaluation["img_size"])))
    save_weights(backbone, path, weights_metadata(model["name"], model["kwargs"], producer="simattn ssl",
                                                  num_classes=0, data_config=data_config, **extra))


class DinoNetwork(nn.Module):
    """Backbone + DINO head over a list of views; views of one resolution go through the backbone as one batch."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, views: List[torch.Tensor]) -> List[torch.Tensor]:
        feats = [self.backbone(torch.cat(list(group)))
                 for _, group in itertools.groupby(views, key=lambda v: tuple(v.shape[-2:]))]
        return list(self.head(torch.cat(feats)).chunk(len(views)))

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """The backbone's no-decay parameters (position embeddings, tokens) for timm's optimizer factory."""
        inner = getattr(self.backbone, "no_weight_decay", lambda: set())()
        return {f"backbone.{name}" for name in inner}


def build_dino_networks(recipe: Mapping[str, Any]) -> tuple[DinoNetwork, DinoNetwork]:
    """Student and teacher; the teacher starts as an exact copy and never receives gradients.

    The teacher is built, not deep-copied: lightly's head uses ``weight_norm``, which ``copy.deepcopy`` rejects.
    """
    from lightly.models.modules import DINOProjectionHead
    from lightly.models.utils import deactivate_requires_grad

    def make(drop_path: float, load_weights: bool) -> DinoNetwork:
        backbone = build_backbone(recipe["model"], drop_path, load_weights)
        h = recipe["head"]
        with warnings.catch_warnings():
            # lightly's head calls torch.nn.utils.weight_norm, which torch deprecates: nothing a user can act on
            warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
            head = DINOProjectionHead(backbone.num_features, h["hidden_dim"], h["bottleneck_dim"], h["output_dim"],
                                      batch_norm=h["batch_norm"], freeze_last_layer=h["freeze_last_layer_epochs"],
                                      norm_last_layer=h["norm_last_layer"])
        return DinoNetwork(backbone, head)

    student = make(recipe["model"]["drop_path_rate"], True)
    teacher = make(0.0, False)  # takes the student's weights below
    teacher.load_state_dict(student.state_dict())
    deactivate_requires_grad(teacher)
    return student, teacher


def build_multicrop_transform(data: Mapping[str, Any], backbone: nn.Module):
    """lightly's DINO multi-crop transform (2 global + n local views), normalized with the backbone's mean/std."""
    from lightly.transforms import DINOTransform
    from timm.data import resolve_data_config
    cfg = resolve_data_config({}, model=backbone)
    return DINOTransform(global_crop_size=data["global_crop_size"], global_crop_scale=tuple(data["global_crop_scale"]),
                         local_crop_size=data["local_crop_size"], local_crop_scale=tuple(data["local_crop_scale"]),
                         n_local_views=data["n_local_views"],
                         normalize={"mean": list(cfg["mean"]), "std": list(cfg["std"])}, **data["augment"])


def _check(recipe: Mapping[str, Any], world_size: int) -> None:
    t = recipe["train"]
    if t["epochs"] < 1:
        raise ValueError(f"train.epochs must be >= 1, got {t['epochs']}")
    if t["batch_size"] % world_size:
        raise ValueError(f"train.batch_size {t['batch_size']} is not divisible by the {world_size} processes")
    if recipe["data"]["n_local_views"] < 0:
        raise ValueError("data.n_local_views must be >= 0")


def _teacher_temp(train: Mapping[str, Any], epoch: int) -> float:
    """The teacher temperature of 0-based ``epoch``: the official DINO schedule, ``linspace(warmup_teacher_temp,
    teacher_temp, warmup_teacher_temp_epochs)`` over the first epochs (so the last warm-up epoch is at
    ``teacher_temp``), then constant."""
    warm = train["warmup_teacher_temp_epochs"]
    if epoch >= warm - 1:
        return train["teacher_temp"]
    return train["warmup_teacher_temp"] + (train["teacher_temp"] - train["warmup_teacher_temp"]) * epoch / (warm - 1)


def _evaluate(teacher: DinoNetwork, recipe: Mapping[str, Any], dist: DistInfo,
              random_init: bool = False) -> Dict[str, Any]:
    # At random init, BatchNorm statistics are always re-estimated (init statistics describe no data).
    return evaluate_backbone(teacher.backbone, recipe["data"], recipe["eval"], device=dist.device,
                             seed=recipe["train"]["seed"],
                             recalibrate_bn=random_init or recipe["eval"]["recalibrate_bn"])


SSL_STATE_FORMAT = "simattn-ssl-state-v2"  # epochs counted from 1


#: the files a DINO run writes into its folder (``overwrite`` deletes them before a fresh run)
RUN_FILES = ("checkpoint.pth", "backbone.safetensors", "results.json", "curves.png", "config.yaml")
#: recipe entries a resumed run must share with its checkpoint (the network and the data it learns from)
_SAME_RUN_KEYS = (("model", "name"), ("model", "kwargs"), ("head", "output_dim"), ("data", "name"), ("data", "root"),
                  ("data", "global_crop_size"), ("data", "local_crop_size"))


def pretrain(recipe: Mapping[str, Any], resume: bool = False, overwrite: bool = False,
             name: Optional[str] = None) -> Dict[str, Any]:
    """Run DINO pretraining described by a full recipe (see :data:`DEFAULTS`) and evaluate the teacher.

    Returns the results written to ``results.json`` with the run folder as ``output`` (on the main process; other
    processes get ``{}``). ``resume`` continues from ``<output>/checkpoint.pth``; the run folder follows
    :mod:`simattn.utils.runs` (``runs/<name>/<date-time>`` by default, another run's folder only with
    ``overwrite``). Epochs count from 1 in logs, checkpoints and results.
    """
    from lightly.loss import DINOLoss
    from lightly.models.utils import update_momentum
    from lightly.utils.scheduler import cosine_schedule
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler
    from timm.utils import random_seed
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    dist = init_distributed(recipe["train"]["device"], recipe["train"]["dist_timeout"])
    try:
        _check(recipe, dist.world_size)
        t = recipe["train"]
        out_dir, ckpt = open_resumable_run(recipe, name, "ssl", resume=resume, overwrite=overwrite,
                                           map_location=dist.device, state_format=SSL_STATE_FORMAT,
                                           keys=_SAME_RUN_KEYS, what="DINO")
        set_threads(t["threads"])
        random_seed(t["seed"], dist.rank)

        student, teacher = build_dino_networks(recipe)
        if dist.distributed and dist.device.type == "cuda":  # BatchNorm (XCiT stem/LPI, BN head) over all GPUs
            student = nn.SyncBatchNorm.convert_sync_batchnorm(student)
            teacher = nn.SyncBatchNorm.convert_sync_batchnorm(teacher)
        student.to(dist.device)
        teacher.to(dist.device)
        log = EpochResults(out_dir, enabled=dist.is_main, results={"recipe": recipe_to_save(recipe),
                                                                   "world_size": dist.world_size})
        if recipe["eval"]["compare_random_init"] and dist.is_main and not resume:
            log.results["random_init"] = _evaluate(teacher, recipe, dist, random_init=True)
            print(f"random init: {log.results['random_init']}", flush=True)

        dataset = build_image_dataset(recipe["data"], "train", build_multicrop_transform(recipe["data"],
                                                                                        student.backbone))
        per_process = t["batch_size"] // dist.world_size
        if len(dataset) < t["batch_size"]:
            raise ValueError(f"train.batch_size {t['batch_size']} exceeds the {len(dataset)} training images")
        sampler = DistributedSampler(dataset, dist.world_size, dist.rank, shuffle=True, seed=t["seed"],
                                     drop_last=True) if dist.distributed else None
        loader = DataLoader(dataset, batch_size=per_process, shuffle=sampler is None, sampler=sampler,
                            num_workers=recipe["data"]["workers"], drop_last=True,
                            pin_memory=dist.device.type == "cuda", persistent_workers=recipe["data"]["workers"] > 0)
        steps_per_epoch = len(loader)
        total_steps = t["epochs"] * steps_per_epoch

        model = DistributedDataParallel(student) if dist.distributed else student
        optimizer = create_optimizer_v2(student, opt=t["optimizer"], lr=t["lr"], weight_decay=t["weight_decay"])
        decay_groups = [g for g in optimizer.param_groups if g["weight_decay"] > 0]
        scheduler = CosineLRScheduler(optimizer, t_initial=total_steps, lr_min=t["min_lr"],
                                      warmup_t=t["warmup_epochs"] * steps_per_epoch, warmup_lr_init=t["min_lr"],
                                      t_in_epochs=False)
        criterion = DINOLoss(recipe["head"]["output_dim"], student_temp=t["student_temp"],
                             teacher_temp=t["teacher_temp"], center_momentum=t["center_momentum"]).to(dist.device)
        use_amp = bool(t["amp"]) and dist.device.type == "cuda"
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp)

        start_epoch, nonfinite, train_time = 0, 0, 0.0  # start_epoch: epochs done
        if ckpt is not None:
            student.load_state_dict(extract_state_dict(ckpt["student"]))
            teacher.backbone.load_state_dict(ckpt["model"])
            teacher.head.load_state_dict(ckpt["teacher_head"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            criterion.load_state_dict(ckpt["dino_loss"])
            start_epoch, nonfinite, train_time = restore_progress(ckpt, log, out_dir, dist.is_main)
            log.results.update({k: v for k, v in ckpt.get("results", {}).items() if k != "recipe"})
        start_run_folder(out_dir, recipe, overwrite, () if resume else RUN_FILES, dist.is_main)
        segment_start = time.perf_counter()

        # ``epoch`` counts from 0 inside the loop (schedules, sampler); people see epoch + 1
        for epoch in range(start_epoch, t["epochs"]):
            if sampler is not None:
                sampler.set_epoch(epoch)
            student.train()
            teacher.train()  # as in DINO: BatchNorm layers (XCiT stem, LPI) of the teacher use batch statistics
            teacher_temp = _teacher_temp(t, epoch)
            loss_sum, loss_count = torch.zeros((), device=dist.device), 0
            for i, (views, _) in enumerate(progress(loader, f"epoch {epoch + 1}", steps_per_epoch, dist.is_main)):
                step = epoch * steps_per_epoch + i
                scheduler.step_update(step)
                wd = cosine_schedule(step, total_steps, t["weight_decay"], t["weight_decay_end"])
                for group in decay_groups:
                    group["weight_decay"] = wd
                views = [v.to(dist.device, non_blocking=True) for v in views]

                with torch.autocast(dist.device.type, dtype=torch.float16, enabled=use_amp):
                    with torch.no_grad():
                        teacher_out = teacher(views[:2])  # the teacher sees only the global views
                    student_out = model(views)
                    loss = criterion(teacher_out, student_out, teacher_temp=teacher_temp)
                if not all_finite(loss):
                    nonfinite += 1
                    if nonfinite > t["max_nonfinite_steps"]:
                        raise FloatingPointError(
                            f"training diverged: the DINO loss is {float(loss)} at epoch {epoch + 1} step {i + 1} "
                            f"({nonfinite} non-finite so far, train.max_nonfinite_steps={t['max_nonfinite_steps']});"
                            " no weights were written from this point. Lower train.lr or resume from the last "
                            "checkpoint")
                    if dist.is_main:
                        print(f"warning: non-finite DINO loss at epoch {epoch + 1} step {i + 1}: step skipped "
                              f"({nonfinite} of at most {t['max_nonfinite_steps']})", flush=True)
                    optimizer.zero_grad(set_to_none=True)
                    continue

                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if t["clip_grad"]:
                    scaler.unscale_(optimizer)
                    for p in student.parameters():  # DINO clips each parameter tensor's gradient on its own
                        if p.grad is not None:
                            nn.utils.clip_grad_norm_(p, t["clip_grad"])
                student.head.cancel_last_layer_gradients(epoch)  # frozen prototypes early on
                scaler.step(optimizer)
                scaler.update()

                momentum = cosine_schedule(step, total_steps, t["momentum_teacher"], 1.0)
                update_momentum(student, teacher, m=momentum)
                loss_sum += loss.detach()
                loss_count += 1

            record = {"epoch": epoch + 1, "loss": all_reduce_mean(loss_sum / max(loss_count, 1)).item(),
                      "lr": optimizer.param_groups[0]["lr"], "weight_decay": wd, "momentum": momentum,
                      "teacher_temp": teacher_temp, "nonfinite_skipped": nonfinite}
            last = epoch == t["epochs"] - 1
            every = recipe["eval"]["every"]
            if dist.is_main and (last or (every and (epoch + 1) % every == 0)):
                record.update(_evaluate(teacher, recipe, dist))
            log.log_epoch(record)
            if dist.is_main and (last or (epoch + 1) % max(1, t["save_every"]) == 0):
                check_finite_weights(student, "the DINO student")
                check_finite_weights(teacher, "the DINO teacher")
                atomic_torch_save({
                    "format": SSL_STATE_FORMAT, "recipe": recipe_to_save(recipe),
                    "model": teacher.backbone.state_dict(), "teacher_head": teacher.head.state_dict(),
                    "student": student.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "dino_loss": criterion.state_dict(), "epoch": epoch + 1,
                    "nonfinite_skipped": nonfinite, "train_time_s": train_time + time.perf_counter() - segment_start,
                    "history": log.history, "results": log.results,
                }, out_dir / "checkpoint.pth")
            barrier()

        if dist.is_main:
            final = {k: v for k, v in log.history[-1].items() if k.startswith(("knn", "linear", "feature"))}
            log.results["final"] = final
            log.results["output"] = str(out_dir)
            log.results["train_time_s"] = train_time + time.perf_counter() - segment_start
            check_finite_weights(teacher.backbone, "the DINO teacher backbone")
            log.save()
            log.plot(["loss", "knn_top1", "linear_top1"], title=f"DINO {recipe['model']['name']}",
                     references=log.results.get("random_init"), reference_label="random init")
            save_backbone(teacher.backbone, out_dir / "backbone.safetensors", recipe["model"], recipe["eval"],
                          source="DINO teacher", epochs=t["epochs"])
            return {**log.results, "history": log.history}
        return {}
    finally:
        cleanup_distributed()
