"""SOFT: softmax-free attention with a Gaussian kernel and a Nyström low-rank approximation (Lu et al.).

S_ij = exp(-‖q_i − k_j‖² / (2√d)) with Q = K (one shared projection). With landmarks Q̃, K̃ pooled from the 2-D
token grid, Ŝ = exp(Q ⊖ K̃) · exp(Q̃ ⊖ K̃)⁺ · exp(Q̃ ⊖ K), and Ŝ V is computed right to left (linear in N). The
pseudo-inverse uses Newton–Raphson iterations A_{k+1} = 2A_k − A_k M A_k from A_0 = α Mᵀ with, per (batch, head),
α = 1.8 / (‖M‖₁ ‖M‖∞) (< 2/σ_max², so the iteration converges; for a symmetric M this is the released code's
0.9·2/(max row sum)²). The backward either runs through the iterations or uses the inverse's gradient −Xᵀ G Xᵀ.
All kernel work runs in fp32.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._common import check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import TokenAttention

__all__ = [
    "soft_attention", "soft_attention_reference", "gaussian_kernel", "newton_pinv", "pinv_residual",
    "pool_landmarks", "infer_grid", "SoftAttention",
]

_BACKWARDS = ("exact", "iterative")


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(-‖a_i − b_j‖² / (2√d)) for a (..., Na, d), b (..., Nb, d), in fp32 (or fp64 for fp64 inputs)."""
    acc = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    a, b = a.to(acc), b.to(acc)
    sq = a.square().sum(-1, keepdim=True) + b.square().sum(-1).unsqueeze(-2) - 2 * (a @ b.transpose(-2, -1))
    return torch.exp(sq.clamp_min(0) * (-0.5 / math.sqrt(a.shape[-1])))


def _nr_iterate(m: torch.Tensor, num_iters: int) -> torch.Tensor:
    norm_1 = m.abs().sum(-2).amax(-1)  # max column sum, per (batch, head)
    norm_inf = m.abs().sum(-1).amax(-1)  # max row sum
    x = (1.8 / (norm_1 * norm_inf).clamp_min(1e-30))[..., None, None] * m.transpose(-2, -1)
    for _ in range(num_iters):
        x = 2 * x - x @ m @ x
    return x


class _NewtonPinvExact(torch.autograd.Function):
    """Iterations without a graph; backward as for a true inverse, dM = −Xᵀ G Xᵀ (the released code's choice)."""

    @staticmethod
    def forward(ctx, m, num_iters):
        x = _nr_iterate(m, num_iters)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xt = x.transpose(-2, -1)
        return -(xt @ grad @ xt), None


