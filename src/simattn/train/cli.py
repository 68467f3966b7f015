"""``simattn train -c RECIPE [--option value ...]`` (``torchrun --nproc_per_node=N -m simattn train ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import List, Optional

from .config import TrainConfig, add_config_arguments, list_recipes, load_config, overrides_from_args

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simattn train",
        description="Train a model from a YAML recipe; every recipe option can be overridden on the command line. "
                    "Under torchrun each process trains a shard (DDP); the learning rate follows the global batch.",
        epilog="shipped recipes: " + ", ".join(list_recipes(TrainConfig)))
    add_config_arguments(parser)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config, overrides_from_args(args))
    from .engine import train
    train(cfg)
    return 0
