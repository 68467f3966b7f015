"""Agent attention on Triton kernels, forward and backward: the aggregation V_A = softmax(A Kᵀ/√d + B₁) V
(:func:`agent_gather_triton`) and the broadcast O = softmax(Q Aᵀ/√d + B₂) V_A (:func:`agent_broadcast_triton`),
with no n×N tensor in memory but the biases and their gradients. The kernels and the maths are
:mod:`simattn.kernels.agent.kernels`; this module launches them.

Host path, :mod:`simattn.kernels.host`'s (its launch modes, plan cache, direct launches and
:func:`~simattn.kernels.host.dry_run`): the first call at a signature plans its launches; a
repeat call looks the plan up, allocates its outputs and launches. Eagerly the autograd is a
``torch.autograd.Function``; while compiling, exporting or tracing, on tensor subclasses and under dispatch modes
the same calls run behind the custom ops ``simattn::agent_gather_fwd``, ``simattn::agent_gather_bwd``,
``simattn::agent_broadcast_fwd`` and ``simattn::agent_broadcast_bwd``, all made by
:func:`~simattn.kernels.host.op`.

The inputs are read through their strides (the biases may broadcast over the batch and heads: stride 0); the
gradients come back contiguous in the inputs' dtypes, the biases' summed to their shapes.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from .. import host
from . import kernels as K

__all__ = ["agent_broadcast_triton", "agent_gather_triton"]

# tokens a program streams at least where the token axis is split over programs (GPU; the interpreter: 32)
_CHUNK_LEAST = 256


def _bias_strides(bias: Optional[torch.Tensor], shape) -> tuple:
    """The strides through which the kernels read a bias as if broadcast to ``shape`` (0 where it broadcasts);
    they read the bias itself at them, no view made per call."""
    if bias is None:
        return (0,) * 4
    return bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(*shape).stride()


def _chunks(n: int, bh: int, mode) -> Tuple[int, int]:
    """(programs per (batch, head) along n tokens, tokens per program): about two programs per multiprocessor, at
    least ``_CHUNK_LEAST`` tokens each (32 in the interpreter, so small tests take several); every chunk holds a
    token."""
    least = host.INTERPRETER_BLOCK if mode.interpret else _CHUNK_LEAST
    chunk = triton.cdiv(n, min(triton.cdiv(2 * mode.sms, bh), triton.cdiv(n, least)))
    return triton.cdiv(n, chunk), chunk


def _consts(x, agents, mode, e: int) -> dict:
    """Constexprs shared by the kernels; ``x`` the tokens multiplied with the agents (q or k)."""
    return dict(UPCAST=mode.interpret, PREC=host.precision(x), BLOCK_A=host.block(agents.shape[-2]),
                BLOCK_D=host.block(x.shape[-1]), BLOCK_E=host.block(e))


def _parts(splits: int, shape, like: torch.Tensor) -> torch.Tensor:
    """An fp32 buffer for ``splits`` chunks' partial sums of a ``shape`` tensor (no chunk axis for one chunk)."""
    return torch.empty(tuple(shape) if splits == 1 else (splits, *shape), device=like.device, dtype=torch.float32)


def _sum_parts(parts: torch.Tensor, splits: int) -> torch.Tensor:
    return parts if splits == 1 else parts.sum(0)


def _plan_gather(call, agents, k, v, bias, mode) -> None:
    """What both aggregation calls set from their inputs: mode, bias shape, chunks, sizes, strides, constexprs."""
    B, H, n_a, d = agents.shape
    n_k, e = k.shape[-2], v.shape[-1]
    call.mode, call.bias_shape = mode, (B, H, n_a, n_k)
    call.splits, chunk = _chunks(n_k, B * H, mode)
    call.sizes = (H, n_k, n_a, d, e, float(d ** -0.5), chunk)
    call.strides = (*agents.stride(), *k.stride(), *v.stride(), *_bias_strides(bias, call.bias_shape),
                    triton.next_power_of_2(chunk))
    call.consts = dict(_consts(k, agents, mode, e), HAS_BIAS=bias is not None, AK_NATIVE=host.native(agents, k))


