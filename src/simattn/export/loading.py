"""Build a registered model with its weights and the preprocessing it expects (shared by ``export`` and ``viz``).

The model name and ``timm.create_model`` kwargs can come from the weights file itself (safetensors metadata
``model`` / ``config`` / ``data_config`` as written by ``simattn train``); command-line values override them.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

__all__ = ["build_model", "softmax_twin", "resolve_data_config", "model_stride", "attention_kind",
           "normalize_images"]


def build_model(model_name: Optional[str] = None, weights: Optional[str] = None,
                model_kwargs: Optional[Mapping[str, Any]] = None,
                use_ema: bool = False) -> Tuple[nn.Module, Dict[str, Any]]:
    """:func:`simattn.models.factory.load_model` (the model in eval mode and its spec)."""
    from ..models.factory import load_model
    return load_model(model_name, weights, model_kwargs, use_ema)


def resolve_data_config(model: nn.Module, spec: Optional[Mapping[str, Any]] = None,
                        img_size: Optional[int] = None) -> Dict[str, Any]:
    """Preprocessing for ``model``: timm's resolved config, updated by what was stored with the weights; the input
    size is ``img_size`` if given, else the ``img_size`` the model was built with (a model built at 32 px is fed
    32 px images), else the stored or default one."""
    from timm.data import resolve_model_data_config

    cfg = dict(resolve_model_data_config(model))
    spec = spec or {}
    cfg.update(spec.get("data_config") or {})
    size = img_size or (spec.get("config") or {}).get("img_size")
    if size:
        size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        cfg["input_size"] = (3, *size)
    cfg["input_size"] = tuple(cfg["input_size"])
    return cfg


def model_stride(model: nn.Module) -> int:
    """The model's total downsampling (largest feature reduction, else the patch size, else 32)."""
    info = getattr(model, "feature_info", None)
    if isinstance(info, (list, tuple)) and info and isinstance(info[-1], dict) and "reduction" in info[-1]:
        return int(max(f.get("reduction", 1) for f in info))
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is not None:
        return int(max(patch) if isinstance(patch, (list, tuple)) else patch)
    return 32


def attention_kind(model: nn.Module) -> Optional[str]:
    """The registered attention kind the model uses (``model.attn_type`` or its attention modules), if one."""
    kind = getattr(model, "attn_type", None)
    if kind:
        return kind
    from ..attention import TokenAttention
    kinds = {m.attn_name for m in model.modules() if isinstance(m, TokenAttention)}
    return kinds.pop() if len(kinds) == 1 else None


def normalize_images(x: torch.Tensor, data_config: Mapping[str, Any]) -> torch.Tensor:
    """(N, 3, H, W) images in [0, 1] → normalized with the config's mean and std."""
    mean = torch.tensor(data_config["mean"], dtype=x.dtype).view(1, -1, 1, 1)
    std = torch.tensor(data_config["std"], dtype=x.dtype).view(1, -1, 1, 1)
    return (x - mean) / std


def softmax_twin(spec: Mapping[str, Any]) -> nn.Module:
    """The same architecture as ``spec`` (from :func:`build_model`) with softmax attention and random weights,
    for latency comparisons (weights do not change the cost). Needs a family that takes ``attn_type=``."""
    kwargs = {k: v for k, v in (spec.get("config") or {}).items() if k != "attn_kwargs"}
    model, _ = build_model(spec["model"], None, {**kwargs, "attn_type": "softmax"})
    return model
