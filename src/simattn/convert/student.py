"""Teacher and student: a pretrained model and the same network with another attention kind.

The student keeps every tensor of the teacher: the softmax-free kinds that keep timm's attention layout (``qkv`` of
3·dim outputs, ``proj``, the optional q/k norms) differ from softmax only in how q, k and v are combined, so the
teacher's weights go in unchanged through the family's checkpoint filter; a kind's own extra tensors (XCA's
temperature) start at their initialization, and the teacher kind's own tensors (Agent's biases) are left out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torch import nn

from ..attention import TokenAttention, get_attention_class, list_attentions
from ..models.factory import (attention_kind, create_model, load_initial_weights, load_model, model_spec_from_weights,
                              with_attention)
from ..models.sources import resolve_source

__all__ = ["convertible_kinds", "check_kind", "load_teacher", "build_student", "attention_modules",
           "LAYOUT_PARAMS"]

#: parameter owners of timm's attention layout (TokenAttention); anything else in an attention module is the kind's own
LAYOUT_PARAMS = ("qkv", "q_norm", "k_norm", "norm", "gate", "proj")


def _keeps_layout(kind: str) -> bool:
    cls = get_attention_class(kind)
    return issubclass(cls, TokenAttention) and cls.separate_qk


def convertible_kinds() -> List[str]:
    """Registered attention kinds a softmax teacher converts to (those with separate q, k, v projections)."""
    return [k for k in list_attentions() if _keeps_layout(k) and k != "softmax"]


def check_kind(kind: str, option: str = "--to") -> str:
    """``kind`` if it keeps the qkv/proj layout; a one-line ValueError naming the allowed kinds otherwise."""
    get_attention_class(kind)  # unknown names: the registry's own error
    if kind == "softmax":
        raise ValueError(f"{option} softmax: conversion makes a softmax-free student from a softmax teacher; allowed: "
                         f"{', '.join(k for k in convertible_kinds() if k != 'softmax')}")
    if not _keeps_layout(kind):
        raise ValueError(f"{option} {kind}: this attention does not keep the qkv/proj layout of a softmax "
                         f"teacher (its q and k are tied), so the teacher's weights do not map; allowed: "
                         f"{', '.join(convertible_kinds())}")
    return kind


def load_teacher(weights: str | Path, model: Optional[str] = None, model_kwargs: Optional[Mapping[str, Any]] = None,
                 attn_type: Optional[str] = None) -> Tuple[nn.Module, Dict[str, Any]]:
    """The teacher in eval mode, frozen, and its spec (``model``, ``config``, ``data_config``, ...).

    ``weights``: our ``.safetensors``/``last.pth`` (they name model and kwargs), or timm/official DeiT, ViT or XCiT
    weights on disk (pass ``model``). The teacher's attention is the one its weights record, else ``attn_type``
    (default softmax; pass ``xca`` for timm XCiT weights in an XCiT family model).
    """
    kwargs = dict(model_kwargs or {})
    weights = resolve_source(weights)  # once: the record and the tensors come from this read
    stored = model_spec_from_weights(weights)
    if attn_type is not None:
        kwargs = with_attention(kwargs, attn_type)
    elif stored is None:  # timm/official weights name no attention: they are softmax networks
        kwargs = with_attention(kwargs, "softmax")
    # (our own records rebuild the network they hold, whose attention is its recorded or default kind)
    teacher, spec = load_model(model, weights, kwargs)
    for p in teacher.parameters():
        p.requires_grad_(False)
    spec["attn_type"] = spec["config"].get("attn_type") or attention_kind(teacher)
    return teacher, spec


def build_student(teacher_spec: Mapping[str, Any], kind: str, attn_kwargs: Optional[Mapping[str, Any]] = None,
                  num_classes: Optional[int] = None, init_from: Optional[str | Path] = None,
                  ) -> Tuple[nn.Module, Dict[str, Any], Any]:
    """The teacher's network with ``attn_type=kind``: (model, create_model kwargs, load report or None).

    ``init_from``: weights to start from (the teacher's file for a conversion, through the family's checkpoint
    filter); None leaves the random initialization (the from-scratch baseline).
    """
    check_kind(kind)
    kwargs = with_attention({k: v for k, v in teacher_spec["config"].items() if k != "attn_kwargs"}, kind, attn_kwargs)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    model = create_model(teacher_spec["model"], **kwargs)
    report = None
    if init_from is not None:
        # the student's kind starts its own tensors fresh, and the teacher's kind's own tensors have no place in
        # it; everything outside the attention layers must carry over
        report = load_initial_weights(model, init_from, model_name=teacher_spec["model"], partial=True)
        stray = [k for k in report.missing if ".attn." not in k]
        if stray:
            raise ValueError(f"{init_from}: the teacher's tensors do not cover the student network: "
                             f"{report.summary()}")
        stray = [k for k in report.unexpected if ".attn." not in k]
        if stray:
            raise ValueError(f"{init_from}: the teacher's tensors {', '.join(stray[:3])} have no place in the "
                             f"student network: {report.summary()}")
    return model, kwargs, report


def attention_modules(model: nn.Module) -> List[Tuple[str, TokenAttention]]:
    """Every attention layer of ``model`` in forward order, with its module name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TokenAttention)]
