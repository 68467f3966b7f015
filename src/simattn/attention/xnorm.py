"""UFO-ViT's XNorm attention: A(x) = XN(Q) · XN(Kᵀ V) with XN(a) = γ · a / ‖a‖₂.

Axes (our reading of the slides' equations (7)-(8)): each query token is normalized over its channels, and each
column j of the d×dv matrix KᵀV is normalized over the key-channel axis i, so out[n, j] = γ_q γ_kv ·
cos(q_n, (KᵀV)[:, j]): a cosine similarity between a token's query and a column of KᵀV. Each XN has its own
learnable per-head γ (initialised to 1) and the norms have an eps, unlike a widely copied third-party version.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from ..kernels import linear as linear_kernels
from ._common import (acc_dtype, apply_token_mask, check_per_head, check_positive, check_qkv, check_token_mask,
                      matmul_dtype)
from ._registry import register_attention
from .backends import NO_BACKWARD, Call, Policy, check_backend, dispatch, register_policy, triton_limits
from .base import TokenAttention
from .reference import xnorm_reference as xnorm_attention_reference

__all__ = ["xnorm_attention", "xnorm_attention_reference", "xnorm", "XNormAttention"]

Gamma = Union[float, torch.Tensor]


def xnorm(a: torch.Tensor, dim: int, gamma: Gamma = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """XN(a) = γ · a / (‖a‖₂ + eps) along ``dim``."""
    return gamma * a / (torch.linalg.vector_norm(a, 2, dim=dim, keepdim=True) + eps)


def xnorm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gamma_q: Gamma = 1.0,
                    gamma_kv: Gamma = 1.0, mask: Optional[torch.Tensor] = None, eps: float = 1e-6,
                    backend: str = "auto") -> torch.Tensor:
    """XNorm attention on q (B, H, Nq, d), k, v (B, H, Nk, ·); ``mask`` (B, Nk) removes keys.

    Fast path: KᵀV and its column norms in fp32; the per-token query norm is applied to the output rows, so the
    normalized query is never materialized. γ may be floats or per-head tensors: shape (H,), (H, 1, 1),
    (1, H, 1, 1) or (B, H, 1, 1). ``backend``: ``'triton'`` runs one fused forward kernel (SimA's skeleton with the
    column and row norms as epilogue, :func:`simattn.kernels.linear.launch.linear_triton`; it has no backward, so
    it refuses a call where q, k, v or γ needs a gradient), ``'torch'`` torch ops, ``'auto'`` the kernel on CUDA
    where it takes the call, else torch (:mod:`simattn.attention.backends`).
    """
    check_qkv(q, k, v, "xnorm")
    gamma_q = check_per_head("xnorm", "gamma_q", gamma_q, q)
    gamma_kv = check_per_head("xnorm", "gamma_kv", gamma_kv, q)
    check_positive("xnorm", "eps", eps)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "xnorm", k.device)
    return dispatch("xnorm", backend, Call(q, k, v, params=(gamma_q, gamma_kv)), matmul_dtype(q), _xnorm_triton,
                    _xnorm_fp32, q, k, v, gamma_q, gamma_kv, mask, eps)


def _xnorm_triton(dt: torch.dtype, q, k, v, gamma_q: Gamma, gamma_kv: Gamma, mask: Optional[torch.Tensor],
                  eps: float) -> torch.Tensor:
    B, H = q.shape[:2]
    gamma = torch.as_tensor(gamma_q, dtype=torch.float32, device=q.device) * gamma_kv  # γ_q γ_kv per head
    gamma = gamma.expand(B, H, 1, 1).reshape(B * H).float()
    return linear_kernels.linear_triton("xnorm", q, k, v, mask=mask, gamma=gamma, eps=eps, out_dtype=dt)


def _xnorm_fp32(q, k, v, gamma_q: Gamma, gamma_kv: Gamma, mask: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    kv = apply_token_mask(k.to(acc_dtype(k)), mask).transpose(-2, -1) @ v.to(acc_dtype(v))  # (B, H, d, dv)
    kv = xnorm(kv, dim=-2, gamma=gamma_kv, eps=eps) * gamma_q
    return _query_xnorm_product(q, kv, eps)


def _xnorm_takes_triton(call: Call) -> Optional[str]:
    """XNorm's kernel is a forward only (its column and row norms have no backward kernel)."""
    if call.grad:
        return NO_BACKWARD
    return triton_limits(call.q, call.k, call.v)


register_policy("xnorm", Policy({"triton": _xnorm_takes_triton},
                                why="auto: the Triton kernel on CUDA where nothing needs a gradient: it has no "
                                    "backward"))


def _query_xnorm_product(q: torch.Tensor, kv: torch.Tensor, eps: float) -> torch.Tensor:
    """XN(q) · kv with q's norm applied to the output rows (the normalized query is never materialized)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    q_norm = torch.linalg.vector_norm(q.to(acc), 2, dim=-1, keepdim=True) + eps
    return (q.to(acc) @ kv) / q_norm


@register_attention("xnorm")
class XNormAttention(TokenAttention):
    """UFO-ViT multi-head XNorm attention with timm's ``Attention`` signature.

    Parameters ``gamma_q`` and ``gamma_kv`` (per head, init 1) are the two XN scales; extra options ``eps`` and
    ``backend`` ('auto' | 'torch' | 'triton', :func:`xnorm_attention`).
    No token-token weight matrix is formed, so ``attn_drop > 0`` is rejected. At a query that is exactly zero the
    gradient of XN is γ/eps (1e6 with the default eps), beyond fp16's range: the normalization's, not round-off.
    """

    exp_complexity = "0"

    def __init__(self, dim: int, num_heads: int = 8, *, eps: float = 1e-6, backend: str = "auto",
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.backend = check_backend(type(self).__name__, "xnorm", backend)
        self.gamma_q = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.gamma_kv = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.eps = check_positive(type(self).__name__, "eps", eps)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling is Python
            acc = torch.promote_types(q.dtype, torch.float32)
            kv = apply_token_mask(k.to(acc), mask).transpose(-2, -1) @ v.to(acc)
            kv = self.gamma_kv * kv / (torch.linalg.vector_norm(kv, 2, dim=-2, keepdim=True) + self.eps) * self.gamma_q
            return _query_xnorm_product(q, kv, self.eps).to(q.dtype)
        else:
            return xnorm_attention(q, k, v, gamma_q=self.gamma_q, gamma_kv=self.gamma_kv, mask=mask, eps=self.eps,
                                   backend=self.backend)

    def no_weight_decay(self):
        return {"gamma_q", "gamma_kv"}
