"""DINO self-distillation (Caron et al. 2021) for any registered backbone, as in the SimA paper's Table 5.

A student (backbone + DINO head) learns to match a teacher on multi-crop views; the teacher is an exponential
moving average of the student whose momentum follows a cosine schedule to 1; the teacher's outputs are centered
(a running mean) and sharpened (a low temperature) so that neither collapse mode wins. Weight decay follows a cosine
schedule 0.04 → 0.4, the learning rate a warm-up then cosine decay (timm's scheduler).

Library pieces: lightly's ``DINOProjectionHead``, ``DINOLoss`` (centering with a DDP all-reduce, sharpening,
cross-view cross-entropy), ``DINOTransform`` (multi-crop), ``cosine_schedule`` and ``update_momentum``; timm's
``create_optimizer_v2`` and ``CosineLRScheduler``; models come from :mod:`simattn.models.factory`.

The run is a task of the training engine (:class:`DinoTrainer`, :mod:`simattn.engine.core`), which owns DDP,
SyncBatchNorm, AMP, clipping (``clip_mode: param_norm`` clips each tensor as DINO does), the checkpoint and exact
resume, the run folder and the logs; its options are :class:`simattn.ssl.config.SslConfig`. Outputs in ``output``: the engine's ``last.pth``,
``metrics.jsonl``, ``summary.json`` (per-epoch history, k-NN / linear top-1, the random-init reference),
``summary.csv`` and ``config.yaml``; ``backbone.safetensors`` (the teacher backbone with its ``simattn-weights-v1``
record, ``num_classes`` 0, so ``simattn export``/``viz`` open it) and ``curves.png``.
"""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ..engine.core import Engine, run
from ..engine.log import plot_history
from ..utils.recipe import recipe_to_save
from .config import SslConfig
from .data import build_image_dataset
from .evaluate import evaluate_backbone

__all__ = ["DinoNetwork", "DinoTrainer", "build_backbone", "save_backbone", "build_dino_networks",
           "build_multicrop_transform", "pretrain"]


def build_backbone(model: Mapping[str, Any], drop_path_rate: float = 0.0, load_weights: bool = True) -> nn.Module:
    """A registered model without classifier (``num_classes=0``): ``backbone(x)`` gives the CLS/pooled features.

    With ``load_weights`` and a recipe ``weights`` path, the backbone starts from those weights
    (:func:`~simattn.models.factory.load_initial_weights`: a classification checkpoint, official/timm weights or a
    DINO backbone; its classifier is dropped, position embeddings resized) and the report is printed.
    """
    from ..models.factory import create_model, load_initial_weights
    backbone = create_model(model["name"], num_classes=0, drop_path_rate=drop_path_rate, **model["kwargs"])
    if load_weights and model.get("weights"):
        report = load_initial_weights(backbone, model["weights"], model_name=model["name"],
                                      partial=model.get("weights_partial", False),
                                      partial_option="model.weights_partial=true")
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


def build_dino_networks(cfg: SslConfig) -> tuple[DinoNetwork, DinoNetwork]:
    """Student and teacher; the teacher starts as an exact copy and never receives gradients.

    The teacher is built, not deep-copied: lightly's head uses ``weight_norm``, which ``copy.deepcopy`` rejects.
    """
    from lightly.models.modules import DINOProjectionHead
    from lightly.models.utils import deactivate_requires_grad

    def make(drop_path: float, load_weights: bool) -> DinoNetwork:
        backbone = build_backbone(dataclasses.asdict(cfg.model), drop_path, load_weights)
        h = dataclasses.asdict(cfg.head)
        with warnings.catch_warnings():
            # lightly's head calls torch.nn.utils.weight_norm, which torch deprecates: nothing a user can act on
            warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
            head = DINOProjectionHead(backbone.num_features, h["hidden_dim"], h["bottleneck_dim"], h["output_dim"],
                                      batch_norm=h["batch_norm"], freeze_last_layer=h["freeze_last_layer_epochs"],
                                      norm_last_layer=h["norm_last_layer"])
        return DinoNetwork(backbone, head)

    student = make(cfg.model.drop_path_rate, True)
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


