"""Nested YAML recipes with defaults, typo checks and command-line overrides (``simattn ssl`` and ``simattn detect``;
``simattn train`` has its own flat, typed recipes in :mod:`simattn.train.config`).

A recipe is a nested dict. Every key must exist in the defaults (a misspelt key is an error, not silently ignored),
except inside sections whose default is an empty dict (``{}``): those are free-form keyword arguments handed to a
library call (e.g. ``model.kwargs`` → ``timm.create_model``). ``--set section.key=value`` overrides are parsed as YAML
scalars, so ``--set train.epochs=3`` gives an int and ``--set model.kwargs.img_size=32`` works too;
``--set model.kwargs=null`` empties a free-form section.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, Mapping, Optional

__all__ = ["load_recipe", "merge_recipe", "parse_overrides"]


def merge_recipe(base: Mapping[str, Any], update: Mapping[str, Any], schema: Optional[Mapping[str, Any]] = None,
                 where: str = "") -> Dict[str, Any]:
    """``base`` deep-updated with ``update``; keys not in ``schema`` (the defaults; ``base`` itself if None) raise
    ValueError naming them. Sections that are ``{}`` in the schema are free-form and merged key by key."""
    schema = base if schema is None else schema
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in schema:
            known = ", ".join(sorted(schema)) or "(none)"
            raise ValueError(f"recipe: unknown key {name!r}; known keys here: {known}")
        if isinstance(schema[key], Mapping):
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping, got {type(value).__name__}")
            if schema[key]:  # a checked section
                out[key] = merge_recipe(out[key], value or {}, schema[key], where=f"{name}.")
            elif value is None:  # free-form keyword arguments: null empties them
                out[key] = {}
            else:  # ... a mapping adds to / overrides them key by key
                out[key] = {**out[key], **value}
        else:
            out[key] = _as_type_of(schema[key], value, name)
    return out


def _as_type_of(default: Any, value: Any, name: str) -> Any:
    """YAML reads ``1e-3`` (no dot) as a string; where the default is a number, such strings are numbers."""
    if isinstance(default, (int, float)) and not isinstance(default, bool) and isinstance(value, str):
        try:
            is_int = isinstance(default, int) and value.lstrip("+-").isdigit()
            return int(value) if is_int else float(value)
        except ValueError:
            raise ValueError(f"recipe: {name!r} must be a number, got {value!r}") from None
    return value


def parse_overrides(items: Iterable[str]) -> Dict[str, Any]:
    """``['train.epochs=3', 'model.kwargs.depth=4']`` → nested dict (values parsed as YAML scalars)."""
    import yaml
    nested: Dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form section.key=value")
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[leaf] = yaml.safe_load(raw)
    return nested


def load_recipe(defaults: Mapping[str, Any], path: Optional[str] = None,
                overrides: Iterable[str] = ()) -> Dict[str, Any]:
    """Defaults, then the YAML file at ``path`` (if any), then ``section.key=value`` overrides."""
    from .io import read_yaml_mapping
    recipe = copy.deepcopy(dict(defaults))
    if path is not None:
        recipe = merge_recipe(recipe, read_yaml_mapping(path), defaults)
    return merge_recipe(recipe, parse_overrides(overrides), defaults)
