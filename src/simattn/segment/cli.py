"""``simattn segment -c RECIPE [--option value ...]``: train a segmenter and score it by mIoU.

    simattn segment -c seg_digits_cpu --output runs/seg_sima            # the embedded digit scenes, CPU
    simattn segment -c seg_digits_cpu --model-kwargs attn_type=softmax  # its softmax twin
    torchrun --nproc_per_node=8 -m simattn segment -c seg_fpn_xcit_small_12_p16_ade20k --data-dir /data/ADEChallengeData2016
"""
from __future__ import annotations

import argparse
from typing import List, Optional

from ..utils.io import json_dumps
from ..utils.recipe import print_config_if_asked, recipe_from_args, recipe_parser
from .config import SegmentConfig

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "simattn segment", "Train a semantic-segmentation model (Semantic FPN or UperNet on any registered "
        "backbone) from a YAML recipe and score it by mIoU; every option can be overridden on the command line. "
        "Under torchrun each process trains a shard (DDP).", SegmentConfig,
        example="epochs=2 model_kwargs.attn_type=softmax")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if print_config_if_asked(SegmentConfig, args):
        return 0
    cfg = recipe_from_args(SegmentConfig, args)
    from .task import segment
    result = segment(cfg)
    if result.is_main:
        final = result.summary.get("final", {})
        print(json_dumps({"output": str(result.output), "val_miou": final.get("val_miou"),
                          "val_macc": final.get("val_macc"), "val_aacc": final.get("val_aacc")}))
    return 0
