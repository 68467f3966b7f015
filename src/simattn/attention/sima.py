"""SimA: softmax-free attention with l1-normalized queries and keys (Koohpayegani & Pirsiavash).

Each channel of q and of k is divided by its l1 norm over the token axis; then out = q̂ (k̂ᵀ v) (cost linear in
tokens) or (q̂ k̂ᵀ) v (cost linear in channels). No softmax, no exp, no scale.

The fast path never materializes q̂ or k̂: with s_q, s_k the per-channel l1 norms,
``q̂ (k̂ᵀ v) = q · ((kᵀv / s_k[:, None]) / s_q[:, None])`` so the whole normalization lands on the d×d matrix, and
``(q̂ k̂ᵀ) v = ((q / s_q) / s_k) kᵀ v`` in the other order. Each norm divides on its own: the product s_q s_k (and
the reciprocal of a small norm) can exceed fp16's range (65504) where neither norm does, and fp16 backends (Core ML)
run this graph as written.

``backend='triton'`` runs q̂(k̂ᵀv) as fused Triton kernels (:mod:`simattn.kernels.linear.launch`) on CUDA, or on
CPU under ``TRITON_INTERPRET=1``. ``backend='cpp'`` runs it as one compiled CPU call for eager fp32 inference
(:mod:`simattn.kernels.cpu.sima`). ``'auto'`` takes the CPU kernel wherever it is built and applies, and on a GPU
the Triton kernels wherever they apply, unless ``sima_gpu_table.json`` holds a measurement for this GPU's compute
capability, dtype, head dim and pass in which torch was faster at the nearest measured (B·H, N)
(:func:`measured_backend`).

This file holds the op side by side: the reference (:func:`sima_attention_reference`, imported), the torch path
(:func:`sima_torch`), the TorchScript formula (:func:`sima_scripted`), the bindings of the CPU kernel and the Triton
kernels, and the one dispatcher (:func:`sima_path`) that the functional op and the module's fused path both ask.

Output bound. Every channel c of q̂ and of k̂ has Σ_n |q̂_nc| ≤ 1 and Σ_j |k̂_jc| ≤ 1 (so |q̂_nc| ≤ 1), and
out[n, e] = Σ_c q̂_nc Σ_j k̂_jc v_je with |Σ_j k̂_jc v_je| ≤ max_j |v_je|. Hence

    |out[n, e]| ≤ (Σ_c |q̂_nc|) · max_j |v_je| ≤ d · max_j |v_je|   and   Σ_n |out[n, e]| ≤ d · max_j |v_je|.

At N = 1 every nonzero entry of q̂ and k̂ is ±1, so out = (Σ_c sign(q_c k_c)) · v: the bound d · |v| is reached
when q and k agree in sign (e.g. q = k); over N tokens the average |out| is at most d · max|v| / N. In fp16
terms: under fp16 autocast the op computes and returns its output in fp32, so the attention itself cannot
overflow, but the fp16 layer after it (the output projection) overflows once d · max|v| > 65504, e.g. d = 64
with |v| > 1024 at N = 1.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.cpu import sima as sima_cpu
from ._common import (HookPoint, acc_dtype, apply_token_mask, cast, check_positive, check_qkv, eager,
                      kernels_may_run, matmul_dtype, no_autocast, range_safe_dtype, resolve_masks,
                      triton_refusal as linear_triton_refusal)
from ._registry import register_attention
from .base import TokenAttention
from .reference import sima_reference as sima_attention_reference

__all__ = ["sima_attention", "sima_attention_reference", "sima_torch", "sima_scripted", "sima_normalize",
           "sima_path", "resolve_sima_order", "resolve_sima_backend", "cpp_refusal", "triton_refusal",
           "measured_backend", "gpu_table", "backend_table", "index_points", "gpu_points", "gpu_capability",
           "SimAAttention"]

_ORDERS = ("auto", "kv_first", "qk_first")
_BACKENDS = ("auto", "torch", "triton", "cpp")


# ------------------------------------------------------------------------------------------------ the dispatcher


def resolve_sima_order(order: str, n_q: int, n_k: int, head_dim: int) -> str:
    """The matmul order SimA uses. ``'auto'`` picks the cheaper one; for equal lengths this is the official rule
    (``qk_first`` when N < d)."""
    if order not in _ORDERS:
        raise ValueError(f"sima: unknown order {order!r}; expected one of {', '.join(_ORDERS)}")
    if order != "auto":
        return order
    # multiply-adds: kv_first ~ (n_q + n_k) d², qk_first ~ 2 n_q n_k d.
    return "qk_first" if 2 * n_q * n_k < (n_q + n_k) * head_dim else "kv_first"


def resolve_sima_backend(backend: str, q: torch.Tensor) -> str:
    """The implementation SimA tries first on ``q``'s device: ``'torch'``, ``'triton'`` or ``'cpp'``.

    ``'auto'`` is the compiled CPU kernel for CPU tensors where it is built, the Triton kernels on CUDA (not in
    graphs exported for other runtimes, which could not run them) and torch on other devices; :func:`sima_path`
    then says whether the one tried first runs the call.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"sima: unknown backend {backend!r}; expected one of {', '.join(_BACKENDS)}")
    if backend != "auto":
        return backend
    if q.device.type == "cuda":
        return "triton" if kernels_may_run() else "torch"
    return "cpp" if q.device.type == "cpu" and sima_cpu.available() else "torch"


