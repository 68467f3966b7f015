"""Classification data for the engine: timm's preprocessing config, transforms and Mixup for a recipe.

The resumable loaders themselves are the engine's (:mod:`simattn.engine.data`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from torch import nn

from .config import TrainConfig

__all__ = ["data_config_for", "build_transform", "build_mixup"]


def data_config_for(model: nn.Module, cfg: TrainConfig, img_size: Optional[int] = None,
                    crop_pct: Optional[float] = None) -> Dict[str, Any]:
    """timm's ``resolve_data_config`` from the model's pretrained_cfg and the recipe's overrides: input size,
    interpolation, mean, std, crop_pct, crop_mode (plain lists, so it can go into checkpoints and metadata)."""
    from timm.data import resolve_data_config
    size = img_size or cfg.img_size or cfg.model_kwargs.get("img_size")
    args = {"img_size": int(size) if size else None, "interpolation": cfg.interpolation, "mean": cfg.mean,
            "std": cfg.std, "crop_pct": crop_pct or cfg.crop_pct}
    resolved = resolve_data_config(args, model=model)
    from ..utils.memory import check_memory, image_batch_bytes
    _, h, w = resolved["input_size"]
    check_memory(image_batch_bytes(cfg.batch_size, h, w), f"a batch of {cfg.batch_size} images of {h}x{w} pixels")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in resolved.items()}


def build_transform(data_config: Dict[str, Any], cfg: Optional[TrainConfig] = None, is_training: bool = False):
    """timm ``create_transform``: the recipe's augmentations when training, resize + center crop otherwise."""
    from timm.data import create_transform
    common = dict(input_size=tuple(data_config["input_size"]), interpolation=data_config["interpolation"],
                  mean=tuple(data_config["mean"]), std=tuple(data_config["std"]))
    if not is_training:
        return create_transform(**common, is_training=False, crop_pct=data_config["crop_pct"],
                                crop_mode=data_config.get("crop_mode"))
    if cfg is None:
        raise ValueError("training transforms need the recipe (cfg) for their augmentation settings")
    return create_transform(
        **common, is_training=True, scale=tuple(cfg.scale), ratio=tuple(cfg.ratio), hflip=cfg.hflip, vflip=cfg.vflip,
        color_jitter=cfg.color_jitter, auto_augment=cfg.aa, re_prob=cfg.reprob, re_mode=cfg.remode,
        re_count=cfg.recount)


def build_mixup(cfg: TrainConfig, num_classes: int):
    """timm ``Mixup`` (which also applies label smoothing) when mixup or cutmix is on, else None."""
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    from timm.data import Mixup
    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                 switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode, label_smoothing=cfg.smoothing,
                 num_classes=num_classes)
