"""The checks of option values that ask the libraries (timm's optimizers and auto-augment strings) or read a
convention (devices, paths), and the choice lists options share; :class:`simattn.utils.recipe.Opt` fields name them
as ``check=``/``choices=``. Each check returns None, or says what is wrong and what is allowed."""
from __future__ import annotations

import difflib
from typing import Any, List, Optional

__all__ = ["check_optimizer", "check_auto_augment", "check_path", "check_device", "INTERPOLATIONS", "SCHEDULES",
           "PROB", "maybe"]


def _optimizers() -> List[str]:
    from timm.optim import list_optimizers
    return list(list_optimizers())


def check_optimizer(name: str) -> Optional[str]:
    names = _optimizers()
    if name.lower() in names or name.lower().split("_")[-1] in names:  # timm accepts 'lookahead_adamw'
        return None
    close = difflib.get_close_matches(name.lower(), names, n=3)
    return (f"allowed: an optimizer timm.optim knows ({len(names)}, e.g. adamw, sgd, lamb"
            + (f"; did you mean {', '.join(close)}?" if close else "") + ")")


def check_auto_augment(text: str) -> Optional[str]:
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform
    make = (rand_augment_transform if text.startswith("rand") else
            augment_and_mix_transform if text.startswith("augmix") else auto_augment_transform)
    try:
        make(text, {"translate_const": 100, "img_mean": (124, 116, 104)})
    except (AssertionError, ValueError, KeyError, IndexError, TypeError) as e:
        reason = str(e).strip() or "not understood"
        return (f"{reason}; allowed: a timm auto-augment string such as rand-m9-mstd0.5-inc1, augmix-m5-w4-d2, "
                "original, v0, 3a")
    return None


def check_path(text: str) -> Optional[str]:
    """An empty path is refused: ``Path('')`` is the current folder, which nobody means by it."""
    return None if text.strip() else "an empty path is not allowed (give a path, or leave the option out)"


def check_device(text: str) -> Optional[str]:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return None
    return "allowed: cpu, cuda, cuda:N, or null (CUDA when available)"


INTERPOLATIONS = ["bicubic", "bilinear", "nearest", "box", "hamming", "lanczos", "random"]
SCHEDULES = ["cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "plateau", "none"]
PROB = dict(low=0.0, high=1.0)


def maybe(hint: Any) -> Any:
    return Optional[hint]
