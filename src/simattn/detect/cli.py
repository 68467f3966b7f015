"""``simattn detect``: Mask R-CNN training and COCO box/mask AP evaluation on COCO-layout data.

    simattn detect shapes [--output data/shapes]                 # a tiny synthetic COCO-layout dataset
    simattn detect train --config detect_shapes_cpu [--epochs 2 --set model.fpn_channels=64 ...] [--output DIR] [--resume]
    simattn detect eval  --config detect_shapes_cpu --weights runs/detect_shapes_cpu/<date-time>/last.pth
    torchrun --nproc_per_node=8 -m simattn detect train --config configs/detect_maskrcnn_sima_small_12_p16.yaml \\
        --set data.train_images=/data/coco/train2017 ...
"""
from __future__ import annotations

import argparse
from typing import List

from ..utils.io import json_dumps
from ..utils.recipe import (add_recipe_options, print_config_if_asked, recipe_from_args, recipe_name, recipe_parser)
from ..utils.subcommands import check_subcommand
from .config import DetectConfig

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from .shapes import DEFAULT_SHAPES_ROOT
    parser = recipe_parser("simattn detect", "Mask R-CNN with FPN on a SimA backbone")
    sub = parser.add_subparsers(dest="action", required=True)
    add_recipe_options(sub.add_parser("train", help="train Mask R-CNN, evaluating box and mask AP"), DetectConfig,
                       example="data.val_images=/data/val2017")
    ev = sub.add_parser("eval", help="box and mask AP of a trained checkpoint on the val data")
    add_recipe_options(ev, DetectConfig, example="data.val_images=/data/val2017", flags=False)
    ev.add_argument("--weights", required=True, help="the detection run's last.pth")
    shapes = sub.add_parser("shapes", help="write a tiny synthetic COCO-layout dataset (train and val splits)")
    shapes.add_argument("--output", "--out", default=DEFAULT_SHAPES_ROOT,
                        help=f"dataset folder (default {DEFAULT_SHAPES_ROOT}, where configs/detect_shapes_cpu.yaml "
                             "reads it)")
    shapes.add_argument("--train-images", type=int, default=16)
    shapes.add_argument("--val-images", type=int, default=8)
    shapes.add_argument("--size", type=int, default=128, help="image side in pixels")
    shapes.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: List[str]) -> int:
    check_subcommand(argv, ("train", "eval", "shapes"))
    args = _parser().parse_args(argv)
    if args.action == "shapes":
        from .shapes import make_shapes_dataset
        for split, n, seed in (("train", args.train_images, args.seed), ("val", args.val_images, args.seed + 1)):
            images, ann = make_shapes_dataset(args.output, split, n, args.size, seed=seed)
            print(f"{split}: {n} images in {images}, annotations {ann}")
        return 0
    if print_config_if_asked(DetectConfig, args):
        return 0
    from ..utils.extras import require
    require("pycocotools", f"simattn detect {args.action}")
    from .train import evaluate_checkpoint, train
    cfg = recipe_from_args(DetectConfig, args)
    if args.action == "train":
        results = train(cfg)
        if results:
            print(json_dumps({"output": results["output"], **_ap_summary(results.get("eval", {}))}))
        return 0
    from ..utils.io import atomic_write_json
    from ..utils.runs import results_folder
    name = recipe_name(args.config) or "detect"
    from ..models.sources import resolve_source
    source = resolve_source(args.weights, "weights") if args.weights else None  # once, for every step below
    beside = str(source.path) if source is not None and source.tag is None else None  # not in a download cache
    out = results_folder(cfg.output, beside, f"{name}_eval", "detect_eval")
    results = evaluate_checkpoint(cfg, source)
    print(json_dumps(_ap_summary(results)), flush=True)  # shown before anything is written
    atomic_write_json({"weights": args.weights, **results}, out / "eval.json")
    return 0


def _ap_summary(results) -> dict:
    return {f"{kind}_{name}": results[kind][name] for kind in ("bbox", "segm") if kind in results
            for name in ("AP", "AP50", "AP75")}
