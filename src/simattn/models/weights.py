"""The record every ``.safetensors`` file of this project carries, so that any of them rebuilds its model.

Schema ``simattn-weights-v1`` (safetensors metadata is a str → str mapping; "JSON" marks JSON-encoded values):

==================  ==================================================================================================
``format``          ``"simattn-weights-v1"``
``model``           registered model name (``simattn.models.factory.create_model``)
``config``          JSON mapping: the ``create_model`` kwargs that rebuild the network, ``num_classes`` included
``num_classes``     JSON int: classifier outputs; ``0`` for a backbone without classifier (e.g. a DINO teacher)
``data_config``     JSON mapping (optional): preprocessing the weights were trained/evaluated with (``input_size``,
                    ``mean``, ``std``, ``crop_pct``, ``interpolation``)
``producer``        the command that wrote the file (``simattn train``, ``simattn ssl``, ``simattn convert``, ...)
``simattn_version`` the package version that wrote it
any other key       JSON value: extra facts (metrics, recipe, teacher name, the data: ``dataset``, ``data_dir``,
                    ``val_split``, ...), returned in ``extra``
==================  ==================================================================================================

``create_model(meta['model'], **json.loads(meta['config']))`` rebuilds the network the weights fit.

Exported files (``simattn.deploy``: ONNX, ExecuTorch, Core ML, OpenVINO, TFLite) carry the same record, built by
:func:`export_record` (``data_config`` then holds the one input size the graph takes, and ``extra`` the attention
kind and the class names), each in its format's metadata slot; :func:`read_deployed_record` reads it back and checks
what a runtime needs to be fed. Files exported before they shared this record (``model``, ``model_kwargs``,
``attention``, ``input_size``, ``mean``, ``std``, ... as separate JSON keys) are read too.
Records without ``format`` are read too: ``model`` + ``config`` + ``data_config`` (``simattn train``) and ``model`` +
``kwargs`` + ``source`` (the DINO teacher backbone, no classifier).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from torch import nn

from ..utils.io import CheckpointError, PathLike, save_safetensors

__all__ = ["WEIGHTS_FORMAT", "WeightsRecord", "weights_metadata", "save_weights", "train_state_record",
           "parse_weights_metadata", "export_record", "read_deployed_record", "DATA_CONFIG_KEYS", "DATA_RECORD_KEYS"]

WEIGHTS_FORMAT = "simattn-weights-v1"

_RESERVED = ("format", "model", "config", "num_classes", "data_config", "producer", "simattn_version")
#: the extra entries that name the data a classifier was trained on (``simattn validate`` scores it there): the
#: dataset, its root when one was given, and the split the run evaluated
DATA_RECORD_KEYS = ("dataset", "data_dir", "val_split")
#: the preprocessing an exported file records (``input_size``, ``mean`` and ``std`` always)
DATA_CONFIG_KEYS = ("input_size", "mean", "std", "crop_pct", "interpolation")


@dataclass
class WeightsRecord:
    """What a weights file says about the network it holds (see the module docstring for the schema)."""

    model: str
    model_kwargs: Dict[str, Any]
    num_classes: Optional[int]  # None: the file does not say (older records); 0: no classifier
    data_config: Optional[Dict[str, Any]] = None
    producer: Optional[str] = None
    simattn_version: Optional[str] = None
    format: str = WEIGHTS_FORMAT  # or 'legacy' for records written before the schema had a version
    extra: Dict[str, Any] = field(default_factory=dict)

    def create_kwargs(self) -> Dict[str, Any]:
        """``create_model`` kwargs for this network (``num_classes`` included when known)."""
        kwargs = dict(self.model_kwargs)
        if self.num_classes is not None:
            kwargs["num_classes"] = self.num_classes
        return kwargs

    @property
    def input_size(self) -> Tuple[int, int, int]:
        """(channels, height, width) of the preprocessed input (an exported graph takes this size)."""
        return tuple(int(v) for v in (self.data_config or {})["input_size"])

    def to_metadata(self) -> Dict[str, str]:
        """The str → str mapping this record is stored as (safetensors metadata, and every exported format's slot)."""
        kwargs = self.create_kwargs()
        meta = {"format": WEIGHTS_FORMAT, "model": self.model, "config": json.dumps(kwargs, default=str),
                "producer": self.producer or "simattn", "simattn_version": self.simattn_version or _version()}
        if self.num_classes is not None:
            meta["num_classes"] = json.dumps(int(self.num_classes))
        if self.data_config is not None:
            meta["data_config"] = json.dumps(self.data_config, default=str)
        meta.update({k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in self.extra.items()})
        return meta

    def to_dict(self) -> Dict[str, Any]:
        """The record as JSON-ready values (for reports): the schema's keys, then the extra entries."""
        return {"format": self.format, "model": self.model, "model_kwargs": self.create_kwargs(),
                "num_classes": self.num_classes, "data_config": self.data_config, "producer": self.producer,
                "simattn_version": self.simattn_version, **self.extra}


def _version() -> str:
    from .. import __version__
    return __version__


def weights_metadata(model_name: str, model_kwargs: Mapping[str, Any], *, producer: str,
                     num_classes: Optional[int] = None, data_config: Optional[Mapping[str, Any]] = None,
                     **extra: Any) -> Dict[str, str]:
    """The ``simattn-weights-v1`` metadata of a file holding ``model_name`` built with ``model_kwargs``.

    ``num_classes`` defaults to ``model_kwargs['num_classes']``; when given, it is also written into the kwargs so
    they rebuild the same head. ``extra`` entries (metrics, recipe, teacher, ...) are JSON-encoded; their names may
    not shadow a schema key.
    """
    if not model_name:
        raise ValueError("weights metadata needs a model name")
    if not producer:
        raise ValueError("weights metadata needs a producer (the command that writes the file)")
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"extra weights metadata {clash} would shadow schema keys {list(_RESERVED)}")
    kwargs = dict(model_kwargs)
    if num_classes is None:
        num_classes = kwargs.get("num_classes")
    if num_classes is not None:
        kwargs["num_classes"] = int(num_classes)
    meta = {"format": WEIGHTS_FORMAT, "model": model_name, "config": json.dumps(kwargs, default=str),
            "producer": producer, "simattn_version": _version()}
    if num_classes is not None:
        meta["num_classes"] = json.dumps(int(num_classes))
    if data_config is not None:
        meta["data_config"] = json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in data_config.items()})
    meta.update({k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in extra.items()})
    return meta


