"""Efficient Attention (Shen et al., WACV 2021): softmax of q over its channels, softmax of k over tokens, q(kᵀv).

E(Q, K, V) = ρ_q(Q) (ρ_k(K)ᵀ V): each query's channels sum to 1 and each key channel's weights over the tokens
sum to 1, so the d×dv summary ρ_k(K)ᵀV is a set of d weighted means of the values ("global context vectors") and
every output row is a convex combination of them. Linear in N; 2·N·d exps per head (SimA's Table 2: ND).

Released code (cmsflash/efficient-attention, ``EfficientAttention``): the same formula on (n, c, h·w) maps, one head
at a time, inside a module with 1×1-conv projections and a residual; no scale on q or k, no mask. Checked on fixed
inputs (B 2, H 3, N 20, d 16, fp64; its convs given our q, k, v projections, the residual taken off): max |ours −
released| = 4.4e-16 (the reference: 3.3e-16). The paper defines no mask; here a key mask removes tokens from the
key softmax and the sum, which equals running on the kept tokens.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._common import acc_dtype, check_qkv, check_token_mask, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import TokenAttention
from .reference import efficient_reference as efficient_attention_reference

__all__ = ["efficient_attention", "efficient_attention_reference", "EfficientAttention"]


def efficient_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Efficient Attention on q (B, H, Nq, d), k, v (B, H, Nk, ·); ``mask`` (B, Nk) removes keys.

    Both softmaxes and the d×dv summary run in fp32 (fp64 for fp64 inputs) under autocast: the key softmax sums N
    exps and the summary N products."""
    check_qkv(q, k, v, "efficient")
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "efficient", k.device)
    dt = matmul_dtype(q)
    with no_autocast(q):
        out = _efficient(q, k, v, mask)
    return out.to(dt)


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    acc = acc_dtype(q)
    k = k.to(acc)
    if mask is not None:
        k = k.masked_fill(~mask[:, None, :, None], float("-inf"))
    rho_q = q.to(acc).softmax(dim=-1)
    rho_k = k.softmax(dim=-2)
    if mask is not None:  # a fully masked item: -inf everywhere gives NaN weights; it takes no keys instead
        rho_k = torch.where(mask[:, None, :, None], rho_k, torch.zeros_like(rho_k))
    return rho_q @ (rho_k.transpose(-2, -1) @ v.to(acc))


@register_attention("efficient")
class EfficientAttention(TokenAttention):
    """Efficient Attention with timm's ``Attention`` signature (XCiT with Efficient Attention in SimA's Table 2).

    No token-token weight matrix is formed, so ``attn_drop > 0`` is rejected; masks remove keys."""

    exp_complexity = "ND"

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling is Python
            return _efficient(q, k, v, mask).to(q.dtype)
        else:
            return efficient_attention(q, k, v, mask=mask)
