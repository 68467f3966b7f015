"""Name → attention module registry."""
from __future__ import annotations

import re
from typing import Callable, Dict, List, Type

from torch import nn

_ATTENTIONS: Dict[str, Type[nn.Module]] = {}


def register_attention(name: str) -> Callable[[Type[nn.Module]], Type[nn.Module]]:
    """Class decorator that registers an attention module under ``name``."""

    def wrap(cls: Type[nn.Module]) -> Type[nn.Module]:
        if name in _ATTENTIONS and _ATTENTIONS[name] is not cls:
            raise ValueError(f"attention name {name!r} is already registered to {_ATTENTIONS[name].__name__}")
        _ATTENTIONS[name] = cls
        cls.attn_name = name
        return cls

    return wrap


def list_attentions() -> List[str]:
    """Sorted names of all registered attention kinds."""
    return sorted(_ATTENTIONS)


def get_attention_class(name: str) -> Type[nn.Module]:
    """The module class registered under ``name``; ValueError naming the known kinds otherwise."""
    if isinstance(name, type) and issubclass(name, nn.Module):
        return name
    try:
        return _ATTENTIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention {name!r}; known: {', '.join(list_attentions())}") from None


def create_attention(name: str, dim: int, num_heads: int = 8, **kwargs) -> nn.Module:
    """Build the attention module ``name`` with timm's Attention constructor signature."""
    return get_attention_class(name)(dim, num_heads=num_heads, **kwargs)


def attention_class(name, **options) -> Type[nn.Module]:
    """The class for ``name`` with ``options`` bound as constructor defaults, as a named subclass.

    timm's ``VisionTransformer(attn_layer=...)`` rejects ``functools.partial``; this gives it a real class, e.g.
    ``attention_class('sima', order='qk_first')`` or ``attention_class('relu', activation='relu2')``.
    """
    cls = get_attention_class(name)
    if not options:
        return cls

    def __init__(self, dim, num_heads=8, **kwargs):
        cls.__init__(self, dim, num_heads, **{**options, **kwargs})

    suffix = "_".join(f"{k}-{v}" for k, v in sorted(options.items()))
    name = f"{cls.__name__}[{suffix}]"
    # TorchScript serializes the class under its name, which must be an identifier there
    jit_name = f"__torch__.{cls.__module__}.{re.sub(r'[^0-9A-Za-z_]', '_', name)}"
    return type(name, (cls,), {"__init__": __init__, "__module__": cls.__module__, "preset_options": dict(options),
                               "_jit_override_qualname": jit_name})
