"""InLine: injective linear attention (Han et al., NeurIPS 2024).

Linear attention normalized by division maps queries that differ only in scale to the same weights (it is not
injective). InLine subtracts instead: with φ(x) = x·√(s/N), s = d^-½ (the released DeiT's kernel),

    w_ij = φ(q_i)ᵀφ(k_j) − 1/N Σ_m φ(q_i)ᵀφ(k_m) + 1/N,   out_i = Σ_j w_ij v_j + local_i,

each row of W summing to 1. Linear in N: out_i = v̄ + s · q_iᵀ Σ_j (k_j − k̄)(v_j − v̄)ᵀ / N, which the fast path
computes from centered keys and values (no cancellation between q(KᵀV)/N and (q·k̄)v̄ when the means are large).
No exp in the attention.

The local branch: a 3×3 depthwise conv of V over the grid tokens whose kernels are predicted per image and channel
from the mean of the input tokens, ``residual`` = Conv1d(C, C, 1, groups=H) → GELU → Conv1d(C, 9C, 1, groups=H)
(one GELU per channel and image: exp-like work independent of N, SimA's class Hd²). Eagerly it runs as one
depthwise conv over every image's channels, as released; in captured graphs as nine shifted products (the conv's
groups would fix the batch size).

Released code (LeapLabTHU/InLine, ``InLineAttention`` of ``models/inline_deit.py``, no license: run only to
measure): the class token takes part in the attention and in the mean that predicts the kernels, but not in the
conv; followed here. Checked on fixed inputs (B 2, a class token and a 14×14 grid, C 96, 6 heads, fp64, random
weights copied from its module into ours): max |ours − released| = 4.6e-14, on outputs up to 64.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import linear as linear_kernels
from ._common import acc_dtype, check_count, check_positive, check_qkv, eager, matmul_dtype, no_autocast
from ._registry import register_attention
from .backends import EVERYWHERE, Call, Policy, dispatch, register_policy, takes_triton
from .grid import add_to_grid, heads_image, heads_tokens
from .grid_linear import GridLinearAttention
from .reference import inline_reference as inline_attention_reference

__all__ = ["inline_attention", "inline_attention_reference", "local_conv", "InLineAttention"]


def _inline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    v_mean = v.mean(dim=-2, keepdim=True)
    k_centered = k - k.mean(dim=-2, keepdim=True)
    kv = k_centered.transpose(-2, -1) @ ((v - v_mean) / k.shape[-2])  # (B, H, d, dv)
    return v_mean + (q * scale) @ kv


def _inline_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # (k − k̄)ᵀ(v − v̄) = (k − k̄)ᵀv: the kernels' plain q(kᵀv) on the centered keys, then the mean of v
    k_centered = k - k.mean(dim=-2, keepdim=True)
    out = linear_kernels.linear_triton("plain", q * (scale / k.shape[-2]), k_centered, v)
    return out + v.mean(dim=-2, keepdim=True)


def inline_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     scale: Optional[float] = None, backend: str = "auto") -> torch.Tensor:
    """InLine attention on q (B, H, Nq, d), k, v (B, H, Nk, ·) without the local branch; ``scale`` s (default
    d^-½). The means and the d×dv matrix run in fp32 under autocast. ``backend``: ``'triton'`` runs q(kᵀv) on the
    centered keys forward and backward as fused kernels (SimA's skeleton with no feature map or normalizer, the
    means in torch; CUDA, or CPU under ``TRITON_INTERPRET=1``), ``'torch'`` torch ops, ``'auto'`` the kernels on
    CUDA where they take the call, training included, else torch (:mod:`simattn.attention.backends`)."""
    check_qkv(q, k, v, "inline")
    s = q.shape[-1] ** -0.5 if scale is None else check_positive("inline", "scale", scale)
    return dispatch("inline", backend, Call(q, k, v), matmul_dtype(q), _inline_kernels, _inline_fp32, q, k, v, s)


def _inline_kernels(dt: torch.dtype, q, k, v, scale: float) -> torch.Tensor:
    acc = acc_dtype(q)
    with no_autocast(q):  # the means in fp32
        return _inline_triton(q.to(acc), k.to(acc), v.to(acc), scale).to(dt)


def _inline_fp32(q, k, v, scale: float) -> torch.Tensor:
    acc = acc_dtype(q)
    return _inline(q.to(acc), k.to(acc), v.to(acc), scale)


register_policy("inline", Policy({"triton": takes_triton}, why=EVERYWHERE))


def local_conv(v: torch.Tensor, weights: torch.Tensor, grid: Tuple[int, int], prefix: int) -> torch.Tensor:
    """InLine's local branch: the grid tokens of v (B, H, P + n, d) after its ``prefix`` tokens, each image's
    channels convolved with their own k×k kernel ``weights`` (B, H·d, k, k) (cross-correlation, zero padding), as
    (B, H, n, d)."""
    gh, gw = grid
    size = weights.shape[-1]
    if not torch.jit.is_scripting():  # TorchScript compiles none of this block
        if eager():
            # one depthwise conv of every image's channels (several times faster on CPU, forward and backward);
            # its groups count the batch, which a captured graph would fix, hence the shifted products there
            B, C = weights.shape[0], weights.shape[1]
            img = heads_image(v, grid, prefix).reshape(1, B * C, gh, gw)
            out = F.conv2d(img, weights.reshape(B * C, 1, size, size), padding=size // 2, groups=B * C)
            return heads_tokens(out.reshape(B, C, gh, gw), v.shape[1])
    img = F.pad(heads_image(v, grid, prefix), [size // 2] * 4)
    out = torch.zeros_like(img[:, :, :gh, :gw])
    for a in range(size):
        for b in range(size):
            out = out + weights[:, :, a, b, None, None] * img[:, :, a:a + gh, b:b + gw]
    return heads_tokens(out, v.shape[1])


@register_attention("inline")
class InLineAttention(GridLinearAttention):
    """InLine with timm's ``Attention`` signature. Options: ``local_kernel`` (the local branch's kernel size, 3 as
    released; 0 = no local branch), ``scale`` (s, default d^-½) and the grid options of
    :class:`GridLinearAttention` (InLine has neither a fixed conv on V nor a key encoding: ``dwc_kernel`` 0 and
    ``pos_grid`` None by default)."""

    exp_complexity = "Hd²"

    def __init__(self, dim: int, num_heads: int = 8, *, local_kernel: int = 3, scale: Optional[float] = None,
                 dwc_kernel: int = 0, **kwargs) -> None:
        super().__init__(dim, num_heads, dwc_kernel=dwc_kernel, **kwargs)
        name = type(self).__name__
        check_count(name, "local_kernel", local_kernel, low=0)
        if local_kernel % 2 == 0 and local_kernel:
            raise ValueError(f"{name}: local_kernel={local_kernel}; allowed: 0 (none) or an odd kernel size")
        self.local_kernel = local_kernel
        self.feature_scale = self.head_dim ** -0.5 if scale is None else check_positive(name, "scale", scale)
        self.residual: Optional[nn.Module] = None
        if local_kernel:
            self.residual = nn.Sequential(
                nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                nn.Conv1d(dim, dim * local_kernel * local_kernel, 1, groups=num_heads))

    def _forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                 grid_size: Optional[Tuple[int, int]]) -> torch.Tensor:
        """The base class's step with the local branch, which reads x itself."""
        grid, prefix = self.token_grid(x.shape[1], grid_size)
        q, k, v = self.project_grid(x, grid_size)
        out = self.attend(q, k, v, attn_mask, grid_size=grid)
        residual = self.residual
        if residual is not None:
            B, C = x.shape[0], x.shape[2]
            weights = residual(x.mean(dim=1).unsqueeze(-1)).reshape(B, C, self.local_kernel, self.local_kernel)
            out = add_to_grid(out, local_conv(v, weights, grid, prefix).to(out.dtype), prefix)
        return self._output(out, x)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return inline_attention(q, k, v, scale=self.feature_scale, backend=self.backend)

    def core_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _inline(q, k, v, self.feature_scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, local_kernel={self.local_kernel}"
