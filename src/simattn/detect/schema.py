"""``simattn detect`` options: its nested recipe schema, checked by :mod:`simattn.utils.recipe`."""
from __future__ import annotations

from typing import Any, Dict, List, Union

from ..utils.recipe import PROB, Opt, check_device, check_optimizer, check_path, maybe, register_nested_schema

__all__ = ["DETECT_SCHEMA"]


#: every ``simattn detect`` option with its default: XCiT-S12/16 → SimA with Mask R-CNN on COCO (the paper's Table 4)
DETECT_SCHEMA: Dict[str, Any] = {
    "model": {
        "backbone": Opt("sima_small_12_p16"),
        "backbone_kwargs": Opt({}, "extra timm.create_model arguments"),
        "backbone_weights": Opt(None, "classification or DINO weights (.pth / .safetensors)", type=maybe(str)),
        "drop_path_rate": Opt(0.05, low=0.0, high=1.0, high_open=True),
        "out_indices": Opt([3, 5, 7, 11], "blocks 4, 6, 8, 12 (1-based)", type=List[int], low=0, length=4),
        "strides": Opt([4, 8, 16, 32], type=List[int], low=1, length=4),
        "fpn_channels": Opt(256, low=1),
        "box_head_dim": Opt(1024, low=1),
        "mask_head_channels": Opt(256, low=1),
        "min_size": Opt(800, "a list gives multi-scale training", type=Union[int, List[int]], low=1),
        "max_size": Opt(1333, low=1),
        "maskrcnn": Opt({}, "extra torchvision MaskRCNN arguments (rpn_batch_size_per_image, ...)"),
    },
    "data": {
        "train_images": Opt(None, type=maybe(str)),
        "train_annotations": Opt(None, type=maybe(str)),
        "val_images": Opt(None, type=maybe(str)),
        "val_annotations": Opt(None, type=maybe(str)),
        "hflip_prob": Opt(0.5, **PROB),
        "workers": Opt(4, low=0),
    },
    "train": {
        "epochs": Opt(36, low=1),
        "batch_size": Opt(16, "total over all processes", low=1),
        "optimizer": Opt("adamw", check=check_optimizer),
        "lr": Opt(1e-4, low=0.0, low_open=True),
        "weight_decay": Opt(0.05, low=0.0),
        "warmup_steps": Opt(500, low=0),
        "warmup_ratio": Opt(0.001, "warm-up starts at lr × this", low=0.0, high=1.0),
        "lr_decay_epochs": Opt([27, 33], "1-based epochs after which the lr is multiplied by lr_decay_rate",
                               type=List[int], low=0),
        "lr_decay_rate": Opt(0.1, low=0.0, high=1.0, low_open=True),
        "clip_grad": Opt(None, type=maybe(float), low=0.0, low_open=True),
        "amp": Opt(True, "fp16 autocast + loss scaling on CUDA (ignored on CPU)"),
        "max_steps": Opt(None, "stop early after this many optimizer steps (smoke runs)", type=maybe(int), low=1),
        "max_nonfinite_steps": Opt(0, "steps with a non-finite loss to skip before stopping with an error", low=0),
        "seed": Opt(0, low=0),
        "save_every": Opt(1, "epochs between checkpoints (the last epoch is always saved)", low=1),
        "checkpoint_every_steps": Opt(0, "also write last.pth every K updates (0: at epoch ends only)", low=0),
        "device": Opt(None, type=maybe(str), check=check_device),
        "threads": Opt(None, "CPU intra-op threads (null: torch's default)", type=maybe(int), low=1),
        "dist_timeout": Opt(10.0, "minutes a torchrun process waits at a collective before the job stops",
                            low=0.0, low_open=True),
    },
    "eval": {
        "every": Opt(1, "epochs between evaluations (0: only at the end)", low=0),
        "batch_size": Opt(2, low=1),
    },
    "output": Opt(None, "run folder; null = runs/<recipe>/<date-time>", type=maybe(str), check=check_path),
}

register_nested_schema(DETECT_SCHEMA)
