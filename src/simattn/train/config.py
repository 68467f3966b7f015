"""``simattn train`` options: :class:`TrainConfig` (the engine's options, data, augmentation and model) and its
command-line flags.

Recipes are YAML files with the field names of :class:`TrainConfig` as keys (:mod:`simattn.utils.recipe` reads and
checks them). ``-c`` takes a file path or the name of a shipped recipe (``sima_deit_small``, ``digits_cpu``). Every
field is also a flag (``--batch-size 32``; values are YAML, so ``--opt-betas '[0.9, 0.99]'`` works);
``--set key=value`` items and ``--model-kwargs KEY=VALUE ...`` use the one option mini-language of every command.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional

from ..engine.config import EngineConfig, scaled_lr
from ..utils.options import OPTIONS_HELP, deep_merge, parse_assignments, parse_value
from ..utils.recipe import (INTERPOLATIONS, PROB, check_auto_augment, check_path, find_recipe, list_recipes,
                            load_recipe, option, quoted, specs_of)

__all__ = ["TrainConfig", "load_config", "find_recipe", "list_recipes", "add_config_arguments", "overrides_from_args",
           "scaled_lr", "PATH_OPTIONS"]

#: options whose flag value is a path, taken as typed (not read as YAML)
PATH_OPTIONS = ("output", "resume", "data_dir", "initial_checkpoint")


@dataclass
class TrainConfig(EngineConfig):
    """Every option of ``simattn train``: the engine's, and the data, augmentation and model options of image
    classification (each is a recipe key and a ``--flag``)."""

    num_classes: Optional[int] = option(None, "classifier size; None = the dataset's class count (a mismatch is an "
                                            "error)", low=1)
    initial_checkpoint: Optional[str] = option(None, "weights to start from (a classification checkpoint or "
                                                   "safetensors of any layout the model family reads); the "
                                                   "classifier is re-initialized when its size differs",
                                                   check=check_path)
    drop_path: float = option(0.0, "stochastic depth rate", low=0.0, high=1.0, high_open=True)
    drop: float = option(0.0, "dropout rate", low=0.0, high=1.0, high_open=True)
    dataset: str = option("digits", "digits (embedded) | folder/imagenet (root/<split>/<class>/<img>) | cifar10 | "
                                  "cifar100 (checked by simattn.data.create_dataset)")
    data_dir: Optional[str] = option(None, "dataset root (not used by digits)", check=check_path)
    train_split: str = option("train", "split (sub-folder) to train on")
    val_split: str = option("val", "split to evaluate on")
    img_size: Optional[int] = option(None, "input resolution; None = model_kwargs.img_size or the model's default",
                                   low=1)
    scale: List[float] = option(factory=lambda: [0.08, 1.0], help="RandomResizedCrop area range", low=0.0, high=1.0,
                              low_open=True, length=2)
    ratio: List[float] = option(factory=lambda: [3 / 4, 4 / 3], help="RandomResizedCrop aspect range", low=0.0,
                              low_open=True, length=2)
    hflip: float = option(0.5, "horizontal flip probability", **PROB)
    vflip: float = option(0.0, "vertical flip probability", **PROB)
    color_jitter: float = option(0.4, "color jitter strength (ignored when aa is set)", low=0.0)
    aa: Optional[str] = option(None, "timm auto-augment string, e.g. rand-m9-mstd0.5-inc1", check=check_auto_augment)
    interpolation: Optional[str] = option(None, "bicubic | bilinear | ...; None = the model's default",
                                        choices=INTERPOLATIONS)
    mean: Optional[List[float]] = option(None, "None = the model's default", length=3)
    std: Optional[List[float]] = option(None, "None = the model's default", low=0.0, low_open=True, length=3)
    crop_pct: Optional[float] = option(None, "evaluation center-crop ratio; None = the model's default", low=0.0,
                                     high=1.0, low_open=True)
    reprob: float = option(0.0, "random erasing probability", **PROB)
    remode: str = option("pixel", "random erasing fill: pixel | rand | const", choices=["pixel", "rand", "const"])
    recount: int = option(1, "random erasing regions per image", low=1)
    mixup: float = option(0.0, "mixup alpha (0 = off)", low=0.0)
    cutmix: float = option(0.0, "cutmix alpha (0 = off)", low=0.0)
    mixup_prob: float = option(1.0, "probability of mixing a batch", **PROB)
    mixup_switch_prob: float = option(0.5, "probability of cutmix instead of mixup when both are on", **PROB)
    mixup_mode: str = option("batch", "batch | pair | elem", choices=["batch", "pair", "elem"])
    smoothing: float = option(0.1, "label smoothing", low=0.0, high=1.0, high_open=True)

    #: whether ``model_kwargs`` build the trained network (a conversion's student takes its teacher's instead)
    model_kwargs_build_the_model: ClassVar[bool] = True

    def validate(self) -> "TrainConfig":
        """Check every option and the ones that depend on each other (a one-line ValueError)."""
        super().validate()
        for name in ("scale", "ratio"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"option {name!r}: got {quoted(getattr(self, name))}; allowed: [low, high] with "
                                 "low <= high")
        built = self.model_kwargs.get("img_size") if isinstance(self.model_kwargs, dict) else None
        if self.model_kwargs_build_the_model and self.img_size is not None and built is not None \
                and built != self.img_size:
            # the network would be built for one size and fed another: neither silently wins
            raise ValueError(f"options 'img_size' (--img-size) {quoted(self.img_size)} and 'model_kwargs.img_size' "
                             f"(--model-kwargs img_size=) {quoted(built)} disagree: the model is built for one and the "
                             "data is fed at the other; give one of them, or the same size to both")
        return self



def load_config(recipe: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Defaults, then the YAML ``recipe`` (a path or shipped name), then ``overrides``; every option checked.

    A recipe may start from another with ``base: <recipe>`` and change a few keys. ``model_kwargs`` in
    ``overrides`` is merged into the recipe's (``null`` empties it).
    """
    return load_recipe(TrainConfig, recipe, overrides)


