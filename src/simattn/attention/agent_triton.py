"""Agent attention's broadcast step, O = softmax(Q Aᵀ/√d + B) V_A, on Triton kernels, forward and backward: the
queries read the n agents' state without an N×n tensor in memory (the bias B aside, which is an input). The kernels
and the maths are :mod:`simattn.attention.agent_kernels`; this module launches them.

Host path, as :mod:`simattn.attention.linear_triton`'s (whose launch modes, plan cache, direct launches and
:func:`~simattn.attention.linear_triton.dry_run` it shares): the first call at a signature plans its launches; a
repeat call looks the plan up, allocates its outputs and launches. Eagerly the autograd is a
``torch.autograd.Function``; while compiling, exporting or tracing, on tensor subclasses and under dispatch modes
the same calls run behind the custom ops ``simattn::agent_broadcast_fwd`` and ``simattn::agent_broadcast_bwd``.

q, agents, V_A and B are read through their strides (B may broadcast over the batch and heads: stride 0); the
gradients come back contiguous in the inputs' dtypes, B's summed to B's shape.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from . import agent_kernels as K
from . import linear_triton as LT

__all__ = ["agent_broadcast_triton"]
# queries a backward program streams at least, when the query axis is split over programs (GPU; interpreter: 32)
_CHUNK_LEAST = 256


def _bias_view(bias: Optional[torch.Tensor], q: torch.Tensor, n_a: int) -> torch.Tensor:
    """B broadcast to (B, H, N, n) (a view), or a placeholder pointer for none."""
    if bias is None:
        return q
    return bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(*q.shape[:-1], n_a)


def _strides(q, agents, w, bias) -> tuple:
    view = (0,) * 4 if bias is None else _bias_view(bias, q, agents.shape[-2]).stride()
    return (*q.stride(), *agents.stride(), *w.stride(), *view)


def _consts(q, agents, mode) -> dict:
    return dict(QA_NATIVE=LT._native(q, agents), UPCAST=mode.interpret, PREC=LT._precision(q),
                BLOCK_A=LT._block(agents.shape[-2]), BLOCK_D=LT._block(q.shape[-1]))


class _ForwardCall:
    """A forward at one signature: out (B, H, N, dv) in ``out_dtype``."""

    def __init__(self, q, agents, w, bias, out_dtype: torch.dtype, mode):
        B, H, n_q, d = q.shape
        e = w.shape[-1]
        self.mode, self.out_shape, self.out_dtype = mode, (B, H, n_q, e), out_dtype
        self.sizes = (n_q, agents.shape[-2], d, e)
        self.strides = (*_strides(q, agents, w, bias), H * n_q * e, n_q * e, e, 1, triton.next_power_of_2(n_q))
        block = LT._INTERPRETER_BLOCK if mode.interpret else K.FWD_BLOCK
        self.launch = LT._Launch(K._fwd_kernel, (triton.cdiv(n_q, block), B, H), dict(
            _consts(q, agents, mode), HAS_BIAS=bias is not None, BLOCK_E=LT._block(e)), mode)

    def __call__(self, q, agents, w, bias):
        out = torch.empty(self.out_shape, device=q.device, dtype=self.out_dtype)
        with self.mode.device():
            self.launch(q, agents, w, _bias_view(bias, q, agents.shape[-2]), out, *self.sizes,
                        float(q.shape[-1] ** -0.5), *self.strides)
        return out


class _BackwardCall:
    """The gradients at one signature: dq (and dB) per query tile, dA and dW as partial sums per chunk of queries."""

    def __init__(self, g, q, agents, w, bias, bias_grad: bool, mode):
        B, H, n_q, d = q.shape
        n_a, e = agents.shape[-2], w.shape[-1]
        self.mode, self.bias_grad = mode, bias_grad
        least = LT._INTERPRETER_BLOCK if mode.interpret else _CHUNK_LEAST
        self.splits = min(triton.cdiv(2 * mode.sms, B * H), triton.cdiv(n_q, least))
        chunk = triton.cdiv(n_q, self.splits)
        self.sizes = (H, n_q, n_a, d, e, float(d ** -0.5), chunk)
        self.strides = (*_strides(q, agents, w, bias), *g.stride(), triton.next_power_of_2(chunk))
        self.launch = LT._Launch(K._bwd_kernel, (self.splits, B, H), dict(
            _consts(q, agents, mode), HAS_BIAS=bias is not None, BIAS_GRAD=bias_grad, BLOCK_E=LT._block(e)), mode)

    def __call__(self, g, q, agents, w, bias):
        B, H, n_q, _ = q.shape
        n_a = agents.shape[-2]
        dev = q.device
        dq = torch.empty(q.shape, device=dev, dtype=q.dtype)
        db = torch.empty((B, H, n_q, n_a) if self.bias_grad else (0,), device=dev, dtype=torch.float32)
        da = torch.empty((self.splits, *agents.shape), device=dev, dtype=torch.float32)
        dw = torch.empty((self.splits, *w.shape), device=dev, dtype=torch.float32)
        with self.mode.device():
            self.launch(q, agents, w, _bias_view(bias, q, n_a), g, dq, db, da, dw, *self.sizes, *self.strides)
        da, dw = (da[0], dw[0]) if self.splits == 1 else (da.sum(0), dw.sum(0))
        db = db.sum_to_size(bias.shape).to(bias.dtype) if self.bias_grad else db
        return dq, da.to(agents.dtype), dw.to(w.dtype), db


def _signature(q, agents, w, bias) -> tuple:
    return (q.shape, agents.shape, w.shape, q.stride(), agents.stride(), w.stride(), q.dtype, agents.dtype, w.dtype,
            q.device, None if bias is None else (bias.shape, bias.stride(), bias.dtype), LT._dry_sms,
            q.dtype == torch.float32 and LT._tf32())


def _mode(q: torch.Tensor, dry: Optional[int]):
    return LT._Mode("agent attention", q.device, dry, LT._tuning())


def _forward(q, agents, w, bias, out_dtype: torch.dtype) -> torch.Tensor:
    dry = LT._dry_sms
    call = LT._call(("agent forward", *_signature(q, agents, w, bias), out_dtype),
                    lambda: _ForwardCall(q, agents, w, bias, out_dtype, _mode(q, dry)))
    return call(q, agents, w, bias)


def _backward(g, q, agents, w, bias, bias_grad: bool):
    dry = LT._dry_sms
    key = ("agent backward", *_signature(q, agents, w, bias), g.shape, g.stride(), g.dtype, bias_grad)
    call = LT._call(key, lambda: _BackwardCall(g, q, agents, w, bias, bias_grad, _mode(q, dry)))
    return call(g, q, agents, w, bias)


# ------------------------------------------------------------------------------------------------ autograd and ops


class _AgentBroadcast(torch.autograd.Function):
    """Forward and backward for eager calls."""

    @staticmethod
    def forward(ctx, q, agents, w, bias, out_dtype):
        ctx.save_for_backward(q, agents, w, bias)
        return _forward(q, agents, w, bias, out_dtype)

    @staticmethod
    def backward(ctx, g):
        q, agents, w, bias = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, da, dw, db = _backward(g, q, agents, w, bias, bias_grad)
        return dq, da, dw, db if bias_grad else None, None


# Registered for CUDA and, for the interpreter, CPU tensors.


@torch.library.custom_op("simattn::agent_broadcast_fwd", mutates_args=(), device_types=("cuda", "cpu"))
def _fwd_op(q: torch.Tensor, agents: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
            out_dtype: torch.dtype) -> torch.Tensor:
    return _forward(q, agents, w, bias, out_dtype)


@_fwd_op.register_fake
def _fwd_fake(q, agents, w, bias, out_dtype):
    return q.new_empty(*q.shape[:-1], w.shape[-1], dtype=out_dtype)


@torch.library.custom_op("simattn::agent_broadcast_bwd", mutates_args=(), device_types=("cuda", "cpu"))
def _bwd_op(g: torch.Tensor, q: torch.Tensor, agents: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
            bias_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(g, q, agents, w, bias, bias_grad)


@_bwd_op.register_fake
def _bwd_fake(g, q, agents, w, bias, bias_grad):
    db = bias.new_empty(bias.shape) if bias_grad else q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), agents.new_empty(agents.shape), w.new_empty(w.shape), db


def _setup_context(ctx, inputs, output):
    q, agents, w, bias, _ = inputs
    ctx.save_for_backward(q, agents, w, bias)


def _grads(ctx, g):
    q, agents, w, bias = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, da, dw, db = _bwd_op(g, q, agents, w, bias, bias_grad)
    return dq, da, dw, db if bias_grad else None, None


_fwd_op.register_autograd(_grads, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------ entry point


def agent_broadcast_triton(q: torch.Tensor, agents: torch.Tensor, agent_v: torch.Tensor,
                           bias: Optional[torch.Tensor] = None,
                           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax(q Aᵀ/√d + B) V_A on q (B, H, N, d), the agents A (B, H, n, d), their values V_A (B, H, n, dv) and
    an optional bias B broadcasting to (B, H, N, n) → (B, H, N, dv) in ``out_dtype`` (V_A's by default).
    Differentiable in all four. Called by :func:`simattn.attention.agent.agent_attention`, which has checked the
    inputs and that the kernels take them; a device they cannot run on is refused here."""
    out_dtype = out_dtype or agent_v.dtype
    if LT._as_op(q):
        return _fwd_op(q, agents, agent_v, bias, out_dtype)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, agents, agent_v, bias)):
        return _AgentBroadcast.apply(q, agents, agent_v, bias, out_dtype)
    return _forward(q, agents, agent_v, bias, out_dtype)
