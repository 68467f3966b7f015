"""Pieces every attention kind shares: input checks, token masks, fp32 helpers and the hook point."""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

__all__ = [
    "HookPoint",
    "check_count",
    "check_finite",
    "check_positive",
    "fx_call_whole",
    "fx_tracing",
    "check_qkv",
    "cast",
    "check_token_mask",
    "acc_dtype",
    "apply_token_mask",
    "matmul_dtype",
    "no_autocast",
    "range_safe_dtype",
    "resolve_masks",
]


class HookPoint(nn.Identity):
    """A named identity submodule where an attention exposes an intermediate (e.g. SimA's q̂, k̂).

    Fast paths never materialize the intermediate; they call the hook point only when a forward hook is registered
    on it (``has_hooks``), so observing costs nothing when no one is watching.
    """

    __jit_unused_properties__ = ["has_hooks"]  # hooks are a Python-side feature

    @property
    def has_hooks(self) -> bool:
        return bool(self._forward_hooks) or bool(self._forward_pre_hooks)

    @torch.jit.ignore  # any number of tensors: not a TorchScript signature
    def forward(self, *args):  # noqa: D401 - identity on any number of tensors
        return args[0] if len(args) == 1 else args


def fx_call_whole(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[torch.fx.Proxy]:
    """While ``torch.fx`` traces through ``module`` (any tracer: ``symbolic_trace``, FX quantization), record the
    call as one ``call_module`` node, as for a module on the tracer's leaf list, and return its proxy; None when
    not tracing, or when ``module`` is the root of the trace (it cannot call itself). For modules whose forward
    picks dtypes, autocast handling or matmul order in Python."""
    if not fx_tracing():
        return None
    proxy = next((a for a in args if isinstance(a, torch.fx.Proxy)), None)
    if proxy is None or getattr(proxy.tracer, "root", None) is module:
        return None
    return proxy.tracer.create_proxy("call_module", proxy.tracer.path_of_module(module), args, kwargs)


def fx_tracing() -> bool:
    """Whether ``torch.fx`` is symbolically tracing (shapes are proxies): input checks that branch on shapes in
    Python skip then, as timm's do. Eager runs, ``torch.compile`` and ``torch.export`` run the checks; TorchScript
    callers skip them with ``if not torch.jit.is_scripting()``."""
    return is_fx_symbolic_tracing()


def check_count(owner: str, name: str, value: Any, low: int = 1) -> int:
    """``value`` if it is an integer (not a bool) >= ``low``; a one-line ValueError naming ``owner.name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}: {name}={value!r}; allowed: an integer >= {low}")
    return value


def check_finite(owner: str, name: str, value: Any) -> float:
    """``value`` if it is a finite real number; a one-line ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}: {name}={value!r}; allowed: a finite number")
    return float(value)


def check_positive(owner: str, name: str, value: Any) -> float:
    """``value`` if it is a finite number > 0 (norm floors such as ``eps``); a one-line ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}: {name}={value!r}; allowed: a finite number > 0")
    return float(value)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str, same_length: bool = False) -> None:
    """Validate (B, H, N, d) query/key/value shapes with one-line errors."""
    for t, tn in ((q, "q"), (k, "k"), (v, "v")):
        if t.dim() != 4:
            raise ValueError(f"{name}: {tn} must have shape (B, H, N, d), got a {t.dim()}-D tensor of shape {tuple(t.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"{name}: batch and head dims must match, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{name}: q and k head dims differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{name}: k and v token counts differ: k {tuple(k.shape)} vs v {tuple(v.shape)}")
    if same_length and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{name}: this attention needs equal query and key lengths, got {q.shape[-2]} and {k.shape[-2]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"{name}: empty token axis: q {tuple(q.shape)}, k {tuple(k.shape)}")


def check_token_mask(mask: Optional[torch.Tensor], batch: int, length: int, name: str) -> Optional[torch.Tensor]:
    """Validate a boolean keep-mask of shape (B, N) (True = token takes part). Returns it as bool or None."""
    if mask is None:
        return None
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] != length:
        raise ValueError(f"{name}: token mask must have shape (B, N) = ({batch}, {length}), got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name}: token mask must be boolean (True = keep), got dtype {mask.dtype}")
    return mask


def resolve_masks(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], q_mask: Optional[torch.Tensor],
                  name: str) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Validate key and query keep-masks. With equal lengths (self-attention) the key mask also masks queries."""
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], name)
    if q_mask is None and mask is not None and q.shape[-2] == k.shape[-2]:
        q_mask = mask
    q_mask = check_token_mask(q_mask, q.shape[0], q.shape[-2], name)
    return mask, q_mask


def matmul_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on ``t`` runs in: autocast's dtype when autocast is on for t's device, else t's own."""
    return torch.get_autocast_dtype(t.device.type) if torch.is_autocast_enabled(t.device.type) else t.dtype


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype for norms and small reductions: fp32, or the input's own if wider (fp64)."""
    return torch.promote_types(t.dtype, torch.float32)


def range_safe_dtype(t: torch.Tensor) -> torch.dtype:
    """``matmul_dtype`` with fp16 lifted to fp32: for products whose values can exceed fp16's range (65504)."""
    dt = matmul_dtype(t)
    return torch.float32 if dt == torch.float16 else dt


def no_autocast(t: torch.Tensor):
    """A context with autocast off on t's device, so the code inside picks its dtypes explicitly.

    When autocast is already off this is a null context: entering ``torch.autocast`` costs tens of microseconds,
    which is most of a small attention call.
    """
    if torch.is_autocast_enabled(t.device.type):
        return torch.autocast(device_type=t.device.type, enabled=False)
    return nullcontext()


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the dispatcher round trip when t already has that dtype (hot paths)."""
    return t if t.dtype == dtype else t.to(dtype)


def apply_token_mask(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Zero the tokens of t (B, H, N, d) where the keep-mask (B, N) is False."""
    return t if mask is None else t * mask[:, None, :, None].to(t.dtype)
