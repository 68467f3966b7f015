"""``simattn detect``: Mask R-CNN training and COCO box/mask AP evaluation on COCO-layout data.

    simattn detect shapes [--out data/shapes]                    # a tiny synthetic COCO-layout dataset
    simattn detect train --config configs/detect_shapes_cpu.yaml [--set train.epochs=2 ...] [--resume]
    simattn detect eval  --config configs/detect_shapes_cpu.yaml --weights runs/detect_shapes/checkpoint.pth
    torchrun --nproc_per_node=8 -m simattn detect train --config configs/detect_maskrcnn_sima_small_12_p16.yaml \\
        --set data.train_images=/data/coco/train2017 ...
"""
from __future__ import annotations

import argparse
import json
from typing import List

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from .shapes import DEFAULT_SHAPES_ROOT
    parser = argparse.ArgumentParser(prog="simattn detect", description="Mask R-CNN with FPN on a SimA backbone")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("train", "train Mask R-CNN, evaluating box and mask AP"),
                        ("eval", "box and mask AP of a trained checkpoint on the val data")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", help="YAML recipe (see configs/detect_*.yaml)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe entry, e.g. --set data.val_images=/data/val2017 (repeatable)")
        p.add_argument("--output", help="output folder (overrides the recipe's 'output')")
    sub.choices["train"].add_argument("--resume", action="store_true",
                                      help="continue from OUTPUT/checkpoint.pth if it exists")
    sub.choices["eval"].add_argument("--weights", required=True, help="detector checkpoint (checkpoint.pth)")
    shapes = sub.add_parser("shapes", help="write a tiny synthetic COCO-layout dataset (train and val splits)")
    shapes.add_argument("--out", default=DEFAULT_SHAPES_ROOT,
                        help=f"dataset folder (default {DEFAULT_SHAPES_ROOT}, where configs/detect_shapes_cpu.yaml "
                             "reads it)")
    shapes.add_argument("--train-images", type=int, default=16)
    shapes.add_argument("--val-images", type=int, default=8)
    shapes.add_argument("--size", type=int, default=128, help="image side in pixels")
    shapes.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    if args.action == "shapes":
        from .shapes import make_shapes_dataset
        for split, n, seed in (("train", args.train_images, args.seed), ("val", args.val_images, args.seed + 1)):
            images, ann = make_shapes_dataset(args.out, split, n, args.size, seed=seed)
            print(f"{split}: {n} images in {images}, annotations {ann}")
        return 0
    from ..utils.recipe import load_recipe
    from .train import DEFAULTS, evaluate_checkpoint, train
    overrides = list(args.overrides) + ([f"output={args.output}"] if args.output else [])
    recipe = load_recipe(DEFAULTS, args.config, overrides)
    if args.action == "train":
        results = train(recipe, resume=args.resume)
        if results:
            print(json.dumps({"output": recipe["output"], **_ap_summary(results.get("eval", {}))}))
        return 0
    from pathlib import Path

    from ..utils.io import atomic_write_json
    results = evaluate_checkpoint(recipe, args.weights)
    atomic_write_json({"weights": args.weights, **results}, Path(recipe["output"]) / "eval.json")
    print(json.dumps(_ap_summary(results)))
    return 0


def _ap_summary(results) -> dict:
    return {f"{kind}_{name}": results[kind][name] for kind in ("bbox", "segm") if kind in results
            for name in ("AP", "AP50", "AP75")}