def add_config_arguments(parser: argparse.ArgumentParser, schema: type = TrainConfig) -> None:
    """``-c``, ``--set`` and one flag per option of ``schema`` (``--batch-size``; a TrainConfig or a subclass), all
    defaulting to 'not given' so that the recipe's value stands; sections (``convert.*``) are set with ``--set``."""
    parser.add_argument("-c", "--config", metavar="RECIPE",
                        help="recipe: a YAML file or a shipped recipe name (default: built-in defaults)")
    parser.add_argument("--set", dest="set_items", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help=f"recipe options to override ({OPTIONS_HELP}), e.g. --set epochs=3 model_kwargs.depth=4")
    group = parser.add_argument_group("recipe options (override the YAML recipe)")
    for name, opt in specs_of(schema).items():
        if isinstance(opt, Mapping):
            continue
        flag = "--" + name.replace("_", "-")
        help_ = f"{opt.help} (default {opt.default!r})".lstrip()
        if opt.hint is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_)
        elif name == "model_kwargs":
            group.add_argument(flag, dest=name, nargs="+", action="extend", default=argparse.SUPPRESS,
                               metavar="KEY=VALUE", help=f"{opt.help}: {OPTIONS_HELP}")
        else:
            extra = {"nargs": "?", "const": opt.const} if opt.const is not None else {}
            # a path is text as typed: as YAML, '' would be null (the default folder) and 2024 a number
            kind = str if name in PATH_OPTIONS else parse_value
            group.add_argument(flag, dest=name, type=kind, default=argparse.SUPPRESS, help=help_, **extra)


def overrides_from_args(args: argparse.Namespace, schema: type = TrainConfig) -> Dict[str, Any]:
    """The recipe options given on the command line: ``--set`` items, then the per-option flags."""
    fields = {k: v for k, v in specs_of(schema).items() if not isinstance(v, Mapping)}
    given = {k: v for k, v in vars(args).items() if k in fields}
    if "model_kwargs" in given:
        given["model_kwargs"] = parse_assignments(given["model_kwargs"], what="--model-kwargs item")
    return deep_merge(parse_assignments(getattr(args, "set_items", []), what="--set item"), given)
