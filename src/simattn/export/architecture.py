"""What the exporter needs to know about a model: its downsampling, its attention kind, and its softmax twin."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from ..models.factory import attention_kind, with_attention

__all__ = ["softmax_twin", "model_stride", "segmentation_stride", "attention_kind"]


def segmentation_stride(model: nn.Module):
    """A segmenter's coarsest level stride (its input height and width must be multiples of it), else None."""
    from ..models.segmentation import LEVEL_STRIDES, Segmenter
    return max(LEVEL_STRIDES) if isinstance(model, Segmenter) else None


def model_stride(model: nn.Module) -> int:
    """The model's total downsampling (largest feature reduction, else the patch size, else 32; a segmenter's
    coarsest level)."""
    seg = segmentation_stride(model)
    if seg:
        return seg
    info = getattr(model, "feature_info", None)
    if isinstance(info, (list, tuple)) and info and isinstance(info[-1], dict) and "reduction" in info[-1]:
        return int(max(f.get("reduction", 1) for f in info))
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is not None:
        return int(max(patch) if isinstance(patch, (list, tuple)) else patch)
    return 32


def softmax_twin(spec: Mapping[str, Any]) -> nn.Module:
    """The same architecture as ``spec`` (from :func:`~simattn.models.factory.load_model`) with softmax attention
    and random weights, for latency comparisons (weights do not change the cost). Needs a family that takes
    ``attn_type=``."""
    from ..models.factory import load_model

    model, _ = load_model(spec["model"], None, with_attention(spec.get("config") or {}, "softmax"))
    return model
