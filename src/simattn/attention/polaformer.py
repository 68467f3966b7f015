"""PolaFormer: polarity-aware linear attention (Meng et al., ICLR 2025).

q and k (divided by s = softplus of a learned per-channel scale) split into positive and negative parts raised to
a learned per-channel power p = 1 + α·sigmoid(θ) ∈ (1, 1 + α): q⁺ = max(q, 0)^p, q⁻ = max(−q, 0)^p. The
same-sign weights q⁺k⁺ᵀ + q⁻k⁻ᵀ and the opposite-sign weights q⁺k⁻ᵀ + q⁻k⁺ᵀ each weight half of V's channels,
each normalized as linear attention, φ(q)(φ(K)ᵀV)/N / (φ(q)·mean φ(K) + eps); the two halves are concatenated,
the depthwise conv of V (kernel 5) is added, and the result is multiplied by a gate g = xW_g (no activation)
before the output projection. Linear in N; the only exp-like ops act on parameters (the softplus of the scale and
the sigmoid of the power, H·d evaluations each per call whatever N: SimA's class Hd²), constants at inference that
exporters may fold.

Released code (ZacharyMeng/PolaFormer, MIT; ``PolaLinearAttention`` of ``models/pola_pvt.py``, sr_ratio 1): its
``qg`` projection is our ``qkv`` (q) and ``g``, its ``kv`` our ``qkv`` (k, v); its ``scale`` is ``feature_scale``.
The paper's description has learnable polarity-aware coefficient matrices weighting the two terms; the released
module splits V's channels between them instead and multiplies by the gate: the code is followed here. It has no
DeiT: the class token takes part in the attention but not in the conv or the key encoding, as in InLine's DeiT.
Checked on fixed inputs (B 2, a 7×7 grid, C 64, 2 heads, α 4, fp64, random weights copied from its module into
ours): max |ours − released| = 2.8e-14, on outputs up to 98.

Precision: powers up to 1 + α of activations overflow fp16 at once and their products overflow fp32 from about
|q|, |k| ~ 1e4 at α = 4. Each output is a ratio, unchanged when one query's features or all keys' features are
scaled (with eps scaled alike), so the fast path divides them by their peaks (constants to autograd: the function
does not depend on them) and runs in fp32: finite for any fp16 activations.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import linear as linear_kernels
from ._common import acc_dtype, check_finite, check_positive, check_qkv, eager, matmul_dtype, no_autocast
from ._registry import register_attention
from .backends import (EVERYWHERE, TRITON_MAX_HEAD_DIM, Call, Policy, dispatch, register_policy,
                       triton_limits)
from .grid_linear import GridLinearAttention, per_channel
from .reference import polaformer_reference as polaformer_attention_reference

__all__ = ["polaformer_attention", "polaformer_attention_reference", "PolaFormerAttention"]


def _pola(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, power: torch.Tensor, scale: torch.Tensor,
          eps: float) -> torch.Tensor:
    q, k = q / scale, k / scale
    q_pos, q_neg = F.relu(q).pow(power), F.relu(-q).pow(power)
    k_pos, k_neg = F.relu(k).pow(power), F.relu(-k).pow(power)
    # the peaks of each query's features and of all keys' features (see the module docstring)
    q_peak = torch.maximum(q_pos.amax(dim=-1, keepdim=True), q_neg.amax(dim=-1, keepdim=True))
    k_peak = torch.maximum(k_pos.amax(dim=[-2, -1], keepdim=True), k_neg.amax(dim=[-2, -1], keepdim=True))
    q_peak, k_peak = q_peak.detach().clamp_min(1e-30), k_peak.detach().clamp_min(1e-30)
    q_pos, q_neg, k_pos, k_neg = q_pos / q_peak, q_neg / q_peak, k_pos / k_peak, k_neg / k_peak
    n, half = k.shape[-2], v.shape[-1] // 2
    v_same, v_opposite = v[..., :half] / n, v[..., half:] / n
    eps_scaled = eps / (q_peak * k_peak)  # (B, H, Nq, 1)
    kp_mean, kn_mean = k_pos.mean(dim=-2).unsqueeze(-1), k_neg.mean(dim=-2).unsqueeze(-1)  # (B, H, d, 1)
    k_pos_t, k_neg_t = k_pos.transpose(-2, -1), k_neg.transpose(-2, -1)
    same = (q_pos @ (k_pos_t @ v_same) + q_neg @ (k_neg_t @ v_same)) \
        / (q_pos @ kp_mean + q_neg @ kn_mean + eps_scaled)
    opposite = (q_pos @ (k_neg_t @ v_opposite) + q_neg @ (k_pos_t @ v_opposite)) \
        / (q_pos @ kn_mean + q_neg @ kp_mean + eps_scaled)
    return torch.cat([same, opposite], dim=-1)


def _pola_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, power: torch.Tensor, scale: torch.Tensor,
                 eps: float) -> torch.Tensor:
    # each half of v is a feature kind on 2d channels: [q⁺, q⁻] against [k⁺, k⁻] (same sign) or [k⁻, k⁺]
    q, k = q / scale, k / scale
    q_polar = torch.cat([F.relu(q).pow(power), F.relu(-q).pow(power)], dim=-1)
    k_pos, k_neg = F.relu(k).pow(power), F.relu(-k).pow(power)
    half, eps_n = v.shape[-1] // 2, eps * k.shape[-2]  # A V / (A 1 + N·eps), the released mean form's
    linear_triton = linear_kernels.linear_triton
    same = linear_triton("features", q_polar, torch.cat([k_pos, k_neg], dim=-1), v[..., :half], eps=eps_n)
    opposite = linear_triton("features", q_polar, torch.cat([k_neg, k_pos], dim=-1), v[..., half:], eps=eps_n)
    return torch.cat([same, opposite], dim=-1)


def polaformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, power: Union[float, torch.Tensor],
                         scale: Union[float, torch.Tensor] = 1.0, eps: float = 1e-6,
                         backend: str = "auto") -> torch.Tensor:
    """Polarity-aware linear attention on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) with dv even, without
    the conv and the gate. ``power`` (p > 0) and ``scale`` (s > 0): numbers or one value per channel (H·d values).
    Computed in fp32 under autocast. ``backend``: ``'triton'`` makes the polar features in torch and runs each
    half of v forward and backward as fused kernels (a normalized feature kind on 2d channels, d ≤ 64; the
    features are not rescaled by their peaks, as the reference's are not; CUDA, or CPU under
    ``TRITON_INTERPRET=1``), ``'torch'`` torch ops, ``'auto'`` the kernels on CUDA where they take the call (d ≤ 64),
    training included, else torch (:mod:`simattn.attention.backends`)."""
    check_qkv(q, k, v, "polaformer")
    check_positive("polaformer", "eps", eps)
    if v.shape[-1] % 2:
        raise ValueError(f"polaformer: v's head dim must be even (its halves take the same- and opposite-sign "
                         f"weights), got {v.shape[-1]}")
    power = per_channel("polaformer", "power", power, q)
    scale = per_channel("polaformer", "scale", scale, q)
    return dispatch("polaformer", backend, Call(q, k, v, params=(power, scale)), matmul_dtype(q), _pola_kernels,
                    _pola_fp32, q, k, v, power, scale, eps)


def _acc_params(q: torch.Tensor, *params) -> Tuple[torch.Tensor, ...]:
    acc = acc_dtype(q)
    return tuple(t.to(acc) if torch.is_tensor(t) else torch.full((), t, dtype=acc, device=q.device) for t in params)


def _pola_kernels(dt: torch.dtype, q, k, v, power, scale, eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    with no_autocast(q):  # the polar features in fp32
        power, scale = _acc_params(q, power, scale)
        return _pola_triton(q.to(acc), k.to(acc), v, power, scale, eps).to(dt)


def _pola_fp32(q, k, v, power, scale, eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    power, scale = _acc_params(q, power, scale)
    return _pola(q.to(acc), k.to(acc), v.to(acc), power, scale, eps)


def _pola_takes_triton(call: Call) -> Optional[str]:
    """PolaFormer's polar features [q⁺, q⁻] double the head dim the kernels see."""
    why = triton_limits(call.q, call.k, call.v)
    if why is None and 2 * call.q.shape[-1] > TRITON_MAX_HEAD_DIM:
        why = (f"takes head dims up to {TRITON_MAX_HEAD_DIM // 2} (its polar features double them), got "
               f"d={call.q.shape[-1]}")
    return why


