"""``simattn convert --weights TEACHER --to KIND [-c RECIPE] [--epochs N] [--output DIR] [--compare]``
(``torchrun --nproc_per_node=N -m simattn convert ...`` for DDP)."""
from __future__ import annotations

import argparse
from typing import List, Optional

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import recipe_parser
    from .config import ConvertConfig
    p = recipe_parser(
        "simattn convert",
        "Turn a pretrained softmax ViT into the same network with another attention kind: stage 1 trains each new "
        "attention layer to reproduce the teacher's (attention transfer), stage 2 fine-tunes everything on labels + "
        "the teacher's logits (distillation). Writes DIR/final.safetensors, DIR/report.md, DIR/convert.png and "
        "DIR/results.json. Recipe options are those of simattn train (--epochs is the whole budget: stage 1 + stage "
        "2; --model and --model-kwargs name the teacher's network, which the student keeps) and the convert section "
        "(--convert.KEY or --set convert.KEY=VALUE; --to and --compare for short).",
        ConvertConfig, example="convert.transfer_epochs=2")
    p.add_argument("--weights", metavar="TEACHER",
                   help="teacher weights: our .safetensors / last.pth, or timm/official DeiT, ViT, XCiT weights "
                        "on disk (then pass --model); required unless --print-config")
    p.add_argument("--teacher-attn", metavar="KIND",
                   help="attention of the teacher when the weights do not record it (default softmax; pass xca for "
                        "XCiT weights)")
    p.set_defaults(config="convert_digits")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from ..utils.recipe import print_config_if_asked, recipe_from_args, recipe_overrides
    from .config import ConvertConfig
    args = build_parser().parse_args(argv)
    overrides = recipe_overrides(ConvertConfig, args)
    # the teacher's network (the student is the same with another attention), not a recipe choice
    model, model_kwargs = overrides.pop("model", None), overrides.pop("model_kwargs", None) or {}
    if print_config_if_asked(ConvertConfig, args, overrides):
        return 0
    if not args.weights:
        raise ValueError("--weights TEACHER is required: the weights of the softmax network to convert")
    cfg = recipe_from_args(ConvertConfig, args, overrides)
    from .run import convert
    convert(cfg, args.weights, model, model_kwargs, args.teacher_attn)
    return 0
