"""``simattn convert`` recipes: the training options of ``simattn train`` plus a ``convert:`` section.

A convert recipe is a train recipe (usually ``base: <train recipe>``, whose data, augmentation, optimizer and
schedule drive stage 2 and the baselines) with ``epochs`` the whole budget (stage 1 + stage 2) and a ``convert``
mapping for what only conversion has (:class:`ConvertOptions`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..train.config import TrainConfig, find_recipe, load_config
from ..utils.io import read_yaml_mapping
from ..utils.options import deep_merge

__all__ = ["ConvertOptions", "load_convert_recipe"]


@dataclass
class ConvertOptions:
    """The ``convert:`` section of a recipe."""

    to: str = "sima"                  # attention kind of the student (--to)
    attn_kwargs: Dict[str, Any] = field(default_factory=dict)  # that kind's options
    transfer_epochs: int = 1          # stage 1's share of the epoch budget
    transfer_lr: float = 3e-3         # absolute learning rate of stage 1
    transfer_batch_size: Optional[int] = None  # per process; None = batch_size
    transfer_warmup_epochs: float = 0.0
    transfer_params: List[str] = field(default_factory=lambda: ["qkv", "proj"])
    transfer_loss: str = "relative_mse"  # relative_mse | mse
    transfer_target: str = "attention"   # attention (teacher-forced attention outputs) | block (block outputs)
    distill_alpha: float = 0.9        # weight of the KL term; 1 - alpha on the label loss
    distill_tau: float = 1.0          # softmax temperature of the KL term
    compare: bool = False             # also run the plain fine-tuning and from-scratch baselines

    def validate(self, epochs: int) -> "ConvertOptions":
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"option 'convert.{name}': got {getattr(self, name)!r}; allowed: {allowed}")
        if not isinstance(self.transfer_epochs, int) or self.transfer_epochs < 0:
            raise bad("transfer_epochs", "an integer >= 0")
        if self.transfer_epochs >= epochs:
            raise ValueError(f"option 'epochs': got {epochs}; allowed: more than convert.transfer_epochs "
                             f"({self.transfer_epochs}), since stage 2 needs at least one epoch of the budget")
        if not self.transfer_lr > 0:
            raise bad("transfer_lr", "a number > 0")
        if self.transfer_batch_size is not None and self.transfer_batch_size < 1:
            raise bad("transfer_batch_size", "an integer >= 1 or null")
        if self.transfer_warmup_epochs < 0:
            raise bad("transfer_warmup_epochs", "a number >= 0")
        if self.transfer_loss not in ("relative_mse", "mse"):
            raise bad("transfer_loss", "relative_mse, mse")
        if self.transfer_target not in ("attention", "block"):
            raise bad("transfer_target", "attention, block")
        if not 0.0 <= self.distill_alpha <= 1.0:
            raise bad("distill_alpha", "a number in [0, 1]")
        if not self.distill_tau > 0:
            raise bad("distill_tau", "a number > 0")
        if not isinstance(self.attn_kwargs, dict):
            raise bad("attn_kwargs", "a mapping")
        return self


_CONVERT_FIELDS = {f.name: f for f in dataclasses.fields(ConvertOptions)}
_INT = ("transfer_epochs", "transfer_batch_size")
_FLOAT = ("transfer_lr", "transfer_warmup_epochs", "distill_alpha", "distill_tau")


def _convert_options(values: Mapping[str, Any], epochs: int) -> ConvertOptions:
    out: Dict[str, Any] = {}
    for key, value in values.items():
        if key not in _CONVERT_FIELDS:
            raise ValueError(f"recipe: unknown key 'convert.{key}'; known keys here: {', '.join(_CONVERT_FIELDS)}")
        try:
            if key in _INT and value is not None:
                if isinstance(value, float) and not value.is_integer() or isinstance(value, bool):
                    raise TypeError
                value = int(value)
            elif key in _FLOAT:
                value = float(value)  # YAML 1.1 reads 3e-3 as a string
            elif key == "transfer_params":
                value = [value] if isinstance(value, str) else [str(v) for v in value]
            elif key == "compare":
                value = bool(value)
        except (TypeError, ValueError):
            raise ValueError(f"option 'convert.{key}': got {value!r}; allowed: a number") from None
        out[key] = value
    return ConvertOptions(**out).validate(epochs)


def _read(recipe: str, chain: Tuple[str, ...] = ()) -> Tuple[Optional[str], Dict[str, Any], Dict[str, Any]]:
    """(train base recipe, train keys, convert section) of a convert recipe, following ``base:`` while it names
    convert recipes."""
    path = find_recipe(recipe)
    data = read_yaml_mapping(path)
    section = data.pop("convert", None) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"recipe {path}: 'convert' must be a mapping of options, got {section!r}")
    base = data.pop("base", None)
    if base is not None and str(path.resolve()) not in chain:
        base_path = find_recipe(str(path.parent / f"{base}.yaml") if (path.parent / f"{base}.yaml").is_file()
                                else str(base))
        if "convert" in read_yaml_mapping(base_path):
            inner_base, inner_train, inner_section = _read(str(base_path), chain + (str(path.resolve()),))
            return inner_base, deep_merge(inner_train, data), deep_merge(inner_section, section)
        return str(base_path), data, dict(section)
    return None, data, dict(section)


def load_convert_recipe(recipe: str, overrides: Optional[Mapping[str, Any]] = None
                        ) -> Tuple[TrainConfig, ConvertOptions]:
    """The training options (stage 2 and the baselines; ``epochs`` = the whole budget) and the conversion options
    of ``recipe`` (a path or a shipped name), with ``overrides`` (a nested mapping: train keys at the top,
    conversion keys under ``convert``) applied."""
    base, train_values, section = _read(recipe)
    overrides = dict(overrides or {})
    section = deep_merge(section, overrides.pop("convert", None) or {})
    cfg = load_config(base, deep_merge(train_values, overrides))
    cfg.recipe = str(recipe)
    return cfg, _convert_options(section, cfg.epochs)