class _GatherForward:
    """The aggregation at one signature: W (B, H, n, dv) and its log-sum-exp per agent (B, H, n), fp32; the chunks'
    partial results merged by their log-sum-exps."""

    def __init__(self, agents, k, v, bias, mode):
        _plan_gather(self, agents, k, v, bias, mode)
        self.launch = host.Launch(K.gather_fwd_kernel, (self.splits, *agents.shape[:2]), self.consts, mode)

    def __call__(self, agents, k, v, bias):
        part = (*agents.shape[:-1],) if self.splits == 1 else (self.splits, *agents.shape[:-1])
        w = torch.empty((*part, v.shape[-1]), device=k.device, dtype=torch.float32)
        lse = torch.empty(part, device=k.device, dtype=torch.float32)
        with self.mode.device():
            self.launch(agents, k, v, k if bias is None else bias, w, lse, *self.sizes, *self.strides)
        if self.splits == 1:  # the one chunk's results are the whole's (written without the chunk axis)
            return w, lse
        top = torch.logsumexp(lse, 0)
        return (torch.exp(lse - top).unsqueeze(-1) * w).sum(0), top


class _GatherBackward:
    """dA, dk, dv (and dB₁) of the aggregation at one signature."""

    def __init__(self, agents, k, v, bias, bias_grad: bool, mode):
        _plan_gather(self, agents, k, v, bias, mode)
        self.bias_grad = bias_grad
        self.launch = host.Launch(K.gather_bwd_kernel, (self.splits, *agents.shape[:2]),
                                 dict(self.consts, BIAS_GRAD=bias_grad), mode)

    def __call__(self, gw, w, lse, agents, k, v, bias):
        dev = k.device
        gw = gw.to(torch.float32).contiguous()
        dd = (gw * w).sum(-1)  # D = rowsum(dW ∘ W), per agent
        dk = host.grad_like(k)
        dv = host.grad_like(v)
        db = torch.empty(self.bias_shape if self.bias_grad else (0,), device=dev, dtype=torch.float32)
        da = _parts(self.splits, agents.shape, k)
        with self.mode.device():
            self.launch(agents, k, v, k if bias is None else bias, lse.contiguous(), gw, dd, dk, dv, db,
                        da, *self.sizes, *self.strides)
        db = db.sum_to_size(bias.shape).to(bias.dtype) if self.bias_grad else db
        return _sum_parts(da, self.splits).to(agents.dtype), dk, dv, db


class _BroadcastForward:
    """The broadcast at one signature: out (B, H, N, dv) in ``out_dtype``."""

    def __init__(self, q, agents, w, bias, out_dtype: torch.dtype, mode):
        B, H, n_q, d = q.shape
        e = w.shape[-1]
        self.mode, self.out_shape, self.out_dtype = mode, (B, H, n_q, e), out_dtype
        self.bias_shape = (B, H, n_q, agents.shape[-2])
        self.sizes = (n_q, agents.shape[-2], d, e, float(d ** -0.5))
        self.strides = (*q.stride(), *agents.stride(), *w.stride(), *_bias_strides(bias, self.bias_shape),
                        H * n_q * e, n_q * e, e, 1, triton.next_power_of_2(n_q))
        block = host.INTERPRETER_BLOCK if mode.interpret else K.FWD_BLOCK
        self.launch = host.Launch(K.broadcast_fwd_kernel, (triton.cdiv(n_q, block), B, H), dict(
            _consts(q, agents, mode, e), HAS_BIAS=bias is not None, QA_NATIVE=host.native(q, agents)), mode)

    def __call__(self, q, agents, w, bias):
        out = torch.empty(self.out_shape, device=q.device, dtype=self.out_dtype)
        with self.mode.device():
            self.launch(q, agents, w, q if bias is None else bias, out, *self.sizes, *self.strides)
        return out


class _BroadcastBackward:
    """dq, dA, dW (and dB₂) of the broadcast at one signature: dq (and dB₂) per query tile, dA and dW as partial
    sums per chunk of queries."""

    def __init__(self, g, q, agents, w, bias, bias_grad: bool, mode):
        B, H, n_q, d = q.shape
        n_a, e = agents.shape[-2], w.shape[-1]
        self.mode, self.bias_grad, self.bias_shape = mode, bias_grad, (B, H, n_q, n_a)
        self.splits, chunk = _chunks(n_q, B * H, mode)
        self.sizes = (H, n_q, n_a, d, e, float(d ** -0.5), chunk)
        self.strides = (*q.stride(), *agents.stride(), *w.stride(), *_bias_strides(bias, self.bias_shape),
                        *g.stride(), triton.next_power_of_2(chunk))
        self.launch = host.Launch(K.broadcast_bwd_kernel, (self.splits, B, H), dict(
            _consts(q, agents, mode, e), HAS_BIAS=bias is not None, BIAS_GRAD=bias_grad,
            QA_NATIVE=host.native(q, agents)), mode)

    def __call__(self, g, q, agents, w, bias):
        dev = q.device
        dq = host.grad_like(q)
        db = torch.empty(self.bias_shape if self.bias_grad else (0,), device=dev, dtype=torch.float32)
        da, dw = _parts(self.splits, agents.shape, q), _parts(self.splits, w.shape, q)
        with self.mode.device():
            self.launch(q, agents, w, q if bias is None else bias, g, dq, db, da, dw, *self.sizes,
                        *self.strides)
        db = db.sum_to_size(bias.shape).to(bias.dtype) if self.bias_grad else db
        return dq, _sum_parts(da, self.splits).to(agents.dtype), _sum_parts(dw, self.splits).to(w.dtype), db


