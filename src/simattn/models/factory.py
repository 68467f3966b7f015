"""Build a registered model by name, rebuild one from saved weights, or start one from foreign weights: the one
place every tool (train, validate, bench, export, viz, ssl, detect, convert) does this.

Weights record what built them (:mod:`simattn.models.weights`: model name, kwargs, ``num_classes``, preprocessing,
producer), so :func:`load_model` rebuilds the exact network of any file the project writes. :func:`load_initial_weights`
starts a model of any shape from weights made for another (our files, official SimA/XCiT ``.pth``, timm DeiT/XCiT
weights, a DINO backbone): the family's ``checkpoint_filter_fn`` maps the layout and resizes position embeddings, a
classifier of another shape is reset, and a report says what happened. Everything loads with ``weights_only=True``.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from ..utils.io import (MODEL_ENTRIES, CheckpointError, extract_state_dict, load_weights, non_finite_tensors,
                        shape_mismatches, state_dict_entry)
from ..utils.recipe import Opt, add_option_flags, check_path, maybe
from ..utils.values import OPTIONS_HELP, parse_assignments
from .sources import WeightsSource, overlay_with_tag_file, resolve_source
from .weights import WeightsRecord

__all__ = ["create_model", "check_model_name", "check_model", "patch_grid", "check_patch_grid", "similar_names",
           "model_options", "add_model_arguments", "parse_model_kwargs", "MODEL_KWARGS_HELP", "checkpoint_filter_for",
           "model_spec_from_weights", "recorded_attention", "load_model", "load_initial_weights",
           "InitialWeightsReport"]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with a one-line ValueError for an unknown name or arguments the model rejects.

    ``pretrained=True`` takes the weights of the tag ``name`` names (``model.tag``; a bare model name: its default
    tag) through :func:`~simattn.models.sources.resolve_source`: from timm's cache, downloaded once into it, or a
    one-line error naming the address when there is no network. ``pretrained_cfg_overlay=dict(file=F)``
    gives the file instead. timm then loads it strictly (its classifier reset for another ``num_classes``)."""
    import timm

    check_model_name(name)
    overlay = kwargs.get("pretrained_cfg_overlay") or {}
    if kwargs.get("pretrained") and not overlay.get("file") and not overlay.get("state_dict"):
        kwargs["pretrained_cfg_overlay"] = overlay_with_tag_file(name if "." in name else _default_tag(name), overlay)
    try:
        return timm.create_model(name, **kwargs)
    except TypeError as e:
        raise ValueError(f"cannot build {name} with {kwargs}: {e}") from None


def _default_tag(name: str) -> str:
    """``name``'s default pretrained tag, or a one-line ValueError when it has none with weights."""
    from timm.models import get_pretrained_cfg
    cfg = get_pretrained_cfg(name)
    tag = f"{name}.{cfg.tag}" if cfg is not None and cfg.tag else name
    if cfg is None or not (cfg.url or cfg.hf_hub_id or cfg.file):
        import timm
        tags = timm.list_pretrained(f"{name}.*")
        raise ValueError(f"pretrained=True for {name}: it has no released weights by default"
                         + (f"; its pretrained tags: {', '.join(tags)}" if tags else "; no tag of it has any")
                         + " (or pass pretrained_cfg_overlay=dict(file=PATH))")
    return tag


def check_model_name(name: str) -> None:
    """A one-line ValueError for a name timm does not know, suggesting at most 3 known names like it."""
    import timm

    from . import list_models  # the package import registers every family with timm

    if isinstance(name, str) and timm.is_model(name):
        return
    ours = list_models()
    close = similar_names(str(name), ours, timm.list_models())
    hint = ("did you mean " + (f"{', '.join(close[:-1])} or " if len(close) > 1 else "") + f"{close[-1]}?"
            if close else "not a simattn or timm model")
    raise ValueError(f"unknown model {name!r}: {hint} (simattn.list_models() names all {len(ours)} simattn models)")


def check_model(name: str, kwargs: Optional[Mapping[str, Any]] = None) -> None:
    """What a run checks of a model before building it: a name timm knows (:func:`check_model_name`) and the
    shared options in ``kwargs`` within their ranges (depth, sizes, rates; other keys are the model's own)."""
    from ._checks import check_model_kwargs

    check_model_name(name)
    check_model_kwargs(name, kwargs or {})


