"""The engine's options: how every training task runs (batch per process, accumulation, EMA, precision, compile,
clipping, optimizer and schedule, seeds, workers, threads, the run folder), declared once.

Every task's schema extends :class:`EngineConfig` with what it trains (:class:`simattn.classify.config.TrainConfig`,
:class:`simattn.convert.config.ConvertConfig`, :class:`simattn.ssl.config.SslConfig`,
:class:`simattn.detect.config.DetectConfig`), so an engine option is the same key, flag and meaning in every task.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..utils.recipe import SCHEDULES, check_device, check_fields, check_optimizer, check_path, option

__all__ = ["EngineConfig", "scaled_lr"]


@dataclass
class EngineConfig:
    """Every option the engine reads (each is a recipe key, a ``--set`` key and a ``--flag`` of every task)."""

    workers: int = option(0, "data-loader worker processes per rank", low=0)
    pin_memory: bool = option(False, "pin host memory for faster GPU copies (CUDA only)")
    aug_repeats: int = option(0, "repeated augmentation (RepeatAugSampler) copies per image; 0 = off", low=0)
    epochs: int = option(10, "training epochs", low=1)
    batch_size: int = option(64, "per process", low=1)
    grad_accum_steps: int = option(1, "micro-batches per optimizer update", low=1)
    steps_per_epoch: Optional[int] = option(None, "cap on optimizer updates per epoch (quick runs); None = full epochs",
                                          low=1)
    max_updates: Optional[int] = option(None, "stop after this many optimizer updates in all (smoke runs; the epoch "
                                            "where it stops is evaluated as the last); None = every epoch", low=1)
    opt: str = option("adamw", "optimizer name (timm.optim)", check=check_optimizer)
    opt_eps: Optional[float] = option(None, "optimizer epsilon; None = the optimizer's default", low=0.0, low_open=True)
    opt_betas: Optional[List[float]] = option(None, "optimizer betas; None = the optimizer's default", low=0.0,
                                            high=1.0, high_open=True, length=2)
    momentum: float = option(0.9, "SGD-style momentum", low=0.0, high=1.0, high_open=True)
    weight_decay: float = option(0.05, "weight decay (not applied to norms, biases, tokens)", low=0.0)
    lr: Optional[float] = option(None, "absolute learning rate; None = lr_base scaled by the global batch", low=0.0,
                               low_open=True)
    lr_base: float = option(5e-4, "learning rate at a global batch of lr_base_size", low=0.0, low_open=True)
    lr_base_size: int = option(512, "global batch at which lr_base applies", low=1)
    lr_base_scale: str = option("linear", "linear | sqrt", choices=["linear", "sqrt"])
    sched: str = option("cosine", "schedule name (timm.scheduler): cosine | step | ... | none", choices=SCHEDULES)
    sched_on_updates: bool = option(False, "step the schedule every update instead of every epoch")
    decay_rate: float = option(0.1, "poly: the power of the decay; step/multistep: the factor per decay",
                               low=0.0, low_open=True)
    warmup_epochs: float = option(5, "linear warmup length (at most a quarter of the run: a longer one is shortened, "
                                     "with a note)", low=0.0)
    warmup_lr: float = option(1e-6, "learning rate at the start of warmup", low=0.0)
    min_lr: float = option(1e-5, "floor of the decayed learning rate", low=0.0)
    cooldown_epochs: int = option(0, "epochs at min_lr after the schedule", low=0)
    clip_grad: Optional[float] = option(None, "gradient clipping threshold; None = off", low=0.0, low_open=True)
    clip_mode: str = option("norm", "norm | value | agc (timm) | param_norm (each parameter tensor's gradient norm on "
                                    "its own, as DINO clips)", choices=["norm", "value", "agc", "param_norm"])
    model_ema: bool = option(False, "keep an EMA of the weights (timm ModelEmaV3)")
    model_ema_decay: float = option(0.9998, "EMA decay per update", low=0.0, high=1.0, low_open=True, high_open=True)
    model_ema_warmup: bool = option(False, "ramp the EMA decay up over the first updates")
    max_nonfinite_steps: int = option(0, "updates with a non-finite loss to skip (counted in the log) before the run "
                                       "stops with an error", low=0)
    device: Optional[str] = option(None, "cpu | cuda; None = cuda when available", check=check_device)
    amp: bool = option(False, "autocast mixed precision")
    amp_dtype: str = option("float16", "float16 (with loss scaling) | bfloat16", choices=["float16", "bfloat16"])
    grad_checkpointing: bool = option(False, "recompute activations in backward (model.set_grad_checkpointing)")
    channels_last: bool = option(False, "channels_last memory format for model and inputs")
    compile: bool = option(False, "torch.compile the model")
    sync_bn: bool = option(False, "SyncBatchNorm across the processes of a multi-process run (CUDA only)")
    threads: Optional[int] = option(None, "CPU intra-op threads per process; None = torch's default", low=1)
    dist_timeout: float = option(10.0, "minutes a torchrun process waits at a collective before the job stops (a "
                                     "frozen or dead rank)", low=0.0, low_open=True)
    output: Optional[str] = option(None, "run folder (last.pth, best/final .safetensors, metrics.jsonl, summary.json, "
                                       "summary.csv); None = runs/<recipe>/<date-time>", check=check_path)
    resume: Optional[str] = option(None, "checkpoint to continue; 'auto' (or the bare flag) = <output>/last.pth",
                                 const="auto", check=check_path)
    overwrite: bool = option(False, "write into <output> even if it holds another run's files (they are replaced)")
    checkpoint_every_epochs: int = option(1, "write last.pth every N epochs (and always after the last)", low=1)
    checkpoint_every_steps: int = option(0, "also write last.pth every K updates (0 = only at epoch ends)", low=0)
    eval_every_epochs: int = option(1, "evaluate every N epochs (and always after the last; 0 = only after the last)",
                                    low=0)
    log_interval: int = option(50, "updates between progress lines / JSON step records (0 = at epoch ends only)",
                               low=0)
    seed: int = option(0, "base seed (each rank adds its rank)", low=0)
    recipe: Optional[str] = option(None, "the recipe this config came from (informational)")

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> Dict[str, Any]:
        """Plain types only (lists, dicts, str, numbers): safe for JSON, YAML and weights_only checkpoints."""
        return dataclasses.asdict(self)

    def validate(self) -> "EngineConfig":
        """Check every option and the ones that depend on each other (a one-line ValueError)."""
        check_fields(self)
        if self.resume == "auto" and not self.output:
            raise ValueError("option 'resume': 'auto' continues <output>/last.pth, so it needs an output folder "
                             "(--output); or give the checkpoint's path")
        return self

    def check_run(self) -> "EngineConfig":
        """:meth:`validate`, and what a task checks before its run builds anything (its model and data can be
        found): the one check of a run and of ``--print-config``. A recipe may load without it (a shipped ImageNet
        recipe leaves ``data_dir`` to the command line)."""
        return self.validate()


def scaled_lr(cfg: EngineConfig, world_size: int = 1) -> float:
    """``cfg.lr`` if set, else ``lr_base × (global batch / lr_base_size)`` (or its square root), global batch =
    batch_size × world_size × grad_accum_steps (the recipes' ``lr 5e-4 × total_batch/512``)."""
    if cfg.lr is not None:
        return cfg.lr
    ratio = cfg.batch_size * world_size * cfg.grad_accum_steps / cfg.lr_base_size
    return cfg.lr_base * (ratio ** 0.5 if cfg.lr_base_scale == "sqrt" else ratio)