def save_weights(model: nn.Module, path: PathLike, metadata: Mapping[str, str]) -> None:
    """Write ``model``'s state dict as safetensors (atomically) with :func:`weights_metadata`'s record.

    ``num_classes`` is taken from the model when the metadata leaves it out, and must agree with it otherwise.
    """
    meta = dict(metadata)
    if meta.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"weights metadata must come from weights_metadata() (format {WEIGHTS_FORMAT!r})")
    own = getattr(model, "num_classes", None)
    if own is not None:
        if "num_classes" not in meta:
            meta["num_classes"] = json.dumps(int(own))
            kwargs = json.loads(meta["config"])
            kwargs["num_classes"] = int(own)
            meta["config"] = json.dumps(kwargs, default=str)
        elif json.loads(meta["num_classes"]) != own:
            raise ValueError(f"weights metadata says num_classes={meta['num_classes']} but the model has {own}")
    save_safetensors(model, path, metadata=meta)


def _json(meta: Mapping[str, str], key: str, path: PathLike) -> Any:
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"weights {path}: metadata {key!r} is not valid JSON ({e.msg})") from None


def parse_weights_metadata(meta: Mapping[str, str], path: PathLike = "<metadata>") -> Optional[WeightsRecord]:
    """A :class:`WeightsRecord` from safetensors metadata, or None when it names no model."""
    if "model" not in meta:
        return None
    fmt = meta.get("format")
    if fmt is not None and fmt != WEIGHTS_FORMAT:
        raise CheckpointError(f"weights {path} have metadata format {fmt!r}; this simattn reads {WEIGHTS_FORMAT!r}")
    if fmt == WEIGHTS_FORMAT:
        kwargs = _record_kwargs(_json(meta, "config", path) if "config" in meta else {}, path)
        num_classes = _json(meta, "num_classes", path) if "num_classes" in meta else kwargs.get("num_classes")
        extra = {k: _maybe_json(v) for k, v in meta.items() if k not in _RESERVED}
        return WeightsRecord(model=meta["model"], model_kwargs=kwargs, num_classes=num_classes,
                             data_config=_json(meta, "data_config", path) if "data_config" in meta else None,
                             producer=meta.get("producer"), simattn_version=meta.get("simattn_version"),
                             extra=extra)
    # records without a format key: simattn train (config, data_config) and the DINO backbone (kwargs, source)
    if "config" in meta:
        kwargs = _json(meta, "config", path)
        num_classes = kwargs.get("num_classes")
        known = ("model", "config", "data_config")
    else:
        kwargs = _json(meta, "kwargs", path) if "kwargs" in meta else {}
        num_classes = 0 if "DINO" in meta.get("source", "") else kwargs.get("num_classes")
        known = ("model", "kwargs")
    kwargs = _record_kwargs(kwargs, path)
    return WeightsRecord(model=meta["model"], model_kwargs=kwargs, num_classes=num_classes,
                         data_config=_json(meta, "data_config", path) if "data_config" in meta else None,
                         format="legacy", extra={k: _maybe_json(v) for k, v in meta.items() if k not in known})


