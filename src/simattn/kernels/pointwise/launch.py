"""Point-wise activation attention, out = s · h(q kᵀ/√d + b) v, as flash-style Triton kernels, forward and backward:
sigmoid attention (``sigmoid_attention(..., backend='triton')``: h = σ, b = −log n or a given number, s = 1) and
ReLU attention (``relu_attention(..., backend='triton')``: h = relu or σ, b = 0, s = L^(-a)). The kernels and the
maths are :mod:`simattn.kernels.pointwise.kernels`; this module launches them.

Host path, :mod:`simattn.kernels.host`'s (its launch modes, plan cache, direct launches and
:func:`~simattn.kernels.host.dry_run`): the first call at a signature (shapes, strides, dtypes, mask present, h, which of b and s apply, output
dtype, device) plans its launches; a repeat call looks the plan up, allocates its outputs and launches, checking
nothing (the kinds' functions checked the inputs). Eagerly the autograd is a ``torch.autograd.Function``; while
compiling, exporting or tracing, and on tensor subclasses or under dispatch modes, the same calls run behind the
custom ops ``simattn::activation_attn_fwd`` and ``simattn::activation_attn_bwd`` with fake implementations and
registered autograd, all made by :func:`~simattn.kernels.host.op`. On a GPU the key (or query) tile, warps and
pipeline depth are autotuned once per (streamed tokens rounded to a power of two, d, dv, h, dtypes)
(``SIMATTN_TRITON_AUTOTUNE=0``: the first configuration).

q, k, v are read through their strides (views of a fused qkv projection are not copied); the gradients come back
contiguous in q's, k's and v's dtypes, the output in ``out_dtype``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from .. import host
from . import kernels as K

__all__ = ["activation_triton", "TRITON_H"]

#: h the kernels compute, by name, with their constexpr flags
TRITON_H = {"relu": dict(SIGMOID=False), "sigmoid": dict(SIGMOID=True)}
# queries (forward, dq) or keys (dk, dv) a program holds: on a GPU by head size; in the interpreter as small as the
# streamed tile (the host's INTERPRETER_BLOCK, 32), so that short test inputs span several tiles
_INTERPRETER_BLOCK_M = 32


def _block_m(d: int, e: int, mode) -> int:
    if mode.interpret:
        return _INTERPRETER_BLOCK_M
    return 128 if max(d, e) <= 64 else 64


def _flags(activation: str, bias: Optional[float], alpha: Optional[float]) -> dict:
    return dict(TRITON_H[activation], LOG_N_BIAS=bias is None, LENGTH_SCALE=alpha is not None)


def _scalars(q: torch.Tensor, bias: Optional[float], alpha: Optional[float]) -> Tuple[float, float, float]:
    """(c = 1/√d, b or 0, a or 0): the kernels' float arguments, not part of a plan; floats always (Triton
    specializes an int argument on its value, which a plan's direct launches do not look at)."""
    return float(q.shape[-1] ** -0.5), 0.0 if bias is None else float(bias), 0.0 if alpha is None else float(alpha)


class _ForwardCall:
    """A forward at one signature: out (B, H, Nq, dv) in ``out_dtype``."""

    def __init__(self, flags: dict, q, k, v, mask, out_dtype: torch.dtype, mode):
        B, H, n_q, d = q.shape
        n_k, e = k.shape[-2], v.shape[-1]
        block_m = _block_m(d, e, mode)
        self.mode, self.out_shape, self.out_dtype = mode, (B, H, n_q, e), out_dtype
        self.head = (H, n_q, n_k, float(n_k), d, e)
        self.strides = (*q.stride(), *k.stride(), *v.stride(), n_q * e * H, n_q * e, e, 1, *host.mask_strides(mask),
                        triton.next_power_of_2(n_k))
        self.launch = host.Launch(K.fwd_kernel, (triton.cdiv(n_q, block_m), B, H), dict(
            flags, HAS_KM=mask is not None, QK_NATIVE=host.native(q, k), PV_NATIVE=v.dtype == torch.bfloat16,
            UPCAST=mode.interpret, PREC=host.precision(q), BLOCK_D=host.block(d), BLOCK_E=host.block(e),
            BLOCK_M=block_m), mode)

    def __call__(self, q, k, v, mask, scalars):
        out = torch.empty(self.out_shape, device=q.device, dtype=self.out_dtype)
        with self.mode.device():
            self.launch(q, k, v, host.mask_bytes(mask, q), out, *self.head, *scalars, *self.strides)
        return out


