"""``simattn validate``: top-1/top-5 accuracy and loss of a model + weights on a dataset, as JSON.

The model name, its kwargs, the preprocessing and the data come from the weights' record (``simattn-weights-v1``
safetensors metadata or a ``last.pth`` train state, read by :func:`simattn.models.factory.load_model`), so
``simattn validate --weights run/best.safetensors`` reproduces the accuracy training reported. Resolution, crop
ratio and interpolation can be changed freely. An exported file (``m.onnx``, ``m.pte``, any format of
:mod:`simattn.deploy` that runs here) is evaluated in its runtime with the preprocessing its record holds, and gives
the same JSON. Weights holding
NaN/inf are refused (naming the tensor) and the JSON never holds NaN: a non-finite metric is written as null with a
warning.

Segmentation weights (a ``simattn segment`` run's ``final.safetensors``, ``best.safetensors`` or ``last.pth``, or a
file exported from one) are scored by mIoU, mAcc, aAcc and per-class IoU on the dataset their record names
(:mod:`simattn.segment.validation`), predicting as the run evaluated (``--mode``, ``--crop-size``, ``--stride``,
``--flip``, ``--scales`` change it); ``--save-predictions DIR`` writes each image's label map as an indexed PNG.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from .models.factory import (add_model_arguments, attention_kind, load_model, model_spec_from_weights,
                             parse_model_kwargs, recorded_attention)
from .models.sources import WeightsSource, resolve_source
from .utils.global_state import restores_global_state
from .utils.io import CheckpointError, atomic_write_json, check_new_file, check_outputs
from .utils.recipe import flag_name
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


#: what to do when a classifier's classes are not the dataset's
OTHER_DATA = "name the data it was trained on with --dataset and --data-dir"
#: the options that only segmentation weights take (their flags, for errors)
SEGMENTATION_ONLY = ("mode", "crop_size", "stride", "flip", "scales", "save_predictions")
#: the options that only classifiers take, with their defaults
CLASSIFICATION_ONLY = {"img_size": None, "crop_pct": None, "interpolation": None, "batch_size": 64, "amp": False,
                       "amp_dtype": "bfloat16", "channels_last": False}


@restores_global_state  # threads= and the data pipeline's seeding stay inside the call
def validate_weights(weights: str | Path, model: Optional[str] = None, model_kwargs: Optional[Dict[str, Any]] = None, *,
                     dataset: Optional[str] = None, data_dir: Optional[str] = None, split: Optional[str] = None,
                     img_size: Optional[int] = None, crop_pct: Optional[float] = None,
                     interpolation: Optional[str] = None, batch_size: int = 64, workers: int = 0,
                     use_ema: bool = False, device: Optional[str] = None, amp: bool = False,
                     amp_dtype: str = "bfloat16", channels_last: bool = False,
                     show_progress: bool = False, threads: Optional[int] = None,
                     mode: Optional[str] = None, crop_size: Optional[List[int]] = None,
                     stride: Optional[List[int]] = None, flip: Optional[bool] = None,
                     scales: Optional[List[float]] = None,
                     save_predictions: Optional[str | Path] = None) -> Dict[str, Any]:
    """Evaluate ``weights`` (checkpoint or safetensors) on ``dataset``/``split``; returns metrics and settings.

    ``model``/``model_kwargs`` default to what the weights record, and so do ``dataset``, ``data_dir`` and
    ``split`` (digits' val split for a record that names no data); the number of classes must match the dataset
    (weights that do not record it get the dataset's). Non-finite metrics are None (listed in ``non_finite``).
    Segmentation weights go to :func:`simattn.segment.validation.validate_segmentation` (``mode`` ..
    ``save_predictions`` are theirs; ``dataset`` and ``split`` default to what the weights record).
    """
    from .segment.validation import check_predictions_dir, segmentation_source

    from . import deploy  # noqa: F401  (its formats read the records of exported files)

    resolved = resolve_source(weights, packages=True)  # once: every step below reads this source
    weights = resolved.path
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: expected an integer >= 1")
    check_predictions_dir(save_predictions)  # before any work
    seg_options = {"mode": mode, "crop_size": crop_size, "stride": stride, "flip": flip, "scales": scales,
                   "save_predictions": save_predictions}
    source = segmentation_source(resolved)
    if source is not None:
        return _validate_segmentation(source, model, model_kwargs, dataset=dataset, data_dir=data_dir, split=split,
                                      workers=workers, use_ema=use_ema, device=device, threads=threads,
                                      show_progress=show_progress, seg_options=seg_options,
                                      classification={"img_size": img_size, "crop_pct": crop_pct,
                                                      "interpolation": interpolation, "batch_size": batch_size,
                                                      "amp": amp, "amp_dtype": amp_dtype,
                                                      "channels_last": channels_last})
    given = [flag_name(k) for k, v in seg_options.items() if v is not None]
    if given:
        raise ValueError(f"{', '.join(given)} applies to segmentation weights only; {weights.name} holds a "
                         "classifier")
    from .segment.config import SEGMENT_DATASETS
    from .data.factory import DATASETS
    dataset, data_dir, split = _recorded_data(resolved, dataset, data_dir, split)
    if dataset not in DATASETS:
        only = " (a segmentation dataset)" if dataset in SEGMENT_DATASETS else ""
        raise ValueError(f"--dataset {dataset}{only}: {weights.name} holds a classifier; classification datasets: "
                         f"{', '.join(DATASETS)}")
    if resolved.deployed:
        return _validate_deployed(resolved, model, model_kwargs, dataset=dataset, data_dir=data_dir, split=split,
                                  img_size=img_size, crop_pct=crop_pct, interpolation=interpolation,
                                  batch_size=batch_size, workers=workers, use_ema=use_ema, device=device, amp=amp,
                                  channels_last=channels_last, show_progress=show_progress, threads=threads)
    return _validate_checkpoint(resolved, model, model_kwargs, dataset=dataset, data_dir=data_dir, split=split,
                                img_size=img_size, crop_pct=crop_pct, interpolation=interpolation,
                                batch_size=batch_size, workers=workers, use_ema=use_ema, device=device, amp=amp,
                                amp_dtype=amp_dtype, channels_last=channels_last, show_progress=show_progress,
                                threads=threads)


def _recorded_data(source: WeightsSource, dataset: Optional[str], data_dir: Optional[str], split: Optional[str]):
    """(dataset, data_dir, split) to score a classifier on: those given, else those its record names (the dataset,
    and its root and evaluated split when the dataset is the recorded one), else digits' val split (older records
    name no data)."""
    record = source.record if source.deployed or source.path.is_file() else None
    recorded = dict(record.extra) if record is not None else {}
    name = dataset or recorded.get("dataset") or "digits"
    same = isinstance(recorded.get("dataset"), str) and name.lower() == recorded["dataset"].lower()
    if same:
        data_dir = data_dir if data_dir is not None else recorded.get("data_dir")
        split = split or recorded.get("val_split")
    return name, data_dir, split or "val"


def _validate_checkpoint(source: WeightsSource, model: Optional[str], model_kwargs: Optional[Dict[str, Any]], *,
                         dataset: str, data_dir: Optional[str], split: str, img_size: Optional[int],
                         crop_pct: Optional[float], interpolation: Optional[str], batch_size: int, workers: int,
                         use_ema: bool, device: Optional[str], amp: bool, amp_dtype: str, channels_last: bool,
                         show_progress: bool, threads: Optional[int]) -> Dict[str, Any]:
    """:func:`validate_weights` of a classifier's checkpoint or safetensors, run in torch."""
    from timm.data import resolve_data_config

    from .data.factory import create_dataset, dataset_classes
    from .engine.data import build_eval_loader
    from .classify.evaluation import evaluate
    from .classify.transforms import build_transform

    if threads is not None:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    weights = source.path
    stored = model_spec_from_weights(source)
    data = create_dataset(dataset, data_dir, split)
    n_classes = len(dataset_classes(data))
    kwargs = dict(model_kwargs or {})
    guessed = (stored is None or stored.get("num_classes") is None) and "num_classes" not in kwargs
    if guessed:
        kwargs["num_classes"] = n_classes
    try:
        net, spec = load_model(model, source, kwargs, use_ema=use_ema)
    except CheckpointError:
        # the class count was taken from the data: weights that load with the model's own count are a classifier
        # of other data, the real problem (named below); others keep their own error
        own = _load_as_saved(model, source, model_kwargs, use_ema) if guessed else None
        if own is None or own[1]["num_classes"] == n_classes:
            raise
        net, spec = own
    if not spec["num_classes"]:
        raise ValueError(f"weights {weights} hold {spec['model']} without a classifier head (num_classes=0, e.g. a "
                         "DINO backbone): validate needs logits; evaluate it with simattn ssl eval (k-NN, linear "
                         "probe) or fine-tune it with simattn train --initial-checkpoint")
    if spec["num_classes"] != n_classes:
        raise ValueError(f"model {spec['model']} has {spec['num_classes']} classes but dataset {dataset!r} has "
                         f"{n_classes}: {OTHER_DATA}")
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
    return _finite_json({"model": spec["model"], "attention": attention_kind(net), "weights": str(weights),
                         "use_ema": use_ema, "dataset": dataset,
                         "split": split, "img_size": data_config["input_size"][-1],
                         "crop_pct": data_config["crop_pct"], "interpolation": data_config["interpolation"],
                         "params": sum(p.numel() for p in net.parameters()), **metrics})


def _load_as_saved(model, source, model_kwargs, use_ema):
    """``load_model`` with the model's own class count, or None when the weights do not load so either."""
    try:
        return load_model(model, source, model_kwargs, use_ema=use_ema)
    except ValueError:  # CheckpointError among them
        return None


def _validate_segmentation(source, model: Optional[str], model_kwargs: Optional[Dict[str, Any]], *,
                           dataset: Optional[str], data_dir: Optional[str], split: Optional[str], workers: int,
                           use_ema: bool, device: Optional[str], threads: Optional[int], show_progress: bool,
                           seg_options: Dict[str, Any], classification: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`validate_weights` of segmentation weights or of a file exported from them."""
    from .segment.config import SEGMENT_DATASETS
    from .segment.validation import validate_segmentation

    given = [flag_name(k) for k, v in classification.items() if v != CLASSIFICATION_ONLY[k]]
    if given:
        raise ValueError(f"{', '.join(given)} applies to classifiers only; {source.path.name} holds a segmenter "
                         "(images are resized as its run evaluated; --scales, --mode slide and --crop-size change "
                         "how it predicts)")
    if dataset is not None and dataset not in SEGMENT_DATASETS:
        raise ValueError(f"--dataset {dataset}: {source.path.name} holds a segmenter; segmentation datasets: "
                         f"{', '.join(SEGMENT_DATASETS)}")
    if model is not None and model != source.model:
        raise ValueError(f"--model {model}: {source.path.name} holds {source.model}")
    if source.deployed:
        fixed = [o for o, v in (("--model-kwargs", model_kwargs), ("--use-ema", use_ema)) if v]
        if fixed:
            raise ValueError(f"{', '.join(fixed)} do(es) not apply to an exported file ({source.path.name}): the "
                             "graph is fixed")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"--device {device}: exported files run on the CPU here")
        dev = None
    else:
        if threads is not None:
            torch.set_num_threads(threads)
        dev = resolve_device(device)
    result = validate_segmentation(source, dataset=dataset, data_dir=data_dir, split=split, device=dev,
                                   model_kwargs=model_kwargs, use_ema=use_ema, threads=threads, workers=workers,
                                   show_progress=show_progress, **seg_options)
    return _finite_json(result)


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


def _validate_deployed(source: WeightsSource, model: Optional[str], model_kwargs: Optional[Dict[str, Any]], *, dataset: str,
                       data_dir: Optional[str], split: str, img_size: Optional[int], crop_pct: Optional[float],
                       interpolation: Optional[str], batch_size: int, workers: int, use_ema: bool,
                       device: Optional[str], amp: bool, channels_last: bool, show_progress: bool,
                       threads: Optional[int]) -> Dict[str, Any]:
    """:func:`validate_weights` of an exported file, run in its runtime on the CPU."""
    from .data.factory import create_dataset, dataset_classes
    from .deploy import DeployedModel
    from .engine.data import build_eval_loader
    from .classify.evaluation import evaluate
    from .classify.transforms import build_transform

    given = [o for o, v in (("--model", model), ("--model-kwargs", model_kwargs), ("--use-ema", use_ema),
                            ("--amp", amp), ("--channels-last", channels_last)) if v]
    if given:
        raise ValueError(f"{', '.join(given)} do(es) not apply to an exported file ({path.name}): the graph is fixed")
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"--device {device}: exported files run on the CPU here")
    path = source.path
    if not path.exists():
        raise FileNotFoundError(f"exported file not found: {path}")
    record = source.record  # before the dataset: a file without a record is refused first
    size = list(record.input_size)
    if img_size and [img_size, img_size] != size[1:]:
        raise ValueError(f"--img-size {img_size}: {path.name} was exported at {size[1]}x{size[2]} and takes only that")
    from .utils.memory import check_memory, image_batch_bytes
    # the record's size is what the images are resized to (a graph with dynamic axes takes any): refuse one that
    # cannot fit before any image is read
    check_memory(image_batch_bytes(batch_size, size[1], size[2], size[0]),
                 f"{path.name}'s recorded input size {size[1]}x{size[2]} (a batch of {batch_size} images)")
    data = create_dataset(dataset, data_dir, split)
    n_classes = len(dataset_classes(data))
    recorded = record.num_classes
    if recorded is not None and recorded != n_classes:
        raise ValueError(f"{path.name} ({record.model}) has {recorded} classes but dataset {dataset!r} has "
                         f"{n_classes}: {OTHER_DATA}")
    _check_classes(record.extra.get("classes"), data, dataset, f"{path.name}'s weights")
    net = DeployedModel(path, threads, record)
    meta = record.data_config
    data_config = {"input_size": list(size), "mean": list(meta["mean"]), "std": list(meta["std"]),
                   "crop_pct": float(crop_pct or meta.get("crop_pct") or 0.875),
                   "interpolation": interpolation or meta.get("interpolation") or "bicubic"}
    data.transform = build_transform(data_config)
    loader = build_eval_loader(data, batch_size, workers)
    metrics = evaluate(net, loader, torch.device("cpu"), show_progress=show_progress, desc="validate")
    return _finite_json({"model": record.model, "attention": recorded_attention(record), "weights": str(path),
                         "runtime": net.runtime,
                         "use_ema": False, "dataset": dataset, "split": split, "img_size": size[-1],
                         "crop_pct": data_config["crop_pct"], "interpolation": data_config["interpolation"],
                         "params": None, **metrics})


def _options():
    from . import deploy
    from .data.factory import DATASETS
    from .segment.config import SEGMENT_DATASETS
    from .segment.validation import eval_option_specs
    from .utils.recipe import INTERPOLATIONS, Opt, check_device, maybe
    return {
        "dataset": Opt(None, "the dataset the weights record (default; digits for a classifier whose record "
                             "names none) | classifiers: digits | folder/imagenet | cifar10 | cifar100 | hfds; "
                             "segmentation weights: digits | ade20k | voc | cityscapes | folder | hfds",
                       type=maybe(str), choices=list(dict.fromkeys([*DATASETS, *SEGMENT_DATASETS]))),
        "data_dir": Opt(None, "dataset root (not used by digits; default: the recorded one, for the recorded "
                              "dataset)", type=maybe(str)),
        "split": Opt(None, "split (sub-folder) to evaluate (default: the split the run evaluated on, else val)",
                     type=maybe(str)),
        "img_size": Opt(None, "evaluation resolution (default: as trained)", type=maybe(int), low=1),
        "crop_pct": Opt(None, "center-crop ratio (default: as trained)", type=maybe(float), low=0.0, high=1.0,
                        low_open=True),
        "interpolation": Opt(None, "resize interpolation (default: as trained)", type=maybe(str),
                             choices=[i for i in INTERPOLATIONS if i != "random"]),
        "batch_size": Opt(64, low=1),
        "workers": Opt(0, "data-loader worker processes", low=0),
        "device": Opt(None, "cpu | cuda | cuda:N (default: cuda when available; exported files: cpu)",
                      type=maybe(str), check=check_device),
        "threads": Opt(None, "CPU threads (torch's, or those of the exported file's runtime: "
                             f"{', '.join(deploy.runtimes())}) (default: the runtime's own)", type=maybe(int), low=1),
        "amp": Opt(False, "autocast"),
        "amp_dtype": Opt("bfloat16", choices=["bfloat16", "float16"]),
        "channels_last": Opt(False, "channels-last memory format"),
        "output": Opt(None, "also write the JSON result to this file", type=maybe(str)),
        "overwrite": Opt(False, "replace an existing --output file"),
        **eval_option_specs(),
        "save_predictions": Opt(None, "segmentation weights: write each image's predicted label map to this new or "
                                      "empty folder (indexed PNG <image stem>.png, the dataset's label values and "
                                      "palette)", type=maybe(str)),
    }


def build_parser() -> argparse.ArgumentParser:
    from .utils.recipe import add_option_flags, command_parser
    p = command_parser("simattn validate",
                       "Top-1/top-5 accuracy and loss of a model + weights on a dataset, printed as JSON; for "
                       "segmentation weights (simattn segment, or a file exported from them), mIoU, mAcc, aAcc and "
                       "per-class IoU. Model, kwargs, preprocessing and dataset default to those recorded with the "
                       "weights.")
    add_model_arguments(p, weights_required=True)
    add_option_flags(p, _options())
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from .utils.recipe import checked_flags
    args = build_parser().parse_args(argv)
    options = _options()
    # the segmentation eval flags default to 'not given' (the run's settings), so only given ones are checked
    vars(args).update(checked_flags(args, {k: v for k, v in options.items()
                                           if v.default is not None or getattr(args, k) is not None}))
    check_outputs({"--output": args.output, "--save-predictions": args.save_predictions},
                  {"--weights": args.weights, "--data-dir": args.data_dir})
    if args.output:
        check_new_file(args.output, args.overwrite)
    seg = {k: getattr(args, k) for k in SEGMENTATION_ONLY}
    result = validate_weights(args.weights, args.model, parse_model_kwargs(args.model_kwargs), dataset=args.dataset,
                              data_dir=args.data_dir, split=args.split, img_size=args.img_size, crop_pct=args.crop_pct,
                              interpolation=args.interpolation, batch_size=args.batch_size, workers=args.workers,
                              use_ema=args.use_ema, device=args.device, amp=args.amp, amp_dtype=args.amp_dtype,
                              channels_last=args.channels_last, show_progress=use_tqdm(), threads=args.threads,
                              **seg)
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
