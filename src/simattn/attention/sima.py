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
capability, dtype, head dim and pass in which torch was faster at the nearest measured (B·H, N): the backend
chooser's policy for SimA (:mod:`simattn.attention.backends`).

This file holds SimA's three paths side by side: the reference (:func:`sima_attention_reference`, imported), the
one torch path (:func:`_sima_torch`: batched products, or eagerly on a CPU one batch item at a time on the views of a
fused projection, and under TorchScript the same batched products in fp32) and the bindings of the kernels (the CPU
kernel and the Triton kernels), with the one dispatcher (:func:`sima_path`, which asks the backend chooser) that the
functional op and the module's fused path both ask. The l1 norms are :func:`sima_l1_norms` wherever SimA takes them
(the torch path, the module's fused path, :func:`sima_normalize` and XCiT-SimA's class attention).

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

from typing import Optional, Tuple

import torch
from torch import nn

from ..kernels import linear as linear_kernels
from ..kernels.cpu import sima as sima_cpu
from ._common import (HookPoint, acc_dtype, apply_token_mask, cast, check_positive, check_qkv, eager, no_autocast,
                      range_safe_dtype, resolve_masks)
from ._registry import register_attention
from .backends import Call, Policy, check_backend, choose, register_policy, triton_limits
from .base import TokenAttention
from .reference import sima_reference as sima_attention_reference

# What a user calls. The other public names serve the package: sima_l1_norms (XCiT-SimA's class attention),
# resolve_sima_order (the attention benchmark sizes its inputs by it) and sima_path (the dispatcher).
__all__ = ["sima_attention", "sima_attention_reference", "sima_normalize", "SimAAttention"]

_ORDERS = ("auto", "kv_first", "qk_first")


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


def sima_path(backend: str, order: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              masked: bool) -> Tuple[str, str]:
    """(implementation, matmul order) that run one call on checked q, k, v, for :func:`sima_attention` and the
    module's fused path alike: the implementation is the backend chooser's (:func:`simattn.attention.backends.choose`:
    the CPU kernel, the Triton kernels where the measured table does not find torch faster, or torch), the order
    :func:`resolve_sima_order`'s. The Triton kernels compute q̂(k̂ᵀv), so their order is always ``kv_first``."""
    resolved = resolve_sima_order(order, q.shape[-2], k.shape[-2], q.shape[-1])
    path = choose("sima", backend, Call(q, k, v, extra=(order, resolved, masked)))
    return path, "kv_first" if path == "triton" else resolved


# SimA's policy reads ``Call.extra`` = (order asked for, the order 'auto' resolves to, whether a token mask takes
# part); a call without it is the plain one
_PLAIN = ("kv_first", "kv_first", False)


def _sima_takes_triton(call: Call) -> Optional[str]:
    """SimA's linear kernels compute q̂(k̂ᵀv) only."""
    if (call.extra or _PLAIN)[0] == "qk_first":
        return "computes q̂(k̂ᵀv) (order 'auto' or 'kv_first'), got order 'qk_first'"
    return triton_limits(call.q, call.k, call.v)


def _sima_takes_cpp(call: Call) -> Optional[str]:
    """The compiled CPU kernel: q̂(k̂ᵀv) in fp32 on CPU tensors with unit stride along d, eagerly, without a mask,
    autocast or anything that needs gradients (it has no autograd)."""
    q, k, v = call.q, call.k, call.v
    _, resolved, masked = call.extra or _PLAIN
    if call.device != "cpu":
        return "runs on CPU tensors only"
    if not (q.dtype == k.dtype == v.dtype == torch.float32):
        return f"takes float32 q, k and v, got {q.dtype}, {k.dtype}, {v.dtype}"
    if resolved != "kv_first":
        return f"computes q̂(k̂ᵀv) (order 'kv_first'), got order {resolved!r}"
    if masked:
        return "takes no mask"
    if call.grad:  # before the graph state, which costs a training call a microsecond
        return "has no autograd (run it under torch.no_grad() or torch.inference_mode())"
    # the graph before the loader, whose lock Dynamo cannot trace, and before the checks on sizes, which would put
    # guards in a graph
    if call.graph is not None:
        return "runs eagerly only (not traced, scripted, compiled or exported)"
    if not sima_cpu.available():
        return f"is not built: {sima_cpu.unavailable_reason()}"
    if call.autocast is not None:
        return "runs without autocast"
    if q.shape != k.shape or 0 in q.shape or 0 in v.shape:
        return f"takes q and k of one nonempty shape, got {tuple(q.shape)} and {tuple(k.shape)}"
    if any(t.stride(-1) != 1 or t.stride(-2) < t.shape[-1] for t in (q, k, v)):
        return "needs unit stride along the last dim and token rows that do not overlap"
    return None