#: create_model arguments that make timm open or download another file: a record names a network, never a file
_LOADING_KWARGS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir")


def _record_kwargs(kwargs: Any, path: PathLike) -> Dict[str, Any]:
    """A record's model kwargs: a mapping, without arguments that would make the build open another file."""
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"weights {path}: model kwargs in the metadata are a {type(kwargs).__name__}, "
                              "not a mapping")
    loading = sorted(k for k in kwargs if k in _LOADING_KWARGS)
    if loading:
        raise CheckpointError(f"weights {path}: the record's model kwargs hold {', '.join(loading)}, which would make "
                              "the build open or download another file; a record names a network only: write the "
                              "file again without them")
    return kwargs


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def train_state_record(state: Mapping[str, Any]) -> Optional[WeightsRecord]:
    """The record a ``simattn train`` state (``last.pth``) carries in its entries, None for any other checkpoint."""
    if not isinstance(state.get("model_name"), str):
        return None
    kwargs = _record_kwargs(dict(state.get("model_kwargs") or {}), "(a training state)")
    config = state.get("config") if isinstance(state.get("config"), Mapping) else {}
    producer = state["task"] if isinstance(state.get("task"), str) else "simattn train"
    # a segmentation run's state keeps its whole configuration: how to reopen its data and evaluate it
    kept = config if producer == "simattn segment" else DATA_RECORD_KEYS
    return WeightsRecord(model=state["model_name"], model_kwargs=kwargs, num_classes=kwargs.get("num_classes"),
                         data_config=state.get("data_config"), producer=producer, format="train-state",
                         extra={k: config[k] for k in kept if config.get(k) is not None})


