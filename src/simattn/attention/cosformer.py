"""CosFormer (Qin et al., ICLR 2022): ReLU feature maps, optionally with the cosine re-weighting on the 2-D grid.

Without re-weighting (SimA's Table 2 row): out = φ(Q)(φ(K)ᵀV) / max(φ(Q) Σ_j φ(k_j), eps) with φ = ReLU, linear in
N and free of exp.

Re-weighting (``reweight=True``): CosFormer weights each pair by cos(π/2 · (i − j) / M) over a 1-D sequence. For a
token grid SimA's appendix A.4 takes one cosine per axis, φ(q_{i,m})·φ(k_{j,n}) · cos(α_i − α_j) · cos(β_m − β_n),
with row angles α = π/2 · row / H and column angles β = π/2 · column / W (1-based, as CosFormer's π i / 2M), and
expands it into four products: cos α cos β, cos α sin β, sin α cos β and sin α sin β of each token's angles, each
multiplying q and k. The feature maps become 4d wide, so re-weighting costs 4× the Q·K products of SimA. Prefix
tokens (a class token) sit at angle 0 on both axes: the grid's own angles lie in (0, π/2], so every pair's weight
stays in [0, 1]. The grid comes as ``grid_size`` or is inferred like SOFT's (a square grid after 0 or 1 prefix
tokens). SimA reports that the re-weighted form did not converge on ImageNet.

Released code (OpenNLPLab/cosFormer, ``CosformerAttention``, 1-D only): the same non-causal formula, with the
denominator clamped at eps = 1e-6 (followed here). Checked on fixed inputs (B 2, H 3, N 20, d 16, fp64; its
projections given ours): its 1-D re-weighting equals ours on a 1×N grid (α constant, β = π/2 · i / N) to max
|ours − released| = 6.7e-16, and with its angle index set to 0 (sin = 0, cos = 1: the re-weighting off) ours
without re-weighting to 1.1e-16. The paper's 2-D re-weighting has no released code.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ._common import (acc_dtype, apply_token_mask, check_positive, check_qkv, check_token_mask, matmul_dtype,
                      no_autocast)
from ._registry import register_attention
from .base import GridAttention
from .reference import cosformer_reference as cosformer_attention_reference
from .grid import infer_grid

__all__ = ["cosformer_attention", "cosformer_attention_reference", "cosformer_weights", "CosFormerAttention"]


def cosformer_weights(grid_size: Tuple[int, int], num_prefix_tokens: int, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """The (4, P + H·W) weights cos α cos β, cos α sin β, sin α cos β, sin α sin β of each token's row and column
    angles (prefix tokens: angle 0)."""
    gh, gw = grid_size
    index = torch.arange(gh * gw, device=device)
    alpha = F.pad(((index // gw) + 1).to(dtype) * (math.pi / 2 / gh), [num_prefix_tokens, 0])
    beta = F.pad(((index % gw) + 1).to(dtype) * (math.pi / 2 / gw), [num_prefix_tokens, 0])
    ca, sa, cb, sb = alpha.cos(), alpha.sin(), beta.cos(), beta.sin()
    return torch.stack([ca * cb, ca * sb, sa * cb, sa * sb])


def _features(x: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """ReLU(x) (B, H, N, d), or with re-weighting its four weighted copies side by side (B, H, N, 4d)."""
    phi = F.relu(x)
    if weights is None:
        return phi
    return torch.cat([phi * w[:, None] for w in weights.unbind(0)], dim=-1)


def _cosformer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               weights: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    acc = acc_dtype(q)
    phi_q = _features(q.to(acc), weights)
    phi_k = apply_token_mask(_features(k.to(acc), weights), mask)
    kv = phi_k.transpose(-2, -1) @ v.to(acc)  # (B, H, d or 4d, dv)
    denom = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (B, H, Nq, 1)
    return (phi_q @ kv) / denom.clamp_min(eps)


def cosformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, reweight: bool = False,
                        grid_size: Optional[Tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None,
                        mask: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """CosFormer on q (B, H, Nq, d), k, v (B, H, Nk, ·); ``mask`` (B, Nk) removes keys.

    ``reweight=True`` applies the 2-D cosine re-weighting (equal query and key lengths, on ``grid_size`` or a
    square grid inferred after 0 or 1 prefix tokens). The d×dv (4d×dv) summary and the normalizer run in fp32."""
    check_qkv(q, k, v, "cosformer", same_length=reweight)
    check_positive("cosformer", "eps", eps)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "cosformer", k.device)
    weights = None
    if reweight:
        grid, prefix = infer_grid(k.shape[-2], grid_size, num_prefix_tokens, name="cosformer")
        weights = cosformer_weights(grid, prefix, acc_dtype(q), q.device)
    dt = matmul_dtype(q)
    with no_autocast(q):
        out = _cosformer(q, k, v, mask, weights, eps)
    return out.to(dt)


@register_attention("cosformer")
class CosFormerAttention(GridAttention):
    """CosFormer with timm's ``Attention`` signature; options ``reweight`` (the 2-D cosine re-weighting, off by
    default as in SimA's Table 2), ``eps`` and ``num_prefix_tokens`` (None = infer 0 or 1; re-weighting only;
    :class:`~simattn.attention.base.GridAttention`).

    ``forward(x, grid_size=(H, W))`` for non-square grids when re-weighting. No weight matrix is formed, so
    ``attn_drop > 0`` is rejected; masks remove keys."""

    exp_complexity = "0"
    # only the re-weighting works on the grid: masks and keys of another length fit the rest
    supports_mask = True
    supports_cross_length = True

    def __init__(self, dim: int, num_heads: int = 8, *, reweight: bool = False, eps: float = 1e-6,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if not isinstance(reweight, bool):
            raise ValueError(f"CosFormerAttention: reweight={reweight!r}; allowed: True or False")
        self.eps = check_positive(type(self).__name__, "eps", eps)
        self.reweight = reweight

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling is Python
            weights: Optional[torch.Tensor] = None
            if self.reweight:
                grid, prefix = self.token_grid(k.shape[-2], grid_size)
                weights = cosformer_weights(grid, prefix, torch.promote_types(q.dtype, torch.float32), q.device)
            return _cosformer(q, k, v, mask, weights, self.eps).to(q.dtype)
        else:
            return cosformer_attention(q, k, v, reweight=self.reweight, grid_size=grid_size,
                                       num_prefix_tokens=self.num_prefix_tokens, mask=mask, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, reweight={self.reweight}"
