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
any other key       JSON value: extra facts (metrics, recipe, teacher name, ...), returned in ``extra``
==================  ==================================================================================================

``create_model(meta['model'], **json.loads(meta['config']))`` rebuilds the network the weights fit.
Records without ``format`` are read too: ``model`` + ``config`` + ``data_config`` (``simattn train``) and ``model`` +
``kwargs`` + ``source`` (the DINO teacher backbone, no classifier).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from torch import nn

from ..utils.io import CheckpointError, PathLike, load_checkpoint, read_safetensors_metadata, save_safetensors

__all__ = ["WEIGHTS_FORMAT", "WeightsRecord", "weights_metadata", "save_weights", "read_weights_record",
           "parse_weights_metadata"]

WEIGHTS_FORMAT = "simattn-weights-v1"

_RESERVED = ("format", "model", "config", "num_classes", "data_config", "producer", "simattn_version")


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
        kwargs = _json(meta, "config", path) if "config" in meta else {}
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
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"weights {path}: model kwargs in the metadata are a {type(kwargs).__name__}, "
                              "not a mapping")
    return WeightsRecord(model=meta["model"], model_kwargs=kwargs, num_classes=num_classes,
                         data_config=_json(meta, "data_config", path) if "data_config" in meta else None,
                         format="legacy", extra={k: _maybe_json(v) for k, v in meta.items() if k not in known})


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read_weights_record(path: PathLike) -> Optional[WeightsRecord]:
    """The record of a weights file: safetensors metadata, or the ``model_name``/``model_kwargs``/``data_config``
    entries of a ``simattn train`` state (``last.pth``). None when the file does not name its model."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        try:
            meta = read_safetensors_metadata(path)
        except Exception as e:  # safetensors raises several types for a damaged header
            raise CheckpointError(f"cannot read safetensors file {path}: {e}") from None
        return parse_weights_metadata(meta, path)
    state = load_checkpoint(path)
    if not isinstance(state.get("model_name"), str):
        return None
    kwargs = dict(state.get("model_kwargs") or {})
    return WeightsRecord(model=state["model_name"], model_kwargs=kwargs, num_classes=kwargs.get("num_classes"),
                         data_config=state.get("data_config"), producer="simattn train", format="train-state")