def export_record(model_name: str, model_kwargs: Mapping[str, Any], data_config: Mapping[str, Any], *,
                  attention: Optional[str] = None, classes: Optional[Sequence[str]] = None,
                  num_classes: Optional[int] = None, producer: str = "simattn export", **extra: Any) -> WeightsRecord:
    """The record of a file exported at ``data_config['input_size']``: the weights' record with the preprocessing
    (:data:`DATA_CONFIG_KEYS`), the attention kind (``'mixed'`` when None) and the class names, when known."""
    config = {k: [int(v) if k == "input_size" else float(v) for v in data_config[k]]
              for k in ("input_size", "mean", "std") if data_config.get(k) is not None}
    if data_config.get("crop_pct") is not None:
        config["crop_pct"] = float(data_config["crop_pct"])
    if data_config.get("interpolation"):
        config["interpolation"] = str(data_config["interpolation"])
    kwargs = dict(model_kwargs)
    if num_classes is None:
        num_classes = kwargs.get("num_classes")
    extra = {"attention": attention or "mixed", **extra}
    if classes is not None:
        extra["classes"] = [str(c) for c in classes]
    record = WeightsRecord(model=model_name, model_kwargs=kwargs, num_classes=num_classes, data_config=config,
                           producer=producer, simattn_version=_version(), extra=extra)
    return check_deployed_record(record, "export record")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _number(value: Any) -> bool:
    import math
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_deployed_record(record: Optional[WeightsRecord], what: str = "metadata") -> WeightsRecord:
    """``record`` checked for what a runtime needs to be fed (input size, mean and std, and the preprocessing and
    class names when recorded): a one-line ValueError names what is missing or malformed."""
    config = (record.data_config if record is not None else None) or {}
    missing = ([] if record is not None else ["model", "model_kwargs"]) + \
        [k for k in ("input_size", "mean", "std") if k not in config]
    if missing:
        raise ValueError(f"{what} lacks simattn metadata ({', '.join(missing)}); export it with `simattn export`")
    from ..utils.recipe import INTERPOLATIONS

    size, mean, std = config["input_size"], config["mean"], config["std"]
    if not (isinstance(size, (list, tuple)) and len(size) == 3 and
            all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        raise ValueError(f"{what}: metadata input_size {_shown(size)} is not [channels, height, width]")
    for name, values in (("mean", mean), ("std", std)):
        if not (isinstance(values, (list, tuple)) and len(values) == size[0] and all(map(_number, values))):
            raise ValueError(f"{what}: metadata {name} {_shown(values)} is not {size[0]} finite numbers (one per "
                             "channel)")
    if any(v <= 0 for v in std):
        raise ValueError(f"{what}: metadata std {_shown(std)} has a value <= 0")
    if not isinstance(record.model, str) or not record.model:
        raise ValueError(f"{what}: metadata model {_shown(record.model)} is not a name")
    attention = record.extra.get("attention")
    if attention is not None and (not isinstance(attention, str) or not attention):
        raise ValueError(f"{what}: metadata attention {_shown(attention)} is not a name")
    if not isinstance(record.model_kwargs, dict):
        raise ValueError(f"{what}: metadata model_kwargs {_shown(record.model_kwargs)} is not a mapping")
    crop = config.get("crop_pct")
    if crop is not None and not (_number(crop) and 0 < crop <= 1):
        raise ValueError(f"{what}: metadata crop_pct {_shown(crop)} is not a number in (0, 1]")
    interpolations = [i for i in INTERPOLATIONS if i != "random"]
    interpolation = config.get("interpolation")
    if interpolation is not None and interpolation not in interpolations:
        raise ValueError(f"{what}: metadata interpolation {_shown(interpolation)} is not one of "
                         f"{', '.join(interpolations)}")
    classes = record.extra.get("classes")
    if classes is not None and not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{what}: metadata classes {_shown(classes)} is not a list of class names")
    return record


#: keys of the records exported files carried before they shared the weights' record (JSON values)
_EXPORT_V0 = ("model", "model_kwargs", "attention", "input_size", "mean", "std", "simattn_version", "crop_pct",
              "interpolation", "classes")


def read_deployed_record(meta: Mapping[str, Any], what: str = "metadata") -> WeightsRecord:
    """The record an exported file carries (``meta``: its metadata slot as a mapping, values JSON text or already
    decoded), checked by :func:`check_deployed_record`; one-line ValueErrors name what is missing or malformed."""
    if "format" not in meta and "model_kwargs" in meta:  # exported before the weights' record was shared
        # the ONNX and Core ML slots held JSON text, the .pte one the decoded values
        old = {k: _maybe_json(v) if isinstance(v, str) else v for k, v in meta.items() if k in _EXPORT_V0}
        kwargs = old.get("model_kwargs")
        record = WeightsRecord(
            model=old.get("model"), model_kwargs=kwargs,
            num_classes=kwargs.get("num_classes") if isinstance(kwargs, dict) else None,
            data_config={k: old[k] for k in DATA_CONFIG_KEYS if k in old}, producer="simattn export",
            simattn_version=old.get("simattn_version"), format="export-v0",
            extra={k: old[k] for k in ("attention", "classes") if k in old})
        return check_deployed_record(record, what)
    try:
        record = parse_weights_metadata({k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()},
                                        what)
    except CheckpointError as e:
        raise ValueError(f"{what}: malformed simattn metadata ({str(e).split(': ', 1)[-1]})") from None
    return check_deployed_record(record, what)