def sima_path(backend: str, order: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              masked: bool) -> Tuple[str, str]:
    """(implementation, matmul order) that run one call on checked q, k, v: the one place SimA's backend and order
    are chosen, for :func:`sima_attention` and the module's fused path alike.

    An explicit backend runs or raises a one-line ValueError saying why it cannot (the Triton kernels' dtypes and
    head dims are checked here, once; the device where they launch); ``'auto'`` falls back to torch wherever the
    implementation it tries first (:func:`resolve_sima_backend`) cannot run the call or, on a GPU, was measured
    slower (:func:`measured_backend`). The Triton kernels compute q̂(k̂ᵀv), so their order is always ``kv_first``.
    """
    chosen = resolve_sima_backend(backend, q)
    resolved = resolve_sima_order(order, q.shape[-2], k.shape[-2], q.shape[-1])
    if chosen == "cpp":
        refusal = cpp_refusal(q, k, v, resolved, masked)
        if refusal is None:
            return "cpp", resolved
        if backend == "cpp":
            raise ValueError(f"sima: backend 'cpp' {refusal}; backend 'auto' runs torch there")
        return "torch", resolved
    if chosen != "triton" or q.shape[0] * q.shape[1] == 0:  # (empty batches: nothing to launch)
        return "torch", resolved
    if backend == "triton":
        if order not in ("auto", "kv_first"):
            raise ValueError(f"sima: backend 'triton' computes q̂(k̂ᵀv) (order 'auto' or 'kv_first'), got order "
                             f"{order!r}; use backend='torch' for it")
        refusal = linear_triton_refusal(q, k, v)
        if refusal is not None:
            raise ValueError(f"sima: backend 'triton' {refusal}")
        return "triton", "kv_first"
    if triton_refusal(q, k, v, resolved) is None and measured_backend(q, k, v) == "triton":
        return "triton", resolved
    return "torch", resolved


# ------------------------------------------------------------------------------------------------ auto on a GPU
_GPU_TABLE = "sima_gpu_table.json"
_PASSES = ("fwd", "fwd+bwd")
#: a table's measured points per compute capability, then per (dtype, head dim, pass): ((B·H, ((N, whether
#: Triton was at least as fast as torch), ...)), ...), both levels sorted
Grid = Tuple[Tuple[int, Tuple[Tuple[int, bool], ...]], ...]
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@functools.lru_cache(maxsize=None)
def gpu_table() -> dict:
    """The checked-in table (package data): ``{"points": [{"capability": "sm_90", "dtype": "bfloat16", "head_dim":
    64, "pass": "fwd" or "fwd+bwd", "bh": B·H, "tokens": N, "triton_ms": ..., "torch_ms": ..., ...}, ...]}``, GPU
    times measured by ``simattn bench attention --device cuda --write-table PATH``."""
    return json.loads(resources.files(__package__).joinpath(_GPU_TABLE).read_text())


