"""Model kwargs checked before anything is built: every family's constructor options have declared ranges, so
``timm.create_model(name, drop_path_rate=1.5)`` or ``--model-kwargs depth=-1`` is a one-line ValueError naming the
model, the argument and what is allowed, not a traceback from deep inside a layer (or a silently odd network)."""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, MutableMapping, Optional, Sequence, Union

from ..utils.recipe import Opt, check_value

__all__ = ["MODEL_OPTIONS", "check_model_kwargs", "image_batch_error", "feature_out_indices", "feature_levels"]

_RATE = dict(low=0.0, high=1.0, high_open=True)
_SIZES = Union[int, List[int]]

#: the constructor options our families share, by the names timm uses
MODEL_OPTIONS: Dict[str, Opt] = {
    "num_classes": Opt(1000, "classifier outputs (0: no classifier)", type=int, low=0),
    "in_chans": Opt(3, type=int, low=1),
    "img_size": Opt(224, type=_SIZES, low=1),
    "patch_size": Opt(16, type=_SIZES, low=1),
    "embed_dim": Opt(384, type=_SIZES, low=1),
    "embed_dims": Opt([64], type=List[int], low=1),
    "depth": Opt(12, type=_SIZES, low=1),
    "depths": Opt([1], type=List[int], low=1),
    "num_heads": Opt(6, type=_SIZES, low=1),
    "mlp_ratio": Opt(4.0, type=Union[float, List[float]], low=0.0, low_open=True),
    "drop_rate": Opt(0.0, "dropout rate", type=float, **_RATE),
    "pos_drop_rate": Opt(0.0, type=float, **_RATE),
    "proj_drop_rate": Opt(0.0, type=float, **_RATE),
    "attn_drop_rate": Opt(0.0, type=float, **_RATE),
    "drop_path_rate": Opt(0.0, "stochastic depth rate", type=float, **_RATE),
}


def image_batch_error(model: str, in_chans: int, shape: Sequence[int]) -> ValueError:
    """The one-line error for an input that is not a (B, in_chans, H, W) image batch (wrong rank or channels)."""
    return ValueError(f"{model}: expected an image batch of shape (B, in_chans={in_chans}, H, W), got an input of "
                      f"shape {tuple(shape)}")


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (list, tuple)) and value else value


def check_model_kwargs(model: str, kwargs: Mapping[str, Any]) -> None:
    """Raise a one-line ValueError when a kwarg of ``model`` is outside its declared range, or when the patch size
    does not divide the image size."""
    for name, spec in MODEL_OPTIONS.items():
        if name in kwargs and kwargs[name] is not None:
            try:
                check_value(name, spec, kwargs[name])
            except ValueError as e:
                raise ValueError(f"{model}: {e}") from None
    img, patch = kwargs.get("img_size"), kwargs.get("patch_size")
    if isinstance(img, int) and isinstance(patch, int) and img % patch:
        raise ValueError(f"{model}: patch_size={patch} does not divide img_size={img}; allowed: an image size that is "
                         f"a multiple of the patch size (e.g. {img - img % patch or patch})")
    if isinstance(img, int) and isinstance(patch, int) and img < 2 * patch:
        raise ValueError(f"{model}: img_size={img} makes {img // patch}x{img // patch} patch(es) of {patch} px; the "
                         f"attention needs at least 2x2: img_size >= {2 * patch} or patch_size <= {max(1, img // 2)}")
    dim, heads = _first(kwargs.get("embed_dim")), _first(kwargs.get("num_heads"))
    if isinstance(dim, int) and isinstance(heads, int) and dim % heads:
        raise ValueError(f"{model}: embed_dim={dim} is not a multiple of num_heads={heads}")


def feature_out_indices(model: str, kwargs: MutableMapping[str, Any], default: Any) -> Any:
    """``out_indices`` taken out of ``kwargs`` (``default`` when not given), checked for its form: an int k (the
    last k levels) or a sequence of ints (levels, negative from the end); a one-line ValueError otherwise."""
    out_indices = kwargs.pop("out_indices", default)
    is_int = isinstance(out_indices, int) and not isinstance(out_indices, bool)
    indices = out_indices if isinstance(out_indices, (list, tuple)) else None
    if not (is_int and out_indices >= 1) and not (
            indices and all(isinstance(i, int) and not isinstance(i, bool) for i in indices)):
        raise ValueError(f"{model}: out_indices={out_indices!r}; allowed: a tuple of feature levels (ints, negative "
                         "from the last) or an int k >= 1 for the last k levels")
    return out_indices


@contextmanager
def feature_levels(model: str, out_indices: Any, features_only: bool, levels: Optional[int] = None) -> Iterator[None]:
    """Around a build: with ``features_only``, timm's assertion or IndexError for a level the model does not have
    becomes a one-line ValueError naming ``out_indices`` and the ``levels`` there are (else read from timm's
    message)."""
    try:
        yield
    except (AssertionError, IndexError) as e:
        if not features_only:
            raise
        found = re.search(r"\((\d+) to (\d+)\)", str(e))
        levels = levels or (int(found.group(2)) + 1 if found else None)
        allowed = (f"levels 0..{levels - 1} (or -{levels}..-1), or an int k <= {levels} for the last k"
                   if levels else "the model's feature levels")
        raise ValueError(f"{model}: out_indices={out_indices!r} names a feature level the model does not have; "
                         f"allowed: {allowed}") from None