def _planned(what: str, build, *tensors, extra=()):
    """The call planned for these tensors (built by ``build(mode)`` at a new signature)."""
    return host.plan("agent attention", (what, *extra), tensors, build)


def _gather_forward(agents: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    bias: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    call = _planned("agent gather", lambda mode: _GatherForward(agents, k, v, bias, mode), agents, k, v, bias)
    return call(agents, k, v, bias)


def _gather_fake(agents, k, v, bias):
    return (agents.new_empty(*agents.shape[:-1], v.shape[-1], dtype=torch.float32),
            agents.new_empty(agents.shape[:-1], dtype=torch.float32))


def _gather_backward(gw: torch.Tensor, agents: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: Optional[torch.Tensor], w: torch.Tensor, lse: torch.Tensor,
                     bias_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _planned("agent gather backward", lambda mode: _GatherBackward(agents, k, v, bias, bias_grad, mode),
                    agents, k, v, bias, gw, extra=(bias_grad,))
    return call(gw, w, lse, agents, k, v, bias)


def _forward(q: torch.Tensor, agents: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
             out_dtype: torch.dtype) -> torch.Tensor:
    call = _planned("agent broadcast", lambda mode: _BroadcastForward(q, agents, w, bias, out_dtype, mode),
                    q, agents, w, bias, extra=(out_dtype,))
    return call(q, agents, w, bias)


def _fake(q, agents, w, bias, out_dtype):
    return q.new_empty(*q.shape[:-1], w.shape[-1], dtype=out_dtype)


def _backward(g: torch.Tensor, q: torch.Tensor, agents: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
              out_dtype: torch.dtype,
              bias_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _planned("agent broadcast backward", lambda mode: _BroadcastBackward(g, q, agents, w, bias, bias_grad,
                                                                                 mode),
                    q, agents, w, bias, g, extra=(bias_grad,))
    return call(g, q, agents, w, bias)


# ------------------------------------------------------------------------------------------------ the ops
# Registered for CUDA and, for the interpreter, CPU tensors; the biases' gradients only where wanted.

_gather = host.op("simattn::agent_gather", _gather_forward, _gather_backward, _gather_fake, tensors=4, grads=4,
                  save_output=True, flags=(3,))
_broadcast = host.op("simattn::agent_broadcast", _forward, _backward, _fake, tensors=4, grads=4, flags=(3,))


# ------------------------------------------------------------------------------------------------ entry points


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def agent_gather_triton(agents: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The aggregation V_A = softmax(A kᵀ/√d + B₁) v on the agents A (B, H, n, d), k (B, H, N, d), v (B, H, N, dv)
    and an optional bias B₁ broadcasting to (B, H, n, N) → (B, H, n, dv) in fp32. Differentiable in all four."""
    return _gather(k, _needs_grad(agents, k, v, bias), agents, k, v, bias)


def agent_broadcast_triton(q: torch.Tensor, agents: torch.Tensor, agent_v: torch.Tensor,
                           bias: Optional[torch.Tensor] = None,
                           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The broadcast softmax(q Aᵀ/√d + B₂) V_A on q (B, H, N, d), the agents A (B, H, n, d), their values V_A
    (B, H, n, dv) and an optional bias B₂ broadcasting to (B, H, N, n) → (B, H, N, dv) in ``out_dtype`` (V_A's by
    default). Differentiable in all four."""
    out_dtype = out_dtype or agent_v.dtype
    return _broadcast(q, _needs_grad(q, agents, agent_v, bias), q, agents, agent_v, bias, out_dtype)
