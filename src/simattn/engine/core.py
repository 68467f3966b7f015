"""The one training engine: every command that trains (``train``, ``ssl``, ``detect``, ``segment``, both ``convert``
stages) is a task run by :class:`Engine`.

The engine owns the run: the process group (:mod:`simattn.engine.dist`), world size, rank and device, the DDP wrap,
SyncBatchNorm, mixed precision (:mod:`simattn.engine.amp`), gradient accumulation and clipping, the weight EMA, the
non-finite guard, the run folder (:mod:`simattn.utils.runs`), the config check, the one checkpoint (``last.pth``) and
its same-run check on resume (:mod:`simattn.engine.state`), the reproducible data stream (:mod:`simattn.engine.data`),
``metrics.jsonl``, ``summary.json``/``summary.csv``, ``config.yaml`` and progress; a command made of several runs
(convert's stages) runs them through :mod:`simattn.engine.stages`. One process or many (``torchrun``: each rank a
shard of the data, rank 0 writes). Checkpoints hold the full state, per-rank RNG states and the position in the
epoch, so a run killed at any point and resumed from its last checkpoint ends with the same weights and metrics as
one that was never interrupted.

The constructor only stores the options (a task's own constructor stores its fields, before or after
``super().__init__``). :meth:`Engine.run` builds the run (:meth:`Engine.build`) and trains it; building calls the
task's methods in this order, each once, with what the earlier ones made already in place:

1. the run folder is resolved and checked and the resume checkpoint read (``self.resuming``, ``self.out``);
2. ``setup()``: open the data (before the model: the data may decide its head);
3. ``create_model()`` → (model, record): the network the optimizer trains (with its initial weights unless
   ``self.resuming``) and the ``create_model`` kwargs that rebuild it;
4. ``train_dataset()`` → the training dataset, its transform set (the model exists by now);
5. the engine places the model (device, SyncBN, EMA) and builds the optimizer and schedule (``build_optimizer()``/
   ``build_scheduler()``, overridable);
6. on resume, the checkpoint's state goes back in, the task's through ``load_task_state(state)``;
7. the run folder is claimed, ``started()`` runs, and the model is compiled / wrapped in DDP.

Then every step: ``to_device(batch)`` → (batch on the device, samples) and ``batch_loss(batch)`` → loss, or (loss,
{name: part}); every evaluated epoch ``evaluate()`` → metrics (keys as the history shows them); at the end
``finish(summary)``: what the task exports (weights, plots). ``task_state()`` is the task's own progress in
``last.pth``.

Optional: ``on_epoch_start()``, ``before_step()`` (gradients final, before the optimizer step), ``after_update()``,
``epoch_extra()`` and ``summary_extra()`` (more entries for the records), ``describe_eval(record)`` and
``same_run_facts()`` (what the run derives that a resumed run must share: the class count the data gives).
Declarations: ``producer``, ``task_name``, ``task_files``, ``csv_columns``, ``model_option``, ``input_options``
(options naming the run's input files) and ``same_run_options`` (options a resumed run must share with its
checkpoint), each option a dotted name.

``cfg`` is the task's schema, an :class:`~simattn.engine.config.EngineConfig` subclass: the engine reads its run,
batch, optimizer, schedule, precision and checkpoint options, the same in every task.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as torch_dist
import yaml
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.layers import convert_sync_batchnorm
from timm.utils import ModelEmaV3, dispatch_clip_grad, random_seed
from torch import nn

from ..models.factory import attention_kind
from ..utils.global_state import preserved_global_state
from ..utils.io import atomic_write_json, atomic_write_text, check_finite_weights
from ..utils.recipe import flag_name, recipe_name, recipe_to_save
from ..utils.runlog import progress, use_tqdm
from ..utils.runs import (check_inputs_kept, check_not_in_use, check_run_folder, claim_run_folder, held_run_folders,
                          release_run_folders, resolve_output)
from ..utils.timing import set_threads
from .amp import MixedPrecision
from .config import EngineConfig, scaled_lr
from .data import build_train_loader
from .dist import (DistInfo, all_finite, all_reduce_mean, barrier, broadcast_buffers, cleanup_distributed,
                   init_distributed)
from .log import MetricsLog
from .state import load_train_state, resume_path, resume_run, save_run

__all__ = ["Engine", "RunResult", "run", "session", "ENGINE_FILES", "build_optimizer", "build_scheduler", "scaled_lr",
           "option_value", "WARMUP_SHARE", "run_warmup_epochs"]

#: the files the engine writes into every run folder (a task adds its own: ``Engine.task_files``)
ENGINE_FILES = ("last.pth", "metrics.jsonl", "summary.json", "summary.csv", "config.yaml")


def build_optimizer(cfg: EngineConfig, model: nn.Module, world_size: int = 1) -> Tuple[torch.optim.Optimizer, float]:
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


#: the largest share of a run its warm-up may take: a recipe's warm-up in a run cut short with ``--epochs`` would
#: otherwise fill the run (the lr never reaching its peak) or leave the decay a few updates
WARMUP_SHARE = 0.25


def run_warmup_epochs(cfg: EngineConfig) -> float:
    """The warm-up a run of ``cfg`` gets: ``warmup_epochs``, at most :data:`WARMUP_SHARE` of the run (in whole epochs
    when the schedule steps per epoch)."""
    cap = cfg.epochs * WARMUP_SHARE
    return min(cfg.warmup_epochs, cap if cfg.sched_on_updates else math.floor(cap))


def build_scheduler(cfg: EngineConfig, optimizer: torch.optim.Optimizer, updates_per_epoch: int):
    """timm ``create_scheduler_v2`` → (scheduler or None, total epochs including cooldown).

    A warm-up shortened by :func:`run_warmup_epochs` comes before the decay, which starts at the peak lr the warm-up
    ends on (timm's warm-up otherwise overlaps the decay's first epochs, a step down that is small only while the
    warm-up is a small part of the run); every other schedule is timm's as the recipe gives it."""
    warmup = run_warmup_epochs(cfg)
    shortened = warmup < cfg.warmup_epochs
    scheduler, total = create_scheduler_v2(
        optimizer, sched=cfg.sched, num_epochs=cfg.epochs - warmup if shortened else cfg.epochs,
        warmup_epochs=warmup, warmup_prefix=shortened, warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr,
        cooldown_epochs=cfg.cooldown_epochs, decay_rate=cfg.decay_rate, step_on_epochs=not cfg.sched_on_updates,
        updates_per_epoch=updates_per_epoch)
    return scheduler, int(round(total)) if shortened else total


