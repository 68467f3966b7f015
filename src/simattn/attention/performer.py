"""Performer (Choromanski et al., ICLR 2021): FAVOR+, softmax attention through positive orthogonal random features.

With x' = x / d^¼ and m random features w_1..w_m, φ(x) = exp(−‖x'‖²/2) / √m · (exp(w_iᵀx'))_i is positive and
E[φ(q)·φ(k)] = exp(q·k/√d); out = D⁻¹ φ(Q)(φ(K)ᵀV) with D = diag(φ(Q) Σ_j φ(k_j)), linear in N with N·m exps per
head (SimA's Table 2: ND). The features are orthogonal in blocks of d (QR of a Gaussian matrix, Haar-distributed
by the signs of R's diagonal), each row scaled to the norm of a Gaussian vector (the paper's regular, unbiased
scaling); m defaults to ⌊d ln d⌋ as in the authors' and lucidrains' code.

Stabilizers, exact because they cancel in D⁻¹: queries subtract each row's largest w_iᵀq' (‖q'‖²/2 is constant
over a row and cancels too), keys subtract the largest w_iᵀk' − ‖k'‖²/2 over all keys and features of a (batch,
head). All feature work runs in fp32 under autocast.

Redrawing (the paper redraws the random features during training): the module holds its features in the buffer
``features`` (saved with the weights, so a checkpoint evaluates as it was trained) and, in training mode, draws
new ones every ``redraw_interval`` forward calls (1 = every call, 0 = never; default 1000 as lucidrains'
``feature_redraw_interval``). Evaluation never redraws: it is deterministic. ``feature_seed`` makes the draws
reproducible (draw t uses a generator seeded with feature_seed + t), else they come from torch's global generator.
Redrawing happens in eager Python only: a captured graph (TorchScript, torch.export, torch.compile) uses the
features it was captured with.

Released code (lucidrains/performer-pytorch ``FastAttention``, a port of the authors' JAX ``fast_attention``):
the same kernel, but it adds eps = 1e-4 to every feature after the stabilizer (a bias the paper does not have) and
computes φ in the inputs' dtype. Checked on fixed inputs and features (B 2, H 3, N 20, d 16, m 44, fp64): max
|ours − released| = 1.8e-15 with its eps set to 0 (the reference: 1.3e-15), and 0.56 with its default eps: its key
stabilizer subtracts the largest wᵀk' but not ‖k'‖²/2, so the keys' features are of order 1e-3 here and the eps
pulls the weights towards uniform. Its ``gaussian_orthogonal_random_matrix`` draws the same distribution (QR
without the sign fix).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ._common import (acc_dtype, apply_token_mask, check_count, check_qkv, check_token_mask, eager, matmul_dtype,
                      no_autocast)
from ._registry import register_attention
from .base import TokenAttention
from .reference import performer_reference as performer_attention_reference

__all__ = ["performer_attention", "performer_attention_reference", "orthogonal_random_features", "favor_features",
           "PerformerAttention"]


def orthogonal_random_features(num_features: int, dim: int, generator: Optional[torch.Generator] = None,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(num_features, dim) random features on the CPU: blocks of ``dim`` orthonormal rows (Haar), each row scaled
    to the length of an independent standard Gaussian vector in R^dim."""
    check_count("performer", "num_features", num_features)
    check_count("performer", "dim", dim)
    blocks = []
    for _ in range(-(-num_features // dim)):
        gauss = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)
        blocks.append((q * torch.sign(torch.diagonal(r)).unsqueeze(0)).T)  # rows orthonormal, Haar distributed
    rows = torch.cat(blocks)[:num_features]
    lengths = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (rows * lengths).to(dtype)


def favor_features(x: torch.Tensor, features: torch.Tensor, is_query: bool) -> torch.Tensor:
    """φ(x) of FAVOR+ for x (B, H, N, d) with features (m, d), up to a factor per row (queries) or per (batch, head)
    (keys), which cancels in the attention's normalization; in x's dtype."""
    x = x * x.shape[-1] ** -0.25
    proj = x @ features.to(x.dtype).transpose(-2, -1)  # (B, H, N, m)
    if is_query:
        return torch.exp(proj - proj.amax(dim=-1, keepdim=True).detach())
    logits = proj - 0.5 * x.square().sum(dim=-1, keepdim=True)
    return torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True).detach())


