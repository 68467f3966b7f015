"""``simattn train -c RECIPE [--option value ...]`` (``torchrun --nproc_per_node=N -m simattn train ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import List, Optional

from ..utils.recipe import print_config_if_asked, recipe_from_args, recipe_parser
from .config import TrainConfig

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "simattn train", "Train a model from a YAML recipe; every recipe option can be overridden on the command "
        "line. Under torchrun each process trains a shard (DDP); the learning rate follows the global batch.",
        TrainConfig, example="epochs=3 model_kwargs.depth=4")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if print_config_if_asked(TrainConfig, args):
        return 0
    cfg = recipe_from_args(TrainConfig, args)
    from .task import train
    train(cfg)
    return 0