def newton_pinv(m: torch.Tensor, num_iters: int = 20, backward: str = "exact") -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of the (…, m, m) matrix ``m`` by Newton–Raphson iterations."""
    if backward not in _BACKWARDS:
        raise ValueError(f"soft: unknown backward {backward!r}; expected one of {', '.join(_BACKWARDS)}")
    if num_iters < 0:
        raise ValueError(f"soft: num_iters must be >= 0, got {num_iters}")
    if backward == "exact":
        return _NewtonPinvExact.apply(m, num_iters)
    return _nr_iterate(m, num_iters)


def pinv_residual(m: torch.Tensor, num_iters: int = 20) -> torch.Tensor:
    """Convergence residual ‖M X M − M‖_F / ‖M‖_F per (batch, head) after ``num_iters`` iterations."""
    with torch.no_grad():
        m = m.to(torch.promote_types(m.dtype, torch.float32))
        x = _nr_iterate(m, num_iters)
        return torch.linalg.matrix_norm(m @ x @ m - m) / torch.linalg.matrix_norm(m).clamp_min(1e-30)


def infer_grid(n: int, grid_size: Optional[Tuple[int, int]] = None,
               num_prefix_tokens: Optional[int] = None) -> Tuple[Tuple[int, int], int]:
    """((H, W), number of prefix tokens) for n tokens: from ``grid_size`` or a square grid with 0 or 1 prefix tokens."""
    if grid_size is not None:
        gh, gw = grid_size
        prefix = n - gh * gw
        if prefix < 0 or (num_prefix_tokens is not None and prefix != num_prefix_tokens):
            raise ValueError(f"soft: {n} tokens do not fit grid {gh}x{gw} with {num_prefix_tokens or 0} prefix tokens")
        return (gh, gw), prefix
    for prefix in ((num_prefix_tokens,) if num_prefix_tokens is not None else (0, 1)):
        side = math.isqrt(max(n - prefix, 0))
        if side > 0 and side * side == n - prefix:
            return (side, side), prefix
    raise ValueError(f"soft: cannot infer a square token grid from N={n}; pass grid_size=(H, W)")


def pool_landmarks(x: torch.Tensor, grid_size: Tuple[int, int], ratio: int, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Landmarks by ratio×ratio stride-ratio average pooling of the grid tokens of x (B, H, N, d) → (B, H, m, d)."""
    B, H, N, d = x.shape
    gh, gw = grid_size
    grid = x[:, :, num_prefix_tokens:].reshape(B * H, gh, gw, d).permute(0, 3, 1, 2)
    pooled = F.avg_pool2d(grid, ratio, ratio, ceil_mode=True) if ratio > 1 else grid
    return pooled.flatten(2).transpose(1, 2).reshape(B, H, -1, d)


def _check_soft(q, k, v, grid_size, num_prefix_tokens):
    check_qkv(q, k, v, "soft")
    return infer_grid(k.shape[-2], grid_size, num_prefix_tokens)


