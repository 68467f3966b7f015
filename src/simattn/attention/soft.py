"""SOFT: softmax-free attention with a Gaussian kernel and a Nyström low-rank approximation (Lu et al.).

S_ij = exp(-‖q_i − k_j‖² / (2√d)) with Q = K (one shared projection). With landmarks Q̃, K̃ pooled from the 2-D
token grid, Ŝ = exp(Q ⊖ K̃) · exp(Q̃ ⊖ K̃)⁺ · exp(Q̃ ⊖ K), and Ŝ V is computed right to left (linear in N).

The inverse of the m×m landmark kernel M uses Newton–Raphson iterations V ← 2V − V P V, ``newton_init``:

- ``'released'`` (default; the released code, which produced the published numbers): P = M + 0.01·I and
  V₀ = α P with α = 0.9·2 / (max row sum of M)² per (batch, head), 20 iterations. The 0.01·I keeps P
  well conditioned, so the result approximates (M + 0.01·I)⁻¹, not M⁺.
- ``'paper'`` (the paper's Sec. 3.3): P = M and V₀ = α M with α = 2βⁿ / ‖M‖₁², β = ½, n the smallest integer ≥ 0
  with ‖I − α M‖₁ ≤ 1, searched up to n = 10 (the limit of the released code's own search of this kind; a kernel
  that is not diagonally dominant never meets the inequality and gets n = 10). The iteration converges to M⁺,
  slowly when M is ill conditioned (close landmarks): expose it with :func:`pinv_residual`.

The backward either runs through the iterations or, as the released code does, uses the inverse's gradient
dP = −Vᵀ G Vᵀ (exact once the iteration has converged). All kernel work runs in fp32 (fp64 for fp64 inputs).
Precision limit: the kernel is exp of minus a squared distance, so for far-apart tokens (e.g. activations of
order 1e4) it underflows to exactly 0 in every float format, and the output and its gradient are 0: the method's
range, not round-off.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._common import check_count, check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import GridReducedAttention
from .grid import add_heads_image, head_images, head_tokens, heads_image, infer_grid, pool_landmarks

__all__ = ["soft_attention", "gaussian_kernel", "newton_pinv", "pinv_residual", "pool_landmarks", "SoftAttention"]

_BACKWARDS = ("exact", "iterative")


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, same_points: bool = False) -> torch.Tensor:
    """exp(-‖a_i − b_j‖² / (2√d)) for a (..., Na, d), b (..., Nb, d), in fp32 (or fp64 for fp64 inputs).

    ‖a − b‖² = ‖a‖² + ‖b‖² − 2 a·b (matmul cost) rounds relative to ‖a‖², so the points are first moved by b's
    mean (distances do not change): the rounding then scales with the points' spread, not their distance from
    the origin. Without it, activations of order 1e4 at d = 64 carry a rounding error of ~1e2 in fp32, and the
    kernel of a token with itself, exp(0) = 1, comes out as e⁻²⁵. ``same_points``: a and b are the same points
    (the landmark kernel), whose diagonal is exp(0) = 1 exactly.
    """
    acc = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    center = b.detach().to(acc).mean(-2, keepdim=True)  # a constant shift: no gradient flows through it
    a, b = a.to(acc) - center, b.to(acc) - center
    return _kernel(a, b, _sq_norms(a), _sq_norms(b), same_points)


def _sq_norms(x: torch.Tensor) -> torch.Tensor:
    return x.square().sum(-1)


def _kernel(a: torch.Tensor, b: torch.Tensor, a_sq: torch.Tensor, b_sq: torch.Tensor,
            same_points: bool = False) -> torch.Tensor:
    """exp(-‖a_i − b_j‖² / (2√d)) from a (…, Na, d), b (…, Nb, d) (centered) and their squared norms (…, N)."""
    sq = a_sq.unsqueeze(-1) + b_sq.unsqueeze(-2) - 2 * (a @ b.transpose(-2, -1))
    if same_points:
        # out of place, and from ops every exporter and runtime takes (Core ML has no in-place write into a
        # diagonal view; onnxruntime has no boolean EyeLike)
        index = torch.arange(sq.shape[-1], device=sq.device)
        sq = sq.masked_fill(index.unsqueeze(-1) == index, 0.0)
    return torch.exp(sq.clamp_min(0) * (-0.5 / math.sqrt(a.shape[-1])))


def _soft_kernels(q: torch.Tensor, k: torch.Tensor, q_landmarks: torch.Tensor,
                  k_landmarks: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SOFT's three kernels exp(Q ⊖ K̃), exp(Q̃ ⊖ K̃), exp(Q̃ ⊖ K) as :func:`gaussian_kernel` computes them, with
    one shift (the key landmarks' mean) and each squared norm computed once for all three."""
    acc = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
    center = k_landmarks.detach().to(acc).mean(-2, keepdim=True)
    same_landmarks = q_landmarks is k_landmarks
    qc = q.to(acc) - center
    kc = qc if k is q else k.to(acc) - center
    klc = k_landmarks.to(acc) - center
    qlc = klc if same_landmarks else q_landmarks.to(acc) - center
    q_sq, kl_sq = _sq_norms(qc), _sq_norms(klc)
    k_sq = q_sq if k is q else _sq_norms(kc)
    ql_sq = kl_sq if same_landmarks else _sq_norms(qlc)
    return (_kernel(qc, klc, q_sq, kl_sq), _kernel(qlc, klc, ql_sq, kl_sq, same_landmarks),
            _kernel(qlc, kc, ql_sq, k_sq))


