"""Build a registered model by name, and rebuild one from saved weights: the one place every tool does this.

Weights record what built them: safetensors files carry ``model`` (the name), ``config`` (JSON ``create_model``
kwargs) and optionally ``data_config`` in their metadata; training checkpoints carry ``model_name``,
``model_kwargs`` and ``data_config`` entries. Loading goes through the family's ``checkpoint_filter_fn`` so
official and timm layouts map, with ``weights_only=True`` and keys that do not fit reported by name.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import yaml
from torch import nn

from ..utils.io import CheckpointError, load_checkpoint, load_weights, read_safetensors_metadata

__all__ = ["create_model", "add_model_arguments", "parse_model_kwargs", "checkpoint_filter_for", "model_spec_from_weights", "load_model"]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with a one-line ValueError for an unknown name or arguments the model rejects."""
    import timm

    from . import list_models  # the package import registers every family with timm

    if not timm.is_model(name):
        raise ValueError(f"unknown model {name!r}; simattn models: {', '.join(list_models())}")
    try:
        return timm.create_model(name, **kwargs)
    except TypeError as e:
        raise ValueError(f"cannot build {name} with {kwargs}: {e}") from None


def add_model_arguments(parser: Any, weights_required: bool = False) -> None:
    """The model-source options of every command that loads a model (``export``, ``viz``, ``validate``):
    ``--model``, ``--weights``, ``--use-ema`` and ``--model-kwargs`` (see :func:`load_model`)."""
    parser.add_argument("--model", help="registered model name (default: the name stored with --weights)")
    parser.add_argument("--weights", required=weights_required,
                        help="checkpoint (.pth) or .safetensors file" + ("" if weights_required else
                                                                         "; random weights when omitted"))
    parser.add_argument("--use-ema", action="store_true", help="load the EMA weights of a training checkpoint")
    parser.add_argument("--model-kwargs", nargs="*", default=[], metavar="KEY=VALUE",
                        help="timm.create_model kwargs as KEY=VALUE items (YAML values) or one JSON mapping, e.g. "
                             "act_layer=relu img_size=32 num_classes=10")


def parse_model_kwargs(items: Union[str, Iterable[str], None]) -> Dict[str, Any]:
    """``create_model`` kwargs from the command line (``--model-kwargs`` of export, viz, validate, bench model).

    ``['img_size=32', 'act_layer=relu', 'attn_kwargs={order: kv_first}']`` → a kwargs dict. Values are parsed as
    YAML, so numbers, booleans, lists and dicts work and plain words stay strings. An item may also be a whole
    mapping, JSON (``'{"img_size": 32}'``) or YAML (``'{img_size: 32}'``); a single string is one item. Bad text
    raises a one-line ValueError that names it.
    """
    if isinstance(items, str):
        items = [items]
    kwargs: Dict[str, Any] = {}
    for item in items or ():
        if item.lstrip().startswith(("{", "[")):
            kwargs.update(_parse_kwargs_mapping(item))
            continue
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"model kwarg {item!r} is not KEY=VALUE")
        try:
            kwargs[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError:
            kwargs[key.strip()] = text
    return kwargs


def _parse_kwargs_mapping(text: str) -> Dict[str, Any]:
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError:
        try:
            mapping = yaml.safe_load(text)
        except yaml.YAMLError as e:
            reason = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(f"model kwargs {text!r} are not a valid mapping: {reason}") from None
    if not isinstance(mapping, dict):
        raise ValueError(f"model kwargs {text!r} must be a JSON object (a mapping), not a {type(mapping).__name__}")
    return mapping


def checkpoint_filter_for(name: str) -> Optional[Callable]:
    """The ``checkpoint_filter_fn`` of the module that registers model ``name`` (None if it has none)."""
    import timm
    module = importlib.import_module(timm.models.model_entrypoint(name).__module__)
    return getattr(module, "checkpoint_filter_fn", None)


def model_spec_from_weights(path: str | Path) -> Optional[Dict[str, Any]]:
    """``{'model', 'config', 'data_config'}`` recorded with weights (safetensors metadata or a train state), or
    None when the file does not say."""
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {path}")
        try:
            meta = read_safetensors_metadata(path)
        except Exception as e:  # safetensors raises several types for a damaged header
            raise CheckpointError(f"cannot read safetensors file {path}: {e}") from None
        if "model" not in meta:
            return None
        return {"model": meta["model"], "config": json.loads(meta.get("config", "{}")),
                "data_config": json.loads(meta["data_config"]) if "data_config" in meta else None}
    state = load_checkpoint(path)
    if "model_name" not in state:
        return None
    return {"model": state["model_name"], "config": dict(state.get("model_kwargs", {})),
            "data_config": state.get("data_config")}


def load_model(model_name: Optional[str] = None, weights: Optional[str | Path] = None,
               model_kwargs: Optional[Mapping[str, Any]] = None,
               use_ema: bool = False) -> Tuple[nn.Module, Dict[str, Any]]:
    """Create a registered model in eval mode, optionally with weights.

    Args:
        model_name: a registered name; taken from the weights' record when None.
        weights: a checkpoint (``.pth``) or ``.safetensors`` file.
        model_kwargs: ``create_model`` kwargs; they override the ones recorded with the weights.
        use_ema: load the EMA weights of a training checkpoint.

    Returns:
        (model, spec) with spec = ``{'model', 'config', 'data_config', 'weights'}`` (``data_config`` may be None).
    """
    spec: Dict[str, Any] = {"model": model_name, "config": {}, "data_config": None, "weights": None}
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"weights file not found: {path}")
        stored = model_spec_from_weights(path)
        if stored:
            if model_name is not None and stored["model"] != model_name:
                raise ValueError(f"weights {path} were saved for model {stored['model']!r}, not {model_name!r}")
            spec.update(model=stored["model"], config=dict(stored.get("config") or {}),
                        data_config=stored.get("data_config"))
        spec["weights"] = str(path)
    if spec["model"] is None:
        raise ValueError("no model name: pass --model (the weights file does not name its model)"
                         if weights else "no model name: pass --model NAME")
    spec["config"].update(model_kwargs or {})
    model = create_model(spec["model"], **spec["config"])
    if weights is not None:
        load_weights(model, weights, use_ema=use_ema, filter_fn=checkpoint_filter_for(spec["model"]))
    return model.eval(), spec