def index_points(points: Sequence[dict]) -> Dict[str, Dict[Tuple[str, int, str], Grid]]:
    """Measured points → per capability and (dtype, head dim, pass), the grid :func:`measured_backend` searches.
    A point measured twice keeps its last measurement; points are never merged into thresholds."""
    cells: Dict[str, Dict[tuple, Dict[int, Dict[int, bool]]]] = {}
    for p in points:
        key = (p["dtype"], int(p["head_dim"]), p["pass"])
        row = cells.setdefault(p["capability"], {}).setdefault(key, {}).setdefault(int(p["bh"]), {})
        row[int(p["tokens"])] = p["triton_ms"] <= p["torch_ms"]
    return {cap: {key: tuple((bh, tuple(sorted(row[bh].items()))) for bh in sorted(row))
                  for key, row in keys.items()} for cap, keys in cells.items()}


@functools.lru_cache(maxsize=None)
def backend_table() -> Dict[str, Dict[Tuple[str, int, str], Grid]]:
    """The package's table, indexed (:func:`index_points`)."""
    return index_points(gpu_table()["points"])


@torch.compiler.assume_constant_result
def gpu_points(capability: str) -> Optional[Dict[Tuple[str, int, str], Grid]]:
    """The measured grids of one compute capability (None: not measured), a constant under ``torch.compile``."""
    return backend_table().get(capability)


