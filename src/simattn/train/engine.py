"""The training run: timm's model, optimizer, scheduler, loss, EMA and scaler around a resumable loop.

One process or many (``torchrun``: DDP, each rank a shard of the data, rank 0 writes). Checkpoints hold the full
state, per-rank RNG states and the position in the epoch, so a run killed at any point and resumed from its last
checkpoint ends with the same weights and metrics as one that was never interrupted.

Extending the engine (e.g. distillation) — subclass :class:`Trainer` and run it with ``train(cfg, trainer_cls=...)``:

- ``cfg`` is a :class:`~simattn.train.config.TrainConfig` (or a dataclass subclass of it with more fields);
- ``build_model(self, num_classes) -> (model, create_model_kwargs)`` builds the trained model; the kwargs go into
  checkpoints and the exported safetensors metadata. Alternatively pass ``model_factory=fn(cfg, num_classes) ->
  (model, kwargs)`` to ``Trainer``/``train`` instead of subclassing;
- ``compute_loss(self, images, target) -> loss`` is the training loss of one micro-batch (already on the device,
  under autocast and DDP's no_sync; ``target`` is soft when Mixup is on). The default is
  ``self.criterion(self.forward_model(images), target)``;
- ``extra_state(self) -> dict`` is saved in ``last.pth`` (tensors and plain values only: weights_only loading) and
  handed back to ``load_extra_state(self, state)`` on resume;
- ``export_metadata(self) -> dict`` is added to the metadata of every exported safetensors file (JSON values).

Attributes a subclass needs (a teacher model, ...) are set before calling ``super().__init__``, since the
constructor already resumes (and so calls ``load_extra_state``).

Run folder rules (:mod:`simattn.utils.runs`): a run never writes into a folder holding another run's files unless
``overwrite``; resuming checks that model, model kwargs and data match the checkpoint. A non-finite loss stops the
run with a one-line :class:`FloatingPointError` (after ``max_nonfinite_steps`` skipped updates), and weights with
non-finite values are never written.
"""
from __future__ import annotations

import contextlib
import csv
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as torch_dist
import yaml
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, NativeScaler, dispatch_clip_grad, random_seed
from torch import nn

from ..models.factory import create_model
from ..utils.distributed import DistInfo, all_finite, all_reduce_mean, barrier, cleanup_distributed, init_distributed
from ..utils.io import CheckpointError, atomic_write_json, atomic_write_text, check_finite_weights, load_weights
from ..utils.recipe import recipe_name, recipe_to_save
from ..utils.runs import check_inputs_kept, check_run_folder, claim_run_folder, resolve_output
from ..utils.timing import set_threads
from .checkpoint import (capture_rng_state, export_weights, load_train_state, restore_rng_state, save_train_state,
                         weights_metadata)
from .config import TrainConfig, scaled_lr
from .logs import MetricsLog, format_table
from .loader import build_eval_loader, build_mixup, build_train_loader, build_transform, data_config_for
from ..utils.runlog import progress, use_tqdm
from .loop import autocast, evaluate

__all__ = ["train", "Trainer", "TrainResult", "RUN_FILES", "open_datasets", "build_model", "build_optimizer",
           "build_scheduler", "summary_table"]

#: the files a training run writes into its folder (``overwrite`` deletes them before a fresh run)
RUN_FILES = ("last.pth", "best.safetensors", "final.safetensors", "final_ema.safetensors", "metrics.jsonl",
             "summary.json", "summary.csv", "config.yaml")
#: summary.csv columns (timm's train.py layout) and the history keys they come from
CSV_COLUMNS = {"epoch": "epoch", "train_loss": "train_loss", "eval_loss": "val_loss", "eval_top1": "val_top1",
               "eval_top5": "val_top5", "lr": "lr"}


@dataclass
class TrainResult:
    """What :func:`train` returns: the summary written to ``summary.json`` and the trained modules."""
    summary: Dict[str, Any]
    model: nn.Module
    ema: Optional[nn.Module]
    output: Path


