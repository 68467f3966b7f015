"""The one build of a registered family model through timm, and the one door of its weights files: options
checked, ``out_indices`` checked (a ``features_only`` level the model lacks is one line), an overlay file loaded
through simattn's loader where the class takes timm's ``custom_load`` hook (:class:`LoadsThroughSimattn`), and
the released files' yacs configs readable by timm's loader during the build only."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from timm.models import build_model_with_cfg
from torch import nn

from ._checks import check_model_kwargs, feature_levels, feature_out_indices
from .released import released_files_readable

__all__ = ["build_family_model", "LoadsThroughSimattn", "loads_files_through_simattn"]


class LoadsThroughSimattn:
    """The one door for a family's weights files: timm's ``load_pretrained`` calls this model's
    ``load_pretrained(path)`` where the pretrained config says ``custom_load`` (every released url tag, and every
    ``pretrained_cfg_overlay=dict(file=F)``, :func:`loads_files_through_simattn`), which loads the file as every
    simattn command does (:func:`~simattn.models.factory.load_initial_weights`: the training script's ``model``
    entry, not an EMA beside it; the family's filter, the grids resampled; the classifier reset for another class
    count; strict otherwise). timm's own ``.npz`` reader stays for ``.npz`` files."""

    def load_pretrained(self, checkpoint_path: str, prefix: str = "") -> None:
        if str(checkpoint_path).endswith(".npz"):
            return super().load_pretrained(checkpoint_path, prefix)  # type: ignore[misc]
        from .factory import load_initial_weights
        load_initial_weights(self, checkpoint_path, strict=True)


def loads_files_through_simattn(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` of a family's build whose ``pretrained_cfg_overlay`` file (timm's way to name a file for a tag)
    is loaded by :class:`LoadsThroughSimattn`, as a tag's download is, unless the overlay says otherwise."""
    overlay = dict(kwargs.get("pretrained_cfg_overlay") or {})
    if overlay.get("file") and "custom_load" not in overlay:
        kwargs = {**kwargs, "pretrained_cfg_overlay": {**overlay, "custom_load": True}}
    return kwargs


def _with_tag_file(variant: str, pretrained: bool, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` whose overlay names the file of the tag timm would load (the one asked with
    ``pretrained_cfg='tag'``, else the variant's default), as simattn finds or downloads it: a download reached
    through ``timm.create_model(tag, pretrained=True)`` lands in timm's cache whole or not at all, as through every
    simattn command."""
    asked = kwargs.get("pretrained_cfg")
    if not pretrained or not (asked is None or isinstance(asked, str)):
        return kwargs
    from timm.models import get_pretrained_cfg

    from .sources import overlay_with_tag_file, pretrained_tag
    if asked is None:
        default = get_pretrained_cfg(variant)
        asked = default.tag if default is not None else None
    tag = pretrained_tag(f"{variant}.{asked}") if asked else None
    if tag is None:
        return kwargs
    return {**kwargs, "pretrained_cfg_overlay": overlay_with_tag_file(tag, kwargs.get("pretrained_cfg_overlay"))}


def build_family_model(model_cls: Callable[..., nn.Module], variant: str, pretrained: bool, kwargs: Dict[str, Any],
                       filter_fn: Callable, default_out_indices: Any, *, getter: bool = True,
                       levels: Optional[int] = None, **build: Any) -> nn.Module:
    """``timm.models.build_model_with_cfg(model_cls, variant, pretrained, ...)`` with the family's filter and
    ``kwargs`` (the user's), ``build`` (the family's own constructor arguments); ``getter``: timm's feature getter
    (else its sequential flattening, as Swin's); ``levels``: the feature levels there are, for the message where
    timm's own does not say."""
    check_model_kwargs(variant, kwargs)
    if isinstance(model_cls, type) and issubclass(model_cls, LoadsThroughSimattn):
        kwargs = loads_files_through_simattn(_with_tag_file(variant, pretrained, kwargs))
    out_indices = feature_out_indices(variant, kwargs, default_out_indices)
    feature_cfg = dict(out_indices=out_indices, **({"feature_cls": "getter"} if getter else
                                                    {"flatten_sequential": True}))
    with feature_levels(variant, out_indices, kwargs.get("features_only", False), levels), \
            released_files_readable():
        return build_model_with_cfg(model_cls, variant, pretrained, pretrained_filter_fn=filter_fn,
                                    feature_cfg=feature_cfg, **build, **kwargs)
