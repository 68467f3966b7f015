"""Classification data for the engine: timm's preprocessing config, transforms and Mixup for a recipe.

The resumable loaders themselves are the engine's (:mod:`simattn.engine.data`).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

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
    """timm ``create_transform``: the recipe's augmentations when training (with posterize keeping at least 1 bit,
    see :func:`_keep_a_posterize_bit`), resize + center crop otherwise."""
    from timm.data import create_transform
    common = dict(input_size=tuple(data_config["input_size"]), interpolation=data_config["interpolation"],
                  mean=tuple(data_config["mean"]), std=tuple(data_config["std"]))
    if not is_training:
        return create_transform(**common, is_training=False, crop_pct=data_config["crop_pct"],
                                crop_mode=data_config.get("crop_mode"))
    if cfg is None:
        raise ValueError("training transforms need the recipe (cfg) for their augmentation settings")
    return _keep_a_posterize_bit(create_transform(
        **common, is_training=True, scale=tuple(cfg.scale), ratio=tuple(cfg.ratio), hflip=cfg.hflip, vflip=cfg.vflip,
        color_jitter=cfg.color_jitter, auto_augment=cfg.aa, re_prob=cfg.reprob, re_mode=cfg.remode,
        re_count=cfg.recount))


# Pillow 13.0 made ImageOps.posterize raise ValueError for bits outside 1..8 (12.x and earlier returned a black
# image for 0), and timm's posterize levels reach 0: PosterizeIncreasing (the inc1 RandAugment ops, AugMix) keeps
# 4 - int(m / 10 * 4) bits, 0 at magnitude 10, which mstd0.5 noise around m9 reaches in one draw of 44 (below 0 past
# 10 with mmax); Posterize keeps int(m / 10 * 4), 0 below magnitude 2.5 (AutoAugment's v0 policy names it at 2). So
# the posterize ops of the transform built here keep at least 1 bit, the strongest posterize Pillow accepts; timm's
# own tables stay untouched for its other users. Every other op of timm's tables, tried over magnitudes 0 to 30 on
# RGB images, gives arguments Pillow accepts.
def _posterize_keeping_a_bit(img, bits_to_keep, **kwargs):
    """timm's posterize op with at least 1 bit kept (module level: the transform pickles into loader workers)."""
    from timm.data import auto_augment
    return auto_augment.posterize(img, max(1, bits_to_keep), **kwargs)


def _augment_ops(transform) -> Iterator[Any]:
    """The ops of the timm augmentations in a (nested) Compose: RandAugment's and AugMix's ``ops``, AutoAugment's
    sub-policies."""
    for step in getattr(transform, "transforms", None) or ():
        yield from _augment_ops(step)
    yield from getattr(transform, "ops", None) or ()
    for sub_policy in getattr(transform, "policy", None) or ():
        yield from sub_policy


def _keep_a_posterize_bit(transform):
    """``transform`` with each timm posterize op made to keep at least 1 bit (see the comment above)."""
    from timm.data import auto_augment
    for op in _augment_ops(transform):
        if getattr(op, "aug_fn", None) is auto_augment.posterize:
            op.aug_fn = _posterize_keeping_a_bit
    return transform


def build_mixup(cfg: TrainConfig, num_classes: int):
    """timm ``Mixup`` (which also applies label smoothing) when mixup or cutmix is on, else None."""
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    from timm.data import Mixup
    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                 switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode, label_smoothing=cfg.smoothing,
                 num_classes=num_classes)
