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
    "check_device",
    "check_finite",
    "check_per_head",
    "check_positive",
    "check_rate",
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


def eager() -> bool:
    """Not being traced, scripted, compiled or exported: memory-layout and launch-count choices made only for eager
    speed stay out of captured graphs (a runtime would have to run their copies and views as written)."""
    return not (torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling() or fx_tracing())


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


def check_rate(owner: str, name: str, value: Any) -> float:
    """``value`` if it is a probability in [0, 1) (dropout rates: 1 would scale the kept values by 1/0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{owner}: {name}={value!r}; allowed: a number in [0, 1)")
    return float(value)


def check_device(owner: str, device: Any) -> None:
    """A one-line ValueError when ``device`` is not a device name, or names one this machine lacks (``'cuda'``
    without CUDA, ``'cuda:3'`` on a machine with one GPU); None passes (the default device)."""
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{owner}: device={device!r} is not a device; allowed: e.g. 'cpu', 'cuda', 'cuda:0'") from None
    backend = getattr(torch, dev.type, None) if dev.type not in ("cpu", "meta") else None
    is_available = getattr(backend, "is_available", None)
    if is_available is None:  # cpu, meta, and kinds torch has no availability query for
        return
    if not is_available():
        raise ValueError(f"{owner}: device={device!r} was asked for, but {dev.type.upper()} is not available on this "
                         f"machine; allowed: 'cpu'")
    count = getattr(backend, "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise ValueError(f"{owner}: device={device!r} was asked for, but this machine has {count()} {dev.type} "
                         f"device(s); allowed: indices 0 to {count() - 1}")


def check_per_head(owner: str, name: str, value: Any, q: torch.Tensor) -> Any:
    """A per-head option (XCA's temperature, XNorm's γ) for q (B, H, N, d): a finite number, or a tensor on q's
    device with one value, or one per head shaped (H,), (H, 1, 1), (1, H, 1, 1) or (B, H, 1, 1). Returns the
    number, or the tensor shaped to broadcast against (B, H, ·, ·); a one-line ValueError otherwise.

    Shapes only, no values: reading a tensor's values would wait for the GPU on every call."""
    if not torch.is_tensor(value):
        return check_finite(owner, name, value)
    if value.device != q.device and value.dim() > 0:  # torch itself lets 0-dim CPU tensors meet any device
        raise ValueError(f"{owner}: {name} is on {value.device} but q is on {q.device}; allowed: one device")
    B, H = q.shape[0], q.shape[1]
    if value.dim() == 1 and value.shape[0] == H:
        return value.reshape(1, H, 1, 1)
    shape = [1] * (4 - value.dim()) + list(value.shape) if value.dim() <= 4 else list(value.shape)
    if len(shape) != 4 or not (shape[0] == 1 or shape[0] == B) or not (shape[1] == 1 or shape[1] == H) \
            or shape[2] != 1 or shape[3] != 1:
        raise ValueError(f"{owner}: {name} has shape {tuple(value.shape)}; expected one value per head for "
                         f"{H} heads: shape ({H},), ({H}, 1, 1) or (1, {H}, 1, 1), or a single value")
    return value


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str, same_length: bool = False) -> None:
    """Validate (B, H, N, d) query/key/value shapes and their device with one-line errors."""
    qs, ks, vs = q.shape, k.shape, v.shape  # each read once: every call of every kind runs this
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        tn, t = next((tn, t) for tn, t in (("q", qs), ("k", ks), ("v", vs)) if len(t) != 4)
        raise ValueError(f"{name}: {tn} must have shape (B, H, N, d), got a {len(t)}-D tensor of shape {tuple(t)}")
    if q.device != k.device or k.device != v.device:
        raise ValueError(f"{name}: q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if qs[0] != ks[0] or qs[1] != ks[1] or ks[0] != vs[0] or ks[1] != vs[1]:
        raise ValueError(f"{name}: batch and head dims must match, got q {tuple(qs)}, k {tuple(ks)}, v {tuple(vs)}")
    if qs[3] != ks[3]:
        raise ValueError(f"{name}: q and k head dims differ: q {tuple(qs)} vs k {tuple(ks)}")
    if ks[2] != vs[2]:
        raise ValueError(f"{name}: k and v token counts differ: k {tuple(ks)} vs v {tuple(vs)}")
    if same_length and qs[2] != ks[2]:
        raise ValueError(f"{name}: this attention needs equal query and key lengths, got {qs[2]} and {ks[2]}")
    if qs[2] == 0 or ks[2] == 0:
        raise ValueError(f"{name}: empty token axis: q {tuple(qs)}, k {tuple(ks)}")


def check_token_mask(mask: Optional[torch.Tensor], batch: int, length: int, name: str,
                     device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """Validate a boolean keep-mask of shape (B, N) (True = token takes part), on ``device`` when given. Returns it
    as bool or None."""
    if mask is None:
        return None
    if device is not None and mask.device != device:
        raise ValueError(f"{name}: token mask is on {mask.device} but the keys are on {device}; allowed: one device")
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] != length:
        raise ValueError(f"{name}: token mask must have shape (B, N) = ({batch}, {length}), got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name}: token mask must be boolean (True = keep), got dtype {mask.dtype}")
    return mask


def resolve_masks(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], q_mask: Optional[torch.Tensor],
                  name: str) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Validate key and query keep-masks. With equal lengths (self-attention) the key mask also masks queries."""
    if mask is None and q_mask is None:
        return None, None
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], name, k.device)
    if q_mask is None and mask is not None and q.shape[-2] == k.shape[-2]:
        q_mask = mask
    q_mask = check_token_mask(q_mask, q.shape[0], q.shape[-2], name, q.device)
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
