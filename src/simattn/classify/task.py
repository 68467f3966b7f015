"""Image classification as a task of the engine (:mod:`simattn.engine.core`): ``simattn train`` runs it, and
``simattn convert``'s stages extend it.

The task supplies the data (a dataset ``train`` reads, its classes), the model (the recipe's, or a
``model_factory``), timm's transforms, Mixup and loss, top-1/top-5 evaluation with ``best.safetensors`` whenever
top-1 improves, and ``final.safetensors`` (+ ``final_ema.safetensors``) at the end. Everything else (DDP, AMP, the
checkpoint and resume, the run folder, logs) is the engine's.

Extending it (e.g. distillation) — subclass :class:`Trainer` and run it with ``train(cfg, trainer_cls=...)``:

- ``build_model(self, num_classes) -> (model, create_model_kwargs)`` builds the trained model (or pass
  ``model_factory=fn(cfg, num_classes) -> (model, kwargs)``);
- ``compute_loss(self, images, target)`` on the device (soft targets when Mixup is on);
- ``task_state``/``load_task_state`` (extend ``super()``'s) and ``export_metadata(self) -> dict`` (added to every
  exported file).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import nn

from ..engine.core import ENGINE_FILES, Engine, RunResult, build_optimizer, build_scheduler, run
from ..engine.data import build_eval_loader
from ..engine.log import format_table
from ..engine.state import export_weights, weights_metadata
from ..models.factory import attention_kind, create_model
from ..engine.dist import DistInfo
from .config import TrainConfig
from .evaluation import evaluate
from .transforms import build_mixup, build_transform, data_config_for

__all__ = ["train", "Trainer", "TrainResult", "RUN_FILES", "open_datasets", "data_record", "build_model",
           "build_optimizer", "build_scheduler", "summary_table"]

TrainResult = RunResult
#: the files a training run writes into its folder (``overwrite`` moves them aside until the new run succeeded)
RUN_FILES = ENGINE_FILES + ("best.safetensors", "final.safetensors", "final_ema.safetensors")


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


def data_record(cfg: TrainConfig) -> Dict[str, Any]:
    """What a weights file says about the data it classifies, so that ``simattn validate`` evaluates it there by
    default: the dataset, its root (when one was given; absolute where it is a local folder) and the split the run
    evaluated."""
    from ..models.weights import DATA_RECORD_KEYS
    from ..utils.io import recorded_location
    record = {k: str(getattr(cfg, k)) for k in DATA_RECORD_KEYS if getattr(cfg, k)}
    if "data_dir" in record:
        record["data_dir"] = recorded_location(record["data_dir"])
    return record


def build_model(cfg: TrainConfig, num_classes: int) -> Tuple[nn.Module, Dict[str, Any]]:
    """The recipe's model for ``num_classes`` classes, and the full create_model kwargs (for metadata)."""
    kwargs = {**cfg.model_kwargs, "num_classes": num_classes}
    if cfg.drop_path:
        kwargs.setdefault("drop_path_rate", cfg.drop_path)
    if cfg.drop:
        kwargs.setdefault("drop_rate", cfg.drop)
    return create_model(cfg.model, **kwargs), kwargs