def soft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   grid_size: Optional[Tuple[int, int]] = None, ratio: int = 2,
                   num_prefix_tokens: Optional[int] = None, q_landmarks: Optional[torch.Tensor] = None,
                   k_landmarks: Optional[torch.Tensor] = None, num_iters: int = 20, backward: str = "exact",
                   mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SOFT attention on q (B, H, Nq, d), k, v (B, H, Nk, ·); in the paper k is q.

    Landmarks default to ratio×ratio average pooling of the key grid (``grid_size`` (H, W) or inferred for a square
    grid, after ``num_prefix_tokens`` leading tokens such as CLS, which take part as queries and keys but not in the
    pooling). Pass ``q_landmarks`` / ``k_landmarks`` (B, H, m, d) to use others (e.g. a learned conv).
    """
    if mask is not None:
        raise ValueError("soft: token masks are not supported (landmarks are pooled over the whole grid)")
    grid, prefix = _check_soft(q, k, v, grid_size, num_prefix_tokens)
    if k_landmarks is None:
        k_landmarks = pool_landmarks(k, grid, ratio, prefix)
    if q_landmarks is None:
        q_landmarks = k_landmarks if q is k else pool_landmarks(q, grid, ratio, prefix)
    dt = matmul_dtype(v)
    with no_autocast(q):
        left = gaussian_kernel(q, k_landmarks)  # (B, H, Nq, m)
        core = gaussian_kernel(q_landmarks, k_landmarks)  # (B, H, m, m)
        right = gaussian_kernel(q_landmarks, k)  # (B, H, m, Nk)
        out = left @ (newton_pinv(core, num_iters, backward) @ (right @ v.to(left.dtype)))
    return out.to(dt)


def soft_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                             grid_size: Optional[Tuple[int, int]] = None, ratio: int = 2,
                             num_prefix_tokens: Optional[int] = None) -> torch.Tensor:
    """Quadratic, literal form: materialize Ŝ = exp(Q⊖K̃) pinv(exp(Q̃⊖K̃)) exp(Q̃⊖K) with an exact
    ``torch.linalg.pinv``, then Ŝ V."""
    grid, prefix = _check_soft(q, k, v, grid_size, num_prefix_tokens)
    k_l = pool_landmarks(k, grid, ratio, prefix)
    q_l = pool_landmarks(q, grid, ratio, prefix)
    s_hat = gaussian_kernel(q, k_l) @ torch.linalg.pinv(gaussian_kernel(q_l, k_l)) @ gaussian_kernel(q_l, k)
    return s_hat @ v.to(s_hat.dtype)


@register_attention("soft")
class SoftAttention(TokenAttention):
    """SOFT attention module with timm's ``Attention`` signature; q and k share one projection (``qkv`` holds q, v).

    Extra options: ``ratio`` (landmark pooling k = stride), ``landmarks`` ('pool' | 'conv': a stride-``ratio`` conv
    + LayerNorm + GELU as in the released code), ``num_iters``, ``backward`` ('exact' | 'iterative'),
    ``v_conv_kernel`` (depthwise conv on V over the grid, added to the output; 0 = off), ``num_prefix_tokens``
    (None = infer 0 or 1). ``forward(x, grid_size=(H, W))`` for non-square grids.
    """

    supports_mask = False
    supports_cross_length = False
    separate_qk = False

    def __init__(self, dim: int, num_heads: int = 8, *, ratio: int = 2, landmarks: str = "pool",
                 num_iters: int = 20, backward: str = "exact", v_conv_kernel: int = 0,
                 num_prefix_tokens: Optional[int] = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if landmarks not in ("pool", "conv"):
            raise ValueError(f"soft: unknown landmarks {landmarks!r}; expected 'pool' or 'conv'")
        if backward not in _BACKWARDS:
            raise ValueError(f"soft: unknown backward {backward!r}; expected one of {', '.join(_BACKWARDS)}")
        if ratio < 1:
            raise ValueError(f"soft: ratio must be >= 1, got {ratio}")
        self.ratio, self.num_iters, self.backward = ratio, num_iters, backward
        self.num_prefix_tokens = num_prefix_tokens
        self.landmarks = landmarks
        if landmarks == "conv" and ratio > 1:
            self.landmark_conv = nn.Conv2d(dim, dim, ratio, stride=ratio)
            self.landmark_norm = nn.LayerNorm(dim)
        self.v_conv = nn.Conv2d(dim, dim, v_conv_kernel, padding=v_conv_kernel // 2, groups=dim) \
            if v_conv_kernel else None

    def _grid_map(self, t: torch.Tensor, grid, prefix, fn):
        """Apply fn to the (B, C, H, W) image of the grid tokens of t (B, heads, N, d)."""
        B, Hh, N, d = t.shape
        img = t[:, :, prefix:].permute(0, 1, 3, 2).reshape(B, Hh * d, *grid)
        return fn(img)

    def attend(self, q, k, v, mask, grid_size=None):
        grid, prefix = infer_grid(q.shape[-2], grid_size, self.num_prefix_tokens)
        B, Hh, N, d = q.shape
        q_landmarks = None
        if self.landmarks == "conv" and self.ratio > 1:
            lm = self._grid_map(q, grid, prefix, self.landmark_conv).flatten(2).transpose(1, 2)  # (B, m, C)
            lm = F.gelu(self.landmark_norm(lm))
            q_landmarks = lm.reshape(B, -1, Hh, d).transpose(1, 2)
        out = soft_attention(q, q, v, grid_size=grid, ratio=self.ratio, num_prefix_tokens=prefix,
                             q_landmarks=q_landmarks, k_landmarks=q_landmarks, num_iters=self.num_iters,
                             backward=self.backward)
        if self.v_conv is not None:
            conv = self._grid_map(v, grid, prefix, self.v_conv).reshape(B, Hh, d, -1).transpose(-2, -1)
            out = out + F.pad(conv.to(out.dtype), (0, 0, prefix, 0))
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ratio={self.ratio}, landmarks={self.landmarks!r}, num_iters={self.num_iters}"