def patch_grid(name: str, kwargs: Optional[Mapping[str, Any]] = None,
               img_size: Optional[int] = None) -> Optional[Tuple[int, int, int, int]]:
    """``(rows, cols, patch, size)``: the grid of patch tokens model ``name`` (built with ``kwargs``, on the meta
    device: no memory, no time) makes of a square input of ``img_size`` px (the size it is built for when None),
    and its patch size; None for models without one patch embedding (the convolutional pyramids)."""
    with torch.device("meta"):
        model = create_model(name, **dict(kwargs or {}))
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is None:
        return None
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    size = img_size or int(model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    return size // ph, size // pw, ph, size


def check_patch_grid(name: str, kwargs: Optional[Mapping[str, Any]] = None, img_size: Optional[int] = None,
                     fix: str = "img_size") -> Optional[int]:
    """A one-line ValueError where model ``name``'s input of ``img_size`` px makes fewer than 2×2 patches: one
    patch is no image for an attention over the grid (the run would train a bag of one token). Returns the number of
    patch tokens (None where :func:`patch_grid` does not apply)."""
    grid = patch_grid(name, kwargs, img_size)
    if grid is None:
        return None
    rows, cols, patch, size = grid
    if rows < 2 or cols < 2:
        raise ValueError(f"{name}: a {size} px input makes {rows}x{cols} patch(es) of {patch} px; the attention needs "
                         f"at least 2x2: feed at least {2 * patch} px ({fix}) or build the model with patch_size "
                         f"<= {max(1, size // 2)} (model_kwargs.patch_size)")
    return rows * cols


def similar_names(text: str, preferred: List[str], others: Iterable[str] = (), limit: int = 3) -> List[str]:
    """Up to ``limit`` names like ``text``: those it begins, then the closest by ``difflib``'s ratio (at least 0.6;
    ``preferred`` names count a little closer than ``others``)."""
    import difflib

    names = list(dict.fromkeys([*preferred, *others]))
    own = set(preferred)
    cut_short = [n for n in names if text and n.startswith(text)]
    scored = []
    for n in names:
        score = difflib.SequenceMatcher(None, text, n).ratio() + (0.1 if n in own else 0.0)
        if score >= 0.6:
            scored.append((-score, n))
    return list(dict.fromkeys([*cut_short, *(n for _, n in sorted(scored))]))[:limit]


def model_options(weights_required: bool = False) -> Dict[str, Opt]:
    """The model-source options of every command that loads a model (``export``, ``viz``, ``validate``):
    ``model``, ``weights``, ``use_ema`` and ``model_kwargs`` (see :func:`load_model`)."""
    return {
        "model": Opt(None, "registered model name (default: the name stored with --weights)", type=maybe(str)),
        "weights": Opt(None, "weights: a .safetensors file written by simattn, a training checkpoint (.pth), a "
                             "bare state dict with --model, a folder simattn hub save wrote (DIR, local-dir:DIR, "
                             "hf-hub:ORG/NAME), or a pretrained tag (MODEL.TAG: simattn list pretrained)"
                             + ("" if weights_required else "; random weights when omitted"),
                       type=maybe(str), check=check_path, required=weights_required),
        "use_ema": Opt(False, "load the EMA entry of a training checkpoint (model_ema, state_dict_ema) instead of "
                              "its model entry, which is the default, as the authors evaluate it"),
        "model_kwargs": Opt({}, MODEL_KWARGS_HELP),
    }


def add_model_arguments(parser: Any, weights_required: bool = False) -> None:
    """The flags of :func:`model_options` (``--model``, ``--weights``, ``--use-ema``, ``--model-kwargs``)."""
    add_option_flags(parser, model_options(weights_required))


#: the one description of ``--model-kwargs`` (every command that builds a model)
MODEL_KWARGS_HELP = ("create_model kwargs as " + OPTIONS_HELP + "; they override those recorded with the weights, "
                     "e.g. img_size=32 act_layer=relu attn_kwargs.order=kv_first")


def parse_model_kwargs(items: Union[str, Iterable[str], None]) -> Dict[str, Any]:
    """``create_model`` kwargs from ``--model-kwargs`` items, in the one option mini-language
    (:func:`simattn.utils.values.parse_assignments`): ``['img_size=32', 'attn_kwargs.order=kv_first']`` →
    ``{'img_size': 32, 'attn_kwargs': {'order': 'kv_first'}}``."""
    return parse_assignments(items, what="--model-kwargs item")


def checkpoint_filter_for(name_or_model: Union[str, nn.Module]) -> Optional[Callable]:
    """The ``checkpoint_filter_fn`` of the module that registers model ``name`` (or defines the model's class),
    None if it has none."""
    import timm
    if isinstance(name_or_model, str):
        module_name = timm.models.model_entrypoint(name_or_model).__module__
    else:
        module_name = type(name_or_model).__module__
    return getattr(importlib.import_module(module_name), "checkpoint_filter_fn", None)


def _spec(record: WeightsRecord) -> Dict[str, Any]:
    return {"model": record.model, "config": record.create_kwargs(), "data_config": record.data_config,
            "num_classes": record.num_classes, "producer": record.producer, "extra": dict(record.extra)}


def model_spec_from_weights(weights: Union[str, Path, WeightsSource]) -> Optional[Dict[str, Any]]:
    """``{'model', 'config', 'data_config', 'num_classes', 'producer', 'extra'}`` recorded with weights
    (``config``: the ``create_model`` kwargs), or None when they do not name their model."""
    record = resolve_source(weights).record
    return _spec(record) if record is not None else None


def with_attention(model_kwargs: Mapping[str, Any], kind: str,
                   attn_kwargs: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """``create_model`` kwargs for the same network with attention ``kind``: ``attn_type`` set, and ``attn_kwargs``
    replaced by ``attn_kwargs`` (another kind's options would not fit; None keeps them when the kind is unchanged)."""
    kwargs = dict(model_kwargs)
    same = kwargs.get("attn_type") == kind
    kwargs["attn_type"] = kind
    if attn_kwargs:
        kwargs["attn_kwargs"] = dict(attn_kwargs)
    elif not same:
        kwargs.pop("attn_kwargs", None)
    return kwargs


def attention_kind(model: nn.Module) -> Optional[str]:
    """The registered attention kind the model uses (``model.attn_type`` or its attention modules), if one."""
    kind = getattr(model, "attn_type", None)
    if kind:
        return kind
    from ..attention import TokenAttention
    kinds = {m.attn_name for m in model.modules() if isinstance(m, TokenAttention)}
    return kinds.pop() if len(kinds) == 1 else None


def recorded_attention(record: Optional[WeightsRecord]) -> Optional[str]:
    """The attention kind of the network a weights record describes: as recorded, else its ``attn_type`` kwarg, else
    that of the model the record rebuilds (on the meta device: no memory, no time)."""
    if record is None:
        return None
    kind = record.extra.get("attention") or record.create_kwargs().get("attn_type")
    if isinstance(kind, str):
        return kind
    try:
        with torch.device("meta"):
            return attention_kind(create_model(record.model, **record.create_kwargs()))
    except ValueError:  # a record of a network this version cannot build names no kind
        return None


def load_model(model_name: Optional[str] = None, weights: Union[str, Path, WeightsSource, None] = None,
               model_kwargs: Optional[Mapping[str, Any]] = None,
               use_ema: bool = False) -> Tuple[nn.Module, Dict[str, Any]]:
    """Create a registered model in eval mode, optionally with weights that must fit it exactly.

    Args:
        model_name: a registered name; taken from the weights' record when None.
        weights: a ``.safetensors`` file, a training checkpoint (``.pth``), a bare state dict (needs a name), a
            folder timm reads (``DIR``, ``local-dir:DIR``, ``hf-hub:ORG/NAME``: :mod:`simattn.models.hub`), a
            pretrained tag, or the :class:`~simattn.models.sources.WeightsSource` any of them resolved to.
        model_kwargs: ``create_model`` kwargs; they override the ones recorded with the weights.
        use_ema: load the EMA weights of a training checkpoint.

    Returns:
        (model, spec) with spec = ``{'model', 'config', 'data_config', 'num_classes', 'producer', 'extra',
        'weights'}`` (``data_config``, ``num_classes`` and ``producer`` may be None; ``num_classes`` is 0 for a
        backbone without classifier).
    """
    spec: Dict[str, Any] = {"model": model_name, "config": {}, "data_config": None, "num_classes": None,
                            "producer": None, "extra": {}, "weights": None}
    stored = None
    if weights is not None:
        source = resolve_source(weights)
        path = weights = source.path
        stored = model_spec_from_weights(source)
        if stored:
            if model_name is not None and stored["model"] != model_name:
                raise ValueError(f"weights {path} were saved for model {stored['model']!r}, not {model_name!r}")
            spec.update(stored)
        spec["weights"] = str(path)
    if spec["model"] is None:
        raise ValueError("no model name: pass --model (the weights file does not name its model)"
                         if weights else "no model name: pass --model NAME")
    spec["config"] = {**spec["config"], **(model_kwargs or {})}
    model = create_model(spec["model"], **spec["config"])
    spec["num_classes"] = getattr(model, "num_classes", spec["num_classes"])
    if weights is not None:
        try:
            load_weights(model, weights, use_ema=use_ema, filter_fn=checkpoint_filter_for(spec["model"]),
                         checkpoint=source.checkpoint())
        except CheckpointError as e:
            if stored or "does not fit" not in str(e):
                raise
            raise CheckpointError(f"{e}; the file records no model: pass the --model-kwargs it was built with"
                                  ) from None
        bad = non_finite_tensors(model)
        if bad:  # a diverged run's weights: every map, metric or export made from them would be meaningless
            tensor = model.state_dict()[bad[0]]
            count = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"weights {weights}: tensor {bad[0]!r} holds {count} non-finite value(s) (NaN/inf) "
                                  f"of {tensor.numel()}; refusing to use them")
    return model.eval(), spec


# --- starting from weights made for another network -------------------------------------------------------------

@dataclass
class InitialWeightsReport:
    """What :func:`load_initial_weights` did: tensor names loaded as they were, position embeddings resized
    (``'pos_embed (1, 197, 64) -> (1, 17, 64)'``), classifier tensors reset (left at their initialization: another
    shape, or absent from the weights) or dropped (the model has no classifier), and other names the model has
    but the weights lack (``missing``) or the other way round (``unexpected``)."""

    path: str
    source_model: Optional[str] = None  # the model the weights record, if they do
    entry: Optional[str] = None  # the checkpoint's entry the tensors came from ('model', 'state_dict_ema', ...)
    ema_left: Optional[str] = None  # an EMA entry beside the one loaded, not loaded (use_ema takes it)
    loaded: List[str] = field(default_factory=list)
    resized: List[str] = field(default_factory=list)
    reset: List[str] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for logs."""
        total = len(self.loaded) + len(self.reset) + len(self.missing)
        parts = [f"loaded {len(self.loaded)}/{total} tensors from {self.path}"
                 + (f" ({self.source_model})" if self.source_model else "")
                 + (f", its {self.entry!r} entry" if self.entry else "")
                 + (f" (not the EMA {self.ema_left!r} beside it: use_ema takes that)" if self.ema_left else "")]
        for what, names in (("resized", self.resized), ("classifier reset", self.reset),
                            ("classifier dropped", self.dropped), ("missing", self.missing),
                            ("unexpected", self.unexpected)):
            if names:
                parts.append(f"{what}: {_names(names)}")
        return "; ".join(parts)


def _names(items: List[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _classifier_prefixes(model: nn.Module) -> Tuple[str, ...]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or "head"
    names = names if isinstance(names, (list, tuple)) else (names,)
    return tuple(f"{n}." for n in names)


def _initial_state_dict(checkpoint: Mapping[str, Any], use_ema: bool,
                        whole: bool = False) -> Tuple[Optional[str], Dict[str, torch.Tensor]]:
    """(the entry they came from, None for a bare state dict; the network's tensors) in a checkpoint of any of the
    layouts we start from.

    ``model``/``state_dict`` (ours, official SimA/XCiT/DeiT ``.pth``), ``teacher`` (official DINO), or a bare state
    dict (timm ``.safetensors``/``.bin``); inside, a ``backbone.`` prefix (a DINO network: backbone + projection
    head) selects the backbone and drops the projection head, unless ``whole`` (a model whose filter maps the
    networks built around a backbone: a segmenter's, mmseg's ``backbone.`` + ``decode_head.``).
    """
    if not use_ema and not any(k in checkpoint for k in MODEL_ENTRIES) \
            and isinstance(checkpoint.get("teacher"), Mapping):
        entry, sd = "teacher", extract_state_dict(checkpoint["teacher"])
    else:
        entry, sd = state_dict_entry(checkpoint, ema=use_ema), extract_state_dict(checkpoint, use_ema=use_ema)
    if not whole and any(k.startswith("backbone.") for k in sd):
        sd = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
    return entry, sd


def load_initial_weights(model: nn.Module, path: Union[str, Path, WeightsSource], *, model_name: Optional[str] = None,
                         use_ema: bool = False, strict: bool = False, partial: bool = False,
                         partial_option: str = "partial=True") -> InitialWeightsReport:
    """Start ``model`` from weights trained for a network of the same family, possibly of another resolution or
    with another classifier.

    Reads our ``.safetensors`` files, training and DINO checkpoints, official SimA/XCiT/DeiT ``.pth`` files and
    timm weights on disk (``.pth``/``.safetensors``/``.bin``); maps them with the family's ``checkpoint_filter_fn``
    (``model_name``'s, else that of the model's class), which resamples absolute position embeddings to the
    model's grid (timm's ``resample_abs_pos_embed``). Classifier tensors of another shape, or absent from the
    weights, keep the model's initialization (``reset``); those of a model without classifier are ``dropped``.

    A tensor of the network body that the weights leave at its initialization (``missing``) is refused unless
    ``partial`` (the user's ``partial_option``, named in the error): such a run would train a network part of which
    never saw the file, and say nothing. Unexpected names are reported, not fatal, unless ``strict``. Raises
    :class:`~simattn.utils.io.CheckpointError` (one line) for those, when any other tensor has the wrong shape, or
    when no tensor loads at all. The model is only modified when no error is raised.
    """
    source = resolve_source(path, "initial weights")
    path = source.path
    record = source.record
    checkpoint = source.checkpoint()
    entry, raw = _initial_state_dict(checkpoint, use_ema, getattr(model, "maps_whole_checkpoints", False))
    filter_fn = checkpoint_filter_for(model_name) if model_name else checkpoint_filter_for(model)
    sd = filter_fn(dict(raw), model) if filter_fn is not None else dict(raw)
    own = model.state_dict()
    heads = _classifier_prefixes(model)
    report = InitialWeightsReport(path=str(path), source_model=record.model if record else None,
                                  entry=entry, ema_left=None if use_ema else state_dict_entry(checkpoint, ema=True))
    keep: Dict[str, torch.Tensor] = {}
    wrong = []
    for key, value in sd.items():
        if key.startswith(heads):
            if key not in own:
                report.dropped.append(key)
            elif value.shape != own[key].shape:
                report.reset.append(key)
            else:
                keep[key] = value
        elif key not in own:
            report.unexpected.append(key)
        elif value.shape != own[key].shape:
            wrong.append(key)
        else:
            keep[key] = value
            if key in raw and raw[key].shape != value.shape:
                report.resized.append(f"{key} {tuple(raw[key].shape)} -> {tuple(value.shape)}")
    for key in own:
        if key not in sd:
            (report.reset if key.startswith(heads) else report.missing).append(key)
    name = model_name or type(model).__name__
    if wrong:
        raise CheckpointError(f"initial weights {path} do not fit {name}: shape mismatch: "
                              f"{shape_mismatches(wrong, raw, sd, own)}")
    if not keep:
        raise CheckpointError(f"initial weights {path} do not fit {name}: none of their {len(sd)} tensors match "
                              f"the model's names (e.g. {_names(sorted(sd), 3)} vs {_names(list(own), 3)})")
    if report.missing and not partial:
        raise CheckpointError(f"initial weights {path} would leave {len(report.missing)} of the {len(own)} tensors "
                              f"of {name} at their initialization (first missing: {report.missing[0]}"
                              + (f"; first unexpected: {report.unexpected[0]}" if report.unexpected else "")
                              + f"): give weights made for this network, or {partial_option} to start from them "
                              "anyway")
    if strict and (report.missing or report.unexpected):
        raise CheckpointError(f"initial weights {path} do not fit {name} exactly: "
                              + "; ".join(f"{what}: {_names(names)}" for what, names in
                                          (("missing", report.missing), ("unexpected", report.unexpected)) if names))
    order = {k: i for i, k in enumerate(own)}  # the model's order, whatever the file's (safetensors sorts)
    for names in (report.reset, report.missing):
        names.sort(key=order.__getitem__)
    report.loaded = sorted(keep, key=order.__getitem__)
    model.load_state_dict(keep, strict=False)
    return report
