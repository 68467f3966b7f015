"""``simattn ssl``: DINO pretraining and frozen-feature evaluation.

    simattn ssl train --config ssl_digits [--set train.epochs=5 ...] [--output DIR] [--resume] [--overwrite]
    simattn ssl eval  --config ssl_digits --weights runs/ssl_digits/<date-time>/backbone.safetensors
    torchrun --nproc_per_node=8 -m simattn ssl train --config ssl_dino_sima_small_12_p16
"""
from __future__ import annotations

import argparse
from typing import List

from ..utils.io import json_dumps
from ..utils.recipe import add_recipe_arguments, recipe_from_args, recipe_name
from .schema import SSL_SCHEMA

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simattn ssl", description="DINO self-supervised pretraining and k-NN / "
                                     "linear-probe evaluation of any registered backbone")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("train", "DINO pretraining (then k-NN and linear probe of the teacher)"),
                        ("eval", "k-NN and linear probe of a backbone's frozen features")):
        p = sub.add_parser(name, help=help_)
        add_recipe_arguments(p, SSL_SCHEMA, "train.epochs=3", run=name == "train")
    ev = sub.choices["eval"]
    ev.add_argument("--weights", help="backbone weights (.pth checkpoint or .safetensors); omit for random init")
    ev.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    return parser


def main(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    recipe = recipe_from_args(SSL_SCHEMA, args)
    name = recipe_name(args.config) or "ssl"
    if args.action == "train":
        from ..utils.extras import require
        require("lightly", "simattn ssl train")
        from .dino import pretrain
        results = pretrain(recipe, resume=args.resume, overwrite=args.overwrite, name=name)
        if results:
            print(json_dumps({"output": results["output"], **results.get("final", {})}))
        return 0
    return _evaluate(recipe, args, name)


def _evaluate(recipe, args, name: str) -> int:
    from ..utils.distributed import init_distributed
    from ..models.factory import load_initial_weights
    from ..utils.io import atomic_write_json
    from ..utils.runs import results_folder
    from .dino import build_backbone
    from .evaluate import evaluate_backbone
    device = init_distributed(recipe["train"]["device"], recipe["train"]["dist_timeout"]).device
    backbone = build_backbone(recipe["model"]).to(device)
    if args.weights:
        # any file the project opens: a DINO checkpoint or backbone, a classifier (its head is dropped), timm weights
        report = load_initial_weights(backbone, args.weights, model_name=recipe["model"]["name"], use_ema=args.ema,
                                      strict=True)
        print(report.summary(), flush=True)
    out = results_folder(recipe["output"], args.weights, f"{name}_eval", "ssl_eval")
    results = evaluate_backbone(backbone, recipe["data"], recipe["eval"], device=device, seed=recipe["train"]["seed"])
    results = {"model": recipe["model"]["name"], "weights": args.weights or "random init", **results}
    print(json_dumps(results), flush=True)  # shown before anything is written
    atomic_write_json(results, out / "eval.json")
    return 0
