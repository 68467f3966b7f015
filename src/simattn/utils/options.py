"""The one option mini-language of every command: ``KEY=VALUE`` items.

Used by ``--set`` (recipe overrides), ``--model-kwargs`` and ``--attn-kwargs``:

- the value is parsed as a YAML scalar or flow collection: ``3`` is an int, ``1e-3`` a float, ``true`` a bool,
  ``null`` None, ``[0.9, 0.999]`` a list, ``{order: kv_first}`` a mapping, and a plain word stays a string;
- a dotted key nests: ``convert.transfer_lr=1e-3`` is ``{'convert': {'transfer_lr': 0.001}}`` and ``attn_kwargs.order=kv_first`` is
  ``{'attn_kwargs': {'order': 'kv_first'}}``;
- a later item for the same key wins; mappings given for the same key are merged key by key.

Bad text raises a one-line ``ValueError`` that quotes the item and says what is allowed.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Union

import re

import yaml

__all__ = ["parse_value", "parse_assignments", "deep_merge", "OPTIONS_HELP"]

#: one sentence for ``--help`` texts
OPTIONS_HELP = ("KEY=VALUE items; values are YAML (3, 1e-3, true, null, [a, b], {k: v}), dotted keys nest "
                "(a.b=1 is {a: {b: 1}})")


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, which reads ``1e-3`` (no dot) as a string; here it is a float, as in YAML 1.2."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."))


def parse_value(text: str) -> Any:
    """A YAML value; text that is not valid YAML (e.g. ``a: b: c``) stays the string it is."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        return text


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> Dict[str, Any]:
    """``base`` updated with ``update``, mappings merged key by key (neither input is modified)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_assignments(items: Union[str, Iterable[str], None], what: str = "option") -> Dict[str, Any]:
    """``['model.name=x', 'epochs=3']`` → ``{'model': {'name': 'x'}, 'epochs': 3}``.

    ``what`` names the items in error messages (``'--set item'``, ``'model kwarg'``). A single string is one item.
    """
    if isinstance(items, str):
        items = [items]
    nested: Dict[str, Any] = {}
    for item in items or ():
        key, sep, text = str(item).partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or not all(p.strip() for p in parts):
            raise ValueError(f"{what} {item!r} is not KEY=VALUE (e.g. epochs=3, attn_kwargs.order=kv_first)")
        value = parse_value(text)
        for part in reversed(parts[1:]):
            value = {part.strip(): value}
        nested = deep_merge(nested, {parts[0].strip(): value})
    return nested
