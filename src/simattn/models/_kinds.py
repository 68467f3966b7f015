"""The attention options a model is built with, when ``attn_type=`` keeps its own kind or names another.

A model made for a kind with options of its own (Agent-DeiT's 49 agents, FLatten's focusing factor, CosFormer's
re-weighting) still takes any ``attn_type``: those options belong to its kind and fall away for another, with a
one-line note, while the facts of its token layout (``TokenAttention.layout_options``: the prefix tokens, the grid
of a key encoding) go to every kind that takes them, its own included. ``attn_kwargs`` the chosen kind does not
take are a ValueError naming them (:func:`simattn.attention.attention_class`).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Union

from ..attention import get_attention_class

__all__ = ["kind_options"]

_logger = logging.getLogger("simattn.models")


def _same(a: Union[str, type], b: Union[str, type]) -> bool:
    return get_attention_class(a) is get_attention_class(b)


def kind_options(variant: str, own_kind: str, own_options: Optional[Mapping[str, Any]], kind: Union[str, type],
                 options: Optional[Mapping[str, Any]] = None,
                 layout: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The options to build attention ``kind`` with in model ``variant``, made for ``own_kind`` with
    ``own_options``: the ``layout`` facts the kind's class takes (``layout_options``), then ``own_options`` where
    ``kind`` is the model's own, then the caller's ``options``."""
    options = dict(options or {})
    takes = getattr(get_attention_class(kind), "layout_options", ())
    layout = {k: v for k, v in (layout or {}).items() if k in takes}
    if _same(kind, own_kind):
        return {**(own_options or {}), **layout, **options}
    dropped = [k for k in (own_options or {}) if k not in options]
    if dropped:
        name = kind if isinstance(kind, str) else getattr(kind, "attn_name", kind.__name__)
        _logger.warning("note: %s with attn_type=%r: %s's own option(s) %s left out", variant, name, own_kind,
                        ", ".join(dropped))
    return {**layout, **options}
