"""Softmax multi-head attention (ViT/DeiT), the baseline every softmax-free kind is measured against."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import HookPoint, cast, check_finite, check_qkv, check_rate, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import TokenAttention
from .reference import softmax_reference as softmax_attention_reference

__all__ = ["softmax_attention", "softmax_attention_reference", "softmax_weights", "SoftmaxAttention"]


def _sdpa_mask(mask: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor) -> Optional[torch.Tensor]:
    """A (B, Nk) keep-mask becomes SDPA's (B, 1, 1, Nk) boolean mask; 4-D masks pass through."""
    if mask is None or mask.dim() == 4:
        return mask
    if mask.dim() != 2 or mask.shape != (k.shape[0], k.shape[-2]):
        raise ValueError(f"softmax: mask must be (B, Nk) = ({k.shape[0]}, {k.shape[-2]}) or 4-D, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"softmax: token mask must be boolean (True = keep), got dtype {mask.dtype}")
    return mask[:, None, None, :]


def _check_options(scale: Optional[float], dropout_p: float = 0., is_causal: bool = False) -> None:
    if scale is not None:
        check_finite("softmax", "scale", scale)
    check_rate("softmax", "dropout_p", dropout_p)
    if not isinstance(is_causal, bool):
        raise ValueError(f"softmax: is_causal={is_causal!r}; allowed: True or False")


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                      scale: Optional[float] = None, dropout_p: float = 0., is_causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / √d) v through ``F.scaled_dot_product_attention`` (fused kernels where available).

    ``mask``: boolean keep-mask (B, Nk) over keys, or any mask SDPA accepts (4-D bool or additive float).

    Under autocast the op runs in its inputs' own dtype and returns autocast's: autocast would round fp32 q and k
    to fp16/bf16 before the scores, an error of about |q|·|k|·scale·ε in every logit, which at large activations
    exceeds the gaps between logits (×1e4 inputs: 10-20 % off). The fused kernels accumulate the scores in fp32
    from inputs of any dtype, so low-precision inputs (a network's projections under autocast) run as before.
    """
    check_qkv(q, k, v, "softmax")
    _check_options(scale, dropout_p, is_causal)
    sdpa_mask = _sdpa_mask(mask, q, k)
    if torch.is_autocast_enabled(q.device.type):
        low = torch.get_autocast_dtype(q.device.type)
        dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
        if dt != low:  # (inputs in autocast's dtype already have nothing to round: the plain call below)
            if sdpa_mask is not None and sdpa_mask.is_floating_point():
                sdpa_mask = cast(sdpa_mask, dt)
            with no_autocast(q):
                out = F.scaled_dot_product_attention(cast(q, dt), cast(k, dt), cast(v, dt), attn_mask=sdpa_mask,
                                                     dropout_p=dropout_p, scale=scale, is_causal=is_causal)
            return cast(out, low)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, dropout_p=dropout_p, scale=scale,
                                          is_causal=is_causal)


def softmax_weights(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None,
                    scale: Optional[float] = None) -> torch.Tensor:
    """The (B, H, Nq, Nk) weights softmax(q kᵀ · scale); ``mask`` is SDPA-style (bool keep or additive).

    Scores and softmax run in fp32 (fp64 for fp64 inputs) even under autocast: fp16 scores overflow past 65504, and
    scores from inputs rounded to fp16/bf16 are off by |q|·|k|·scale·ε. Returned in the dtype ``weights @ v``
    runs in (autocast's, else q's)."""
    _check_options(scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
    with no_autocast(q):
        logits = (cast(q, acc) * scale) @ cast(k, acc).transpose(-2, -1)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask.to(acc)
        weights = logits.softmax(dim=-1)
    return cast(weights, matmul_dtype(q))


@register_attention("softmax")
class SoftmaxAttention(TokenAttention):
    """Softmax attention with timm's ``Attention`` signature and parameter names.

    ``attn_drop`` drops attention weights in training; ``is_causal=True`` lets query i see keys j <= i.
    ``fused=True`` (default) runs SDPA; ``fused=False`` runs the explicit path, which materializes the weights and
    passes them through the ``attn_weights`` hook point (export- and inspection-friendly).
    """

    exp_complexity = "HN²"
    supports_causal = True
    supports_attn_drop = True

    def __init__(self, dim: int, num_heads: int = 8, *, fused: bool = True, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.fused = fused
        self.attn_weights = HookPoint()


    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               is_causal: bool = False) -> torch.Tensor:
        if torch.jit.is_scripting():  # SDPA; the hook point is Python
            sdpa_mask = mask[:, None, None, :] if mask is not None and mask.dim() == 2 else mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, scale=self.scale, is_causal=is_causal,
                                                  dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            return self._attend_python(q, k, v, mask, is_causal)

    def _attend_python(self, q, k, v, mask, is_causal):
        if self.fused and not self.attn_weights.has_hooks:
            return softmax_attention(q, k, v, mask=mask, scale=self.scale,
                                     dropout_p=self.attn_drop.p if self.training else 0., is_causal=is_causal)
        if is_causal:
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()[None, None]
            mask = causal if mask is None else _sdpa_mask(mask, q, k) & causal
        weights = self.attn_weights(softmax_weights(q, k, _sdpa_mask(mask, q, k), self.scale))
        return self.attn_drop(weights) @ v
