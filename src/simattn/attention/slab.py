"""SLAB's simplified linear attention (Guo et al., ICML 2024).

    out_i = ReLU(q_i) (ReLU(K)ᵀ V) / (ReLU(q_i) · Σ_j ReLU(k_j) + eps) + DWC(V)_i,

computed in fp32 (the paper's and the released code's choice, against fp16 overflow of the sums), linear in N and
free of exp. The depthwise conv on V (kernel 5) and a learned position encoding added to k act on the grid tokens
(:mod:`simattn.attention.grid_linear`). SLAB's other half, PRepBN (LayerNorm replaced by a re-parameterized
BatchNorm during training), is a normalization of the whole block: see :mod:`simattn.models.prepbn`.

Released code (xinghaochen/SLAB, ``Attention`` of ``classification/models/slab_deit.py``, no license: run only to
measure): the same formula, with the product order picked by cost (the same value). Its DeiT has no class token
(the tokens are averaged for the head), which the models here follow; a prefix token, where a model has one, takes
part in the attention but not in the conv or the key encoding. Checked on fixed inputs (B 2, a 14×14 grid, C 64,
2 heads, fp64 with its fp32 cast read as fp64, random weights copied from its module into ours):
max |ours − released| = 3.6e-15, on outputs up to 33.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import linear as linear_kernels
from ._common import acc_dtype, check_positive, check_qkv, matmul_dtype
from ._registry import register_attention
from .backends import EVERYWHERE, Call, Policy, dispatch, register_policy, takes_triton
from .grid_linear import GridLinearAttention
from .reference import slab_reference as slab_attention_reference

__all__ = ["slab_attention", "slab_attention_reference", "SLABAttention"]


def _slab(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    phi_q, phi_k = F.relu(q), F.relu(k)
    kv = phi_k.transpose(-2, -1) @ v  # (B, H, d, dv)
    denom = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1) + eps  # (B, H, Nq, 1)
    return (phi_q @ kv) / denom


def slab_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, eps: float = 1e-6,
                   backend: str = "auto") -> torch.Tensor:
    """SLAB's linear attention on q (B, H, Nq, d), k, v (B, H, Nk, ·), without the conv on V; fp32 under autocast.

    ``backend``: ``'triton'`` runs it forward and backward as fused kernels (relu as the prologue of SimA's
    skeleton, :func:`simattn.kernels.linear.launch.linear_triton`; CUDA, or CPU under ``TRITON_INTERPRET=1``),
    ``'torch'`` as torch ops, ``'auto'`` the kernels on CUDA where they take the call, training included, else torch
    (:mod:`simattn.attention.backends`)."""
    check_qkv(q, k, v, "slab")
    check_positive("slab", "eps", eps)
    return dispatch("slab", backend, Call(q, k, v), matmul_dtype(q), _slab_triton, _slab_fp32, q, k, v, eps)


def _slab_triton(dt: torch.dtype, q, k, v, eps: float) -> torch.Tensor:
    return linear_kernels.linear_triton("slab", q, k, v, eps=eps, out_dtype=dt)


def _slab_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    return _slab(q.to(acc), k.to(acc), v.to(acc), eps)


register_policy("slab", Policy({"triton": takes_triton}, why=EVERYWHERE))


@register_attention("slab")
class SLABAttention(GridLinearAttention):
    """SLAB's attention with timm's ``Attention`` signature. Options: ``eps`` and the grid options of
    :class:`GridLinearAttention` (``dwc_kernel`` 5 by default, ``pos_grid``, ``num_prefix_tokens``)."""

    def __init__(self, dim: int, num_heads: int = 8, *, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.eps = check_positive(type(self).__name__, "eps", eps)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return slab_attention(q, k, v, eps=self.eps, backend=self.backend)

    def core_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _slab(q, k, v, self.eps)
