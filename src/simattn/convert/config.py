"""``simattn convert`` recipes: the training options of ``simattn train`` plus a ``convert:`` section.

A convert recipe is a train recipe (usually ``base: <train recipe>``, whose data, augmentation, optimizer and
schedule drive stage 2 and the baselines) with ``epochs`` the whole budget (stage 1 + stage 2) and a ``convert``
section for what only conversion has (:class:`ConvertOptions`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional

from ..train.config import TrainConfig
from ..utils.recipe import load_recipe, option, section

__all__ = ["ConvertConfig", "ConvertOptions", "StageConfig", "load_convert_recipe"]


@dataclass
class ConvertOptions:
    """The ``convert:`` section of a recipe: what only conversion has."""

    to: str = option("sima", "attention kind of the student; it must keep the qkv/proj layout", flags=("--to",))
    attn_kwargs: Dict[str, Any] = option(factory=dict, help="that kind's options (create_attention kwargs)",
                                         belongs_to=("to",))
    transfer_epochs: int = option(1, "stage 1's share of the epoch budget", low=0)
    transfer_lr: float = option(3e-3, "absolute learning rate of stage 1", low=0.0, low_open=True)
    transfer_batch_size: Optional[int] = option(None, "per process; null = batch_size", low=1)
    transfer_warmup_epochs: float = option(0.0, "stage 1's linear warm-up", low=0.0)
    transfer_params: List[str] = option(factory=lambda: ["qkv", "proj"],
                                        help="the parameters stage 1 trains (names within each attention block)")
    transfer_loss: str = option("relative_mse", choices=["relative_mse", "mse"])
    transfer_target: str = option("attention", "attention (teacher-forced attention outputs) | block (block outputs)",
                                  choices=["attention", "block"])
    distill_alpha: float = option(0.9, "weight of the KL term; 1 - alpha on the label loss", low=0.0, high=1.0)
    distill_tau: float = option(1.0, "softmax temperature of the KL term", low=0.0, low_open=True)
    compare: bool = option(False, "also run the plain fine-tuning and from-scratch baselines", flags=("--compare",))


@dataclass
class StageConfig(TrainConfig):
    """One stage of a conversion: the options of ``simattn train`` on the student, whose network (its
    ``model_kwargs``) is the teacher's, not the recipe's, so the data size need not match a size in it."""

    #: the student is the teacher's network (--model/--model-kwargs): the recipe's model_kwargs build nothing
    model_kwargs_build_the_model: ClassVar[bool] = False


@dataclass
class ConvertConfig(StageConfig):
    """A convert recipe: the options of ``simattn train`` (stage 2 and the baselines; ``epochs`` is the whole budget)
    and the ``convert`` section."""

    convert: ConvertOptions = section(ConvertOptions)

    def validate(self) -> "ConvertConfig":
        super().validate()
        if self.convert.transfer_epochs >= self.epochs:
            raise ValueError(f"option 'epochs': got {self.epochs}; allowed: more than convert.transfer_epochs "
                             f"({self.convert.transfer_epochs}), since stage 2 needs at least one epoch of the budget")
        return self

    def stage_config(self, **changes: Any) -> StageConfig:
        """The training options alone, with ``changes`` (each stage is a run of ``simattn train``'s task)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(StageConfig)}
        return StageConfig(**{**values, **changes})


def load_convert_recipe(recipe: str = "convert_digits", overrides: Optional[Mapping[str, Any]] = None
                        ) -> ConvertConfig:
    """The conversion recipe ``recipe`` (a path or a shipped name, read like every recipe: ``base:`` chains, checked
    values), with ``overrides`` (a nested mapping: train keys at the top, conversion keys under ``convert``)."""
    return load_recipe(ConvertConfig, recipe, overrides)