def _teacher_temp(train: Mapping[str, Any], epoch: int) -> float:
    """The teacher temperature of 0-based ``epoch``: the official DINO schedule, ``linspace(warmup_teacher_temp,
    teacher_temp, warmup_teacher_temp_epochs)`` over the first epochs (so the last warm-up epoch is at
    ``teacher_temp``), then constant."""
    warm = train["warmup_teacher_temp_epochs"]
    if epoch >= warm - 1:
        return train["teacher_temp"]
    return train["warmup_teacher_temp"] + (train["teacher_temp"] - train["warmup_teacher_temp"]) * epoch / (warm - 1)


def _evaluate(teacher: DinoNetwork, cfg: SslConfig, device: torch.device, random_init: bool = False
              ) -> Dict[str, Any]:
    # At random init, BatchNorm statistics are always re-estimated (init statistics describe no data).
    return evaluate_backbone(teacher.backbone, cfg, device=device, recalibrate_bn=random_init or cfg.eval.recalibrate_bn)


class DinoTrainer(Engine):
    """DINO as a task of the engine: the student is the trained model; the teacher, the centering and the
    schedules of weight decay, teacher momentum and temperature are the task's."""

    producer = "simattn ssl"
    task_name = "ssl"
    task_files = ("backbone.safetensors", "curves.png", "eval.json")  # eval.json: `ssl eval` of this run
    csv_columns = {"knn_top1": "knn_top1", "linear_top1": "linear_top1"}
    scheduler_metric = "knn_top1"

    model_option = "model.name"
    input_options = ("model.weights",)
    same_run_options = ("model.name", "model.kwargs", "head.output_dim", "data.name", "data.root",
                        "data.global_crop_size", "data.local_crop_size")

    def __init__(self, cfg: SslConfig, dist=None) -> None:
        super().__init__(cfg, dist)
        self.random_init: Optional[Dict[str, Any]] = None
        self.schedules = dataclasses.asdict(cfg.dino)
        self.teacher_temp = _teacher_temp(self.schedules, 0)
        self.weight_decay, self.momentum = cfg.weight_decay, cfg.dino.momentum_teacher

    def create_model(self):
        from lightly.loss import DINOLoss
        self.student, self.teacher = build_dino_networks(self.cfg)
        if self.sync_bn:  # the engine converts the student
            from timm.layers import convert_sync_batchnorm
            self.teacher = convert_sync_batchnorm(self.teacher)
        self.teacher.to(self.device)
        d = self.cfg.dino
        self.criterion = DINOLoss(self.cfg.head.output_dim, student_temp=d.student_temp, teacher_temp=d.teacher_temp,
                                  center_momentum=d.center_momentum).to(self.device)
        return self.student, dict(self.cfg.model.kwargs)

    def train_dataset(self):
        data = dataclasses.asdict(self.cfg.data)
        return build_image_dataset(data, "train", build_multicrop_transform(data, self.student.backbone))

    def started(self) -> None:
        if self.cfg.eval.compare_random_init and self.dist.is_main and self.random_init is None:
            self.random_init = _evaluate(self.teacher, self.cfg, self.device, random_init=True)
            print(f"random init: {self.random_init}", flush=True)

    def on_epoch_start(self) -> None:
        self.teacher.train()  # as in DINO: BatchNorm layers (XCiT stem, LPI) of the teacher use batch statistics
        self.teacher_temp = _teacher_temp(self.schedules, self.epoch)

    def to_device(self, batch):
        views, _, skipped = batch
        if skipped or not views:
            raise ValueError(f"{skipped} unreadable image(s) in a DINO batch; check the dataset folder")
        return [v.to(self.device, non_blocking=True) for v in views], len(views[0])

    def batch_loss(self, views: List[torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            teacher_out = self.teacher(views[:2])  # the teacher sees only the global views
        student_out = self.forward_model(views)
        return self.criterion(teacher_out, student_out, teacher_temp=self.teacher_temp)

    def before_step(self) -> None:
        from lightly.utils.scheduler import cosine_schedule
        self.student.head.cancel_last_layer_gradients(self.epoch)  # frozen prototypes early on
        self.weight_decay = cosine_schedule(self.global_step, self.total_steps, self.cfg.weight_decay,
                                            self.cfg.dino.weight_decay_end)
        # groups with decay (no-decay groups hold 0); looked up each step: loading a checkpoint replaces the groups
        for group in self.optimizer.param_groups:
            if group["weight_decay"] > 0:
                group["weight_decay"] = self.weight_decay

    def after_update(self) -> None:
        from lightly.models.utils import update_momentum
        from lightly.utils.scheduler import cosine_schedule
        self.momentum = cosine_schedule(self.global_step - 1, self.total_steps, self.cfg.dino.momentum_teacher, 1.0)
        update_momentum(self.student, self.teacher, m=self.momentum)

    def epoch_extra(self) -> Dict[str, Any]:
        return {"weight_decay": self.weight_decay, "momentum": self.momentum, "teacher_temp": self.teacher_temp}

    @property
    def total_steps(self) -> int:
        return self.num_epochs * self.updates_per_epoch

    def evaluate(self) -> Dict[str, Any]:
        # k-NN and the linear probe run on the main process; the others wait at the epoch's checkpoint
        return _evaluate(self.teacher, self.cfg, self.device) if self.dist.is_main else {}

    def describe_eval(self, record: Dict[str, Any]) -> str:
        shown = [f"{k} {record[k]:.2f}%" for k in ("knn_top1", "linear_top1") if record.get(k) is not None]
        return (", " + ", ".join(shown)) if shown else ""

    def task_state(self) -> Dict[str, Any]:
        return {"teacher": self.teacher.state_dict(), "dino_loss": self.criterion.state_dict(),
                "random_init": self.random_init}

    def load_task_state(self, state: Dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.criterion.load_state_dict(state["dino_loss"])
        self.random_init = state.get("random_init")

    def summary_extra(self) -> Dict[str, Any]:
        final = {k: v for k, v in (self.last_eval or {}).items() if k.startswith(("knn", "linear", "feature"))}
        return {"recipe": recipe_to_save(self.cfg), "final": final, "random_init": self.random_init}

    def finish(self, summary: Dict[str, Any]) -> None:
        from ..utils.io import check_finite_weights
        check_finite_weights(self.teacher.backbone, "the DINO teacher backbone")
        plot_history(self.history, ["train_loss", "knn_top1", "linear_top1"], self.out / "curves.png",
                     title=f"DINO {self.cfg.model.name}", references=self.random_init,
                     reference_label="random init")
        save_backbone(self.teacher.backbone, self.out / "backbone.safetensors", dataclasses.asdict(self.cfg.model),
                      dataclasses.asdict(self.cfg.eval), source="DINO teacher", epochs=self.num_epochs)


def pretrain(cfg: SslConfig) -> Dict[str, Any]:
    """Run DINO pretraining as ``cfg`` says and evaluate the teacher.

    Returns the summary written to ``summary.json`` (``history``, ``final`` k-NN / linear top-1, ``random_init``,
    ``output``) on the main process, ``{}`` on the others. ``resume`` continues a checkpoint (``auto``:
    ``<output>/last.pth``); the run folder follows :mod:`simattn.utils.runs` (``runs/<recipe>/<date-time>`` by
    default, another run's folder only with ``overwrite``). Epochs count from 1 in logs, checkpoints and results.
    """
    result = run(cfg, DinoTrainer)
    return result.summary if result.is_main else {}
