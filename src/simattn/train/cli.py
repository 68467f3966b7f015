"""``simattn train -c RECIPE [--option value ...]`` (``torchrun --nproc_per_node=N -m simattn train ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional

from ..classify.config import TrainConfig
from ..utils.recipe import print_config_if_asked, recipe_from_args, recipe_overrides, recipe_parser

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "simattn train", "Train a model from a YAML recipe; every recipe option can be overridden on the command "
        "line. Under torchrun each process trains a shard (DDP); the learning rate follows the global batch.",
        TrainConfig, example="epochs=3 model_kwargs.depth=4")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = _model_from_tag(recipe_overrides(TrainConfig, args))
    if print_config_if_asked(TrainConfig, args, overrides):
        return 0
    cfg = recipe_from_args(TrainConfig, args, overrides)
    from ..classify.task import train
    train(cfg)
    return 0


def _model_from_tag(overrides: Dict[str, Any]) -> Dict[str, Any]:
    """A pretrained tag given to ``--initial-checkpoint`` without ``--model`` is the model too, as validate, export
    and convert take it (the recipe's model options then fall away, with their note)."""
    weights = overrides.get("initial_checkpoint")
    if not isinstance(weights, str) or "model" in overrides:
        return overrides
    from ..models.sources import pretrained_tag
    if pretrained_tag(weights) is None:
        return overrides
    import sys
    print(f"note: --initial-checkpoint {weights} sets the model ({weights}), as the other commands take it from "
          "the tag; --model names another", file=sys.stderr, flush=True)
    return {**overrides, "model": weights}
