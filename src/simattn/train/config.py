"""``simattn train`` options: the :class:`~simattn.utils.recipe.TrainConfig` schema as command-line flags.

Recipes are YAML files with the field names of :class:`TrainConfig` as keys (:mod:`simattn.utils.recipe` reads and
checks them). ``-c`` takes a file path or the name of a shipped recipe (``sima_deit_small``, ``digits_cpu``). Every
field is also a flag (``--batch-size 32``; values are YAML, so ``--opt-betas '[0.9, 0.99]'`` works);
``--set key=value`` items and ``--model-kwargs KEY=VALUE ...`` use the one option mini-language of every command.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, Mapping, Optional

from ..utils.options import OPTIONS_HELP, deep_merge, parse_assignments, parse_value
from ..utils.recipe import TrainConfig, find_recipe, list_recipes, load_recipe, scaled_lr, specs_of

__all__ = ["TrainConfig", "load_config", "find_recipe", "list_recipes", "add_config_arguments", "overrides_from_args",
           "scaled_lr"]


def load_config(recipe: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Defaults, then the YAML ``recipe`` (a path or shipped name), then ``overrides``; every option checked.

    A recipe may start from another with ``base: <recipe>`` and change a few keys. ``model_kwargs`` in
    ``overrides`` is merged into the recipe's (``null`` empties it).
    """
    return load_recipe(TrainConfig, recipe, overrides)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``-c``, ``--set`` and one flag per option (``--batch-size``), all defaulting to 'not given' so that the
    recipe's value stands."""
    parser.add_argument("-c", "--config", metavar="RECIPE",
                        help="recipe: a YAML file or a shipped recipe name (default: built-in defaults)")
    parser.add_argument("--set", dest="set_items", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help=f"recipe options to override ({OPTIONS_HELP}), e.g. --set epochs=3 model_kwargs.depth=4")
    group = parser.add_argument_group("recipe options (override the YAML recipe)")
    for name, opt in specs_of(TrainConfig).items():
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
            group.add_argument(flag, dest=name, type=parse_value, default=argparse.SUPPRESS, help=help_, **extra)


def overrides_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    """The recipe options given on the command line: ``--set`` items, then the per-option flags."""
    fields = specs_of(TrainConfig)
    given = {k: v for k, v in vars(args).items() if k in fields}
    if "model_kwargs" in given:
        given["model_kwargs"] = parse_assignments(given["model_kwargs"], what="--model-kwargs item")
    return deep_merge(parse_assignments(getattr(args, "set_items", []), what="--set item"), given)
