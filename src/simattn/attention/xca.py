"""XCA: XCiT's cross-covariance attention, a softmax over the d×d channel-channel matrix."""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (HookPoint, acc_dtype, apply_token_mask, check_per_head, check_positive, check_qkv, matmul_dtype,
                      no_autocast, resolve_masks)
from ._registry import register_attention
from .base import TokenAttention
from .reference import xca_reference as xca_attention_reference

__all__ = ["xca_attention", "xca_attention_reference", "xca_weights", "XCAttention"]


def _temperature(temperature, q):
    """The temperature as a tensor that broadcasts against the (B, H, d, d) scores; one-line errors otherwise."""
    return torch.as_tensor(check_per_head("xca", "temperature", temperature, q), dtype=acc_dtype(q), device=q.device)


def xca_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  temperature: Union[float, torch.Tensor] = 1.0, mask: Optional[torch.Tensor] = None,
                  eps: float = 1e-12) -> torch.Tensor:
    """XCA on q, k, v (B, H, N, d) (equal lengths: the channel covariance sums over shared tokens).

    q and k are l2-normalized along tokens; weights = softmax(q̂ᵀ k̂ · temperature) over key channels (d×d,
    computed in fp32); out = v · weightsᵀ. ``temperature``: a float or a per-head tensor (H,) / (H, 1, 1).
    ``mask`` (B, N) removes tokens from the norms and the covariance; masked output rows are zero.
    """
    check_qkv(q, k, v, "xca", same_length=True)
    mask, _ = resolve_masks(q, k, mask, None, "xca")
    return _apply_weights(v, xca_weights(q, k, temperature, mask, eps), mask)


def xca_weights(q: torch.Tensor, k: torch.Tensor, temperature: Union[float, torch.Tensor] = 1.0,
                mask: Optional[torch.Tensor] = None, eps: float = 1e-12) -> torch.Tensor:
    """The (B, H, d, d) channel weights softmax(q̂ᵀ k̂ · temperature), in fp32."""
    check_positive("xca", "eps", eps)
    with no_autocast(q):
        return _xca_weights(q, k, _temperature(temperature, q), mask, eps)


def _xca_weights(q: torch.Tensor, k: torch.Tensor, temperature: torch.Tensor, mask: Optional[torch.Tensor],
                 eps: float) -> torch.Tensor:
    acc = torch.promote_types(q.dtype, torch.float32)
    q_hat = F.normalize(apply_token_mask(q.to(acc), mask), dim=-2, eps=eps)
    k_hat = F.normalize(apply_token_mask(k.to(acc), mask), dim=-2, eps=eps)
    return ((q_hat.transpose(-2, -1) @ k_hat) * temperature.to(acc)).softmax(dim=-1)


def _apply_weights(v: torch.Tensor, weights: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    return apply_token_mask(v, mask) @ weights.to(matmul_dtype(v)).transpose(-2, -1)


@register_attention("xca")
class XCAttention(TokenAttention):
    """XCiT cross-covariance attention with a learnable per-head ``temperature`` (initialised to 1).

    ``attn_weights`` is a hook point on the (B, H, d, d) channel weights; ``attn_drop`` drops entries of those
    weights in training, as XCiT does. Parameter names follow timm's XCiT
    (``qkv``, ``temperature``, ``proj``).
    """

    exp_complexity = "Hd²"
    supports_cross_length = False
    supports_attn_drop = True

    def __init__(self, dim: int, num_heads: int = 8, *, eps: float = 1e-12, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.eps = check_positive(type(self).__name__, "eps", eps)
        self.attn_weights = HookPoint()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling and the hook point are Python
            weights = _xca_weights(q, k, self.temperature, mask, self.eps)
            return apply_token_mask(v, mask) @ self.attn_drop(weights).to(v.dtype).transpose(-2, -1)
        else:
            check_qkv(q, k, v, "xca", same_length=True)
            mask, _ = resolve_masks(q, k, mask, None, "xca")
            weights = self.attn_weights(xca_weights(q, k, self.temperature, mask, self.eps))
            return _apply_weights(v, self.attn_drop(weights), mask)

    def no_weight_decay(self):
        return {"temperature"}