_NEWTON_INITS = ("released", "paper")


def _paper_alpha(m: torch.Tensor, max_halvings: int = 10) -> torch.Tensor:
    """α = 2βⁿ/‖M‖₁² (β = ½) with the smallest n ≥ 0 such that ‖I − αM‖₁ ≤ 1, per matrix (…,)."""
    norm_1 = m.abs().sum(-2).amax(-1).clamp_min(1e-30)  # max column sum
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    alpha = torch.zeros_like(norm_1)
    done = torch.zeros_like(norm_1, dtype=torch.bool)
    for n in range(max_halvings + 1):
        a = 2 * 0.5 ** n / norm_1.square()
        ok = ((eye - a[..., None, None] * m).abs().sum(-2).amax(-1) <= 1) | (n == max_halvings)
        alpha = torch.where(done, alpha, a)
        done = done | ok
        if bool(done.all()):  # a host sync per halving; few are needed (and only with this option)
            break
    return alpha


def _nr_iterate(m: torch.Tensor, num_iters: int, init: str = "released") -> torch.Tensor:
    if init == "released":
        p = m + 0.01 * torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        alpha = 1.8 / m.abs().sum(-1).amax(-1).square().clamp_min(1e-30)  # max row sum of M (≥ 0 entries)
    else:
        p = m
        alpha = _paper_alpha(m)
    # V₀ = α Pᵀ (= α P for SOFT's symmetric kernel; the transpose keeps the iteration a pseudo-inverse otherwise)
    x = alpha[..., None, None] * p.transpose(-2, -1)
    for _ in range(num_iters):
        x = 2 * x - x @ p @ x
    return x


def _check_newton_init(init: str) -> None:
    if init not in _NEWTON_INITS:
        raise ValueError(f"soft: unknown newton_init {init!r}; expected one of {', '.join(_NEWTON_INITS)}")


class _NewtonPinvExact(torch.autograd.Function):
    """Iterations without a graph; backward as for a true inverse, dP = −Xᵀ G Xᵀ (the released code's choice)."""

    @staticmethod
    def forward(ctx, m, num_iters, init):
        x = _nr_iterate(m, num_iters, init)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xt = x.transpose(-2, -1)
        return -(xt @ grad @ xt), None, None


def newton_pinv(m: torch.Tensor, num_iters: int = 20, backward: str = "exact",
                newton_init: str = "released") -> torch.Tensor:
    """Newton–Raphson inverse of the (…, m, m) landmark kernel ``m``: (M + 0.01·I)⁻¹ with ``newton_init='released'``,
    M⁺ with ``'paper'`` (see the module docstring)."""
    if backward not in _BACKWARDS:
        raise ValueError(f"soft: unknown backward {backward!r}; expected one of {', '.join(_BACKWARDS)}")
    _check_newton_init(newton_init)
    check_count("soft", "num_iters", num_iters, low=0)
    if backward == "exact":
        return _NewtonPinvExact.apply(m, num_iters, newton_init)
    return _nr_iterate(m, num_iters, newton_init)


