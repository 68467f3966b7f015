"""``simattn validate``: top-1/top-5 accuracy and loss of a model + weights on a dataset, as JSON.

The model name, its kwargs and the preprocessing come from the weights' record (``simattn-weights-v1`` safetensors
metadata or a ``last.pth`` train state, read by :func:`simattn.models.factory.load_model`), so
``simattn validate --weights run/best.safetensors`` reproduces the accuracy training reported. Resolution, crop
ratio and interpolation can be changed freely. An exported file (``m.onnx``, ``m.pte``, any format of
:mod:`simattn.deploy` that runs here) is evaluated in its runtime with the preprocessing its record holds, and gives
the same JSON. Weights holding
NaN/inf are refused (naming the tensor) and the JSON never holds NaN: a non-finite metric is written as null with a
warning.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from .models.factory import add_model_arguments, load_model, model_spec_from_weights, parse_model_kwargs
from .utils.global_state import restores_global_state
from .utils.io import atomic_write_json, check_outputs
from .utils.runlog import use_tqdm

__all__ = ["validate_weights", "resolve_device", "main"]


def resolve_device(device: Optional[str]) -> torch.device:
    """``device`` as a torch device (CUDA when available if None); a one-line ValueError for a name torch does not
    know or a CUDA device on a machine without one."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: evaluation runs on cpu or cuda (cuda:N)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _finite_json(result: Dict[str, Any]) -> Dict[str, Any]:
    """Non-finite floats → None (JSON null), listed under ``non_finite``."""
    bad = [k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return result
    return {**{k: (None if k in bad else v) for k, v in result.items()}, "non_finite": bad}


@restores_global_state  # threads= and the data pipeline's seeding stay inside the call
def validate_weights(weights: str | Path, model: Optional[str] = None, model_kwargs: Optional[Dict[str, Any]] = None, *,
                     dataset: str = "digits", data_dir: Optional[str] = None, split: str = "val",
                     img_size: Optional[int] = None, crop_pct: Optional[float] = None,
                     interpolation: Optional[str] = None, batch_size: int = 64, workers: int = 0,
                     use_ema: bool = False, device: Optional[str] = None, amp: bool = False,
                     amp_dtype: str = "bfloat16", channels_last: bool = False,
                     show_progress: bool = False, threads: Optional[int] = None) -> Dict[str, Any]:
    """Evaluate ``weights`` (checkpoint or safetensors) on ``dataset``/``split``; returns metrics and settings.

    ``model``/``model_kwargs`` default to what the weights record; the number of classes must match the dataset
    (weights that do not record it get the dataset's). Non-finite metrics are None (listed in ``non_finite``).
    """
    from timm.data import resolve_data_config

    from .data.factory import create_dataset, dataset_classes
    from .engine.data import build_eval_loader
    from .train.evaluation import evaluate
    from .train.transforms import build_transform

    from . import deploy

    weights = Path(weights)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: expected an integer >= 1")
    if deploy.for_path(weights) is not None:
        return _validate_deployed(weights, model, model_kwargs, dataset=dataset, data_dir=data_dir, split=split,
                                  img_size=img_size, crop_pct=crop_pct, interpolation=interpolation,
                                  batch_size=batch_size, workers=workers, use_ema=use_ema, device=device, amp=amp,
                                  channels_last=channels_last, show_progress=show_progress, threads=threads)
    if threads is not None:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    stored = model_spec_from_weights(weights)
    data = create_dataset(dataset, data_dir, split)
    n_classes = len(dataset_classes(data))
    kwargs = dict(model_kwargs or {})
    if (stored is None or stored.get("num_classes") is None) and "num_classes" not in kwargs:
        kwargs["num_classes"] = n_classes
    net, spec = load_model(model, weights, kwargs, use_ema=use_ema)
    if not spec["num_classes"]:
        raise ValueError(f"weights {weights} hold {spec['model']} without a classifier head (num_classes=0, e.g. a "
                         "DINO backbone): validate needs logits; evaluate it with simattn ssl eval (k-NN, linear "
                         "probe) or fine-tune it with simattn train --initial-checkpoint")
    if spec["num_classes"] != n_classes:
        raise ValueError(f"model {spec['model']} has {spec['num_classes']} classes but dataset {dataset!r} has "
                         f"{n_classes}")
    _check_classes((spec.get("extra") or {}).get("classes"), data, dataset, "the weights")
    net.to(dev)
    if channels_last:
        net.to(memory_format=torch.channels_last)

    # the preprocessing the weights were trained/evaluated with, then the requested changes
    data_config = dict(spec["data_config"]) if spec.get("data_config") else \
        {k: list(v) if isinstance(v, tuple) else v for k, v in resolve_data_config({}, model=net).items()}
    if img_size:
        data_config["input_size"] = [data_config["input_size"][0], int(img_size), int(img_size)]
    if crop_pct:
        data_config["crop_pct"] = float(crop_pct)
    if interpolation:
        data_config["interpolation"] = interpolation
    from .utils.memory import check_memory, image_batch_bytes
    _, h, w = data_config["input_size"]
    check_memory(image_batch_bytes(batch_size, h, w), f"a batch of {batch_size} images of {h}x{w} pixels")
    data.transform = build_transform(data_config)
    loader = build_eval_loader(data, batch_size, workers)
    metrics = evaluate(net, loader, dev, amp=amp, amp_dtype=amp_dtype, channels_last=channels_last,
                       show_progress=show_progress, desc="validate")
    return _finite_json({"model": spec["model"], "weights": str(weights), "use_ema": use_ema, "dataset": dataset,
                         "split": split, "img_size": data_config["input_size"][-1],
                         "crop_pct": data_config["crop_pct"], "interpolation": data_config["interpolation"],
                         "params": sum(p.numel() for p in net.parameters()), **metrics})


def _check_classes(trained_on: Any, data, dataset: str, what: str) -> None:
    """A one-line ValueError when the class names recorded for the model (``trained_on``, a list, or None when not
    recorded) are not those of ``data`` in the same order: the accuracy would be meaningless."""
    from .data.factory import dataset_classes

    data_classes = [str(c) for c in dataset_classes(data)]
    if isinstance(trained_on, list) and [str(c) for c in trained_on] != data_classes:
        differ = [f"{i}: {a!r} vs {b!r}" for i, (a, b) in enumerate(zip(trained_on, data_classes)) if str(a) != b]
        raise ValueError(f"{what} were trained on other classes than dataset {dataset!r} holds (index: weights vs "
                         f"data) {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}: the accuracy would be "
                         "meaningless")


def _validate_deployed(path: Path, model: Optional[str], model_kwargs: Optional[Dict[str, Any]], *, dataset: str,
                       data_dir: Optional[str], split: str, img_size: Optional[int], crop_pct: Optional[float],
                       interpolation: Optional[str], batch_size: int, workers: int, use_ema: bool,
                       device: Optional[str], amp: bool, channels_last: bool, show_progress: bool,
                       threads: Optional[int]) -> Dict[str, Any]:
    """:func:`validate_weights` of an exported file, run in its runtime on the CPU."""
    from .data.factory import create_dataset, dataset_classes
    from .deploy import DeployedModel, read_metadata
    from .engine.data import build_eval_loader
    from .train.evaluation import evaluate
    from .train.transforms import build_transform

    given = [o for o, v in (("--model", model), ("--model-kwargs", model_kwargs), ("--use-ema", use_ema),
                            ("--amp", amp), ("--channels-last", channels_last)) if v]
    if given:
        raise ValueError(f"{', '.join(given)} do(es) not apply to an exported file ({path.name}): the graph is fixed")
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"--device {device}: exported files run on the CPU here")
    if not path.exists():
        raise FileNotFoundError(f"exported file not found: {path}")
    record = read_metadata(path)  # before the dataset: a file without a record is refused first
    size = list(record.input_size)
    if img_size and [img_size, img_size] != size[1:]:
        raise ValueError(f"--img-size {img_size}: {path.name} was exported at {size[1]}x{size[2]} and takes only that")
    data = create_dataset(dataset, data_dir, split)
    n_classes = len(dataset_classes(data))
    recorded = record.num_classes
    if recorded is not None and recorded != n_classes:
        raise ValueError(f"{path.name} ({record.model}) has {recorded} classes but dataset {dataset!r} has "
                         f"{n_classes}")
    _check_classes(record.extra.get("classes"), data, dataset, f"{path.name}'s weights")
    net = DeployedModel(path, threads)
    meta = record.data_config
    data_config = {"input_size": list(size), "mean": list(meta["mean"]), "std": list(meta["std"]),
                   "crop_pct": float(crop_pct or meta.get("crop_pct") or 0.875),
                   "interpolation": interpolation or meta.get("interpolation") or "bicubic"}
    data.transform = build_transform(data_config)
    loader = build_eval_loader(data, batch_size, workers)
    metrics = evaluate(net, loader, torch.device("cpu"), show_progress=show_progress, desc="validate")
    return _finite_json({"model": record.model, "weights": str(path), "runtime": net.runtime,
                         "use_ema": False, "dataset": dataset, "split": split, "img_size": size[-1],
                         "crop_pct": data_config["crop_pct"], "interpolation": data_config["interpolation"],
                         "params": None, **metrics})