@contextlib.contextmanager
def _weight_norm_detached(model: nn.Module):
    """``model`` without the weights that ``torch.nn.utils.weight_norm`` computes from ``weight_g``/``weight_v``
    (non-leaf tensors, which ``copy.deepcopy`` refuses; e.g. lightly's DINO head); each is computed again before
    the next forward, in the model and in any copy of it."""
    from torch.nn.utils.weight_norm import WeightNorm
    held = [(m, hook.name, getattr(m, hook.name)) for m in model.modules() for hook in m._forward_pre_hooks.values()
            if isinstance(hook, WeightNorm) and hook.name in m.__dict__]
    for m, name, _ in held:
        delattr(m, name)
    try:
        yield model
    finally:
        for m, name, weight in held:
            setattr(m, name, weight)


def option_value(cfg: Any, name: str) -> Any:
    """The value of option ``name`` of a schema instance (dotted for sections: ``model.weights``)."""
    for part in name.split("."):
        cfg = getattr(cfg, part)
    return cfg


@dataclass
class RunResult:
    """What :func:`run` returns: the summary written to ``summary.json``, the trained modules and the folder."""
    summary: Dict[str, Any]
    model: nn.Module
    ema: Optional[nn.Module]
    output: Path
    is_main: bool = True  # the process that wrote the files (under torchrun, rank 0)