register_policy("polaformer", Policy({"triton": _pola_takes_triton}, why=EVERYWHERE + " (d up to 64)"))


@register_attention("polaformer")
class PolaFormerAttention(GridLinearAttention):
    """PolaFormer with timm's ``Attention`` signature. Options: ``alpha`` (α ≥ 0, the power's range; 4 as
    released), ``eps`` and the grid options of :class:`GridLinearAttention` (``dwc_kernel`` 5 by default,
    ``pos_grid``, ``num_prefix_tokens``). Parameters beyond timm's: ``g`` (the gate, Linear(C, C) with the qkv
    bias setting), ``power`` θ (1, H, 1, d) and ``feature_scale`` (1, 1, C), both zero at initialization."""

    exp_complexity = "Hd²"  # softplus of the scale, sigmoid of the power

    def __init__(self, dim: int, num_heads: int = 8, *, alpha: float = 4.0, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        name = type(self).__name__
        if self.head_dim % 2:
            raise ValueError(f"{name}: head dim {self.head_dim} (dim {dim} / {num_heads} heads) must be even")
        alpha = check_finite(name, "alpha", alpha)
        if alpha < 0:
            raise ValueError(f"{name}: alpha={alpha}; allowed: a finite number >= 0")
        self.alpha = alpha
        self.eps = check_positive(name, "eps", eps)
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.g = nn.Linear(dim, dim, bias=kwargs.get("qkv_bias", False), **dd)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dim, **dd))
        self.feature_scale = nn.Parameter(torch.zeros(1, 1, dim, **dd))

    def _power_and_scale(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return (1 + self.alpha * torch.sigmoid(self.power),
                F.softplus(self.feature_scale).reshape(1, self.num_heads, 1, self.head_dim))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        power, scale = self._power_and_scale()
        if eager():  # heads laid out apart once, not by each of its eight products (as the released code does)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return polaformer_attention(q, k, v, power=power, scale=scale, eps=self.eps, backend=self.backend)

    def core_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        power, scale = self._power_and_scale()
        return _pola(q, k, v, power.to(q.dtype), scale.to(q.dtype), self.eps)

    def _merge_heads(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads merged times the gate g = xW_g (written out: TorchScript has no super())."""
        B, N, C = x.shape
        return out.transpose(1, 2).reshape(B, N, C) * self.g(x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}"
