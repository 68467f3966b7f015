"""``simattn viz``: q̂/k̂ token-importance heatmaps (SimA) or CLS attention maps (softmax) overlaid on images.

Examples::

    simattn viz --model sima_deit_small_patch16_224 --weights best.safetensors --image skimage:astronaut
    simattn viz --weights best.safetensors --image photo.jpg sklearn:china.jpg --block 5

Writes, per image, ``<model>_<image>_block<i>.png`` (image and maps side by side), one overlay PNG per map at the
model's input resolution, and ``viz.json`` listing them (a folder with an earlier ``viz.json`` takes
``--overwrite``). Exit status 2 on bad input.

Segmentation weights (``simattn segment``, or a file exported from them) draw, per image of the dataset they record
(``--data-dir``, ``--split``, ``--count`` change which), the image, the predicted mask and the ground truth overlaid
in the dataset's palette side by side (``<model>_<image stem>.png``) (:mod:`.segmentation`)::

    simattn viz --weights runs/seg/final.safetensors --split val --count 4
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..utils.recipe import flag_name

__all__ = ["main", "build_parser", "visualize", "RANDOM_WEIGHTS_WARNING"]


def _options():
    from ..data.images import SKIMAGE_PHOTOS, SKLEARN_PHOTOS
    from ..utils.recipe import Opt, maybe
    return {
        "img_size": Opt(None, "input resolution (default: the model's)", type=maybe(int), low=16),
        "image": Opt(["skimage:astronaut"], "image files, skimage:NAME or sklearn:NAME; bundled: skimage: "
                     f"{', '.join(SKIMAGE_PHOTOS)}; sklearn: {', '.join(SKLEARN_PHOTOS)}", type=List[str]),
        "block": Opt(-1, "attention block index, negative from the end"),
        "output": Opt("runs/viz", "output folder", flags=("--out",)),
        "overwrite": Opt(False, "write into a folder an earlier viz wrote (its viz.json), replacing the files of "
                         "the same names; others there are kept"),
        "alpha": Opt(0.5, "heatmap opacity over the image", low=0.0, high=1.0),
        "cmap": Opt("jet", "matplotlib colormap", choices=_colormaps, allowed="a matplotlib colormap name "
                    "(jet, viridis, magma, ...)"),
        "data_dir": Opt(None, "segmentation weights: dataset root (default: the recorded one)", type=maybe(str)),
        "split": Opt(None, "segmentation weights: split to draw (default: the one the run evaluated on)",
                     type=maybe(str)),
        "count": Opt(None, "segmentation weights: images to draw, from the first (default 4)", type=maybe(int),
                     low=1),
        "threads": Opt(None, "segmentation weights: CPU threads (torch's, or the exported file's runtime)",
                       type=maybe(int), low=1),
    }


#: the options of segmentation panels only, and those of attention maps only (with their defaults)
SEGMENTATION_ONLY = ("data_dir", "split", "count", "threads")
ATTENTION_ONLY = {"img_size": None, "image": ["skimage:astronaut"], "block": -1, "cmap": "jet"}


def _colormaps() -> List[str]:
    import matplotlib
    return sorted(matplotlib.colormaps)


def build_parser() -> argparse.ArgumentParser:
    from ..models.factory import add_model_arguments
    from ..utils.recipe import add_option_flags, command_parser

    p = command_parser("simattn viz", __doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    add_option_flags(p, _options())
    return p


#: said on stderr, in every figure title and in viz.json when no --weights are given
RANDOM_WEIGHTS_WARNING = "random weights (no --weights): these maps show an untrained network"


def visualize(model, data_config, sources: List[str], out_dir: Path, *, model_name: str, block: int = -1,
              alpha: float = 0.5, cmap: str = "jet", note: Optional[str] = None) -> List[Dict[str, Any]]:
    """Heatmaps of ``model`` for each image source, written under ``out_dir``; returns one record per image.
    ``note`` (e.g. a warning) is added to every figure title."""
    from .heatmaps import render_panels, save_overlay, token_maps
    from ..data.images import image_label, image_tensor, load_image

    records = []
    labels = [image_label(source) for source in sources]
    for i, (source, label) in enumerate(zip(sources, labels)):
        if labels.count(label) > 1:  # one/x.png and two/x.png: each input gets its own files
            label = f"{label}_{i + 1}"
        x, shown = image_tensor(load_image(source), data_config)
        result = token_maps(model, x, shown, block)
        stem = f"{model_name}_{label}_block{result.block}"
        panel = out_dir / f"{stem}.png"
        title = (f"{model_name}: {result.module} (block {result.block} of {result.num_blocks}, 0-based)"
                 + (f"\n{note}" if note else ""))
        size = render_panels(result, panel, alpha=alpha, cmap=cmap, title=title)
        overlays = {name: str(save_overlay(shown, heat, out_dir / f"{stem}_{name}.png", alpha, cmap))
                    for name, heat in result.maps.items()}
        records.append({"image": source, "panel": str(panel), "title": title, "panel_size": list(size),
                        "overlays": overlays,
                        "block": result.block, "num_blocks": result.num_blocks, "module": result.module,
                        "grids": {k: list(g) for k, g in result.grids.items()}, "prefix_tokens": result.prefix_tokens,
                        "raw_range": result.raw_range})
        grids = ", ".join(f"{k} on {g[0]}x{g[1]}" for k, g in result.grids.items())
        print(f"{source}: {result.module} (block {result.block} of {result.num_blocks}), {grids} -> {panel}")
    return records


def run_segmentation(args: argparse.Namespace, source) -> int:
    """Segmentation panels of ``source`` (:func:`~.segmentation.visualize_segmentation`) and their ``viz.json``."""
    from ..utils.global_state import preserved_global_state
    from ..utils.io import atomic_write_json
    from .segmentation import visualize_segmentation

    given = [flag_name(k) for k, v in ATTENTION_ONLY.items() if getattr(args, k) != v]
    given += [o for o, v in (("--model", args.model), ("--model-kwargs", args.model_kwargs)) if v]
    if given:
        raise ValueError(f"{', '.join(given)} applies to attention maps of classifiers; {source.path.name} holds a "
                         "segmenter (its panels show the dataset it records: --data-dir, --split, --count)")
    if args.use_ema and source.deployed:
        raise ValueError(f"--use-ema does not apply to an exported file ({source.path.name})")
    out_dir = Path(args.output)
    with preserved_global_state():
        if args.threads is not None:
            import torch
            torch.set_num_threads(args.threads)
        summary = visualize_segmentation(source, out_dir, data_dir=args.data_dir, split=args.split,
                                         count=args.count or 4, alpha=args.alpha, threads=args.threads,
                                         use_ema=args.use_ema)
    path = out_dir / "viz.json"
    atomic_write_json(summary, path)
    print(f"summary: {path}")
    return 0


def _check_output(args: argparse.Namespace) -> None:
    """An earlier viz's folder (its ``viz.json``) is refused without --overwrite, before any work (the one output
    policy, :func:`~simattn.utils.io.check_new_file`)."""
    from ..utils.io import check_new_file
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out} is a file; viz writes a folder of figures there")
    check_new_file(out / "viz.json", args.overwrite, "--output")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..data.images import resolve_data_config
    from ..models.factory import load_model, parse_model_kwargs
    from ..utils.io import atomic_write_json

    _check_output(args)
    if args.weights is not None:
        from ..models.sources import resolve_source
        from ..segment.validation import segmentation_source
        args.weights = resolve_source(args.weights, packages=True)  # once: every step below reads this source
        source = segmentation_source(args.weights)
        if source is not None:
            return run_segmentation(args, source)
    given = [flag_name(k) for k in SEGMENTATION_ONLY if getattr(args, k) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} applies to segmentation weights only (simattn segment runs); "
                         f"{args.weights or 'a model without --weights'} is no segmenter")
    model, spec = load_model(args.model, args.weights, parse_model_kwargs(args.model_kwargs), args.use_ema)
    data_config = resolve_data_config(model, spec, args.img_size)
    out_dir = Path(args.output)
    warning = RANDOM_WEIGHTS_WARNING if args.weights is None else None
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    torch.manual_seed(0)
    records = visualize(model, data_config, args.image, out_dir, model_name=spec["model"], block=args.block,
                        alpha=args.alpha, cmap=args.cmap, note=warning and f"warning: {warning}")
    summary = out_dir / "viz.json"
    atomic_write_json({"model": spec["model"], "model_kwargs": spec["config"], "weights": spec["weights"],
                       **({"warning": warning} if warning else {}),
                       "input_size": list(data_config["input_size"]), "images": records}, summary)
    print(f"summary: {summary}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn viz``; returns the exit status."""
    from ..utils.recipe import checked_flags
    args = build_parser().parse_args(argv)
    vars(args).update(checked_flags(args, _options()))
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
