"""``simattn convert`` recipes: the training options of ``simattn train`` plus a ``convert:`` section.

A convert recipe is a train recipe (usually ``base: <train recipe>``, whose data, augmentation, optimizer and
schedule drive stage 2 and the baselines) with ``epochs`` the whole budget (stage 1 + stage 2) and a ``convert``
mapping for what only conversion has (:class:`ConvertOptions`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from ..train.config import TrainConfig
from ..utils.recipe import Opt, check_section, load_recipe, maybe, section

__all__ = ["CONVERT_SCHEMA", "ConvertConfig", "ConvertOptions", "load_convert_recipe"]

#: the ``convert:`` section of a recipe: what only conversion has
CONVERT_SCHEMA: Dict[str, Any] = {
    "to": Opt("sima", "attention kind of the student (--to); it must keep the qkv/proj layout"),
    "attn_kwargs": Opt({}, "that kind's options (create_attention kwargs)"),
    "transfer_epochs": Opt(1, "stage 1's share of the epoch budget", low=0),
    "transfer_lr": Opt(3e-3, "absolute learning rate of stage 1", low=0.0, low_open=True),
    "transfer_batch_size": Opt(None, "per process; null = batch_size", type=maybe(int), low=1),
    "transfer_warmup_epochs": Opt(0.0, "stage 1's linear warm-up", low=0.0),
    "transfer_params": Opt(["qkv", "proj"], "the parameters stage 1 trains (names within each attention block)",
                           type=List[str]),
    "transfer_loss": Opt("relative_mse", choices=["relative_mse", "mse"]),
    "transfer_target": Opt("attention", "attention (teacher-forced attention outputs) | block (block outputs)",
                           choices=["attention", "block"]),
    "distill_alpha": Opt(0.9, "weight of the KL term; 1 - alpha on the label loss", low=0.0, high=1.0),
    "distill_tau": Opt(1.0, "softmax temperature of the KL term", low=0.0, low_open=True),
    "compare": Opt(False, "also run the plain fine-tuning and from-scratch baselines"),
}


@dataclass
class ConvertConfig(TrainConfig):
    """A convert recipe: the options of ``simattn train`` (stage 2 and the baselines; ``epochs`` is the whole budget)
    and the ``convert`` section (:data:`CONVERT_SCHEMA`)."""

    convert: Dict[str, Any] = section(CONVERT_SCHEMA)

    #: the student is the teacher's network (--model/--model-kwargs): the recipe's model_kwargs build nothing
    model_kwargs_build_the_model: ClassVar[bool] = False

    def validate(self) -> "ConvertConfig":
        super().validate()
        ConvertOptions(**self.convert).validate(self.epochs)
        return self

    def train_config(self) -> TrainConfig:
        """The training options alone (each stage is a run of ``simattn train``'s task)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)}
        return TrainConfig(**values)


@dataclass
class ConvertOptions:
    """The ``convert:`` section as attributes (:data:`CONVERT_SCHEMA` says what each is)."""

    to: str = "sima"
    attn_kwargs: Dict[str, Any] = field(default_factory=dict)
    transfer_epochs: int = 1
    transfer_lr: float = 3e-3
    transfer_batch_size: Optional[int] = None
    transfer_warmup_epochs: float = 0.0
    transfer_params: List[str] = field(default_factory=lambda: ["qkv", "proj"])
    transfer_loss: str = "relative_mse"
    transfer_target: str = "attention"
    distill_alpha: float = 0.9
    distill_tau: float = 1.0
    compare: bool = False

    def validate(self, epochs: int) -> "ConvertOptions":
        """Every option in its range (one-line ValueError), and stage 1 leaving stage 2 at least one epoch."""
        for key, value in check_section(dataclasses.asdict(self), CONVERT_SCHEMA, "convert.").items():
            setattr(self, key, value)
        if self.transfer_epochs >= epochs:
            raise ValueError(f"option 'epochs': got {epochs}; allowed: more than convert.transfer_epochs "
                             f"({self.transfer_epochs}), since stage 2 needs at least one epoch of the budget")
        return self


def load_convert_recipe(recipe: str, overrides: Optional[Mapping[str, Any]] = None
                        ) -> Tuple[TrainConfig, ConvertOptions]:
    """The training options (stage 2 and the baselines; ``epochs`` = the whole budget) and the conversion options
    of ``recipe`` (a path or a shipped name, read like every recipe: ``base:`` chains, checked values), with
    ``overrides`` (a nested mapping: train keys at the top, conversion keys under ``convert``) applied."""
    cfg = load_recipe(ConvertConfig, recipe, overrides)
    return cfg.train_config(), ConvertOptions(**cfg.convert)