def _performer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, features: torch.Tensor,
               mask: Optional[torch.Tensor]) -> torch.Tensor:
    acc = acc_dtype(q)
    phi_q = favor_features(q.to(acc), features, True)
    phi_k = apply_token_mask(favor_features(k.to(acc), features, False), mask)
    kv = phi_k.transpose(-2, -1) @ v.to(acc)  # (B, H, m, dv)
    denom = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
    # far-apart q and k (activations of order 1e4) underflow every product: 0, not 0/0
    return (phi_q @ kv) / denom.clamp_min(1e-30)


def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, features: torch.Tensor,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """FAVOR+ on q (B, H, Nq, d), k, v (B, H, Nk, ·) with random ``features`` (m, d)
    (:func:`orthogonal_random_features`); ``mask`` (B, Nk) removes keys. Features and sums in fp32."""
    check_qkv(q, k, v, "performer")
    if not torch.is_tensor(features) or features.dim() != 2 or features.shape[-1] != q.shape[-1]:
        shape = tuple(features.shape) if torch.is_tensor(features) else type(features).__name__
        raise ValueError(f"performer: features must have shape (m, d) = (m, {q.shape[-1]}), got {shape}")
    if features.device != q.device:
        raise ValueError(f"performer: features are on {features.device} but q is on {q.device}; allowed: one device")
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "performer", k.device)
    dt = matmul_dtype(q)
    with no_autocast(q):
        out = _performer(q, k, v, features, mask)
    return out.to(dt)


@register_attention("performer")
class PerformerAttention(TokenAttention):
    """Performer (FAVOR+) with timm's ``Attention`` signature; one set of random features shared by the heads.

    Options: ``num_features`` (m; None = ⌊d ln d⌋ for head dim d), ``redraw_interval`` (training calls between
    redraws; 0 = never), ``feature_seed`` (None = torch's global generator). See the module docstring. No weight
    matrix is formed, so ``attn_drop > 0`` is rejected; masks remove keys."""

    exp_complexity = "ND"

    def __init__(self, dim: int, num_heads: int = 8, *, num_features: Optional[int] = None,
                 redraw_interval: int = 1000, feature_seed: Optional[int] = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        name = type(self).__name__
        if num_features is None:
            num_features = max(1, int(self.head_dim * math.log(self.head_dim)))
        self.num_features = check_count(name, "num_features", num_features)
        self.redraw_interval = check_count(name, "redraw_interval", redraw_interval, low=0)
        if feature_seed is not None:
            check_count(name, "feature_seed", feature_seed, low=0)
        self.feature_seed = feature_seed
        self.draws = 0
        self.calls_since_redraw = 0
        self.register_buffer("features", self._draw())

    def _draw(self) -> torch.Tensor:
        generator = None
        if self.feature_seed is not None:
            generator = torch.Generator().manual_seed(self.feature_seed + self.draws)
        self.draws += 1
        return orthogonal_random_features(self.num_features, self.head_dim, generator)

    @torch.jit.unused
    def redraw_features(self) -> None:
        """Draw new random features in place (same device and dtype)."""
        with torch.no_grad():
            self.features.copy_(self._draw())
        self.calls_since_redraw = 0

    @torch.jit.unused
    def _count_call(self) -> None:
        if self.training and self.redraw_interval > 0 and eager():
            if self.calls_since_redraw >= self.redraw_interval:
                self.redraw_features()
            self.calls_since_redraw += 1

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # redrawing and autocast handling are Python
            return _performer(q, k, v, self.features, mask).to(q.dtype)
        else:
            self._count_call()
            return performer_attention(q, k, v, features=self.features, mask=mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_features={self.num_features}, redraw_interval={self.redraw_interval}"
