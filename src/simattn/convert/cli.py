"""``simattn convert --weights TEACHER --to KIND [-c RECIPE] [--epochs N] [--output DIR] [--compare]``
(``torchrun --nproc_per_node=N -m simattn convert ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import List, Optional

from ..utils.options import deep_merge

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from ..train.config import add_config_arguments
    from .options import ConvertConfig
    p = argparse.ArgumentParser(
        prog="simattn convert",
        description="Turn a pretrained softmax ViT into the same network with another attention kind: stage 1 "
                    "trains each new attention layer to reproduce the teacher's (attention transfer), stage 2 "
                    "fine-tunes everything on labels + the teacher's logits (distillation). Writes "
                    "DIR/final.safetensors, DIR/report.md, DIR/convert.png and DIR/results.json. Recipe options are "
                    "those of simattn train (--epochs is the whole budget: stage 1 + stage 2; --model and "
                    "--model-kwargs name the teacher's network, which the student keeps), conversion options are "
                    "set with --set convert.KEY=VALUE.")
    p.add_argument("--weights", required=True, metavar="TEACHER",
                   help="teacher weights: our .safetensors / last.pth, or timm/official DeiT, ViT, XCiT weights "
                        "on disk (then pass --model)")
    p.add_argument("--to", default=None, metavar="KIND",
                   help="attention kind of the student (default: the recipe's convert.to, sima); it must keep "
                        "the qkv/proj layout")
    p.add_argument("--teacher-attn", metavar="KIND",
                   help="attention of the teacher when the weights do not record it (default softmax; pass xca for "
                        "XCiT weights)")
    p.add_argument("--compare", action="store_true",
                   help="also train the baselines at the same budget: plain fine-tuning and from scratch")
    add_config_arguments(p, ConvertConfig)
    p.set_defaults(config="convert_digits")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from ..train.config import overrides_from_args
    from .options import ConvertConfig, load_convert_recipe
    from .run import convert
    args = build_parser().parse_args(argv)
    overrides = overrides_from_args(args, ConvertConfig)
    # the teacher's network (the student is the same with another attention), not a recipe choice
    model, model_kwargs = overrides.pop("model", None), overrides.pop("model_kwargs", None) or {}
    convert_section = {}
    if args.to:
        convert_section["to"] = args.to
    if args.compare:
        convert_section["compare"] = True
    if convert_section:
        overrides = deep_merge(overrides, {"convert": convert_section})
    cfg, options = load_convert_recipe(args.config, overrides)
    convert(cfg, options, args.weights, model, model_kwargs, args.teacher_attn)
    return 0