def pinv_residual(m: torch.Tensor, num_iters: int = 20, newton_init: str = "released") -> torch.Tensor:
    """Convergence residual ‖P X P − P‖_F / ‖P‖_F per (batch, head) after ``num_iters`` iterations, with P the
    matrix the iteration inverts (M + 0.01·I for 'released', M for 'paper')."""
    _check_newton_init(newton_init)
    with torch.no_grad():
        m = m.to(torch.promote_types(m.dtype, torch.float32))
        x = _nr_iterate(m, num_iters, newton_init)
        if newton_init == "released":
            m = m + 0.01 * torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        return torch.linalg.matrix_norm(m @ x @ m - m) / torch.linalg.matrix_norm(m).clamp_min(1e-30)


def _check_soft(q, k, v, grid_size, num_prefix_tokens, ratio, num_iters, landmarks):
    check_qkv(q, k, v, "soft")
    check_count("soft", "ratio", ratio)
    check_count("soft", "num_iters", num_iters, low=0)
    for name, lm in landmarks:
        if lm is not None and (lm.dim() != 4 or lm.shape[:2] != q.shape[:2] or lm.shape[-1] != q.shape[-1]):
            raise ValueError(f"soft: {name} must have shape (B, H, m, d) = ({q.shape[0]}, {q.shape[1]}, m, "
                             f"{q.shape[-1]}), got {tuple(lm.shape)}")
        if lm is not None and lm.device != q.device:
            raise ValueError(f"soft: {name} is on {lm.device} but q is on {q.device}; allowed: one device")
    return infer_grid(k.shape[-2], grid_size, num_prefix_tokens)