def open_datasets(cfg: TrainConfig):
    """The train and val datasets (transforms set later) and their class names, with one-line errors."""
    from ..data.factory import create_dataset, dataset_classes
    train_set = create_dataset(cfg.dataset, cfg.data_dir, cfg.train_split)
    val_set = create_dataset(cfg.dataset, cfg.data_dir, cfg.val_split)
    classes, val_classes = dataset_classes(train_set), dataset_classes(val_set)
    if classes != val_classes:
        raise ValueError(f"the {cfg.train_split!r} and {cfg.val_split!r} splits of {cfg.dataset} have different "
                         f"classes ({len(classes)} vs {len(val_classes)})")
    if len(classes) < 2:
        raise ValueError(f"dataset {cfg.dataset!r} has {len(classes)} class ({', '.join(map(str, classes))}): a "
                         "classifier needs at least 2 (one sub-folder per class)")
    for where, value in (("num_classes", cfg.num_classes), ("model kwarg num_classes",
                                                            cfg.model_kwargs.get("num_classes"))):
        if value is not None and value != len(classes):
            raise ValueError(f"{where}={value} does not match dataset {cfg.dataset!r}, which has {len(classes)} "
                             "classes")
    return train_set, val_set, list(classes)


def build_model(cfg: TrainConfig, num_classes: int) -> Tuple[nn.Module, Dict[str, Any]]:
    """The recipe's model for ``num_classes`` classes, and the full create_model kwargs (for metadata)."""
    kwargs = {**cfg.model_kwargs, "num_classes": num_classes}
    if cfg.drop_path:
        kwargs.setdefault("drop_path_rate", cfg.drop_path)
    if cfg.drop:
        kwargs.setdefault("drop_rate", cfg.drop)
    return create_model(cfg.model, **kwargs), kwargs


def build_optimizer(cfg: TrainConfig, model: nn.Module, world_size: int = 1) -> Tuple[torch.optim.Optimizer, float]:
    """timm ``create_optimizer_v2`` at the learning rate the recipe gives for this global batch."""
    opt_kwargs: Dict[str, Any] = {}
    if cfg.opt_eps is not None:
        opt_kwargs["eps"] = cfg.opt_eps
    if cfg.opt_betas is not None:
        opt_kwargs["betas"] = tuple(cfg.opt_betas)
    lr = scaled_lr(cfg, world_size)
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=lr, weight_decay=cfg.weight_decay,
                                    momentum=cfg.momentum, **opt_kwargs)
    return optimizer, lr


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, updates_per_epoch: int):
    """timm ``create_scheduler_v2`` → (scheduler or None, total epochs including cooldown)."""
    return create_scheduler_v2(
        optimizer, sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs,
        warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr, cooldown_epochs=cfg.cooldown_epochs,
        step_on_epochs=not cfg.sched_on_updates, updates_per_epoch=updates_per_epoch)