@torch.compiler.assume_constant_result
def gpu_capability(device: torch.device) -> str:
    """``'sm_90'`` for a compute capability 9.0 device."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _nearest(entries: Sequence[tuple], x) -> tuple:
    """The entry whose first value is nearest ``x`` on a log scale (entries sorted by it): past the geometric mean
    of two neighbours, the larger. Integer comparisons only, so symbolic sizes under ``torch.compile`` give guards."""
    i = 0
    while i + 1 < len(entries) and x * x >= entries[i][0] * entries[i + 1][0]:
        i += 1
    return entries[i]


def measured_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """``'triton'`` or ``'torch'`` for CUDA tensors the kernels take: the faster at the measured point nearest this
    call (on a log scale in B·H, then in N = the longer token axis) among those of this GPU's compute capability,
    dtype (autocast's where it is on), head dim and pass (``fwd+bwd`` where autograd records the call); Triton where
    the table has no such point."""
    grids = gpu_points(gpu_capability(q.device))
    if grids is None:
        return "triton"
    pass_ = "fwd+bwd" if _needs_grad(q, k, v) else "fwd"
    grid = grids.get((_DTYPE_NAMES.get(matmul_dtype(q), ""), q.shape[-1], pass_))
    if grid is None:
        return "triton"
    _, row = _nearest(grid, q.shape[0] * q.shape[1])
    _, faster = _nearest(row, max(q.shape[-2], k.shape[-2]))
    return "triton" if faster else "torch"


# ------------------------------------------------------------------------------------------------ where each runs


def triton_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str) -> Optional[str]:
    """Why the Triton kernels cannot run this call (None where they can): they compute q̂(k̂ᵀv) for fp32, fp16 and
    bf16 with head dims up to 128, and need the triton package."""
    if order == "qk_first":
        return "computes q̂(k̂ᵀv) (order 'auto' or 'kv_first')"
    return linear_triton_refusal(q, k, v)


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether autograd records this call (the CPU kernel and the per-item path have no backward)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def cpp_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, masked: bool) -> Optional[str]:
    """Why the compiled CPU kernel cannot run this call (None where it can): it computes q̂(k̂ᵀv) in fp32 on CPU
    tensors with unit stride along d, eagerly, without a mask, autocast or anything that needs gradients."""
    if not sima_cpu.available():
        return f"is not built: {sima_cpu.unavailable_reason()}"
    if not (q.device.type == k.device.type == v.device.type == "cpu"):
        return "runs on CPU tensors only"
    if not (q.dtype == k.dtype == v.dtype == torch.float32):
        return f"takes float32 q, k and v, got {q.dtype}, {k.dtype}, {v.dtype}"
    if order != "kv_first":
        return f"computes q̂(k̂ᵀv) (order 'kv_first'), got order {order!r}"
    if masked:
        return "takes no mask"
    if _needs_grad(q, k, v):
        return "has no autograd (run it under torch.no_grad() or torch.inference_mode())"
    if torch.is_autocast_enabled("cpu"):
        return "runs without autocast"
    if q.shape != k.shape or 0 in q.shape or 0 in v.shape:
        return f"takes q and k of one nonempty shape, got {tuple(q.shape)} and {tuple(k.shape)}"
    if any(t.stride(-1) != 1 or t.stride(-2) < t.shape[-1] for t in (q, k, v)):
        return "needs unit stride along the last dim and token rows that do not overlap"
    if not eager():
        return "runs eagerly only (not traced, scripted, compiled or exported)"
    return None


# ------------------------------------------------------------------------------------------------ the op


def sima_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, order: str = "auto",
                   mask: Optional[torch.Tensor] = None, q_mask: Optional[torch.Tensor] = None,
                   eps: float = 1e-12, backend: str = "auto") -> torch.Tensor:
    """SimA attention on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) → (B, H, Nq, dv).

    Args:
        order: ``'auto'`` (cheaper order from the lengths and d), ``'kv_first'`` = q̂(k̂ᵀv), ``'qk_first'`` = (q̂k̂ᵀ)v.
        mask: boolean keep-mask (B, Nk) over key tokens; masked tokens leave the norms and the sums. When Nq == Nk
            it also masks the queries (self-attention), so kept outputs equal running on the kept tokens alone;
            masked query rows are zero.
        q_mask: explicit keep-mask (B, Nq) over queries (cross-attention).
        eps: lower bound of the l1 norms (``F.normalize`` semantics).
        backend: ``'torch'``, ``'triton'`` (fused kernels for the q̂(k̂ᵀv) order, any length: CUDA tensors, or CPU
            ones under ``TRITON_INTERPRET=1``), ``'cpp'`` (the compiled CPU kernel, see :func:`cpp_refusal` for
            where it applies) or ``'auto'`` (:func:`sima_path`).

    Norms and the folded d×d matrix are computed in fp32 under autocast; fp16 work is lifted to fp32.
    """
    check_qkv(q, k, v, "sima")
    check_positive("sima", "eps", eps)
    mask, q_mask = resolve_masks(q, k, mask, q_mask, "sima")
    path, resolved = sima_path(backend, order, q, k, v, mask is not None or q_mask is not None)
    if path == "cpp":
        return sima_cpu.sima_kv_first(q, k, v, eps)
    if path == "triton":
        return _sima_triton(q, k, v, mask, q_mask, eps)
    return sima_torch(q, k, v, resolved, mask, q_mask, eps)


def _sima_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 q_mask: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """The Triton kernels' binding: the torch path's dtypes (bf16 products under bf16, fp32 otherwise; under
    autocast the output in that compute dtype)."""
    try:
        from ..kernels.linear.launch import sima_triton
    except ImportError as e:
        raise ValueError(f"sima: backend 'triton' needs the triton package ({e})") from None
    dt = range_safe_dtype(q)
    out_dtype = dt if torch.is_autocast_enabled(q.device.type) else q.dtype
    return sima_triton(q, k, v, mask=mask, q_mask=q_mask, eps=eps, compute_dtype=dt, out_dtype=out_dtype)


def sima_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, mask: Optional[torch.Tensor] = None,
               q_mask: Optional[torch.Tensor] = None, eps: float = 1e-12) -> torch.Tensor:
    """The torch path on checked inputs: ``order`` resolved (``'kv_first'`` or ``'qk_first'``), masks resolved."""
    autocast = torch.is_autocast_enabled(q.device.type)
    dt = range_safe_dtype(q)  # fp16 has too little range for the folded scale
    out_dtype = q.dtype
    acc = torch.promote_types(q.dtype, torch.float32)  # norms and the d×d matrix: fp32 or better
    with no_autocast(q):
        q, k = apply_token_mask(q, q_mask), apply_token_mask(k, mask)
        # abs().sum() is several times faster on CPU than vector_norm(ord=1) over a strided axis.
        s_q = q.abs().sum(-2, dtype=acc).clamp_min(eps)  # (B, H, d)
        s_k = k.abs().sum(-2, dtype=acc).clamp_min(eps)
        if not autocast and _runs_per_item(q, k, v, order):
            return _kv_first_per_item(q, k, v, s_q, s_k)
        out = _normalized_product(q, k, v, s_q, s_k, order, dt, acc)
    return out if autocast else cast(out, out_dtype)


def _normalized_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor,
                        order: str, dt: torch.dtype, acc: torch.dtype) -> torch.Tensor:
    """q̂(k̂ᵀv) or (q̂k̂ᵀ)v from q, k, v (B, H, N, d) and their l1 norms s_q, s_k (B, H, d), which divide the d×d
    matrix (or the shorter operand) instead of q and k; products in ``dt``, the d×d matrix in ``acc``."""
    B, H, n_q, d = q.shape
    n_k, d_v = k.shape[-2], v.shape[-1]
    # bmm on (B·H, N, d): a view for contiguous inputs and for B = 1. Views of a fused qkv projection with B > 1
    # are copied here; running each head's strided view instead measured slower than the copy.
    q3, k3, v3 = q.reshape(B * H, n_q, d), k.reshape(B * H, n_k, d), v.reshape(B * H, n_k, d_v)
    # Each norm divides on its own, never s_q s_k, nor a reciprocal that a small norm takes past fp16's range
    # (see the module docstring): kᵀv / s_k is at most max|v|, q / s_q at most 1.
    if order == "kv_first":
        kv = torch.bmm(cast(k3, acc).transpose(1, 2), cast(v3, acc))  # (B·H, d, dv), fp32: sums over all tokens
        kv = kv / s_k.reshape(B * H, d, 1) / s_q.reshape(B * H, d, 1)
        out = torch.bmm(cast(q3, dt), cast(kv, dt))
    else:
        # Scale the shorter operand; the N×N product of q̂ and k̂ lies in [-d, d].
        s_q, s_k = s_q.reshape(B * H, 1, d), s_k.reshape(B * H, 1, d)
        if n_q <= n_k:
            attn = torch.bmm(cast(cast(q3, acc) / s_q / s_k, dt), cast(k3, dt).transpose(1, 2))
        else:
            attn = torch.bmm(cast(q3, dt), cast(cast(k3, acc) / s_k / s_q, dt).transpose(1, 2))
        out = torch.bmm(attn, cast(v3, dt))
    return out.view(B, H, n_q, d_v)


_WIDE = (torch.float32, torch.float64)
#: elements per batch item (N·H·d) from which running each batch item on the strided views of a fused projection
#: beats copying them into (B·H, N, d) blocks: about 25 µs of launches per item against about 0.6 ns per copied
#: element (measured on an AVX-512 Xeon); below it the general path is as fast
_PER_ITEM_ELEMENTS = 2 ** 14


def _runs_per_item(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str) -> bool:
    """Whether :func:`_kv_first_per_item` runs (autocast off): eager q̂(k̂ᵀv) in fp32/fp64 without autograd, on a
    CPU (a GPU copies faster than it launches), B > 1, large items, and views that (B·H, N, d) would copy."""
    B, H = q.shape[:2]
    if B == 1 or order != "kv_first" or q.device.type != "cpu":
        return False
    if not (q.dtype in _WIDE and q.dtype == k.dtype == v.dtype) or _needs_grad(q, k, v):
        return False
    large = max(q.shape[-2], k.shape[-2]) * H * q.shape[-1] >= _PER_ITEM_ELEMENTS
    return large and not all(t.stride(0) == H * t.stride(1) for t in (q, k, v)) and eager()


def _kv_first_per_item(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s_q: torch.Tensor,
                       s_k: torch.Tensor) -> torch.Tensor:
    """q̂(k̂ᵀv) without autograd, one batch item at a time on the strided (H, N, d) views of a fused projection:
    no copy of q, k or v. The output (B, H, N, dv) is laid out token-major, (B, N, H, dv) in memory, so merging
    the heads after it is a view. The same operations and rounding as :func:`_normalized_product`."""
    B, H, n_q, _ = q.shape
    s_q, s_k = s_q.unsqueeze(-1), s_k.unsqueeze(-1)  # (B, H, d, 1)
    out = q.new_empty(B, n_q, H, v.shape[-1]).transpose(1, 2)
    for b in range(B):
        kv = torch.bmm(k[b].transpose(1, 2), v[b]).div_(s_k[b]).div_(s_q[b])
        torch.bmm(q[b], kv, out=out[b])
    return out


def sima_scripted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                  eps: float) -> torch.Tensor:
    """q̂(k̂ᵀv) in fp32 (or fp64) as plain ops that TorchScript compiles: the module's path when scripted, where the
    other paths' choices (dtypes, order, kernels) are Python. ``mask`` (B, Nk) masks the queries too when the
    lengths are equal."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_ = apply_token_mask(q, mask if q.shape[-2] == k.shape[-2] else None)
    k_ = apply_token_mask(k, mask)
    s_q = q_.abs().sum(-2, dtype=acc).clamp_min(eps).unsqueeze(-1)
    s_k = k_.abs().sum(-2, dtype=acc).clamp_min(eps).unsqueeze(-1)
    return (q_.to(acc) @ ((k_.to(acc).transpose(-2, -1) @ v.to(acc)) / s_k / s_q)).to(v.dtype)


