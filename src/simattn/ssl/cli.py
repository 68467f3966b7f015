"""``simattn ssl``: DINO pretraining and frozen-feature evaluation.

    simattn ssl train --config ssl_digits [--epochs 5 --set dino.teacher_temp=0.05 ...] [--output DIR] [--resume]
    simattn ssl eval  --config ssl_digits --weights runs/ssl_digits/<date-time>/backbone.safetensors
    torchrun --nproc_per_node=8 -m simattn ssl train --config ssl_dino_sima_small_12_p16
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import List

from ..utils.io import json_dumps
from ..utils.recipe import (add_recipe_options, print_config_if_asked, recipe_from_args, recipe_name, recipe_parser)
from ..utils.subcommands import check_subcommand
from .config import SslConfig

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = recipe_parser("simattn ssl", "DINO self-supervised pretraining and k-NN / linear-probe evaluation of "
                           "any registered backbone")
    sub = parser.add_subparsers(dest="action", required=True)
    train = sub.add_parser("train", help="DINO pretraining (then k-NN and linear probe of the teacher)")
    add_recipe_options(train, SslConfig, example="epochs=3 model.kwargs.depth=4")
    ev = sub.add_parser("eval", help="k-NN and linear probe of a backbone's frozen features")
    add_recipe_options(ev, SslConfig, example="eval.linear_epochs=0", flags=False)
    ev.add_argument("--weights", help="backbone weights (.pth checkpoint or .safetensors); omit for random init")
    ev.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    return parser


def main(argv: List[str]) -> int:
    check_subcommand(argv, ("train", "eval"))
    args = _parser().parse_args(argv)
    if print_config_if_asked(SslConfig, args):
        return 0
    cfg = recipe_from_args(SslConfig, args)
    if args.action == "train":
        from ..utils.extras import require
        require("lightly", "simattn ssl train")
        from .dino import pretrain
        results = pretrain(cfg)
        if results:
            print(json_dumps({"output": results["output"], **results.get("final", {})}))
        return 0
    return _evaluate(cfg, args, recipe_name(args.config) or "ssl")


def _evaluate(cfg: SslConfig, args, name: str) -> int:
    from ..engine.dist import init_distributed
    from ..models.factory import load_initial_weights
    from ..models.sources import resolve_source
    from ..utils.io import atomic_write_json
    from ..utils.runs import results_folder
    from .dino import build_backbone
    from .evaluate import evaluate_backbone
    device = init_distributed(cfg.device, cfg.dist_timeout).device
    backbone = build_backbone(dataclasses.asdict(cfg.model)).to(device)
    source = resolve_source(args.weights, "weights") if args.weights else None  # once, for every step below
    if source is not None:
        # any file the project opens: a DINO checkpoint or backbone, a classifier (its head is dropped), timm weights
        report = load_initial_weights(backbone, source, model_name=cfg.model.name, use_ema=args.ema,
                                      strict=True)
        print(report.summary(), flush=True)
    # the results go beside the weights file (a hub folder's, for local-dir: and hf-hub: names; not a tag's cache)
    beside = str(source.path) if source is not None and source.tag is None else None
    out = results_folder(cfg.output, beside, f"{name}_eval", "ssl_eval")
    results = evaluate_backbone(backbone, cfg, device=device)
    results = {"model": cfg.model.name, "weights": args.weights or "random init", **results}
    print(json_dumps(results), flush=True)  # shown before anything is written
    atomic_write_json(results, out / "eval.json")
    return 0