class Trainer(Engine):
    """Classification training of ``cfg`` on ``dist`` (see the module docstring for the extension points)."""

    producer = "simattn train"
    task_name = "train"
    task_files = ("best.safetensors", "final.safetensors", "final_ema.safetensors")
    csv_columns = {"eval_loss": "val_loss", "eval_top1": "val_top1", "eval_top5": "val_top5"}
    input_options = ("initial_checkpoint",)
    same_run_options = ("model", "model_kwargs", "data_dir", "model_ema")

    def __init__(self, cfg: TrainConfig, dist: Optional[DistInfo] = None,
                 model_factory: Optional[Callable[[TrainConfig, int], Tuple[nn.Module, Dict[str, Any]]]] = None
                 ) -> None:
        super().__init__(cfg, dist)
        self._model_factory = model_factory
        self.best: Dict[str, Any] = {"top1": -1.0, "epoch": -1}
        self.train_skipped = 0
        self.initial_weights: Optional[Dict[str, Any]] = None

    # ----- the task
    def setup(self) -> None:
        cfg = self.cfg
        self._train_set, self._val_set, self.classes = open_datasets(cfg)
        self.num_classes = len(self.classes)
        self.val_loader = build_eval_loader(self._val_set, cfg.batch_size, cfg.workers, self.dist, self.pin_memory)
        self.mixup = build_mixup(cfg, self.num_classes)
        if self.mixup is not None:
            self.criterion = SoftTargetCrossEntropy()  # Mixup already smoothed the targets
        elif cfg.smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
        else:
            self.criterion = nn.CrossEntropyLoss()

    def create_model(self) -> Tuple[nn.Module, Dict[str, Any]]:
        model, kwargs = self.build_model(self.num_classes)
        cfg = self.cfg
        if cfg.initial_checkpoint and not self.resuming:  # a resumed run's weights come from its checkpoint
            from ..models.factory import load_initial_weights
            report = load_initial_weights(model, cfg.initial_checkpoint, model_name=cfg.model,
                                          partial=cfg.initial_checkpoint_partial, use_ema=cfg.initial_checkpoint_ema,
                                          partial_option="--initial-checkpoint-partial")
            self.initial_weights = {"path": str(cfg.initial_checkpoint), "summary": report.summary(),
                                    "entry": report.entry,
                                    "partial": bool(report.missing),
                                    **{k: len(v) for k, v in report.as_dict().items() if isinstance(v, list)}}
            if self.dist.is_main:
                print(f"initial weights: {report.summary()}", flush=True)
        return model, kwargs

    def build_model(self, num_classes: int) -> Tuple[nn.Module, Dict[str, Any]]:
        """The model to train and its ``create_model`` kwargs (recorded in checkpoints and weights metadata)."""
        if self._model_factory is not None:
            return self._model_factory(self.cfg, num_classes)
        return build_model(self.cfg, num_classes)

    def train_dataset(self):
        cfg = self.cfg
        self.data_config = data_config_for(self.model, cfg)
        built = cfg.model_kwargs.get("img_size")
        fed = self.data_config["input_size"][-1]
        default = (getattr(self.model, "pretrained_cfg", None) or {}).get("input_size", (None,))[-1]
        if built and built != fed and self.dist.is_main:
            print(f"note: the model is built for {built} px (model kwarg img_size) and the data is fed at {fed} px "
                  "(img_size): the data's size wins, the position embedding is resampled on every forward; set "
                  "both alike to train at one size", flush=True)
        elif not built and cfg.img_size and default and default != fed and self.dist.is_main:
            print(f"note: img_size sets the data's size ({fed} px); the model is built at its default {default} px "
                  "and resamples its position embedding on every forward, as its weights will keep it: pass "
                  f"--model-kwargs img_size={fed} to build it at {fed} px", flush=True)
        self._train_set.transform = build_transform(self.data_config, cfg, is_training=True)
        self._val_set.transform = build_transform(self.data_config)
        return self._train_set

    def started(self) -> None:
        if self.initial_weights is not None:
            self.log.record("initial_weights", **self.initial_weights)

    def to_device(self, batch) -> Tuple[Tuple[torch.Tensor, torch.Tensor], int]:
        images, target, skipped = batch
        self.train_skipped += skipped
        if self.mixup is not None and len(target) % 2:  # Mixup pairs samples: drop one after a skipped image
            images, target = images[:-1], target[:-1]
        if not len(target):  # a whole batch of broken files: the folder is broken, not a few images
            raise ValueError(f"every image of a training batch was unreadable ({self.train_skipped} unreadable "
                             "so far); check the dataset folder")
        images = images.to(self.device, non_blocking=True)
        target = target.to(self.device, non_blocking=True)
        if self.cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        n = len(target)
        if self.mixup is not None:
            images, target = self.mixup(images, target)
        return (images, target), n

    def batch_loss(self, batch) -> torch.Tensor:
        return self.compute_loss(*batch)

    def compute_loss(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of one micro-batch (runs under autocast; ``target`` is soft when Mixup is on)."""
        return self.criterion(self.forward_model(images), target)

    def same_run_facts(self) -> Dict[str, Any]:
        return {"dataset": str(self.cfg.dataset).lower(),  # dataset names are case-insensitive
                "num_classes": self.num_classes, "input size": list(self.data_config["input_size"])}

    def export_metadata(self) -> Dict[str, Any]:
        """More metadata for every exported safetensors file (JSON-encodable values)."""
        return {}

    def evaluate(self) -> Dict[str, Any]:
        """Validate the model (and EMA); export best.safetensors when top-1 improved."""
        cfg = self.cfg
        amp = dict(amp=self.precision.enabled, amp_dtype=self.precision.dtype)
        metrics = evaluate(self.model, self.val_loader, self.device, **amp, channels_last=cfg.channels_last,
                           show_progress=self.show_bars)
        record = {f"val_{k}": v for k, v in metrics.items()}
        if self.ema is not None:
            ema_metrics = evaluate(self.ema.module, self.val_loader, self.device, **amp,
                                   channels_last=cfg.channels_last)
            record.update({f"ema_val_{k}": ema_metrics[k] for k in ("top1", "top5", "loss")})
        record["train_skipped"] = self.train_skipped
        if metrics["top1"] > self.best["top1"] and self.dist.is_main:
            self.best = {"top1": metrics["top1"], "top5": metrics["top5"], "loss": metrics["loss"],
                         "epoch": self.epoch + 1}
            self._export(self.model, "best.safetensors", epoch=self.epoch + 1, metrics=metrics)
        return record

    def describe_eval(self, record: Dict[str, Any]) -> str:
        if "val_top1" not in record:
            return ""
        text = (f", val top-1 {record['val_top1']:.2f}% top-5 {record['val_top5']:.2f}% loss "
                f"{record['val_loss']:.4f}")
        return text + (f", EMA top-1 {record['ema_val_top1']:.2f}%" if "ema_val_top1" in record else "")

    def describe(self) -> str:
        return super().describe().replace(" params), ", f" params, {self.num_classes} classes), dataset "
                                          f"{self.cfg.dataset}, ", 1)

    def task_state(self) -> Dict[str, Any]:
        return {"best": self.best, "train_skipped": self.train_skipped}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        self.best = dict(state.get("best", self.best))
        self.train_skipped = int(state.get("train_skipped", 0))

    def summary_extra(self) -> Dict[str, Any]:
        final = self.last_eval or {}
        return {
            "final": {k[4:]: final[k] for k in ("val_top1", "val_top5", "val_loss", "val_samples") if k in final},
            "final_train_loss": final.get("train_loss"),
            "ema": {k[8:]: final[k] for k in ("ema_val_top1", "ema_val_top5", "ema_val_loss") if k in final} or None,
            "best": self.best,
            "skipped_unreadable": {"train": self.train_skipped, "val": final.get("val_skipped", 0)},
            "initial_weights": self.initial_weights, "data_config": self.data_config,
            "files": {name: str(self.out / name) for name in
                      ["last.pth", "best.safetensors", "final.safetensors", "metrics.jsonl", "summary.csv",
                       "config.yaml"] + (["final_ema.safetensors"] if self.ema is not None else [])},
        }

    def finish(self, summary: Dict[str, Any]) -> None:
        self.log.info(summary_table(summary))  # the results are shown before anything else is written
        self._export(self.model, "final.safetensors", epoch=self.num_epochs, metrics=summary["final"])
        if self.ema is not None:
            self._export(self.ema.module, "final_ema.safetensors", epoch=self.num_epochs, metrics=summary["ema"])

    def _export(self, module: nn.Module, name: str, **extra: Any) -> None:
        from ..utils.io import check_finite_weights
        check_finite_weights(module, name)
        meta = weights_metadata(self.cfg.model, self.model_kwargs, self.data_config, producer=self.producer,
                                recipe=self.cfg.recipe or "", classes=[str(c) for c in self.classes],
                                **{"attention": attention_kind(module) or "", **data_record(self.cfg),
                                   **self.export_metadata(), **extra})
        export_weights(module, self.out / name, meta)


def summary_table(summary: Dict[str, Any]) -> str:
    """The end-of-run table: final and best accuracy, loss, time, skipped images, output files."""
    final, best = summary["final"], summary["best"]
    rows = [
        ["model", f"{summary['model']} ({summary.get('attention') or 'mixed'} attention, "
                  f"{summary['params'] / 1e6:.2f}M params)"],
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
    return run(cfg, trainer_cls, **trainer_kwargs)