def _options():
    from .data.factory import DATASETS
    from .utils.recipe import INTERPOLATIONS, Opt, check_device, maybe
    return {
        "dataset": Opt("digits", "digits | folder/imagenet | cifar10 | cifar100", choices=list(DATASETS)),
        "data_dir": Opt(None, "dataset root (not used by digits)", type=maybe(str)),
        "split": Opt("val", "split (sub-folder) to evaluate"),
        "img_size": Opt(None, "evaluation resolution (default: as trained)", type=maybe(int), low=1),
        "crop_pct": Opt(None, "center-crop ratio (default: as trained)", type=maybe(float), low=0.0, high=1.0,
                        low_open=True),
        "interpolation": Opt(None, "resize interpolation (default: as trained)", type=maybe(str),
                             choices=[i for i in INTERPOLATIONS if i != "random"]),
        "batch_size": Opt(64, low=1),
        "workers": Opt(0, "data-loader worker processes", low=0),
        "device": Opt(None, "cpu | cuda | cuda:N (default: cuda when available; exported files: cpu)",
                      type=maybe(str), check=check_device),
        "threads": Opt(None, "CPU threads (torch's, or the exported file's runtime: onnxruntime intra-op, "
                             "ExecuTorch's XNNPACK pool) (default: the runtime's own)", type=maybe(int), low=1),
        "amp": Opt(False, "autocast"),
        "amp_dtype": Opt("bfloat16", choices=["bfloat16", "float16"]),
        "channels_last": Opt(False, "channels-last memory format"),
        "output": Opt(None, "also write the JSON result to this file", type=maybe(str)),
    }


