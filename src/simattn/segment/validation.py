"""A segmentation run's files outside training: what a weights file or an exported file says about the data it
segments (:func:`segmentation_source`), the dataset rebuilt from that, and the model or runtime as a per-pixel
predictor (:func:`open_predictor`) scored by ``simattn validate`` (:func:`validate_segmentation`) and drawn by
``simattn viz``.

The record comes from ``final.safetensors`` / ``best.safetensors`` (the weights record's extra entries written by
:func:`simattn.segment.task.dataset_record`), a ``last.pth`` train state (its saved ``simattn segment`` config), or
an exported file (``simattn export`` copies the entries into the file's metadata).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

__all__ = ["SEGMENT_TASK", "SegmentationSource", "segmentation_source", "open_segmentation_dataset",
           "eval_option_specs", "check_predictions_dir", "Predictor", "open_predictor", "eval_settings",
           "validate_segmentation", "SEGMENT_RECORD_KEYS"]

#: the ``task`` entry of a segmentation weights record
SEGMENT_TASK = "semantic_segmentation"
#: the record entries a segmentation weights file carries beside the class names (exported files copy them)
SEGMENT_RECORD_KEYS = ("task", "dataset", "data_dir", "dataset_kwargs", "img_scale", "crop_size", "eval",
                       "train_split", "val_split", "label_ids", "palette", "ignore_index")


@dataclass
class SegmentationSource:
    """What a segmentation weights or exported file records about its network and data (None where it does not
    say): the dataset and how to reopen it, the normalisation, the input size (an exported file's graph size) and
    the evaluation settings of the run."""

    path: Path
    model: str
    deployed: bool
    num_classes: Optional[int] = None
    dataset: Optional[str] = None
    data_dir: Optional[str] = None
    dataset_kwargs: Dict[str, Any] = field(default_factory=dict)
    img_scale: Optional[List[int]] = None
    crop_size: Optional[List[int]] = None
    eval: Dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    val_split: str = "val"
    classes: Optional[List[str]] = None
    mean: Optional[List[float]] = None
    std: Optional[List[float]] = None
    input_size: Optional[List[int]] = None
    #: the weights or exported file resolved (:class:`~simattn.models.sources.WeightsSource`), read once
    weights: Any = None

    def record(self) -> Dict[str, Any]:
        """The entries an exported file carries so that it is scored on the same data (beside ``classes``)."""
        out = {"task": SEGMENT_TASK, "dataset": self.dataset, "data_dir": self.data_dir,
               "dataset_kwargs": dict(self.dataset_kwargs), "img_scale": self.img_scale,
               "crop_size": self.crop_size, "eval": dict(self.eval), "train_split": self.train_split,
               "val_split": self.val_split}
        return {k: v for k, v in out.items() if v is not None}


def _is_segmenter(model: Optional[str]) -> bool:
    from ..models.segmentation import HEADS
    return model in HEADS


def _from_extra(path: Path, model: str, deployed: bool, num_classes, data_config, extra: Mapping[str, Any],
                weights: Any = None) -> SegmentationSource:
    config = data_config or {}
    classes = extra.get("classes")
    source = SegmentationSource(
        path=path, model=model, deployed=deployed, num_classes=num_classes, dataset=extra.get("dataset"),
        data_dir=extra.get("data_dir"), dataset_kwargs=dict(extra.get("dataset_kwargs") or {}),
        img_scale=extra.get("img_scale"), crop_size=extra.get("crop_size"), eval=dict(extra.get("eval") or {}),
        train_split=extra.get("train_split") or "train", val_split=extra.get("val_split") or "val",
        classes=[str(c) for c in classes] if isinstance(classes, list) else None,
        mean=config.get("mean"), std=config.get("std"), input_size=config.get("input_size"), weights=weights)
    return source


def segmentation_source(path: str | os.PathLike) -> Optional[SegmentationSource]:
    """The segmentation record of a weights file (``.safetensors``, a ``last.pth`` train state) or an exported file,
    or None when the file holds another kind of model (a classifier). A file is a segmentation one when its record
    says ``task: semantic_segmentation`` or its model is a registered segmenter."""
    from .. import deploy  # noqa: F401  (its formats read their files' records)
    from ..models.sources import resolve_source

    source = resolve_source(path, packages=True)
    path = source.path
    if source.deployed and not path.exists():
        raise FileNotFoundError(f"exported file not found: {path}")
    record = source.record
    if record is None:
        return None
    extra = record.extra
    if record.format == "train-state":  # the run's whole configuration; the classes are not in a train state
        says_so, extra = record.producer == "simattn segment", {**extra, "classes": None}
    else:
        says_so = extra.get("task") == SEGMENT_TASK
    if not says_so and not _is_segmenter(record.model):
        return None
    return _from_extra(path, record.model, source.deployed, record.num_classes, record.data_config, extra, source)


def open_segmentation_dataset(source: SegmentationSource, *, dataset: Optional[str] = None,
                              data_dir: Optional[str] = None, split: Optional[str] = None, what: str = "--dataset"):
    """The dataset ``source`` records (``dataset``/``data_dir``/``split`` replace the recorded ones), with the
    evaluation transform the run used: resized to fit the recorded ``img_scale``, normalised with the recorded mean
    and std. Its classes must be those the weights were trained on (a one-line ValueError otherwise)."""
    from ..data.segmentation import create_segmentation_dataset

    name = dataset or source.dataset
    if name is None:
        raise ValueError(f"{source.path.name} holds a segmenter but records no dataset; name it with {what} "
                         "(digits, ade20k, voc, cityscapes, folder, hfds) and --data-dir")
    same = name == source.dataset
    root = data_dir if data_dir is not None else (source.data_dir if same else None)
    options = dict(source.dataset_kwargs) if same else {}
    scale = source.img_scale
    if scale is None and source.input_size is not None:  # a record without the resize bound: the input size
        h, w = source.input_size[1:]
        scale = (max(h, w), min(h, w))
    kwargs: Dict[str, Any] = {}
    if source.mean is not None and source.std is not None:
        kwargs.update(mean=tuple(source.mean), std=tuple(source.std))
    data = create_segmentation_dataset(name, root, split or source.val_split, train=False,
                                       scale=tuple(scale) if scale is not None else None, **kwargs, **options)
    if len(data) == 0:
        raise ValueError(f"segmentation dataset {name!r} ({split or source.val_split}) has no images")
    if source.classes is not None and [str(c) for c in data.classes] != source.classes:
        differ = [f"{i}: {a!r} vs {b!r}" for i, (a, b) in enumerate(zip(source.classes, data.classes)) if a != str(b)]
        if len(source.classes) != len(data.classes):
            differ.insert(0, f"{len(source.classes)} vs {len(data.classes)} classes")
        raise ValueError(f"{source.path.name} was trained on other classes than dataset {name!r} holds (weights vs "
                         f"data) {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}: the scores would be "
                         "meaningless")
    if source.num_classes is not None and source.num_classes != data.num_classes:
        raise ValueError(f"{source.path.name} ({source.model}) predicts {source.num_classes} classes but dataset "
                         f"{name!r} has {data.num_classes}")
    return data


def eval_option_specs() -> Dict[str, Any]:
    """``simattn segment``'s ``eval`` options (one declaration: :class:`~simattn.segment.config.SegmentEval`) as
    command flags that default to 'not given', so that the settings the run evaluated with stand unless changed."""
    from ..utils.recipe import option_paths
    from .config import SegmentEval
    return {name: dataclasses.replace(spec, default=None, help=f"{spec.help} (default: as the run evaluated; "
                                                               f"segmentation weights only)")
            for name, spec in option_paths(SegmentEval).items()}


def check_predictions_dir(path: Optional[str | os.PathLike], option: str = "--save-predictions") -> Optional[Path]:
    """``path`` as the folder predictions are written to: it must be new or empty (a one-line ValueError
    otherwise), so that no file already there, input or earlier result, is ever overwritten."""
    if path is None:
        return None
    folder = Path(path)
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir():
            raise ValueError(f"{option} {folder}: exists and is not a folder; give a new or empty folder")
        if any(folder.iterdir()):
            raise ValueError(f"{option} {folder}: the folder is not empty; give a new or empty folder (predictions "
                             "never overwrite files)")
    else:
        parent = next((p for p in folder.absolute().parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{option} {folder}: cannot create the folder ({parent} is not a writable folder)")
    return folder


@dataclass
class Predictor:
    """A segmentation network or exported file as ``fn(images) -> logits`` on ``device``; ``input_size`` (H, W) is
    the one size an exported graph takes (None: any size), ``runtime`` what runs it."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    device: torch.device
    model: str
    runtime: str
    input_size: Optional[Tuple[int, int]]
    params: Optional[int] = None


def open_predictor(source: SegmentationSource, *, device: Optional[torch.device] = None,
                   model_kwargs: Optional[Mapping[str, Any]] = None, use_ema: bool = False,
                   threads: Optional[int] = None) -> Predictor:
    """The network of a weights file (on ``device``, eval mode) or an exported file in its runtime (CPU)."""
    if source.deployed:
        from ..deploy import DeployedModel
        net = DeployedModel(source.path, threads, source.weights.record if source.weights is not None else None)
        _, h, w = net.metadata.input_size
        fixed = any(t is not None for t in net.takes[1:])
        return Predictor(net, torch.device("cpu"), net.metadata.model, net.runtime, (h, w) if fixed else None)
    from ..models.factory import load_model
    net, spec = load_model(None, source.weights or source.path, dict(model_kwargs or {}), use_ema=use_ema)
    device = device or torch.device("cpu")
    net = net.to(device).eval()
    return Predictor(net, device, spec["model"], "torch", None, sum(p.numel() for p in net.parameters()))


def eval_settings(source: SegmentationSource, predictor: Predictor, given: Mapping[str, Any]) -> Dict[str, Any]:
    """mode, crop, stride, flip, scales: the flags given, else the run's, else :class:`SegmentEval`'s defaults;
    windows of a fixed-size exported file are its size."""
    from .config import SegmentEval
    from .inference import MODES
    defaults = dataclasses.asdict(SegmentEval())
    settings = {k: given.get(k) if given.get(k) is not None else source.eval.get(k, defaults[k]) for k in defaults}
    if settings["mode"] not in MODES:
        raise ValueError(f"{source.path.name} records eval mode {settings['mode']!r}; pass --mode whole or slide")
    crop = settings["crop_size"] or source.crop_size
    fixed = predictor.input_size
    if settings["mode"] == "slide":
        if fixed is not None:
            if given.get("crop_size") is not None and tuple(given["crop_size"]) != tuple(fixed):
                raise ValueError(f"--crop-size {' '.join(map(str, given['crop_size']))}: {source.path.name} takes "
                                 f"{fixed[0]}x{fixed[1]} inputs only; slide windows are that size")
            crop = list(fixed)
        if crop is None:
            raise ValueError(f"--mode slide: {source.path.name} records no crop size; pass --crop-size H W")
    settings["crop_size"] = [int(v) for v in crop] if crop is not None else None
    return settings


def validate_segmentation(source: SegmentationSource, *, dataset: Optional[str] = None,
                          data_dir: Optional[str] = None, split: Optional[str] = None,
                          mode: Optional[str] = None, crop_size: Optional[List[int]] = None,
                          stride: Optional[List[int]] = None, flip: Optional[bool] = None,
                          scales: Optional[List[float]] = None, device: Optional[torch.device] = None,
                          model_kwargs: Optional[Mapping[str, Any]] = None, use_ema: bool = False,
                          threads: Optional[int] = None, workers: int = 0,
                          save_predictions: Optional[str | os.PathLike] = None,
                          show_progress: bool = False) -> Dict[str, Any]:
    """mIoU, mAcc, aAcc and per-class IoU/accuracy of a segmentation weights or exported file on the dataset it
    records (or ``dataset``/``data_dir``/``split``), predicting as the run evaluated unless ``mode`` .. ``scales``
    say otherwise; ``save_predictions`` (a new or empty folder) receives one indexed PNG per image in the
    dataset's own label values and palette."""
    from .evaluate import evaluate_segmentation

    folder = check_predictions_dir(save_predictions)
    predictor = open_predictor(source, device=device, model_kwargs=model_kwargs, use_ema=use_ema, threads=threads)
    settings = eval_settings(source, predictor, {"mode": mode, "crop_size": crop_size, "stride": stride,
                                                  "flip": flip, "scales": scales})
    data = open_segmentation_dataset(source, dataset=dataset, data_dir=data_dir, split=split)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    crop = tuple(settings["crop_size"]) if settings["crop_size"] else None
    scores = evaluate_segmentation(
        predictor.fn, data, device=predictor.device, mode=settings["mode"], crop=crop,
        stride=tuple(settings["stride"]), flip=bool(settings["flip"]), scales=tuple(settings["scales"]),
        input_size=predictor.input_size if settings["mode"] == "whole" else None, workers=workers,
        save_dir=folder, show_progress=show_progress)
    name = dataset or source.dataset
    return {"task": SEGMENT_TASK, "model": predictor.model, "weights": str(source.path), "runtime": predictor.runtime,
            "dataset": name, "data_dir": data_dir if data_dir is not None else
            (source.data_dir if name == source.dataset else None),
            "split": split or source.val_split, "mode": settings["mode"],
            "crop_size": settings["crop_size"] if settings["mode"] == "slide" else None,
            "stride": settings["stride"] if settings["mode"] == "slide" else None,
            "flip": bool(settings["flip"]), "scales": list(settings["scales"]),
            "input_size": list(predictor.input_size) if predictor.input_size else None,
            "params": predictor.params, "miou": scores["miou"], "macc": scores["macc"], "aacc": scores["aacc"],
            "images": scores["images"], "pixels": scores["pixels"], "per_class": scores["per_class"],
            "predictions": str(folder) if folder is not None else None}
