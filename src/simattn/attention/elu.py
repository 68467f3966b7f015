"""ELU linear attention (Katharopoulos et al.): φ(x) = elu(x) + 1, out = φ(q)(φ(k)ᵀv) / (φ(q) Σ φ(k))."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..kernels import linear as linear_kernels
from ._common import apply_token_mask, check_positive, check_qkv, check_token_mask, matmul_dtype
from ._registry import register_attention
from .backends import EVERYWHERE, Call, Policy, check_backend, dispatch, register_policy, takes_triton
from .base import TokenAttention
from .reference import elu_reference as elu_attention_reference

__all__ = ["elu_attention", "elu_attention_reference", "elu_feature_map", "ELUAttention"]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 > 0."""
    return F.elu(x) + 1


def elu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                  eps: float = 1e-6, backend: str = "auto") -> torch.Tensor:
    """Linear-cost ELU attention on q (B, H, Nq, d), k, v (B, H, Nk, ·). ``mask`` (B, Nk) removes keys.

    The d×dv summary φ(k)ᵀv and the normalizer φ(q)·Σφ(k) are computed in fp32. ``backend``: ``'triton'`` runs it
    forward and backward as fused kernels (SimA's skeleton with φ as prologue and the normalizer as epilogue,
    :func:`simattn.kernels.linear.launch.linear_triton`; CUDA, or CPU under ``TRITON_INTERPRET=1``), ``'torch'``
    as torch ops, ``'auto'`` the kernels on CUDA where they take the call, training included, else torch
    (:mod:`simattn.attention.backends`).
    """
    check_qkv(q, k, v, "elu")
    check_positive("elu", "eps", eps)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "elu", k.device)
    return dispatch("elu", backend, Call(q, k, v), matmul_dtype(q), _elu_triton, _elu, q, k, v, mask, eps)


def _elu_triton(dt: torch.dtype, q, k, v, mask: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return linear_kernels.linear_triton("elu", q, k, v, mask=mask, eps=eps, out_dtype=dt)


def _elu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    acc = torch.promote_types(q.dtype, torch.float32)
    phi_q = elu_feature_map(q.to(acc))
    phi_k = apply_token_mask(elu_feature_map(k.to(acc)), mask)
    kv = phi_k.transpose(-2, -1) @ v.to(acc)  # (B, H, d, dv)
    denom = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (B, H, Nq, 1)
    return (phi_q @ kv) / (denom + eps)


register_policy("elu", Policy({"triton": takes_triton}, why=EVERYWHERE))


@register_attention("elu")
class ELUAttention(TokenAttention):
    """ELU linear attention module with timm's ``Attention`` signature; extra options ``eps`` and ``backend``
    ('auto' | 'torch' | 'triton', :func:`elu_attention`).

    No weight matrix is formed (φ(q)(φ(k)ᵀv)), so ``attn_drop > 0`` is rejected."""

    exp_complexity = "ND"

    def __init__(self, dim: int, num_heads: int = 8, *, eps: float = 1e-6, backend: str = "auto",
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.eps = check_positive(type(self).__name__, "eps", eps)
        self.backend = check_backend(type(self).__name__, "elu", backend)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling is Python
            return _elu(q, k, v, mask, self.eps).to(q.dtype)
        else:
            return elu_attention(q, k, v, mask=mask, eps=self.eps, backend=self.backend)