def build_parser() -> argparse.ArgumentParser:
    from .utils.recipe import add_option_flags, command_parser
    p = command_parser("simattn validate",
                       "Top-1/top-5 accuracy and loss of a model + weights on a dataset, printed as JSON. Model, kwargs "
                       "and preprocessing default to those recorded with the weights by simattn train.")
    add_model_arguments(p, weights_required=True)
    add_option_flags(p, _options())
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from .utils.recipe import checked_flags
    args = build_parser().parse_args(argv)
    vars(args).update(checked_flags(args, _options()))
    check_outputs({"--output": args.output}, {"--weights": args.weights})
    result = validate_weights(args.weights, args.model, parse_model_kwargs(args.model_kwargs), dataset=args.dataset,
                              data_dir=args.data_dir, split=args.split, img_size=args.img_size, crop_pct=args.crop_pct,
                              interpolation=args.interpolation, batch_size=args.batch_size, workers=args.workers,
                              use_ema=args.use_ema, device=args.device, amp=args.amp, amp_dtype=args.amp_dtype,
                              channels_last=args.channels_last, show_progress=use_tqdm(), threads=args.threads)
    if result.get("non_finite"):
        print(f"warning: non-finite {', '.join(result['non_finite'])} (written as null)", file=sys.stderr)
    print(json.dumps(result, indent=2, allow_nan=False), flush=True)  # the numbers first, whatever happens next
    if args.output:
        try:
            atomic_write_json(result, args.output)
        except OSError as e:
            reason = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e)
            raise ValueError(f"--output {args.output}: cannot write the results ({reason}); they are printed "
                             "above") from None
    return 0
