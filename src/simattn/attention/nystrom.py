"""Nyströmformer (Xiong et al., AAAI 2021) with SOFT's 2-D landmarks: a Nyström approximation of softmax attention.

Ŝ = softmax(QK̃ᵀ/√d) · Z · softmax(Q̃Kᵀ/√d), Z ≈ softmax(Q̃K̃ᵀ/√d)⁺, out = Ŝ V computed right to left (linear in N;
2·N·m + m² exps per head with m landmarks fixed: SimA's Table 2 class HN). The paper takes the landmarks Q̃, K̃ as
means of 1-D segments of the sequence; SOFT's Table 1 runs it in its pyramid with 2-D average pooling of the token
grid instead, with SOFT's ratio per stage ("the downsampling ratio remains identical to ours"), which is what this
kind does: ratio×ratio windows, stride ratio, clipped at the grid's edge, after any prefix (class) tokens, which
take part as queries and keys but not in the pooling. The grid comes as ``grid_size`` or is inferred as SOFT's
(a square grid after 0 or 1 prefix tokens).

The pseudo-inverse is the paper's iteration (Razavi et al.), ``num_iters`` = 6 steps as in the paper and the
released code: Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), from Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞). Softmax rows sum to 1, so
‖A‖∞ = 1 and Z₀ = Aᵀ / (max column sum), per (batch, head) as the released code's ``init_option='exact'``; its
default ``'original'`` takes that maximum over the whole batch (one item's result then depends on the others),
which is not followed. The iteration converges cubically once it starts, but from that Z₀ six steps leave a
landmark kernel with condition number ~10² far from its pseudo-inverse (20 steps reach it): the published method is
the six-step one, so six is the default. All of it runs in fp32 (fp64 for fp64 inputs) under autocast.

Released code (mlpen/Nystromformer, ``LRA/code/attention_nystrom.py`` ``NystromAttention``, 1-D segment means):
checked on fixed inputs (B 2, H 3, N 20, d 16, fp64), its 5 segment means being our pooling on a 1×N grid with
ratio 4: max |ours − released| = 3.3e-15 with its ``'exact'`` init (the reference: 2.3e-15), and 0.11 with its
default ``'original'`` init, whose 6 steps from a smaller Z₀ are further from convergence. Its optional depthwise
conv on V (``conv_kernel_size``) is not part of the paper's method and not implemented; masks are not supported
(the landmarks pool the whole grid).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._common import acc_dtype, check_count, check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import GridReducedAttention
from .reference import nystrom_reference as nystrom_attention_reference
from .grid import infer_grid, pool_landmarks

__all__ = ["nystrom_attention", "nystrom_attention_reference", "iterative_pinv", "NystromAttention"]


def iterative_pinv(a: torch.Tensor, num_iters: int = 6) -> torch.Tensor:
    """Z ≈ A⁺ for row-stochastic (…, m, m) A by ``num_iters`` steps of the cubic iteration (module docstring)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    z = a.transpose(-2, -1) / a.sum(dim=-2).amax(dim=-1)[..., None, None]
    for _ in range(num_iters):
        az = a @ z
        z = (0.25 * z) @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _nystrom(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: Tuple[int, int], prefix: int, ratio: int,
             num_iters: int) -> torch.Tensor:
    acc = acc_dtype(q)
    scale = q.shape[-1] ** -0.25  # on q and k each: QKᵀ/√d
    q, k = q.to(acc) * scale, k.to(acc) * scale
    q_lm, k_lm = pool_landmarks(q, grid, ratio, prefix), pool_landmarks(k, grid, ratio, prefix)
    left = (q @ k_lm.transpose(-2, -1)).softmax(dim=-1)  # (B, H, N, m)
    core = (q_lm @ k_lm.transpose(-2, -1)).softmax(dim=-1)  # (B, H, m, m)
    right = (q_lm @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, m, N)
    return left @ (iterative_pinv(core, num_iters) @ (right @ v.to(acc)))


def nystrom_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      grid_size: Optional[Tuple[int, int]] = None, ratio: int = 2,
                      num_prefix_tokens: Optional[int] = None, num_iters: int = 6,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Nyströmformer on q, k, v (B, H, N, d) with landmarks pooled ratio×ratio from the token grid (``grid_size``
    (H, W), or a square grid inferred after 0 or 1 prefix tokens)."""
    if mask is not None:
        raise ValueError("nystrom: token masks are not supported (landmarks are pooled over the whole grid)")
    check_qkv(q, k, v, "nystrom", same_length=True)
    check_count("nystrom", "ratio", ratio)
    check_count("nystrom", "num_iters", num_iters, low=0)
    grid, prefix = infer_grid(k.shape[-2], grid_size, num_prefix_tokens, name="nystrom")
    dt = matmul_dtype(v)
    with no_autocast(q):
        out = _nystrom(q, k, v, grid, prefix, ratio, num_iters)
    return out.to(dt)


@register_attention("nystrom")
class NystromAttention(GridReducedAttention):
    """Nyströmformer with timm's ``Attention`` signature; options ``ratio`` (landmark window and stride; the SOFT
    pyramid sets SOFT's per stage), ``num_iters`` (pseudo-inverse steps, 6) and ``num_prefix_tokens`` (None =
    infer 0 or 1; :class:`~simattn.attention.base.GridAttention`). ``forward(x, grid_size=(H, W))`` for non-square
    grids. No masks; ``attn_drop > 0`` is rejected (no token-token weight matrix is formed)."""

    def __init__(self, dim: int, num_heads: int = 8, *, num_iters: int = 6, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.num_iters = check_count(type(self).__name__, "num_iters", num_iters, low=0)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        grid, prefix = self.token_grid(q.shape[-2], grid_size)
        if torch.jit.is_scripting():  # autocast handling is Python
            return _nystrom(q, k, v, grid, prefix, self.ratio, self.num_iters).to(v.dtype)
        else:
            return nystrom_attention(q, k, v, grid_size=grid, ratio=self.ratio, num_prefix_tokens=prefix,
                                     num_iters=self.num_iters)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ratio={self.ratio}, num_iters={self.num_iters}"
