"""``simattn convert --weights TEACHER --to KIND [-c RECIPE] [--epochs N] [--output DIR] [--compare]``
(``torchrun --nproc_per_node=N -m simattn convert ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import List, Optional

from ..models.factory import parse_model_kwargs
from ..utils.options import OPTIONS_HELP, deep_merge, parse_assignments

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simattn convert",
        description="Turn a pretrained softmax ViT into the same network with another attention kind: stage 1 "
                    "trains each new attention layer to reproduce the teacher's (attention transfer), stage 2 "
                    "fine-tunes everything on labels + the teacher's logits (distillation). Writes "
                    "DIR/final.safetensors, DIR/report.md, DIR/convert.png and DIR/results.json.")
    p.add_argument("--weights", required=True, metavar="TEACHER",
                   help="teacher weights: our .safetensors / last.pth, or timm/official DeiT, ViT, XCiT weights "
                        "on disk (then pass --model)")
    p.add_argument("--to", default=None, metavar="KIND",
                   help="attention kind of the student (default: the recipe's convert.to, sima); it must keep "
                        "the qkv/proj layout")
    p.add_argument("--model", help="registered model name (default: the one recorded with the weights)")
    p.add_argument("--model-kwargs", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help=f"create_model kwargs of teacher and student ({OPTIONS_HELP})")
    p.add_argument("--teacher-attn", metavar="KIND",
                   help="attention of the teacher when the weights do not record it (default softmax; pass xca for "
                        "XCiT weights)")
    p.add_argument("-c", "--config", default="convert_digits", metavar="RECIPE",
                   help="convert recipe: a YAML file or a shipped name (default convert_digits)")
    p.add_argument("--epochs", type=int, help="the whole budget: stage 1 + stage 2 epochs (default: the recipe's)")
    p.add_argument("--output", metavar="DIR", help="output folder (default runs/<recipe>/<date-time>)")
    p.add_argument("--compare", action="store_true",
                   help="also train the baselines at the same budget: plain fine-tuning and from scratch")
    p.add_argument("--seed", type=int, help="base seed (default: the recipe's)")
    p.add_argument("--set", dest="set_items", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help=f"recipe options ({OPTIONS_HELP}); conversion options under convert., e.g. "
                        "--set lr=5e-4 convert.transfer_lr=1e-3")
    p.add_argument("--resume", action="store_true",
                   help="continue the conversion in --output: finished stages are kept, an interrupted one "
                        "continues from its last.pth")
    p.add_argument("--overwrite", action="store_true", help="start afresh in an --output that holds a conversion")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = parse_assignments(args.set_items, what="--set item")
    given = {"epochs": args.epochs, "seed": args.seed, "output": args.output}
    overrides = deep_merge(overrides, {k: v for k, v in given.items() if v is not None})
    if args.resume:
        overrides["resume"] = "auto"
    if args.overwrite:
        overrides["overwrite"] = True
    convert_section = {}
    if args.to:
        convert_section["to"] = args.to
    if args.compare:
        convert_section["compare"] = True
    if convert_section:
        overrides = deep_merge(overrides, {"convert": convert_section})
    from .options import load_convert_recipe
    from .run import convert
    cfg, options = load_convert_recipe(args.config, overrides)
    convert(cfg, options, args.weights, args.model, parse_model_kwargs(args.model_kwargs), args.teacher_attn)
    return 0
