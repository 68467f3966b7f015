"""Name → attention module registry."""
from __future__ import annotations

import inspect
import re
from typing import Callable, Dict, List, Mapping, Type

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


def constructor_options(cls: Type[nn.Module]) -> List[str]:
    """The keyword options ``cls``'s constructor takes, through the ``**kwargs`` its constructors pass up."""
    names: List[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return list(dict.fromkeys(names))


def check_attention_options(name, options: Mapping[str, object]) -> None:
    """A one-line ValueError naming the ``options`` attention ``name`` does not take (not timm's TypeError from
    deep inside a block)."""
    cls = get_attention_class(name)
    known = constructor_options(cls)
    unknown = [k for k in options if k not in known]
    if unknown:
        kind = getattr(cls, "attn_name", cls.__name__)
        own = [k for k in known if k not in constructor_options(_base_of(cls))]
        raise ValueError(f"attention {kind!r} does not take option(s) {', '.join(unknown)}; its own options: "
                         f"{', '.join(own) or 'none'} (attn_kwargs are the options of the kind in attn_type)")


def _base_of(cls: Type[nn.Module]) -> Type[nn.Module]:
    from .base import TokenAttention  # the options every kind shares, which timm's blocks pass
    return TokenAttention if issubclass(cls, TokenAttention) else nn.Module


def attention_class(name, **options) -> Type[nn.Module]:
    """The class for ``name`` with ``options`` bound as constructor defaults, as a named subclass.

    timm's ``VisionTransformer(attn_layer=...)`` rejects ``functools.partial``; this gives it a real class, e.g.
    ``attention_class('sima', order='qk_first')`` or ``attention_class('relu', activation='relu2')``. Options the
    kind does not take are a ValueError naming them.
    """
    cls = get_attention_class(name)
    if not options:
        return cls
    check_attention_options(cls, options)

    def __init__(self, dim, num_heads=8, **kwargs):
        cls.__init__(self, dim, num_heads, **{**options, **kwargs})

    suffix = "_".join(f"{k}-{v}" for k, v in sorted(options.items()))
    name = f"{cls.__name__}[{suffix}]"
    # TorchScript serializes the class under its name, which must be an identifier there
    jit_name = f"__torch__.{cls.__module__}.{re.sub(r'[^0-9A-Za-z_]', '_', name)}"
    return type(name, (cls,), {"__init__": __init__, "__module__": cls.__module__, "preset_options": dict(options),
                               "_jit_override_qualname": jit_name})
