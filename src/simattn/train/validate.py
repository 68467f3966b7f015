"""``simattn validate``: top-1/top-5 accuracy and loss of a model + weights on a dataset, as JSON.

The model name, its kwargs and the preprocessing come from the weights when they were written by ``simattn train``
(safetensors metadata or a ``last.pth`` train state), so ``simattn validate --weights run/best.safetensors``
reproduces the accuracy training reported. Resolution, crop ratio and interpolation can be changed freely.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..utils.io import atomic_write_json, load_weights
from ..utils.runlog import use_tqdm
from ..models.factory import (add_model_arguments, checkpoint_filter_for, create_model, model_spec_from_weights,
                              parse_model_kwargs)

__all__ = ["validate_weights", "main"]


def validate_weights(weights: str | Path, model: Optional[str] = None, model_kwargs: Optional[Dict[str, Any]] = None, *,
             dataset: str = "digits", data_dir: Optional[str] = None, split: str = "val",
             img_size: Optional[int] = None, crop_pct: Optional[float] = None, interpolation: Optional[str] = None,
             batch_size: int = 64, workers: int = 0, use_ema: bool = False, device: Optional[str] = None,
             amp: bool = False, amp_dtype: str = "bfloat16", channels_last: bool = False,
             show_progress: bool = False) -> Dict[str, Any]:
    """Evaluate ``weights`` (checkpoint or safetensors) on ``dataset``/``split``; returns metrics and settings.

    ``model``/``model_kwargs`` default to what the weights record; the number of classes must match the dataset.
    """
    from timm.data import resolve_data_config

    from ..data.factory import create_dataset, dataset_classes
    from .loader import build_eval_loader, build_transform
    from .loop import evaluate

    weights = Path(weights)
    if not weights.is_file():
        raise FileNotFoundError(f"weights not found: {weights}")
    spec = model_spec_from_weights(weights)
    if model is None:
        if spec is None:
            raise ValueError(f"{weights} does not record its model: pass --model")
        model = spec["model"]
    kwargs = dict(spec["config"]) if spec is not None and spec["model"] == model else {}
    kwargs.update(model_kwargs or {})

    data = create_dataset(dataset, data_dir, split)
    n_classes = len(dataset_classes(data))
    kwargs.setdefault("num_classes", n_classes)
    if kwargs["num_classes"] != n_classes:
        raise ValueError(f"model {model} has {kwargs['num_classes']} classes but dataset {dataset!r} has {n_classes}")

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    net = create_model(model, **kwargs)
    load_weights(net, weights, use_ema=use_ema, filter_fn=checkpoint_filter_for(model))
    net.to(dev)
    if channels_last:
        net.to(memory_format=torch.channels_last)

    # the preprocessing the weights were trained/evaluated with, then the requested changes
    data_config = dict(spec["data_config"]) if spec is not None and spec.get("data_config") else \
        {k: list(v) if isinstance(v, tuple) else v for k, v in resolve_data_config({}, model=net).items()}
    if img_size:
        data_config["input_size"] = [data_config["input_size"][0], int(img_size), int(img_size)]
    if crop_pct:
        data_config["crop_pct"] = float(crop_pct)
    if interpolation:
        data_config["interpolation"] = interpolation
    data.transform = build_transform(data_config)
    loader = build_eval_loader(data, batch_size, workers)
    metrics = evaluate(net, loader, dev, amp=amp, amp_dtype=amp_dtype, channels_last=channels_last,
                       show_progress=show_progress, desc="validate")
    return {"model": model, "weights": str(weights), "use_ema": use_ema, "dataset": dataset, "split": split,
            "img_size": data_config["input_size"][-1], "crop_pct": data_config["crop_pct"],
            "interpolation": data_config["interpolation"], "params": sum(p.numel() for p in net.parameters()),
            **metrics}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simattn validate",
        description="Top-1/top-5 accuracy and loss of a model + weights on a dataset, printed as JSON. Model, kwargs "
                    "and preprocessing default to those recorded with the weights by simattn train.")
    add_model_arguments(p, weights_required=True)
    p.add_argument("--dataset", default="digits", help="digits | folder/imagenet | cifar10 | cifar100")
    p.add_argument("--data-dir", help="dataset root (not used by digits)")
    p.add_argument("--split", default="val")
    p.add_argument("--img-size", type=int, help="evaluation resolution (default: as trained)")
    p.add_argument("--crop-pct", type=float, help="center-crop ratio (default: as trained)")
    p.add_argument("--interpolation", help="resize interpolation (default: as trained)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    p.add_argument("--amp", action="store_true", help="autocast")
    p.add_argument("--amp-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--output", help="also write the JSON result to this file")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    result = validate_weights(args.weights, args.model, parse_model_kwargs(args.model_kwargs), dataset=args.dataset,
                              data_dir=args.data_dir, split=args.split, img_size=args.img_size, crop_pct=args.crop_pct,
                              interpolation=args.interpolation, batch_size=args.batch_size, workers=args.workers,
                              use_ema=args.use_ema, device=args.device, amp=args.amp, amp_dtype=args.amp_dtype,
                              channels_last=args.channels_last, show_progress=use_tqdm())
    if args.output:
        atomic_write_json(result, args.output)
    print(json.dumps(result, indent=2))
    return 0