register_policy("sima", Policy(
    {"triton": _sima_takes_triton, "cpp": _sima_takes_cpp}, table="sima_gpu_table.json",
    why="auto: the CPU kernel on CPU where it is built and applies (inference); on CUDA the Triton kernels where "
        "they take the call, unless the measured table's nearest point found torch faster",
    # where 'auto' resolves SimA's order to (q̂k̂ᵀ)v, torch's product is the cheaper one
    auto=lambda call: (call.extra or _PLAIN)[1] == "kv_first"))


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether autograd records this call (the per-item branch has no backward)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


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
            ones under ``TRITON_INTERPRET=1``), ``'cpp'`` (the compiled CPU kernel: eager fp32 inference without a
            mask) or ``'auto'`` (:func:`sima_path`).

    Norms and the folded d×d matrix are computed in fp32 under autocast; fp16 work is lifted to fp32.
    """
    check_qkv(q, k, v, "sima")
    check_positive("sima", "eps", eps)
    mask, q_mask = resolve_masks(q, k, mask, q_mask, "sima")
    path, resolved = sima_path(backend, order, q, k, v, mask is not None or q_mask is not None)
    out = _kernels(path, q, k, v, mask, q_mask, eps)
    return _sima_torch(q, k, v, resolved, mask, q_mask, eps) if out is None else out


def _kernels(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
             q_mask: Optional[torch.Tensor], eps: float) -> Optional[torch.Tensor]:
    """The kernels' bindings: the CPU kernel's or the Triton kernels' output where ``path`` names one of them, None
    for torch. The Triton kernels take the torch path's dtypes (bf16 products under bf16, fp32 otherwise; under
    autocast the output in that compute dtype)."""
    if path == "cpp":
        return sima_cpu.sima_kv_first(q, k, v, eps)
    if path != "triton":
        return None
    dt = range_safe_dtype(q)
    out_dtype = dt if torch.is_autocast_enabled(q.device.type) else q.dtype
    return linear_kernels.sima_triton(q, k, v, mask=mask, q_mask=q_mask, eps=eps, compute_dtype=dt,
                                      out_dtype=out_dtype)


# ------------------------------------------------------------------------------------------------ the torch path


def sima_l1_norms(x: torch.Tensor, eps: float, dim: int = -2) -> torch.Tensor:
    """SimA's per-channel l1 norms of x over its token axis ``dim``, floored at ``eps``, in fp32 (fp64 for fp64
    inputs) whatever x's dtype: x (B, H, N, d) → (B, H, d). Masked tokens are zero in x (``apply_token_mask``), so
    they leave the sums, and a channel with no kept token takes the floor (its q̂ or k̂ is then 0)."""
    # abs().sum() is several times faster on CPU than vector_norm(ord=1) over a strided axis.
    return x.abs().sum(dim, dtype=acc_dtype(x)).clamp_min(eps)


def _sima_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, mask: Optional[torch.Tensor],
                q_mask: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """The torch path on checked inputs: ``order`` resolved (``'kv_first'`` or ``'qk_first'``), masks resolved.
    Products in the matmul dtype (autocast's, else the inputs'), fp16 lifted to fp32; the output in the products'
    dtype under autocast, else in the inputs'. TorchScript compiles the first branch alone, the products in fp32
    (fp64 for fp64 inputs): autocast and the eager layout choices are Python."""
    if torch.jit.is_scripting():
        return cast(_masked_product(q, k, v, order, mask, q_mask, eps, acc_dtype(q)), q.dtype)
    else:
        autocast = torch.is_autocast_enabled(q.device.type)
        dt = range_safe_dtype(q)  # fp16 has too little range for the folded scale
        out_dtype = q.dtype
        with no_autocast(q):
            out = _masked_product(q, k, v, order, mask, q_mask, eps, dt)
        return out if autocast else cast(out, out_dtype)


def _masked_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, mask: Optional[torch.Tensor],
                    q_mask: Optional[torch.Tensor], eps: float, dt: torch.dtype) -> torch.Tensor:
    """Masked tokens zeroed, their l1 norms, then :func:`_normalized_product` with the products in ``dt``."""
    q, k = apply_token_mask(q, q_mask), apply_token_mask(k, mask)
    return _normalized_product(q, k, v, sima_l1_norms(q, eps), sima_l1_norms(k, eps), order, dt)


def _normalized_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor,
                        order: str, dt: torch.dtype) -> torch.Tensor:
    """q̂(k̂ᵀv) or (q̂k̂ᵀ)v from q, k, v (B, H, N, d) and their l1 norms s_q, s_k (B, H, d), which divide the d×d
    matrix (or the shorter operand) instead of q and k; products in ``dt``, norms and the d×d matrix in fp32 or
    wider. Eagerly on a CPU, large items with B > 1 run one batch item at a time (:func:`_runs_per_item`)."""
    if not torch.jit.is_scripting():
        if _runs_per_item(q, k, v, order, dt):
            return _kv_first_per_item(q, k, v, s_q, s_k)
    acc = acc_dtype(q)
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


def _runs_per_item(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, dt: torch.dtype) -> bool:
    """Whether :func:`_kv_first_per_item` runs: eager q̂(k̂ᵀv) in fp32/fp64 with the products in the inputs' dtype
    (not under bf16 autocast), without autograd, on a CPU (a GPU copies faster than it launches), B > 1, large
    items, and views that (B·H, N, d) would copy."""
    B, H = q.shape[:2]
    if B == 1 or order != "kv_first" or q.device.type != "cpu":
        return False
    if not (q.dtype in _WIDE and dt == q.dtype == k.dtype == v.dtype) or _needs_grad(q, k, v):
        return False
    large = max(q.shape[-2], k.shape[-2]) * H * q.shape[-1] >= _PER_ITEM_ELEMENTS
    return large and not all(t.stride(0) == H * t.stride(1) for t in (q, k, v)) and eager()


def _kv_first_per_item(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s_q: torch.Tensor,
                       s_k: torch.Tensor) -> torch.Tensor:
    """q̂(k̂ᵀv) without autograd, one batch item at a time on the strided (H, N, d) views of a fused projection:
    no copy of q, k or v. The output (B, H, N, dv) is laid out token-major, (B, N, H, dv) in memory, so merging
    the heads after it is a view. The same operations and rounding as the batched products."""
    B, H, n_q, _ = q.shape
    s_q, s_k = s_q.unsqueeze(-1), s_k.unsqueeze(-1)  # (B, H, d, 1)
    out = q.new_empty(B, n_q, H, v.shape[-1]).transpose(1, 2)
    for b in range(B):
        kv = torch.bmm(k[b].transpose(1, 2), v[b]).div_(s_k[b]).div_(s_q[b])
        torch.bmm(q[b], kv, out=out[b])
    return out


def sima_normalize(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None,
                   eps: float = 1e-12) -> Tuple[torch.Tensor, torch.Tensor]:
    """Materialize q̂ and k̂ (for visualization; the module's ``qk_hook`` sees them), l1 over tokens in fp32."""
    check_positive("sima", "eps", eps)
    mask, q_mask = resolve_masks(q, k, mask, None, "sima")
    q, k = apply_token_mask(q, q_mask), apply_token_mask(k, mask)
    return (q.to(acc_dtype(q)) / sima_l1_norms(q, eps).unsqueeze(-2),
            k.to(acc_dtype(k)) / sima_l1_norms(k, eps).unsqueeze(-2))


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
        check_backend("SimAAttention", "sima", backend)
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
        out = _kernels(path, q, k, v, None, None, self.eps)
        if out is not None:
            return out
        s_q, s_k = sima_l1_norms(qkv[..., :2 * C], self.eps, dim=1).view(B, 2, H, d).unbind(1)  # (B, H, d) each
        return _normalized_product(q, k, v, s_q, s_k, order, x.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():
            # the torch path's TorchScript branch: the chooser, the kernels and the hook point are Python
            q_mask = mask if q.shape[-2] == k.shape[-2] else None
            return _sima_torch(q, k, v, "kv_first", mask, q_mask, self.eps)
        else:
            if self.qk_hook.has_hooks:
                self.qk_hook(*sima_normalize(q, k, mask, self.eps))
            return sima_attention(q, k, v, order=self.order, mask=mask, eps=self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, order={self.order!r}, backend={self.backend!r}"
