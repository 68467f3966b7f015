"""``simattn ssl`` options: :class:`SslConfig`, the engine's options (with DINO's defaults) and the sections of DINO
pretraining and its evaluation. The defaults are the ImageNet recipe of the SimA paper's DINO experiment (Table 5).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional

from ..engine.config import EngineConfig
from ..utils.recipe import check_path, option, quoted, section, task_defaults

__all__ = ["SslConfig", "AUGMENT_KEYS"]


#: the augmentation arguments of lightly's ``DINOTransform`` a recipe may set under ``data.augment`` (crop sizes,
#: scales and normalization have options of their own)
AUGMENT_KEYS = ("hf_prob", "vf_prob", "rr_prob", "rr_degrees", "cj_prob", "cj_strength", "cj_bright", "cj_contrast",
                "cj_sat", "cj_hue", "random_gray_scale", "gaussian_blur", "sigmas", "solarization_prob")
_PROBABILITIES = ("hf_prob", "vf_prob", "rr_prob", "cj_prob", "random_gray_scale", "solarization_prob")


def _check_augment(value: Dict[str, Any]) -> Optional[str]:
    unknown = sorted(set(value) - set(AUGMENT_KEYS))
    if unknown:
        return f"unknown DINOTransform argument(s) {', '.join(unknown)}; known: {', '.join(AUGMENT_KEYS)}"
    for key in _PROBABILITIES:
        v = value.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1):
            return f"{key}={quoted(v)} is not a probability in [0, 1]"
    return None


@dataclass
class SslModel:
    name: str = option("sima_small_12_p16", "any model timm.create_model knows (import simattn registers ours)")
    drop_path_rate: float = option(0.1, "student only; the teacher has none", low=0.0, high=1.0, high_open=True)
    kwargs: Dict[str, Any] = option(factory=dict, help="extra timm.create_model arguments (img_size, depth, ...)",
                                    belongs_to=("name",))
    weights: Optional[str] = option(None, "initial backbone weights: classification, official/timm or DINO weights "
                                          "(.pth / .safetensors)", check=check_path, belongs_to=("name",))
    weights_partial: bool = option(False, "start from weights even where they leave tensors of the backbone at "
                                          "their initialization")


@dataclass
class SslHead:
    hidden_dim: int = option(2048, low=1)
    bottleneck_dim: int = option(256, low=1)
    output_dim: int = option(65536, "prototypes K", low=1)
    norm_last_layer: bool = option(True, "weight-normalized last layer with fixed norm (stabler for ViTs)")
    batch_norm: bool = option(False, "BatchNorm in the head's MLP (DINO's ResNet setting; guards tiny runs against "
                                     "collapse)")
    freeze_last_layer_epochs: int = option(1, low=0)


def _dataset_names():
    from .data import dataset_names
    return dataset_names()


def _datasets_on_disk():
    return [name for name in _dataset_names() if name != "digits"]


@dataclass
class SslData:
    name: str = option("folder", "'digits' (embedded), 'folder' (root/train, root/val ImageFolder), 'wds' (shards: "
                               "root is their folder, a brace pattern or a pipe: URL), or any other dataset "
                               "simattn.data.create_dataset reads", choices=_dataset_names)
    root: Optional[str] = option(None, "dataset root (not used by digits)", check=check_path,
                                 belongs_to=("name", _datasets_on_disk))
    global_crop_size: int = option(224, low=1)
    global_crop_scale: List[float] = option(factory=lambda: [0.25, 1.0], low=0.0, high=1.0, low_open=True, length=2)
    local_crop_size: int = option(96, low=1)
    local_crop_scale: List[float] = option(factory=lambda: [0.05, 0.25], low=0.0, high=1.0, low_open=True, length=2)
    n_local_views: int = option(10, low=0)
    augment: Dict[str, Any] = option(factory=dict, help="extra lightly DINOTransform arguments: "
                                     + ", ".join(AUGMENT_KEYS), check=_check_augment)


@dataclass
class Dino:
    weight_decay_end: float = option(0.4, "weight decay follows a cosine from weight_decay to this", low=0.0)
    momentum_teacher: float = option(0.996, "cosine schedule to 1.0", low=0.0, high=1.0, high_open=True)
    teacher_temp: float = option(0.04, "sharpening", low=0.0, low_open=True)
    warmup_teacher_temp: float = option(0.04, low=0.0, low_open=True)
    warmup_teacher_temp_epochs: int = option(0, low=0)
    student_temp: float = option(0.1, low=0.0, low_open=True)
    center_momentum: float = option(0.9, "centering", low=0.0, high=1.0, high_open=True)


@dataclass
class SslEval:
    compare_random_init: bool = option(False, "also evaluate the backbone before training")
    recalibrate_bn: bool = option(False, "re-estimate BatchNorm statistics on the eval training images first")
    img_size: int = option(224, low=1)
    crop_pct: float = option(0.875, low=0.0, high=1.0, low_open=True)
    batch_size: int = option(256, low=1)
    knn_k: int = option(20, low=1)
    knn_temperature: float = option(0.07, low=0.0, low_open=True)
    linear_epochs: int = option(100, "0 disables the linear probe", low=0)
    linear_lr: float = option(1e-3, low=0.0, low_open=True)
    linear_batch_size: int = option(256, low=1)


@dataclass
@task_defaults(epochs=100, batch_size=256, lr=2.5e-4, min_lr=1e-6, warmup_lr=1e-6, warmup_epochs=10,
               weight_decay=0.04, clip_grad=3.0, clip_mode="param_norm", sched_on_updates=True, amp=True, workers=8,
               pin_memory=True, eval_every_epochs=0, log_interval=0)
class SslConfig(EngineConfig):
    """Every ``simattn ssl`` option: the engine's (an absolute ``lr``, a per-update cosine schedule warming up from
    ``warmup_lr``, DINO's per-tensor clipping) and DINO's sections."""

    model: SslModel = section(SslModel)
    head: SslHead = section(SslHead)
    data: SslData = section(SslData)
    dino: Dino = section(Dino)
    eval: SslEval = section(SslEval)

    #: keys of earlier recipes whose option has another name now (the unknown-key error names it)
    renamed: ClassVar[Dict[str, str]] = {"train.optimizer": "opt", "train.save_every": "checkpoint_every_epochs",
                                         "eval.every": "eval_every_epochs"}

    def check_run(self) -> "SslConfig":
        """:meth:`validate`, the backbone (a model timm knows, its shared options in range) and a root for data on
        disk: the checks of the run and of ``--print-config``."""
        self.validate()
        from ..models.factory import check_model
        check_model(self.model.name, self.model.kwargs)
        if self.data.root is None and self.data.name in _datasets_on_disk():
            raise ValueError(f"data {self.data.name!r} is read from disk and needs its root: --set data.root=DIR, or "
                             "--set data.name=digits for the embedded data")
        return self