def sima_normalize(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None,
                   eps: float = 1e-12) -> Tuple[torch.Tensor, torch.Tensor]:
    """Materialize q̂ and k̂ (for visualization and the reference), l1 over tokens in fp32."""
    check_positive("sima", "eps", eps)
    mask, q_mask = resolve_masks(q, k, mask, None, "sima")
    q_hat = F.normalize(apply_token_mask(q.to(acc_dtype(q)), q_mask), p=1.0, dim=-2, eps=eps)
    k_hat = F.normalize(apply_token_mask(k.to(acc_dtype(k)), mask), p=1.0, dim=-2, eps=eps)
    return q_hat, k_hat


@register_attention("sima")
class SimAAttention(TokenAttention):
    """SimA multi-head attention with timm's ``Attention`` constructor signature.

    Extra options: ``order`` ('auto' | 'kv_first' | 'qk_first'), ``eps`` (l1 norm floor), ``backend``
    ('auto' | 'torch' | 'triton' | 'cpp', see :func:`sima_attention`).
    The official code builds ``attn_drop`` but never applies it (the q̂(k̂ᵀv) order forms no weight matrix), so
    ``attn_drop > 0`` is rejected here rather than silently ignored.
    ``qk_hook`` is a :class:`HookPoint` called with (q̂, k̂) only when a forward hook is registered on it.
    """

    exp_complexity = "0"
    fuses_projection = True

    def __init__(self, dim: int, num_heads: int = 8, *, order: str = "auto", eps: float = 1e-12,
                 backend: str = "auto", **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        resolve_sima_order(order, 1, 1, 1)  # validate early
        check_positive("SimAAttention", "eps", eps)
        if backend not in _BACKENDS:
            raise ValueError(f"SimAAttention: unknown backend {backend!r}; expected one of {', '.join(_BACKENDS)}")
        self.order = order
        self.eps = eps
        self.backend = backend
        self.qk_hook = HookPoint()

    def attend_fused(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Eager fp32/fp64 SimA from x without a mask, qk-norm, hook or autocast, on the views of the fused
        projection, with the implementation :func:`sima_path` chooses; for torch, both l1 norms in one reduction
        over the q and k columns of the projection (at small token counts SimA is bound by the number of ops it
        launches). None otherwise, and :meth:`attend` runs :func:`sima_attention`."""
        if (x.dtype not in _WIDE or torch.is_autocast_enabled(x.device.type) or self.qk_hook.has_hooks
                or not isinstance(self.q_norm, nn.Identity) or not isinstance(self.k_norm, nn.Identity)
                or not eager()):
            return None
        B, N, C = x.shape
        H, d = self.num_heads, self.head_dim
        qkv = self.qkv(x)
        q, k, v = qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        check_qkv(q, k, v, "sima")  # as sima_attention does (an empty token axis, for one)
        path, order = sima_path(self.backend, self.order, q, k, v, masked=False)
        if path == "cpp":
            return sima_cpu.sima_kv_first(q, k, v, self.eps)
        if path == "triton":
            return _sima_triton(q, k, v, None, None, self.eps)
        s_q, s_k = qkv[..., :2 * C].abs().sum(1).clamp_min(self.eps).view(B, 2, H, d).unbind(1)  # (B, H, d) each
        if _runs_per_item(q, k, v, order):
            return _kv_first_per_item(q, k, v, s_q, s_k)
        return _normalized_product(q, k, v, s_q, s_k, order, x.dtype, x.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():
            return sima_scripted(q, k, v, mask, self.eps)
        else:
            if self.qk_hook.has_hooks:
                self.qk_hook(*sima_normalize(q, k, mask, self.eps))
            return sima_attention(q, k, v, order=self.order, mask=mask, eps=self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, order={self.order!r}, backend={self.backend!r}"