class Engine:
    """One training run of ``cfg`` on ``dist``; subclasses are the tasks (see the module docstring)."""

    #: the command recorded as the producer of every weights file and of the checkpoint (resumed only by it)
    producer = "simattn train"
    #: what names a default run folder (``runs/<recipe or task>/<date-time>``)
    task_name = "train"
    #: the files the task writes besides :data:`ENGINE_FILES` (``--overwrite`` moves them all aside, and refuses a
    #: folder holding anything else)
    task_files: Tuple[str, ...] = ()
    #: history keys that summary.csv shows after epoch and train_loss (timm's column names → history keys)
    csv_columns: Dict[str, str] = {}
    #: how the training loader batches samples (None: the engine's default, which drops unreadable images)
    collate_fn: Optional[Callable] = None
    #: the option that names the network (recorded in checkpoints and summaries)
    model_option = "model"
    #: options whose values are input files of the run (the run folder must not replace them)
    input_options: Tuple[str, ...] = ()
    #: options a resumed run must share with its checkpoint (the network, the data it learns from)
    same_run_options: Tuple[str, ...] = ()

    def __init__(self, cfg: EngineConfig, dist: Optional[DistInfo] = None) -> None:
        """Store the options; nothing is read or built before :meth:`build` (``dist``: the process group, else
        joined or created there)."""
        self.cfg, self.dist = cfg, dist
        self.built = False

    def build(self) -> "Engine":
        """Build the run, once: the checked folder, the data, the model, the optimizer, the resumed state and the
        claimed folder, in the order of the module docstring (:meth:`run` calls it). Returns the engine."""
        if self.built:
            return self
        resume_state = self._prepare()
        self.setup()
        # identical initial weights on every rank; the per-rank seed for training randomness comes after
        torch.manual_seed(self.cfg.seed)
        self.model, self.model_kwargs = self.create_model()
        random_seed(self.cfg.seed, self.dist.rank)
        self._build_loader(self.train_dataset())
        self._place_model()
        self.optimizer, self.lr = self.build_optimizer()
        self.scheduler, self.num_epochs = self.build_scheduler()
        self.precision = MixedPrecision(self.device, self.cfg.amp, self.cfg.amp_dtype)
        if self.precision.note and self.dist.is_main:
            print(self.precision.note, flush=True)
        self._start_position()
        keep_records = resume_run(self, self.resume_path, resume_state) if resume_state is not None else None
        self._claim_folder(keep_records)  # only now (the resume checkpoint was valid) may files in the folder change
        self.started()
        self.forward_model = self._wrap_model()
        self.built = True
        return self

    def _prepare(self) -> Optional[Dict[str, Any]]:
        """The process group, device and run folder, checked before any work; returns the state of the checkpoint
        to resume (read, not applied) or None."""
        cfg = self.cfg
        if self.dist is None:
            self.dist = init_distributed(cfg.device, cfg.dist_timeout)
        dist = self.dist
        self.device = dist.device
        set_threads(cfg.threads)
        self.show_bars = use_tqdm(dist.is_main)
        self.model_name = option_value(cfg, self.model_option)
        self.pin_memory = cfg.pin_memory and self.device.type == "cuda"
        self.sync_bn = cfg.sync_bn and dist.distributed
        if self.sync_bn and self.device.type != "cuda":
            raise ValueError("sync_bn needs CUDA (SyncBatchNorm has no CPU implementation)")
        self.resume_path = resume_path(cfg)
        self.resuming = self.resume_path is not None
        self.out = resolve_output(cfg.output, recipe_name(cfg.recipe), self.task_name, self.resume_path)
        if dist.is_main:  # another live run there: refused now rather than after the model and data are built
            check_not_in_use(self.out)
        check_run_folder(self.out, self.resume_path, cfg.overwrite, writes=self.run_files)
        return load_train_state(self.resume_path, self.producer) if self.resuming else None

    def _build_loader(self, train_set) -> None:
        cfg = self.cfg
        self.train_loader, self.sampler = build_train_loader(train_set, cfg, self.dist, self.pin_memory,
                                                             self.collate_fn)
        self.updates_per_epoch = len(self.train_loader) // cfg.grad_accum_steps
        if cfg.steps_per_epoch:
            self.updates_per_epoch = min(self.updates_per_epoch, cfg.steps_per_epoch)
        if self.updates_per_epoch < 1:
            raise ValueError(f"an epoch has {len(self.train_loader)} batches, fewer than grad_accum_steps="
                             f"{cfg.grad_accum_steps}: lower batch_size or grad_accum_steps")

    def _place_model(self) -> None:
        """The model on the device in the recipe's layout (channels_last, gradient checkpointing, SyncBN), and its
        EMA."""
        cfg = self.cfg
        self.model.to(self.device)
        if cfg.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if cfg.grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        if self.sync_bn:
            # timm's conversion keeps BatchNormAct2d's activation (torch's drops it)
            self.model = convert_sync_batchnorm(self.model)
        self.ema = None
        if cfg.model_ema:
            with _weight_norm_detached(self.model):  # ModelEmaV3 deep-copies the model
                self.ema = ModelEmaV3(self.model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup)

    def _start_position(self) -> None:
        """The run state of a fresh run (resuming overwrites it)."""
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.loss_sum, self.samples = 0.0, 0
        self.part_sums: Dict[str, float] = {}
        self.nonfinite_skipped, self._skip_update = 0, False
        self.train_time_base, self._segment_start = 0.0, time.perf_counter()
        self.last_eval: Optional[Dict[str, Any]] = None
        self.history: List[Dict[str, Any]] = []

    def _claim_folder(self, keep_records: Optional[int]) -> None:
        """Claim the run folder (main process), open metrics.jsonl (continued on resume) and write config.yaml."""
        cfg, dist = self.cfg, self.dist
        in_place = self.resuming and self.resume_path.resolve().parent == self.out.resolve()
        barrier()
        if dist.is_main:
            inputs = {flag_name(name): option_value(cfg, name) for name in self.input_options}
            check_inputs_kept(self.out, self.run_files, inputs)
            claim_run_folder(self.out, cfg.overwrite, () if in_place else self.run_files,
                             resume_from=self.resume_path, writes=self.run_files)
        source = None if in_place or not self.resuming else self.resume_path.parent / "metrics.jsonl"
        self.log = MetricsLog(self.out, dist.is_main, keep_records, source=source)
        if dist.is_main:
            atomic_write_text(yaml.safe_dump(recipe_to_save(cfg), sort_keys=False), self.out / "config.yaml")

    def _wrap_model(self) -> nn.Module:
        """What the steps call: the model, compiled when asked, in DDP when distributed."""
        forward_model = torch.compile(self.model) if self.cfg.compile else self.model
        if self.dist.distributed:
            from torch.nn.parallel import DistributedDataParallel
            forward_model = DistributedDataParallel(
                forward_model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return forward_model
    @property
    def run_files(self) -> Tuple[str, ...]:
        return ENGINE_FILES + tuple(self.task_files)

    # ----- task: what a task supplies (defaults where one makes sense)
    def setup(self) -> None:
        """Open the datasets (before the model is built: the data may decide its head)."""

    def create_model(self) -> Tuple[nn.Module, Dict[str, Any]]:
        """The model the optimizer trains, with its initial weights unless ``self.resuming`` (those come from the
        checkpoint), and its ``create_model`` kwargs (checkpoints and weights record them)."""
        raise NotImplementedError

    def train_dataset(self):
        """The training dataset, its transform set (the model exists by now)."""
        raise NotImplementedError

    def to_device(self, batch: Any) -> Tuple[Any, int]:
        """(batch on the device, number of samples in it): tensors in tuples, lists and dicts are moved; the samples
        are the length of the batch's first entry."""
        def move(x: Any) -> Any:
            if torch.is_tensor(x):
                return x.to(self.device, non_blocking=True)
            if isinstance(x, (list, tuple)):
                return type(x)(move(v) for v in x)
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            return x
        return move(batch), len(batch[0])

    def batch_loss(self, batch: Any):
        """The loss of one micro-batch (runs under autocast and DDP's no_sync), or (loss, {name: part})."""
        raise NotImplementedError

    def evaluate(self) -> Dict[str, Any]:
        """Metrics of the current weights, merged into the epoch's record (every process calls it)."""
        return {}

    def finish(self, summary: Dict[str, Any]) -> None:
        """Export the task's results (main process; weights are checked finite before)."""

    def same_run_facts(self) -> Dict[str, Any]:
        """What the run derives (no option holds it) that a resumed run must share with its checkpoint, e.g. the
        class count the data gives; added to the values of ``same_run_options``."""
        return {}

    def task_state(self) -> Dict[str, Any]:
        """The task's own progress for ``last.pth`` (tensors and plain values: the best score so far, a teacher),
        given back to :meth:`load_task_state`."""
        return {}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`task_state` saved (called while resuming, once the model, data and optimizer are
        built and before ``started()``)."""

    # ----- optional
    def started(self) -> None:
        """Called on every process once the run folder is claimed (main process: log what it starts from)."""

    def on_epoch_start(self) -> None:
        """Before each training epoch (``self.epoch`` is 0-based)."""

    def before_step(self) -> None:
        """Change gradients after clipping, before the step (e.g. DINO's frozen last layer)."""

    def after_update(self) -> None:
        """After each optimizer update (e.g. a teacher's momentum update)."""

    def epoch_extra(self) -> Dict[str, Any]:
        """More entries for every epoch's record (e.g. where the task's own schedules stand)."""
        return {}

    def summary_extra(self) -> Dict[str, Any]:
        """More entries for summary.json."""
        return {}

    def describe_eval(self, record: Dict[str, Any]) -> str:
        """The evaluation part of the per-epoch line (", val top-1 ...")."""
        return ""

    def build_optimizer(self) -> Tuple[torch.optim.Optimizer, float]:
        return build_optimizer(self.cfg, self.model, self.dist.world_size)

    def build_scheduler(self):
        warmup, cfg = run_warmup_epochs(self.cfg), self.cfg
        if warmup < cfg.warmup_epochs and cfg.sched != "none" and self.dist.is_main:
            print(f"note: warmup_epochs {cfg.warmup_epochs:g} is more than {WARMUP_SHARE:.0%} of this "
                  f"{cfg.epochs}-epoch run: warming up over {warmup:g} epochs instead, then the {cfg.sched} schedule "
                  "from the peak lr (--warmup-epochs sets a shorter warm-up)", flush=True)
        return build_scheduler(cfg, self.optimizer, self.updates_per_epoch)

    def train_time(self) -> float:
        """Seconds spent training, over every session of this run (resumed ones included)."""
        return self.train_time_base + time.perf_counter() - self._segment_start

    # ----- checkpoints (written and taken back by :mod:`simattn.engine.state`)
    def same_run(self) -> Dict[str, Any]:
        """What a resumed run must share with its checkpoint: the values of ``same_run_options`` and
        :meth:`same_run_facts` (the checkpoint records them; resuming compares)."""
        return {**{name: option_value(self.cfg, name) for name in self.same_run_options}, **self.same_run_facts()}

    # ----- training
    def _train_epoch(self) -> None:
        cfg, accum = self.cfg, self.cfg.grad_accum_steps
        self.forward_model.train()
        self.on_epoch_start()
        first_batch = self.step_in_epoch * accum
        self.sampler.set_epoch(self.epoch, start=first_batch * cfg.batch_size)
        n_batches = self.updates_per_epoch * accum
        params = [p for p in self.model.parameters() if p.requires_grad]
        # running loss sum kept on the device between log lines/checkpoints (no host sync per step)
        self._pending_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._pending_parts: Dict[str, torch.Tensor] = {}
        self._pending_samples = 0
        self._t0, self._epoch_seen = time.perf_counter(), 0
        batches = progress(self.train_loader, f"epoch {self.epoch + 1}", n_batches - first_batch, self.show_bars)
        for i, batch in enumerate(batches, start=first_batch):
            if i >= n_batches or self.stopped_early():
                break
            update = (i + 1) % accum == 0
            batch, n = self.to_device(batch)
            self._forward_backward(batch, n, params, update)
            if update:
                self._after_update()
        self._flush_pending()

    def _forward_backward(self, batch: Any, n: int, params, update: bool) -> None:
        cfg = self.cfg
        # DDP: all-reduce gradients only on the micro-batch that completes an update
        no_sync = self.dist.distributed and not update
        with self.forward_model.no_sync() if no_sync else contextlib.nullcontext():
            with self.precision.autocast():
                out = self.batch_loss(batch)
            loss, parts = out if isinstance(out, tuple) else (out, {})
            # one host sync per micro-batch: a non-finite loss must never reach the weights
            if not all_finite(loss):
                self._skip_nonfinite(float(loss.detach()), parts)
                return
            step_now = update and not self._skip_update
            self.precision.backward(loss / cfg.grad_accum_steps)
            if step_now:
                self.precision.unscale(self.optimizer)
                self._clip(params)
                self.before_step()
                self.precision.step(self.optimizer)
        self._pending_loss += loss.detach().double() * n
        for name, value in parts.items():
            self._pending_parts[name] = self._pending_parts.get(name, 0) + value.detach().double() * n
        self._pending_samples += n
        self._epoch_seen += n

    def _clip(self, params: List[nn.Parameter]) -> None:
        """Clip the (unscaled) gradients before the optimizer step."""
        cfg = self.cfg
        if cfg.clip_grad is None:
            return
        if cfg.clip_mode == "param_norm":  # each parameter tensor on its own, as DINO clips
            for p in params:
                if p.grad is not None:
                    nn.utils.clip_grad_norm_(p, cfg.clip_grad)
        else:
            dispatch_clip_grad(params, cfg.clip_grad, mode=cfg.clip_mode)

    def _skip_nonfinite(self, value: float, parts: Dict[str, torch.Tensor]) -> None:
        """Skip the update a non-finite loss belongs to, or stop the run once more than max_nonfinite_steps
        updates were skipped."""
        self.nonfinite_skipped += 1
        where = f"epoch {self.epoch + 1}, update {self.step_in_epoch + 1}/{self.updates_per_epoch}"
        if parts:
            where += " (" + ", ".join(f"{k} {float(v):.4g}" for k, v in parts.items()) + ")"
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
        self.after_update()
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=self.global_step)
        if (cfg.log_interval and self.step_in_epoch % cfg.log_interval == 0) \
                or self.step_in_epoch == self.updates_per_epoch:
            self._log_step()
        if (cfg.checkpoint_every_steps and self.global_step % cfg.checkpoint_every_steps == 0
                and self.step_in_epoch < self.updates_per_epoch):  # at the epoch end, the epoch checkpoint follows
            self._flush_pending()
            save_run(self)
            self.log.info(f"checkpoint: {self.out / 'last.pth'} (epoch {self.epoch + 1}, update "
                          f"{self.step_in_epoch}/{self.updates_per_epoch})")

    def _flush_pending(self) -> None:
        self.loss_sum += float(self._pending_loss)
        for name, value in self._pending_parts.items():
            self.part_sums[name] = self.part_sums.get(name, 0.0) + float(value)
        self.samples += self._pending_samples
        self._pending_loss.zero_()
        self._pending_parts = {}
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
                          f"{self.updates_per_epoch}  loss {loss:.4f}  lr {lr:.3g}  {rate:.0f} samples/s")

    def describe(self) -> str:
        n_params = sum(p.numel() for p in self.model.parameters())
        planned = self.num_epochs * self.updates_per_epoch
        length = f"{self.num_epochs} epochs × {self.updates_per_epoch} updates"
        if self.cfg.max_updates is not None and self.cfg.max_updates < planned:
            length = f"{self.cfg.max_updates} updates (max_updates; the schedule's {length})"
        return (f"model {self.model_name} ({n_params / 1e6:.2f}M params), {self.dist.world_size} process(es) × batch "
                f"{self.cfg.batch_size} × accum {self.cfg.grad_accum_steps}, lr {self.lr:.3g}, {length}, device "
                f"{self.device}, output {self.out}")

    def stopped_early(self) -> bool:
        """Whether ``max_updates`` ends the run before its last epoch."""
        return self.cfg.max_updates is not None and self.global_step >= self.cfg.max_updates

    def is_last_epoch(self) -> bool:
        """Whether the epoch being trained (or just trained) is the run's last."""
        return self.epoch + 1 == self.num_epochs or self.stopped_early()

    def _evaluate_now(self) -> bool:
        """Whether the epoch just trained is evaluated (the last one always is)."""
        every = self.cfg.eval_every_epochs
        return self.is_last_epoch() or bool(every and (self.epoch + 1) % every == 0)

    def run(self) -> RunResult:
        """Build the run (:meth:`build`), train it to its last epoch, evaluate, checkpoint, and finish."""
        self.build()
        log = self.log
        log.info(self.describe())
        self._segment_start = time.perf_counter()
        while self.epoch < self.num_epochs and not self.stopped_early():
            epoch_start = time.perf_counter()
            self._train_epoch()
            names = sorted(self.part_sums)
            totals = all_reduce_mean(torch.tensor([self.loss_sum, self.samples] + [self.part_sums[k] for k in names],
                                                  dtype=torch.float64, device=self.device))
            seen = max(float(totals[1]), 1.0)
            record: Dict[str, Any] = {"epoch": self.epoch + 1, "global_step": self.global_step,
                                      "train_loss": float(totals[0] / seen),
                                      **{k: float(v / seen) for k, v in zip(names, totals[2:])},
                                      "lr": self.optimizer.param_groups[0]["lr"]}
            record.update(self.epoch_extra())
            broadcast_buffers(self.model)  # every rank evaluates and saves the weights rank 0 writes
            evaluated = self._evaluate_now()
            if evaluated:
                metrics = self.evaluate()
                record.update(metrics)
                self.last_eval = dict(record)
            record["epoch_time_s"] = time.perf_counter() - epoch_start
            record["nonfinite_skipped"] = self.nonfinite_skipped
            self.history.append({k: v for k, v in record.items()
                                 if k not in ("global_step", "epoch_time_s", "nonfinite_skipped")
                                 and (isinstance(v, (int, float)) or v is None)})
            log.record("epoch", **record)
            if evaluated:
                self._write_summary_csv()
            log.info(f"epoch {record['epoch']}/{self.num_epochs}: train loss {record['train_loss']:.4f}"
                     + self.describe_eval(record) + f" ({record['epoch_time_s']:.1f}s)")
            if self.scheduler is not None:
                self.scheduler.step(self.epoch + 1, record.get(self.scheduler_metric))
            last = self.is_last_epoch()
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            self.loss_sum, self.samples, self.part_sums = 0.0, 0, {}
            if last or self.epoch % self.cfg.checkpoint_every_epochs == 0:
                save_run(self)
        return self._finish(self.train_time())

    #: the history key a plateau schedule follows
    scheduler_metric = "val_top1"

    def _write_summary_csv(self) -> None:
        """timm's summary.csv: one row per evaluated epoch, rewritten whole (atomically)."""
        if not self.dist.is_main:
            return
        columns = {"epoch": "epoch", "train_loss": "train_loss", **self.csv_columns, "lr": "lr"}
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for row in self.history:
            if any(key in row for key in self.csv_columns.values()) or not self.csv_columns:
                writer.writerow({col: row.get(key, "") for col, key in columns.items()})
        atomic_write_text(text.getvalue(), self.out / "summary.csv")

    def _finish(self, train_time: float) -> RunResult:
        summary = {
            "task": self.producer, "model": self.model_name, "attention": attention_kind(self.model),
            "model_kwargs": self.model_kwargs,
            "recipe": self.cfg.recipe, "params": sum(p.numel() for p in self.model.parameters()),
            "epochs": self.num_epochs, "updates": self.global_step, "world_size": self.dist.world_size,
            "lr": self.lr, "history": self.history, "nonfinite_skipped": self.nonfinite_skipped,
            "train_time_s": train_time, "output": str(self.out),
            "files": {name: str(self.out / name) for name in self.run_files},
            **self.summary_extra(),
        }
        if self.dist.is_main:
            check_finite_weights(self.model, "the model")
            self.finish(summary)
            atomic_write_json(summary, self.out / "summary.json")
        barrier()
        return RunResult(summary, self.model, self.ema.module if self.ema is not None else None, self.out,
                         self.dist.is_main)


@contextlib.contextmanager
def session(cfg: EngineConfig):
    """The process group of one command (joined under torchrun, else created here), its threads, and the run
    folders it holds, given up when its runs are over; ``cfg`` is checked first. Threads, random streams and
    backend flags are put back as they were. Yields the :class:`~simattn.engine.dist.DistInfo`."""
    cfg.check_run()
    with preserved_global_state():
        set_threads(cfg.threads)
        created_group = not (torch_dist.is_available() and torch_dist.is_initialized())
        dist = init_distributed(cfg.device, cfg.dist_timeout)
        held = held_run_folders()
        try:
            yield dist
        finally:
            release_run_folders(keep=held)  # the run folders are free again once the runs are over
            if created_group:
                cleanup_distributed()


def run(cfg: EngineConfig, engine_cls: type, **kwargs: Any) -> RunResult:
    """Run task ``engine_cls`` (an :class:`Engine` subclass) on ``cfg`` (single process, or DDP under torchrun)."""
    with session(cfg) as dist:
        return engine_cls(cfg, dist, **kwargs).run()
