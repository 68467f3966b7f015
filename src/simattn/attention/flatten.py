"""FLatten: focused linear attention (Han et al., ICCV 2023).

φ_p(x) = f_p(ReLU(x) / s) with the focusing function f_p(x) = ‖x‖ · x^p / ‖x^p‖ (p the focusing factor, an
elementwise power; s = softplus of a learned per-channel scale), and

    out_i = φ(q_i) (φ(K)ᵀ V) / N / (φ(q_i) · mean_j φ(k_j) + eps) + DWC(V)_i,

linear in N. Its only exp-like op is the softplus of the scale, H·d evaluations per call whatever N (SimA's class
Hd²; a constant at inference, which exporters may fold). The
depthwise conv on V restores the rank of the N×N weights (kernel 5); the released modules also add a learned
position encoding to k. Both act on the grid tokens only (:mod:`simattn.attention.grid_linear`).

Released code (LeapLabTHU/FLatten-Transformer, ``FocusedLinearAttention`` of ``flatten_pvt.py``, sr_ratio 1, no
license: run only to measure): ReLU(x) + 1e-6 before the scale, the norms of f_p over all C = H·d channels of a
token (not per head), the normalizer φ(q)·mean φ(k) + 1e-6; all followed here. Its DeiT has no released code: the
class token takes part in the attention but not in the conv or the key encoding, as in the same group's InLine
DeiT. Checked on fixed inputs (B 2, a 7×7 grid without a class token, C 64, 2 heads, fp64, random weights copied
from its module into ours): max |ours − released| = 1.1e-14, on outputs up to 36.

Precision: f_p is scale-invariant, so the fast path raises x / max(x) (per token) to the p-th power: no power
overflows or underflows. Everything runs in fp32 under autocast (the released code NaNs in fp16 were powers of
large activations).
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import linear as linear_kernels
from ._common import acc_dtype, check_positive, check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .backends import EVERYWHERE, Call, Policy, dispatch, register_policy, takes_triton
from .grid_linear import GridLinearAttention, per_channel
from .reference import flatten_reference as flatten_attention_reference

__all__ = ["flatten_attention", "flatten_attention_reference", "flatten_feature_map", "FLattenAttention"]


def flatten_feature_map(x: torch.Tensor, focusing_factor: float, scale: torch.Tensor) -> torch.Tensor:
    """φ_p(x) of x (B, H, N, d) with the norms over all H·d channels of each token; ``scale`` 0-d or (1, H, 1, d)."""
    x = (F.relu(x) + 1e-6) / scale
    norm = x.square().sum(dim=[1, 3], keepdim=True).sqrt()
    # f_p(c·x) = f_p(x): powers of x / max(x) lie in (0, 1]; the peak carries no gradient (f_p does not depend on it)
    peak = x.detach().amax(dim=[1, 3], keepdim=True)
    powered = (x / peak).pow(focusing_factor)
    return powered * (norm / powered.square().sum(dim=[1, 3], keepdim=True).sqrt())


def _flatten(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, focusing_factor: float, scale: torch.Tensor,
             eps: float) -> torch.Tensor:
    phi_q = flatten_feature_map(q, focusing_factor, scale)
    phi_k = flatten_feature_map(k, focusing_factor, scale)
    n = k.shape[-2]
    kv = phi_k.transpose(-2, -1) @ (v / n)  # (B, H, d, dv): the mean over keys
    denom = phi_q @ phi_k.mean(dim=-2).unsqueeze(-1) + eps  # (B, H, Nq, 1)
    return (phi_q @ kv) / denom


def flatten_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, focusing_factor: float = 3.0,
                      scale: Union[float, torch.Tensor] = 1.0, eps: float = 1e-6,
                      backend: str = "auto") -> torch.Tensor:
    """Focused linear attention on q (B, H, Nq, d), k, v (B, H, Nk, ·), without the conv on V.

    ``scale``: the positive divisor s of the features, a number or one value per channel (H·d values, e.g. the
    module's softplus of its (1, 1, H·d) scale). Computed in fp32 under autocast. ``backend``: ``'triton'`` makes
    the features in torch (their norms span every head of a token) and runs the rest forward and backward as
    fused kernels (:func:`simattn.kernels.linear.launch.linear_triton`; CUDA, or CPU under
    ``TRITON_INTERPRET=1``), ``'torch'`` torch ops throughout, ``'auto'`` the kernels on CUDA where they take the
    call, training included, else torch (:mod:`simattn.attention.backends`)."""
    check_qkv(q, k, v, "flatten")
    check_positive("flatten", "focusing_factor", focusing_factor)
    check_positive("flatten", "eps", eps)
    scale = per_channel("flatten", "scale", scale, q)
    return dispatch("flatten", backend, Call(q, k, v, params=(scale,)), matmul_dtype(q), _flatten_triton,
                    _flatten_fp32, q, k, v, focusing_factor, scale, eps)


def _acc_scale(scale: Union[float, torch.Tensor], q: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return scale.to(acc) if torch.is_tensor(scale) else torch.full((), scale, dtype=acc, device=q.device)


def _flatten_triton(dt: torch.dtype, q, k, v, focusing_factor: float, scale, eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    with no_autocast(q):  # the features in fp32
        scale = _acc_scale(scale, q, acc)
        phi_q = flatten_feature_map(q.to(acc), focusing_factor, scale)
        phi_k = flatten_feature_map(k.to(acc), focusing_factor, scale)
        # φ(q)(φ(K)ᵀV)/N / (φ(q)·mean φ(k) + eps) = φ(q)(φ(K)ᵀV) / (φ(q)·Σφ(k) + N·eps)
        return linear_kernels.linear_triton("features", phi_q, phi_k, v, eps=eps * k.shape[-2], out_dtype=dt)


def _flatten_fp32(q, k, v, focusing_factor: float, scale, eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    return _flatten(q.to(acc), k.to(acc), v.to(acc), focusing_factor, _acc_scale(scale, q, acc), eps)


register_policy("flatten", Policy({"triton": takes_triton}, why=EVERYWHERE))


@register_attention("flatten")
class FLattenAttention(GridLinearAttention):
    """FLatten with timm's ``Attention`` signature. Options: ``focusing_factor`` (p, 3 in the paper's models),
    ``eps``, and the grid options of :class:`GridLinearAttention` (``dwc_kernel`` 5 by default, ``pos_grid``,
    ``num_prefix_tokens``). The learned scale is ``feature_scale`` (the released ``scale``, (1, 1, C), zero at
    initialization: s = softplus(0) = ln 2)."""

    exp_complexity = "Hd²"  # the softplus of the scale

    def __init__(self, dim: int, num_heads: int = 8, *, focusing_factor: float = 3.0, eps: float = 1e-6,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.focusing_factor = check_positive(type(self).__name__, "focusing_factor", focusing_factor)
        self.eps = check_positive(type(self).__name__, "eps", eps)
        self.feature_scale = nn.Parameter(torch.zeros(1, 1, dim))

    def _scale(self) -> torch.Tensor:
        return F.softplus(self.feature_scale).reshape(1, self.num_heads, 1, self.head_dim)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flatten_attention(q, k, v, focusing_factor=self.focusing_factor, scale=self._scale(), eps=self.eps,
                                 backend=self.backend)

    def core_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _flatten(q, k, v, self.focusing_factor, self._scale().to(q.dtype), self.eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, focusing_factor={self.focusing_factor}"