def soft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   grid_size: Optional[Tuple[int, int]] = None, ratio: int = 2,
                   num_prefix_tokens: Optional[int] = None, q_landmarks: Optional[torch.Tensor] = None,
                   k_landmarks: Optional[torch.Tensor] = None, num_iters: int = 20, backward: str = "exact",
                   newton_init: str = "released", mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SOFT attention on q (B, H, Nq, d), k, v (B, H, Nk, ·); in the paper k is q.

    Landmarks default to ratio×ratio average pooling of the key grid (``grid_size`` (H, W) or inferred for a square
    grid, after ``num_prefix_tokens`` leading tokens such as CLS, which take part as queries and keys but not in the
    pooling). Pass ``q_landmarks`` / ``k_landmarks`` (B, H, m, d) to use others (e.g. a learned conv), in the same
    (unscaled) space as q and k. ``newton_init``: 'released' | 'paper' (module docstring).
    """
    if mask is not None:
        raise ValueError("soft: token masks are not supported (landmarks are pooled over the whole grid)")
    grid, prefix = _check_soft(q, k, v, grid_size, num_prefix_tokens, ratio, num_iters,
                               (("q_landmarks", q_landmarks), ("k_landmarks", k_landmarks)))
    if k_landmarks is None:
        k_landmarks = pool_landmarks(k, grid, ratio, prefix)
    if q_landmarks is None:
        q_landmarks = k_landmarks if q is k else pool_landmarks(q, grid, ratio, prefix)
    dt = matmul_dtype(v)
    with no_autocast(q):
        left, core, right = _soft_kernels(q, k, q_landmarks, k_landmarks)  # (B, H, Nq | m, m | Nk)
        out = left @ (newton_pinv(core, num_iters, backward, newton_init) @ (right @ v.to(left.dtype)))
    return out.to(dt)


@register_attention("soft")
class SoftAttention(GridReducedAttention):
    """SOFT attention module with timm's ``Attention`` signature; q and k share one projection (``qkv`` holds q, v).

    Extra options: ``ratio`` (landmark window and stride), ``landmarks`` ('pool': ratio×ratio average pooling;
    'conv': the released code's learned landmarks, one ``Conv2d(d_h, d_h, ratio, stride=ratio, bias=False)``
    shared by all heads, then ``LayerNorm(d_h)`` and GELU, applied to q / d^¼), ``num_iters``, ``backward``
    ('exact' | 'iterative'), ``newton_init`` ('released' | 'paper', see the module docstring), ``v_conv_kernel``
    (depthwise conv on V over the grid, added to the output; 0 = off), ``num_prefix_tokens`` (None = infer 0 or
    1; :class:`~simattn.attention.base.GridAttention`). ``forward(x, grid_size=(H, W))`` for non-square grids. With
    ``ratio=1`` the landmarks are the tokens themselves (exact kernel, no conv). There is no token-token weight
    matrix, so ``attn_drop > 0`` is rejected.
    """

    # q = k; the 2·N·m + m² kernel exps per head (m = N/ratio² landmarks) are the base's HN², as SimA's Table 2 has
    separate_qk = False

    def __init__(self, dim: int, num_heads: int = 8, *, landmarks: str = "pool", num_iters: int = 20,
                 backward: str = "exact", newton_init: str = "released", v_conv_kernel: int = 0, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if landmarks not in ("pool", "conv"):
            raise ValueError(f"soft: unknown landmarks {landmarks!r}; expected 'pool' or 'conv'")
        if backward not in _BACKWARDS:
            raise ValueError(f"soft: unknown backward {backward!r}; expected one of {', '.join(_BACKWARDS)}")
        _check_newton_init(newton_init)
        check_count("SoftAttention", "num_iters", num_iters, low=0)
        check_count("SoftAttention", "v_conv_kernel", v_conv_kernel, low=0)
        self.num_iters, self.backward, self.newton_init = num_iters, backward, newton_init
        ratio = self.ratio
        self.landmarks = landmarks
        self.landmark_conv: Optional[nn.Module] = None
        self.landmark_norm: Optional[nn.Module] = None
        if landmarks == "conv" and ratio > 1:
            self.landmark_conv = nn.Conv2d(self.head_dim, self.head_dim, ratio, stride=ratio, bias=False)
            self.landmark_norm = nn.LayerNorm(self.head_dim)
        self.v_conv = nn.Conv2d(dim, dim, v_conv_kernel, padding=v_conv_kernel // 2, groups=dim) \
            if v_conv_kernel else None

    def conv_landmarks(self, q: torch.Tensor, grid: Tuple[int, int], prefix: int) -> torch.Tensor:
        """The released code's learned landmarks of q (B, H, N, d) → (B, H, m, d), in q's (unscaled) space."""
        assert self.landmark_conv is not None and self.landmark_norm is not None, "built with landmarks='conv'"
        scale = q.shape[-1] ** 0.25  # the released code works on q / d^¼, where the kernel is exp(-dist / 2)
        lm = head_tokens(self.landmark_conv(head_images(q / scale, grid, prefix)), q.shape[1])  # heads share it
        return F.gelu(self.landmark_norm(lm)) * scale

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        grid, prefix = self.token_grid(q.shape[-2], grid_size)
        landmarks: Optional[torch.Tensor] = None
        if self.landmark_conv is not None:
            landmarks = self.conv_landmarks(q, grid, prefix)
        if torch.jit.is_scripting():  # no autograd.Function or autocast handling: the kernels and iterations as such
            lm = pool_landmarks(q, grid, self.ratio, prefix) if landmarks is None else landmarks
            left = gaussian_kernel(q, lm)
            core = _nr_iterate(gaussian_kernel(lm, lm, True), self.num_iters, self.newton_init)
            out = (left @ (core @ (gaussian_kernel(lm, q) @ v.to(left.dtype)))).to(v.dtype)
        else:
            out = soft_attention(q, q, v, grid_size=grid, ratio=self.ratio, num_prefix_tokens=prefix,
                                 q_landmarks=landmarks, k_landmarks=landmarks, num_iters=self.num_iters,
                                 backward=self.backward, newton_init=self.newton_init)
        if self.v_conv is not None:  # depthwise conv of V on the grid, added to the grid tokens' outputs
            out = add_heads_image(out, self.v_conv(heads_image(v, grid, prefix)), prefix)
        return out

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, ratio={self.ratio}, landmarks={self.landmarks!r}, "
                f"num_iters={self.num_iters}, newton_init={self.newton_init!r}")