class _BackwardCall:
    """The gradients at one signature: dk, dv from one launch over key tiles, dq from one over query tiles."""

    def __init__(self, flags: dict, g, q, k, v, mask, mode):
        B, H, n_q, d = q.shape
        n_k, e = k.shape[-2], v.shape[-1]
        block_m = _block_m(d, e, mode)
        self.mode = mode
        self.head = (H, n_q, n_k, float(n_k), d, e)
        self.strides = (*q.stride(), *k.stride(), *v.stride(), *g.stride(), *host.mask_strides(mask))
        consts = dict(flags, HAS_KM=mask is not None, QK_NATIVE=host.native(q, k), VG_NATIVE=host.native(v, g),
                      BF16_DS=q.dtype == torch.bfloat16,
                      UPCAST=mode.interpret, PREC=host.precision(q), BLOCK_D=host.block(d), BLOCK_E=host.block(e),
                      BLOCK_M=block_m)
        self.buckets = (triton.next_power_of_2(n_q), triton.next_power_of_2(n_k))
        self.dkdv = host.Launch(K.dkdv_kernel, (triton.cdiv(n_k, block_m), B, H),
                               dict(consts, PV_NATIVE=g.dtype == torch.bfloat16), mode)
        self.dq = host.Launch(K.dq_kernel, (triton.cdiv(n_q, block_m), B, H), consts, mode)

    def __call__(self, g, q, k, v, mask, scalars):
        dq = host.grad_like(q)
        dk = host.grad_like(k)
        dv = host.grad_like(v)
        m = host.mask_bytes(mask, q)
        with self.mode.device():
            self.dkdv(q, k, v, g, m, dk, dv, *self.head, *scalars, *self.strides, self.buckets[0])
            self.dq(q, k, v, g, m, dq, *self.head, *scalars, *self.strides, self.buckets[1])
        return dq, dk, dv


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], activation: str,
             bias: Optional[float], alpha: Optional[float], out_dtype: torch.dtype) -> torch.Tensor:
    """The output (:class:`_ForwardCall`), planned once per signature."""
    call = host.plan(f"attention with h={activation}", ("activation forward", activation, bias is None,
                                                        alpha is None, out_dtype), (q, k, v, mask),
                     lambda mode: _ForwardCall(_flags(activation, bias, alpha), q, k, v, mask, out_dtype, mode))
    return call(q, k, v, mask, _scalars(q, bias, alpha))


def _fake(q, k, v, mask, activation, bias, alpha, out_dtype):
    return q.new_empty(*q.shape[:-1], v.shape[-1], dtype=out_dtype)


def _backward(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              activation: str, bias: Optional[float], alpha: Optional[float],
              out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (:class:`_BackwardCall`), planned once per signature."""
    call = host.plan(f"attention with h={activation}", ("activation backward", activation, bias is None,
                                                        alpha is None), (q, k, v, mask, g),
                     lambda mode: _BackwardCall(_flags(activation, bias, alpha), g, q, k, v, mask, mode))
    return call(g, q, k, v, mask, _scalars(q, bias, alpha))


# Registered for CUDA and, for the interpreter, CPU tensors.
_call = host.op("simattn::activation_attn", _forward, _backward, _fake, tensors=4, grads=3)


# ------------------------------------------------------------------------------------------------ entry point


def activation_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, activation: str,
                      bias: Optional[float] = None, alpha: Optional[float] = None,
                      mask: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """s · h(q kᵀ/√d + b) v on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) → (B, H, Nq, dv), with
    ``activation`` h (a key of :data:`TRITON_H`), b = ``bias`` or, when None, −log n, and s = n^(-``alpha``) or,
    when None, 1; n is the number of keys the (B, Nk) keep-``mask`` keeps. Differentiable in q, k and v. Called by
    :func:`simattn.attention.sigmoid.sigmoid_attention` and :func:`simattn.attention.relu.relu_attention`, which
    have checked the inputs and the backend chooser, :mod:`simattn.attention.backends`; a device the kernels cannot run
    on is refused here."""
    out_dtype = out_dtype or v.dtype
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _call(q, grad, q, k, v, mask, activation, bias, alpha, out_dtype)
