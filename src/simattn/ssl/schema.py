"""``simattn ssl`` options: its nested recipe schema, checked by :mod:`simattn.utils.recipe`."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..utils.recipe import Opt, check_device, check_optimizer, check_path, maybe, quoted, register_nested_schema

__all__ = ["SSL_SCHEMA"]


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


#: every ``simattn ssl`` option with its default: the ImageNet recipe of the SimA paper's DINO experiment (Table 5)
SSL_SCHEMA: Dict[str, Any] = {
    "model": {
        "name": Opt("sima_small_12_p16", "any model timm.create_model knows (import simattn registers ours)"),
        "drop_path_rate": Opt(0.1, "student only; the teacher has none", low=0.0, high=1.0, high_open=True),
        "kwargs": Opt({}, "extra timm.create_model arguments (img_size, depth, attn_type, ...)"),
        "weights": Opt(None, "initial backbone weights: classification, official/timm or DINO weights "
                             "(.pth / .safetensors), read by simattn.models.factory.load_initial_weights",
                       type=maybe(str)),
    },
    "head": {
        "hidden_dim": Opt(2048, low=1),
        "bottleneck_dim": Opt(256, low=1),
        "output_dim": Opt(65536, "prototypes K", low=1),
        "norm_last_layer": Opt(True, "weight-normalized last layer with fixed norm (stabler for ViTs)"),
        "batch_norm": Opt(False, "BatchNorm in the head's MLP (DINO's ResNet setting; guards tiny runs against "
                                 "collapse)"),
        "freeze_last_layer_epochs": Opt(1, low=0),
    },
    "data": {
        "name": Opt("folder", "'digits' (embedded) or 'folder' (root/train, root/val ImageFolder)",
                    choices=["digits", "folder"]),
        "root": Opt(None, type=maybe(str)),
        "workers": Opt(8, low=0),
        "global_crop_size": Opt(224, low=1),
        "global_crop_scale": Opt([0.25, 1.0], type=List[float], low=0.0, high=1.0, low_open=True, length=2),
        "local_crop_size": Opt(96, low=1),
        "local_crop_scale": Opt([0.05, 0.25], type=List[float], low=0.0, high=1.0, low_open=True, length=2),
        "n_local_views": Opt(10, low=0),
        "augment": Opt({}, "extra lightly DINOTransform arguments: " + ", ".join(AUGMENT_KEYS),
                       check=lambda value: _check_augment(value)),
    },
    "train": {
        "epochs": Opt(100, low=1),
        "batch_size": Opt(256, "total over all processes", low=1),
        "lr": Opt(2.5e-4, "peak learning rate for this batch size", low=0.0, low_open=True),
        "min_lr": Opt(1e-6, low=0.0),
        "warmup_epochs": Opt(10, low=0),
        "optimizer": Opt("adamw", check=check_optimizer),
        "weight_decay": Opt(0.04, low=0.0),
        "weight_decay_end": Opt(0.4, low=0.0),
        "momentum_teacher": Opt(0.996, "cosine schedule to 1.0", low=0.0, high=1.0, high_open=True),
        "teacher_temp": Opt(0.04, "sharpening", low=0.0, low_open=True),
        "warmup_teacher_temp": Opt(0.04, low=0.0, low_open=True),
        "warmup_teacher_temp_epochs": Opt(0, low=0),
        "student_temp": Opt(0.1, low=0.0, low_open=True),
        "center_momentum": Opt(0.9, "centering", low=0.0, high=1.0, high_open=True),
        "clip_grad": Opt(3.0, "max grad norm of each parameter tensor (as DINO clips); null disables",
                         type=maybe(float), low=0.0, low_open=True),
        "amp": Opt(True, "fp16 autocast + loss scaling on CUDA (ignored on CPU)"),
        "seed": Opt(0, low=0),
        "save_every": Opt(1, "epochs between checkpoints (the last epoch is always saved)", low=1),
        "checkpoint_every_steps": Opt(0, "also write last.pth every K updates (0: at epoch ends only)", low=0),
        "max_nonfinite_steps": Opt(0, "steps with a non-finite loss to skip before stopping with an error", low=0),
        "device": Opt(None, "'cpu', 'cuda' or null (CUDA when available)", type=maybe(str), check=check_device),
        "threads": Opt(None, "CPU intra-op threads (null: torch's default)", type=maybe(int), low=1),
        "dist_timeout": Opt(10.0, "minutes a torchrun process waits at a collective before the job stops",
                            low=0.0, low_open=True),
    },
    "eval": {
        "every": Opt(0, "evaluate every N epochs (0: only at the end)", low=0),
        "compare_random_init": Opt(False, "also evaluate the backbone before training"),
        "recalibrate_bn": Opt(False, "re-estimate BatchNorm statistics on the eval training images first"),
        "img_size": Opt(224, low=1),
        "crop_pct": Opt(0.875, low=0.0, high=1.0, low_open=True),
        "batch_size": Opt(256, low=1),
        "knn_k": Opt(20, low=1),
        "knn_temperature": Opt(0.07, low=0.0, low_open=True),
        "linear_epochs": Opt(100, "0 disables the linear probe", low=0),
        "linear_lr": Opt(1e-3, low=0.0, low_open=True),
        "linear_batch_size": Opt(256, low=1),
    },
    "output": Opt(None, "run folder; null = runs/<recipe>/<date-time>", type=maybe(str), check=check_path),
}

register_nested_schema(SSL_SCHEMA)
