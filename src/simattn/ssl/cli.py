"""``simattn ssl``: DINO pretraining and frozen-feature evaluation.

    simattn ssl train --config configs/ssl_digits.yaml [--set train.epochs=5 ...] [--output DIR] [--resume]
    simattn ssl eval  --config configs/ssl_digits.yaml --weights runs/ssl_digits/backbone.safetensors
    torchrun --nproc_per_node=8 -m simattn ssl train --config configs/ssl_dino_sima_small_12_p16.yaml
"""
from __future__ import annotations

import argparse
import json
from typing import List

from ..utils.io import atomic_write_json

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simattn ssl", description="DINO self-supervised pretraining and k-NN / "
                                     "linear-probe evaluation of any registered backbone")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("train", "DINO pretraining (then k-NN and linear probe of the teacher)"),
                        ("eval", "k-NN and linear probe of a backbone's frozen features")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", help="YAML recipe (see configs/ssl_*.yaml); defaults are the paper's recipe")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe entry, e.g. --set train.epochs=3 (repeatable)")
        p.add_argument("--output", help="output folder (overrides the recipe's 'output')")
    sub.choices["train"].add_argument("--resume", action="store_true",
                                      help="continue from OUTPUT/checkpoint.pth if it exists")
    ev = sub.choices["eval"]
    ev.add_argument("--weights", help="backbone weights (.pth checkpoint or .safetensors); omit for random init")
    ev.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    return parser


def main(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    from .dino import DEFAULTS
    from ..utils.recipe import load_recipe
    overrides = list(args.overrides) + ([f"output={args.output}"] if args.output else [])
    recipe = load_recipe(DEFAULTS, args.config, overrides)
    if args.action == "train":
        from .dino import pretrain
        results = pretrain(recipe, resume=args.resume)
        if results:
            print(json.dumps({"output": recipe["output"], **results.get("final", {})}))
        return 0
    return _evaluate(recipe, args)


def _evaluate(recipe, args) -> int:
    from pathlib import Path

    from ..utils.distributed import init_distributed
    from ..utils.io import load_weights
    from .dino import build_backbone
    from .evaluate import evaluate_backbone
    device = init_distributed(recipe["train"]["device"]).device
    backbone = build_backbone(recipe["model"]).to(device)
    if args.weights:
        load_weights(backbone, args.weights, use_ema=args.ema)
    results = evaluate_backbone(backbone, recipe["data"], recipe["eval"], device=device, seed=recipe["train"]["seed"])
    results = {"model": recipe["model"]["name"], "weights": args.weights or "random init", **results}
    atomic_write_json(results, Path(recipe["output"]) / "eval.json")
    print(json.dumps(results))
    return 0