class Trainer:
    """One training run of ``cfg`` on ``dist`` (see the module docstring for the extension points)."""

    #: the command recorded as the producer of every weights file this trainer exports
    producer = "simattn train"

    def __init__(self, cfg: TrainConfig, dist: Optional[DistInfo] = None,
                 model_factory: Optional[Callable[[TrainConfig, int], Tuple[nn.Module, Dict[str, Any]]]] = None
                 ) -> None:
        dist = dist if dist is not None else init_distributed(cfg.device, cfg.dist_timeout)
        self.cfg, self.dist, self.device = cfg, dist, dist.device
        self._model_factory = model_factory
        set_threads(cfg.threads)
        self.show_bars = use_tqdm(dist.is_main)
        # where the run writes, checked before any work (nothing is written until the resume state proved valid)
        self.resume_path = self._resume_path()
        self.out = resolve_output(cfg.output, recipe_name(cfg.recipe), "train", self.resume_path)
        check_run_folder(self.out, self.resume_path, cfg.overwrite)
        if cfg.initial_checkpoint and self.resume_path is not None:
            raise ValueError("--initial-checkpoint and --resume exclude each other: a resumed run continues from its "
                             "checkpoint's weights; drop one")
        resume_state = load_train_state(self.resume_path, cfg.model) if self.resume_path is not None else None

        train_set, val_set, self.classes = open_datasets(cfg)
        self.num_classes = len(self.classes)
        # identical initial weights on every rank; the per-rank seed for training randomness comes after
        torch.manual_seed(cfg.seed)
        self.model, self.model_kwargs = self.build_model(self.num_classes)
        self.initial_weights: Optional[Dict[str, Any]] = None
        if cfg.initial_checkpoint and resume_state is None:  # a resumed run's weights come from its checkpoint
            from ..models.factory import load_initial_weights
            report = load_initial_weights(self.model, cfg.initial_checkpoint, model_name=cfg.model)
            self.initial_weights = {"path": str(cfg.initial_checkpoint), "summary": report.summary(),
                                    **{k: len(v) for k, v in report.as_dict().items() if isinstance(v, list)}}
            if dist.is_main:
                print(f"initial weights: {report.summary()}", flush=True)
        random_seed(cfg.seed, dist.rank)

        self.data_config = data_config_for(self.model, cfg)
        train_set.transform = build_transform(self.data_config, cfg, is_training=True)
        val_set.transform = build_transform(self.data_config)
        self.train_loader, self.sampler = build_train_loader(train_set, cfg, dist)
        self.val_loader = build_eval_loader(val_set, cfg.batch_size, cfg.workers, dist, cfg.pin_memory)
        self.updates_per_epoch = len(self.train_loader) // cfg.grad_accum_steps
        if cfg.steps_per_epoch:
            self.updates_per_epoch = min(self.updates_per_epoch, cfg.steps_per_epoch)
        if self.updates_per_epoch < 1:
            raise ValueError(f"an epoch has {len(self.train_loader)} batches, fewer than grad_accum_steps="
                             f"{cfg.grad_accum_steps}: lower batch_size or grad_accum_steps")

        self.model.to(self.device)
        if cfg.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if cfg.grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        if cfg.sync_bn and dist.distributed:
            if self.device.type != "cuda":
                raise ValueError("sync_bn needs CUDA (SyncBatchNorm has no CPU implementation)")
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.ema = None
        if cfg.model_ema:
            self.ema = ModelEmaV3(self.model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup)

        self.optimizer, self.lr = build_optimizer(cfg, self.model, dist.world_size)
        self.scheduler, self.num_epochs = build_scheduler(cfg, self.optimizer, self.updates_per_epoch)
        self.scaler = None
        if cfg.amp and cfg.amp_dtype == "float16":
            self.scaler = NativeScaler(device=self.device.type)

        self.mixup = build_mixup(cfg, self.num_classes)
        if self.mixup is not None:
            self.criterion = SoftTargetCrossEntropy()  # Mixup already smoothed the targets
        elif cfg.smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
        else:
            self.criterion = nn.CrossEntropyLoss()

        # run state (a fresh run; _resume overwrites it)
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.loss_sum, self.samples, self.train_skipped = 0.0, 0, 0
        self.nonfinite_skipped, self._skip_update = 0, False
        self.train_time_base, self._segment_start = 0.0, time.perf_counter()
        self.best: Dict[str, Any] = {"top1": -1.0, "epoch": -1}
        self.last_eval: Optional[Dict[str, Any]] = None
        self.history: List[Dict[str, Any]] = []
        keep_records = self._resume(resume_state) if resume_state is not None else None

        # only now (the resume checkpoint was valid) may files in the run folder change
        in_place = self.resume_path is not None and self.resume_path.resolve().parent == self.out.resolve()
        barrier()
        if dist.is_main:
            check_inputs_kept(self.out, RUN_FILES, {"--initial-checkpoint": cfg.initial_checkpoint})
            claim_run_folder(self.out, cfg.overwrite, () if in_place else RUN_FILES)
        source = None if in_place or self.resume_path is None else self.resume_path.parent / "metrics.jsonl"
        self.log = MetricsLog(self.out, dist.is_main, keep_records, source=source)
        if dist.is_main:
            atomic_write_text(yaml.safe_dump(recipe_to_save(cfg), sort_keys=False), self.out / "config.yaml")
            if self.initial_weights is not None:
                self.log.record("initial_weights", **self.initial_weights)

        self.forward_model = torch.compile(self.model) if cfg.compile else self.model
        if dist.distributed:
            from torch.nn.parallel import DistributedDataParallel
            self.forward_model = DistributedDataParallel(
                self.forward_model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # ----- extension points
    def build_model(self, num_classes: int) -> Tuple[nn.Module, Dict[str, Any]]:
        """The model to train and its ``create_model`` kwargs (recorded in checkpoints and weights metadata)."""
        if self._model_factory is not None:
            return self._model_factory(self.cfg, num_classes)
        return build_model(self.cfg, num_classes)

    def compute_loss(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of one micro-batch (runs under autocast; ``target`` is soft when Mixup is on)."""
        return self.criterion(self.forward_model(images), target)

    def extra_state(self) -> Dict[str, Any]:
        """More state for ``last.pth`` (tensors and plain values), given back to :meth:`load_extra_state`."""
        return {}

    def load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` saved (called while resuming, inside the constructor)."""

    def export_metadata(self) -> Dict[str, Any]:
        """More metadata for every exported safetensors file (JSON-encodable values)."""
        return {}

    # ----- checkpoints
    def _resume_path(self) -> Optional[Path]:
        if self.cfg.resume is None:
            return None
        if self.cfg.resume == "auto":
            if not self.cfg.output:
                raise ValueError("--resume without a path continues <output>/last.pth, so it needs --output (or "
                                 "give the checkpoint: --resume RUN/last.pth)")
            return Path(self.cfg.output) / "last.pth"
        return Path(self.cfg.resume)

    def _check_same_run(self, path: Path, state: Dict[str, Any]) -> None:
        """Refuse to resume a checkpoint of another model or data (a one-line CheckpointError naming them)."""
        saved = state.get("config") or {}
        saved_kwargs = dict(state.get("model_kwargs") or {})
        pairs = [
            ("model_kwargs", saved.get("model_kwargs", {}), self.cfg.model_kwargs),
            ("dataset", str(saved.get("dataset", self.cfg.dataset)).lower(), str(self.cfg.dataset).lower()),
            ("data_dir", saved.get("data_dir", self.cfg.data_dir), self.cfg.data_dir),
            ("num_classes", saved_kwargs.get("num_classes", self.num_classes), self.num_classes),
            ("input size", list((state.get("data_config") or {}).get("input_size", self.data_config["input_size"])),
             list(self.data_config["input_size"])),
        ]
        if self.cfg.model_ema != ("model_ema" in state):
            pairs.append(("model_ema", "model_ema" in state, self.cfg.model_ema))
        diffs = [f"{name} {old!r} vs {new!r}" for name, old, new in pairs if old != new]
        if diffs:
            raise CheckpointError(f"cannot resume {path}: the checkpoint and this run differ in {'; '.join(diffs)} "
                                  "(checkpoint vs this run); resume with the run's own options (its config.yaml), "
                                  "or start a new run from its weights with --initial-checkpoint")

    def _resume(self, state: Dict[str, Any]) -> int:
        path = self.resume_path
        self._check_same_run(path, state)
        load_weights(self.model, path)
        if self.ema is not None:
            if "model_ema" not in state:
                raise CheckpointError(f"{path} has no EMA weights but this run keeps an EMA (model_ema)")
            load_weights(self.ema.module, path, use_ema=True)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit this run: {e}") from None
        # timm schedulers are a pure function of the step: the saved state only differs from the one just built
        # when the recipe changed (e.g. more epochs), and then the new recipe is the one to follow
        saved_sched = state.get("scheduler")
        if self.scheduler is not None and saved_sched:
            ignore = ("metric",)
            current = {k: v for k, v in self.scheduler.state_dict().items() if k not in ignore}
            if {k: v for k, v in saved_sched.items() if k not in ignore} != current and self.dist.is_main:
                print(f"note: the learning-rate schedule differs from the one in {path}; following this run's "
                      "recipe", flush=True)
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        if self.epoch > self.num_epochs or (self.epoch == self.num_epochs and self.step_in_epoch):
            raise CheckpointError(f"{path} has trained {self.epoch} epoch(s) (+{self.step_in_epoch} steps) but this "
                                  f"run has {self.num_epochs}: resume with at least {self.epoch + 1} epochs, or start a "
                                  "new run from its weights with --initial-checkpoint")
        self.global_step = int(state["global_step"])
        self.best = dict(state.get("best", self.best))
        self.last_eval = state.get("last_eval")
        self.history = list(state.get("history", []))
        self.train_skipped = int(state.get("train_skipped", 0))
        self.nonfinite_skipped = int(state.get("nonfinite_skipped", 0))
        self.train_time_base = float(state.get("train_time_s", 0.0))
        self.load_extra_state(dict(state.get("extra") or {}))
        ranks = state.get("ranks", [])
        saved_world = int(state.get("world_size", 1))
        saved_batch = (state.get("config") or {}).get("batch_size")
        if saved_world != self.dist.world_size or saved_batch != self.cfg.batch_size:
            if self.dist.is_main:
                print(f"warning: {path} was written with {saved_world} process(es) × batch {saved_batch}; this run "
                      f"uses {self.dist.world_size} × {self.cfg.batch_size}: the data order cannot continue exactly",
                      flush=True)
        if self.dist.rank < len(ranks):
            mine = ranks[self.dist.rank]
            restore_rng_state(mine["rng"])
            self.loss_sum, self.samples = float(mine["loss_sum"]), int(mine["samples"])
        if self.scheduler is not None:
            self.scheduler.step(self.epoch)
            self.scheduler.step_update(self.global_step)
        if self.dist.is_main:
            print(f"resumed from {path}: epoch {self.epoch + 1}, update {self.step_in_epoch}/{self.updates_per_epoch}"
                  f" (global update {self.global_step})", flush=True)
        return int(state.get("metrics_records", 0))

    def train_time(self) -> float:
        """Seconds spent training, over every session of this run (resumed ones included)."""
        return self.train_time_base + time.perf_counter() - self._segment_start

    def _save_state(self) -> None:
        """Write last.pth (rank 0) from every rank's RNG state and partial-epoch sums (a collective call)."""
        mine = {"rng": capture_rng_state(), "loss_sum": float(self.loss_sum), "samples": int(self.samples)}
        if self.dist.distributed:
            ranks: List[Any] = [None] * self.dist.world_size
            torch_dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        if not self.dist.is_main:
            return
        state = {
            "model_name": self.cfg.model, "model_kwargs": self.model_kwargs, "config": self.cfg.to_dict(),
            "data_config": self.data_config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
            "updates_per_epoch": self.updates_per_epoch, "world_size": self.dist.world_size, "ranks": ranks,
            "best": self.best, "last_eval": self.last_eval, "history": self.history,
            "train_skipped": self.train_skipped, "nonfinite_skipped": self.nonfinite_skipped,
            "metrics_records": self.log.records, "train_time_s": self.train_time(),
            "extra": self.extra_state(),
        }
        check_finite_weights(self.model, "the model")
        if self.ema is not None:
            check_finite_weights(self.ema.module, "the EMA model")
            state["model_ema"] = self.ema.module.state_dict()
        save_train_state(self.out / "last.pth", state)

    def _export(self, module: nn.Module, name: str, **extra: Any) -> None:
        check_finite_weights(module, name)
        meta = weights_metadata(self.cfg.model, self.model_kwargs, self.data_config, producer=self.producer,
                                recipe=self.cfg.recipe or "", classes=[str(c) for c in self.classes],
                                **{**self.export_metadata(), **extra})
        export_weights(module, self.out / name, meta)

    # ----- training
    def _train_epoch(self) -> None:
        cfg, accum = self.cfg, self.cfg.grad_accum_steps
        self.forward_model.train()
        first_batch = self.step_in_epoch * accum
        self.sampler.set_epoch(self.epoch, start=first_batch * cfg.batch_size)
        n_batches = self.updates_per_epoch * accum
        params = [p for p in self.model.parameters() if p.requires_grad]
        # running loss sum kept on the device between log lines/checkpoints (no host sync per step)
        self._pending_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._pending_samples = 0
        self._t0, self._epoch_seen = time.perf_counter(), 0
        batches = progress(self.train_loader, f"epoch {self.epoch + 1}", n_batches - first_batch, self.show_bars)
        for i, (images, target, skipped) in enumerate(batches, start=first_batch):
            if i >= n_batches:
                break
            self.train_skipped += skipped
            if self.mixup is not None and len(target) % 2:  # Mixup pairs samples: drop one after a skipped image
                images, target = images[:-1], target[:-1]
            update = (i + 1) % accum == 0
            if not len(target):  # a whole batch of broken files: the folder is broken, not a few images
                raise ValueError(f"every image of a training batch was unreadable ({self.train_skipped} unreadable "
                                 "so far); check the dataset folder")
            self._forward_backward(images, target, params, update)
            if update:
                self._after_update()
        self._flush_pending()

    def _forward_backward(self, images: torch.Tensor, target: torch.Tensor, params, update: bool) -> None:
        cfg = self.cfg
        images = images.to(self.device, non_blocking=True)
        target = target.to(self.device, non_blocking=True)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        n = len(target)
        if self.mixup is not None:
            images, target = self.mixup(images, target)
        # DDP: all-reduce gradients only on the micro-batch that completes an update
        no_sync = self.dist.distributed and not update
        with self.forward_model.no_sync() if no_sync else contextlib.nullcontext():
            with autocast(self.device, cfg.amp, cfg.amp_dtype):
                loss = self.compute_loss(images, target)
            # one host sync per micro-batch: a non-finite loss must never reach the weights
            if not all_finite(loss):
                self._skip_nonfinite(float(loss.detach()))
                return
            step_now = update and not self._skip_update
            scaled = loss / cfg.grad_accum_steps
            if self.scaler is not None:  # timm NativeScaler: scaled backward, unscale + clip + step on updates
                self.scaler(scaled, self.optimizer, clip_grad=cfg.clip_grad, clip_mode=cfg.clip_mode,
                            parameters=params, need_update=step_now)
            else:
                scaled.backward()
                if step_now:
                    if cfg.clip_grad is not None:
                        dispatch_clip_grad(params, cfg.clip_grad, mode=cfg.clip_mode)
                    self.optimizer.step()
        self._pending_loss += loss.detach().double() * n
        self._pending_samples += n
        self._epoch_seen += n

    def _skip_nonfinite(self, value: float) -> None:
        """Skip the update a non-finite loss belongs to, or stop the run once more than max_nonfinite_steps
        updates were skipped."""
        self.nonfinite_skipped += 1
        where = f"epoch {self.epoch + 1}, update {self.step_in_epoch + 1}/{self.updates_per_epoch}"
        limit = self.cfg.max_nonfinite_steps
        if self.nonfinite_skipped > limit:
            raise FloatingPointError(
                f"training diverged: the loss is {value} at {where} ({self.nonfinite_skipped} non-finite so far, "
                f"max_nonfinite_steps={limit}); no weights were written from this point. Lower the learning rate "
                f"(lr {self.lr:.3g}), set clip_grad, or resume from the last checkpoint")
        self._skip_update = True
        self.optimizer.zero_grad(set_to_none=True)
        self.log.info(f"warning: non-finite loss ({value}) at {where}: update skipped "
                      f"({self.nonfinite_skipped} of at most {limit})")
        self.log.record("nonfinite", epoch=self.epoch + 1, step=self.step_in_epoch + 1, loss=None,
                        skipped=self.nonfinite_skipped)

    def _after_update(self) -> None:
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        self._skip_update = False
        self.global_step += 1
        self.step_in_epoch += 1
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=self.global_step)
        if self.step_in_epoch % cfg.log_interval == 0 or self.step_in_epoch == self.updates_per_epoch:
            self._log_step()
        if (cfg.checkpoint_every_steps and self.global_step % cfg.checkpoint_every_steps == 0
                and self.step_in_epoch < self.updates_per_epoch):  # at the epoch end, the epoch checkpoint follows
            self._flush_pending()
            self._save_state()
            self.log.info(f"checkpoint: {self.out / 'last.pth'} (epoch {self.epoch + 1}, update "
                          f"{self.step_in_epoch}/{self.updates_per_epoch})")

    def _flush_pending(self) -> None:
        self.loss_sum += float(self._pending_loss)
        self.samples += self._pending_samples
        self._pending_loss.zero_()
        self._pending_samples = 0

    def _log_step(self) -> None:
        self._flush_pending()
        loss = self.loss_sum / max(self.samples, 1)
        lr = self.optimizer.param_groups[0]["lr"]
        self.log.record("step", epoch=self.epoch + 1, step=self.step_in_epoch, global_step=self.global_step,
                        loss=loss, lr=lr)
        if not self.show_bars:
            elapsed = max(time.perf_counter() - self._t0, 1e-9)
            rate = self._epoch_seen * self.dist.world_size / elapsed
            self.log.info(f"epoch {self.epoch + 1}/{self.num_epochs} update {self.step_in_epoch}/"
                          f"{self.updates_per_epoch}  loss {loss:.4f}  lr {lr:.3g}  {rate:.0f} img/s")

    def run(self) -> TrainResult:
        cfg, log = self.cfg, self.log
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info(f"model {cfg.model} ({n_params / 1e6:.2f}M params, {self.num_classes} classes), dataset "
                 f"{cfg.dataset}, {self.dist.world_size} process(es) × batch {cfg.batch_size} × accum "
                 f"{cfg.grad_accum_steps}, lr {self.lr:.3g}, {self.num_epochs} epochs × {self.updates_per_epoch} updates,"
                 f" device {self.device}, output {self.out}")
        self._segment_start = time.perf_counter()
        while self.epoch < self.num_epochs:
            epoch_start = time.perf_counter()
            self._train_epoch()
            totals = all_reduce_mean(torch.tensor([self.loss_sum, self.samples], dtype=torch.float64,
                                                  device=self.device))
            train_loss = float(totals[0] / max(float(totals[1]), 1.0))
            record: Dict[str, Any] = {"epoch": self.epoch + 1, "global_step": self.global_step,
                                      "train_loss": train_loss, "lr": self.optimizer.param_groups[0]["lr"]}
            if self.epoch + 1 == self.num_epochs or (self.epoch + 1) % cfg.eval_every_epochs == 0:
                self._evaluate_into(record)
            record["epoch_time_s"] = time.perf_counter() - epoch_start
            record["train_skipped"] = self.train_skipped
            record["nonfinite_skipped"] = self.nonfinite_skipped
            self.history.append({k: record[k] for k in ("epoch", "train_loss", "val_top1", "val_top5", "val_loss", "lr")
                                 if k in record})
            log.record("epoch", **record)
            if "val_top1" in record:
                self._write_summary_csv()
            log.info("epoch {epoch}/{n}: train loss {train_loss:.4f}".format(n=self.num_epochs, **record)
                     + (f", val top-1 {record['val_top1']:.2f}% top-5 {record['val_top5']:.2f}% loss "
                        f"{record['val_loss']:.4f}" if "val_top1" in record else "")
                     + (f", EMA top-1 {record['ema_val_top1']:.2f}%" if "ema_val_top1" in record else "")
                     + f" ({record['epoch_time_s']:.1f}s)")
            if self.scheduler is not None:
                self.scheduler.step(self.epoch + 1, record.get("val_top1"))
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            self.loss_sum, self.samples = 0.0, 0
            self._save_state()
        return self._finish(self.train_time())

    def _write_summary_csv(self) -> None:
        """timm's summary.csv: one row per evaluated epoch, rewritten whole (atomically)."""
        if not self.dist.is_main:
            return
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
        writer.writeheader()
        for row in self.history:
            if "val_top1" in row:
                writer.writerow({col: row.get(key, "") for col, key in CSV_COLUMNS.items()})
        atomic_write_text(text.getvalue(), self.out / "summary.csv")

    def _evaluate_into(self, record: Dict[str, Any]) -> None:
        """Validate the model (and EMA) into ``record``; export best.safetensors when top-1 improved."""
        cfg = self.cfg
        metrics = evaluate(self.model, self.val_loader, self.device, amp=cfg.amp, amp_dtype=cfg.amp_dtype,
                           channels_last=cfg.channels_last, show_progress=self.show_bars)
        record.update({f"val_{k}": v for k, v in metrics.items()})
        if self.ema is not None:
            ema_metrics = evaluate(self.ema.module, self.val_loader, self.device, amp=cfg.amp,
                                   amp_dtype=cfg.amp_dtype, channels_last=cfg.channels_last)
            record.update({f"ema_val_{k}": ema_metrics[k] for k in ("top1", "top5", "loss")})
        self.last_eval = dict(record)
        if metrics["top1"] > self.best["top1"] and self.dist.is_main:
            self.best = {"top1": metrics["top1"], "top5": metrics["top5"], "loss": metrics["loss"],
                         "epoch": self.epoch + 1}
            self._export(self.model, "best.safetensors", epoch=self.epoch + 1, metrics=metrics)

    def _finish(self, train_time: float) -> TrainResult:
        final = self.last_eval or {}
        summary = {
            "model": self.cfg.model, "model_kwargs": self.model_kwargs, "recipe": self.cfg.recipe,
            "params": sum(p.numel() for p in self.model.parameters()), "epochs": self.num_epochs,
            "updates": self.global_step, "world_size": self.dist.world_size, "lr": self.lr,
            "final": {k[4:]: final[k] for k in ("val_top1", "val_top5", "val_loss", "val_samples") if k in final},
            "final_train_loss": final.get("train_loss"),
            "ema": {k[8:]: final[k] for k in ("ema_val_top1", "ema_val_top5", "ema_val_loss") if k in final} or None,
            "best": self.best, "history": self.history,
            "skipped_unreadable": {"train": self.train_skipped, "val": final.get("val_skipped", 0)},
            "nonfinite_skipped": self.nonfinite_skipped, "initial_weights": self.initial_weights,
            "train_time_s": train_time, "data_config": self.data_config,
            "files": {name: str(self.out / name) for name in
                      ["last.pth", "best.safetensors", "final.safetensors", "metrics.jsonl", "summary.csv",
                       "config.yaml"] + (["final_ema.safetensors"] if self.ema is not None else [])},
        }
        if self.dist.is_main:
            self.log.info(summary_table(summary))  # the results are shown before anything else is written
            self._export(self.model, "final.safetensors", epoch=self.num_epochs, metrics=summary["final"])
            if self.ema is not None:
                self._export(self.ema.module, "final_ema.safetensors", epoch=self.num_epochs, metrics=summary["ema"])
            atomic_write_json(summary, self.out / "summary.json")
        barrier()
        return TrainResult(summary, self.model, self.ema.module if self.ema is not None else None, self.out)


def summary_table(summary: Dict[str, Any]) -> str:
    """The end-of-run table: final and best accuracy, loss, time, skipped images, output files."""
    final, best = summary["final"], summary["best"]
    rows = [
        ["model", f"{summary['model']} ({summary['params'] / 1e6:.2f}M params)"],
        ["epochs / updates", f"{summary['epochs']} / {summary['updates']}"],
        ["final val top-1 / top-5", f"{final.get('top1', float('nan')):.2f}% / {final.get('top5', float('nan')):.2f}%"],
        ["final val loss", f"{final.get('loss', float('nan')):.4f}"],
        ["best val top-1", f"{best.get('top1', float('nan')):.2f}% (epoch {best.get('epoch')})"],
    ]
    if summary.get("ema"):
        rows.append(["EMA val top-1", f"{summary['ema'].get('top1', float('nan')):.2f}%"])
    skipped = summary["skipped_unreadable"]
    rows += [
        ["unreadable images skipped", f"train {skipped['train']}, val {skipped['val']}"],
        ["non-finite updates skipped", f"{summary.get('nonfinite_skipped', 0)}"],
        ["train time", f"{summary['train_time_s']:.1f}s"],
        ["output", f"{Path(summary['files']['last.pth']).parent}/ (final.safetensors, best.safetensors, last.pth, "
                   "metrics.jsonl, summary.json, summary.csv)"],
    ]
    return format_table(["summary", ""], rows)


def train(cfg: TrainConfig, trainer_cls: type = Trainer, **trainer_kwargs: Any) -> TrainResult:
    """Train ``cfg`` (single process, or DDP under torchrun) and return the summary and trained model.

    ``trainer_cls`` (a :class:`Trainer` subclass) and ``trainer_kwargs`` (e.g. ``model_factory``) customize the run.
    """
    cfg.validate()
    created_group = not (torch_dist.is_available() and torch_dist.is_initialized())
    dist = init_distributed(cfg.device, cfg.dist_timeout)
    try:
        return trainer_cls(cfg, dist, **trainer_kwargs).run()
    finally:
        if created_group:
            cleanup_distributed()
