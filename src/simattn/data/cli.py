"""``simattn data <what>``: dataset tools.

``simattn data pack`` writes one split of any dataset simattn reads as webdataset tar shards and an ``_info.json``
(timm's format; :mod:`simattn.data.pack`)::

    simattn data pack --dataset imagenet --data-dir /data/imagenet --split train --output /data/imagenet-wds
    simattn data pack --dataset digits --split val --output shards/digits --shard-samples 100
    simattn data pack --task segmentation --dataset ade20k --data-dir /data/ade --split val --output shards/ade
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

__all__ = ["main", "pack_options", "build_pack_parser", "run_pack"]

SUBCOMMANDS = {
    "pack": "write a dataset split as webdataset tar shards with timm's _info.json (resumable)",
}


def pack_options():
    """The options of ``simattn data pack``, each declared once."""
    from ..utils.recipe import Opt, check_path, maybe
    from .pack import DEFAULT_QUALITY, DEFAULT_SHARD_BYTES, ENCODINGS, TASKS
    path = dict(type=maybe(str), check=check_path)
    return {
        "task": Opt("classification", "what the labels are: a class per image, or a mask per image "
                    "(segmentation layouts: digits scenes, ade20k, voc, cityscapes, folder)", choices=list(TASKS)),
        "dataset": Opt(None, "dataset name (required): classification digits, folder/imagenet, cifar10, cifar100, "
                       "hfds; segmentation digits, ade20k, voc, cityscapes, folder, hfds; wds: shards packed "
                       "before, packed again (another shard size or encoding)", **path),
        "data_dir": Opt(None, "the dataset's folder (not for the embedded digits); for wds also a shard pattern or "
                        "a pipe: URL", **path),
        "split": Opt(None, "the split to pack (required), e.g. train or val; it names the shards", **path),
        "output": Opt(None, "the folder of the shards and _info.json (required); other splits there are kept", **path),
        "shard_samples": Opt(None, "samples per shard (instead of --shard-bytes)", type=maybe(int), low=1),
        "shard_bytes": Opt(None, f"the most bytes per shard (default {DEFAULT_SHARD_BYTES}, 256 MiB, when neither "
                           "size is given; a larger sample gets a shard of its own)", type=maybe(int), low=1),
        "encode": Opt("keep", "keep: image files' own bytes (in-memory datasets as PNG); jpeg: re-encode as JPEG",
                      choices=list(ENCODINGS)),
        "quality": Opt(None, f"JPEG quality with --encode jpeg (default {DEFAULT_QUALITY})", type=maybe(int), low=1,
                       high=100),
        "classes_file": Opt(None, "segmentation folder layout: the class names file (default <data-dir>/classes.txt)",
                            **path),
        "dataset_kwargs": Opt({}, "segmentation digits: the scenes' options (num_train, num_val, canvas, "
                              "digits_per_scene, digit_size, seed), as in simattn segment's dataset_kwargs"),
    }


def build_pack_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import command_parser
    return command_parser("simattn data pack", SUBCOMMANDS["pack"], pack_options())


def run_pack(argv: List[str]) -> Dict[str, Any]:
    """``simattn data pack`` with arguments ``argv``; returns the split's summary."""
    from ..utils.recipe import checked_flags, flag_name
    from .pack import DEFAULT_QUALITY, DEFAULT_SHARD_BYTES, check_split_name, format_bytes, open_source, pack

    specs = pack_options()
    args = checked_flags(build_pack_parser().parse_args(argv), specs)
    missing = [flag_name(k) for k in ("dataset", "split", "output") if args[k] is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (simattn data pack "
                         "--dataset NAME [--data-dir D] --split S --output DIR)")
    if args["shard_samples"] is not None and args["shard_bytes"] is not None:
        raise ValueError(f"--shard-samples {args['shard_samples']} and --shard-bytes {args['shard_bytes']}: give "
                         "one shard size, not both")
    if args["quality"] is not None and args["encode"] != "jpeg":
        raise ValueError(f"--quality {args['quality']} applies to --encode jpeg only (--encode {args['encode']} "
                         "keeps the images' bytes)")
    check_split_name(args["split"])
    shard_bytes = args["shard_bytes"]
    if args["shard_samples"] is None and shard_bytes is None:
        shard_bytes = DEFAULT_SHARD_BYTES
    quality = args["quality"] if args["quality"] is not None else DEFAULT_QUALITY
    source = open_source(args["task"], args["dataset"], args["data_dir"], args["split"], args["encode"], quality,
                         args["classes_file"], args["dataset_kwargs"])
    real = {k: os.path.realpath(args[k]) if args[k] is not None else None for k in ("data_dir", "classes_file")}
    options = {"task": source.task, "dataset": source.name, **real, "split": args["split"],
               "dataset_kwargs": args["dataset_kwargs"], "encode": args["encode"],
               "quality": quality if args["encode"] == "jpeg" else None,
               "shard_samples": args["shard_samples"], "shard_bytes": shard_bytes}
    summary = pack(source, args["split"], args["output"], options, shard_samples=args["shard_samples"],
                   shard_bytes=shard_bytes)
    print(f"packed {args['split']}: {summary['samples']} samples in {summary['shards']} shard"
          f"{'s' if summary['shards'] != 1 else ''}, {format_bytes(summary['bytes'])}, {summary['classes']} classes "
          f"-> {args['output']} (_info.json, pack_summary.json)")
    return summary


def main(argv: List[str]) -> int:
    from ..utils.subcommands import run_subcommand
    return run_subcommand("simattn data", argv, {"pack": (run_pack, SUBCOMMANDS["pack"])})
