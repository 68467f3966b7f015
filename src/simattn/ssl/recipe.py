"""YAML recipes with defaults, typo checks and command-line overrides (shared by ``simattn ssl`` and ``simattn detect``).

A recipe is a nested dict. Every key must exist in the defaults (a misspelt key is an error, not silently ignored),
except inside sections whose default is an empty dict (``{}``): those are free-form keyword arguments handed to a
library call (e.g. ``model.kwargs`` → ``timm.create_model``). ``--set section.key=value`` overrides are parsed as YAML
scalars, so ``--set train.epochs=3`` gives an int and ``--set model.kwargs.img_size=32`` works too.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional

__all__ = ["load_recipe", "merge_recipe", "parse_overrides"]


def merge_recipe(defaults: Mapping[str, Any], update: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    """``defaults`` deep-updated with ``update``; unknown keys raise ValueError naming them."""
    out = copy.deepcopy(dict(defaults))
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in out:
            known = ", ".join(sorted(out)) or "(none)"
            raise ValueError(f"recipe: unknown key {name!r}; known keys here: {known}")
        base = out[key]
        if isinstance(base, Mapping) and base:  # a checked section
            if not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping, got {type(value).__name__}")
            out[key] = merge_recipe(base, value, where=f"{name}.")
        elif isinstance(base, Mapping):  # free-form keyword arguments
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping, got {type(value).__name__}")
            out[key] = {**base, **(value or {})}
        else:
            out[key] = value
    return out


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


def load_recipe(defaults: Mapping[str, Any], path: Optional[str] = None, overrides: Iterable[str] = ()) -> Dict[str, Any]:
    """Defaults, then the YAML file at ``path`` (if any), then ``section.key=value`` overrides."""
    import yaml
    recipe = copy.deepcopy(dict(defaults))
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"recipe file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"recipe {path} is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(loaded, Mapping):
            raise ValueError(f"recipe {path} must hold a mapping at top level, got {type(loaded).__name__}")
        recipe = merge_recipe(recipe, loaded)
    return merge_recipe(recipe, parse_overrides(overrides))
