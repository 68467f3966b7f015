"""ReLU (point-wise) attention (Wortsman et al.): weights L^(-a) · h(q kᵀ / √d) with L the key length, no softmax."""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from ._common import HookPoint, apply_token_mask, check_qkv, check_token_mask, no_autocast, range_safe_dtype
from ._registry import register_attention
from .base import TokenAttention

__all__ = ["relu_attention", "relu_attention_reference", "relu_weights", "ACTIVATIONS", "ReLUAttention"]

#: h: the point-wise function that replaces softmax.
ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),
    "gelu": F.gelu,
    "softplus": F.softplus,
    "identity": lambda x: x,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
}
# h(c·x) = c^p · h(x) for c > 0: the scale can be folded into the small operand instead of the N×N matrix.
_HOMOGENEOUS_DEGREE = {"relu": 1, "identity": 1, "relu2": 2}


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"relu attention: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") from None


def _length(k: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-example key length L (B, 1, 1, 1): the kept tokens when masked."""
    dtype = torch.promote_types(k.dtype, torch.float32)
    if mask is None:
        # counted from k, not a Python number, so an exported graph keeps the key length symbolic
        return k.new_ones(k.shape[-2], dtype=dtype).sum().reshape(1, 1, 1, 1)
    return mask.sum(-1).clamp_min(1).to(dtype).reshape(-1, 1, 1, 1)


def relu_weights(q: torch.Tensor, k: torch.Tensor, *, activation: str = "relu", alpha: float = 1.0,
                 mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The explicit (B, H, Nq, Nk) weights L^(-alpha) · h(q kᵀ/√d); masked keys get weight 0.

    Under fp16 the logits are computed in fp32 (q·k overflows fp16 for large activations)."""
    h = _activation(activation)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "relu")
    dt = range_safe_dtype(q)
    with no_autocast(q):
        q, k = q.to(dt), k.to(dt)
        w = h((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5) * _length(k, mask).pow(-alpha).to(dt)
        return w if mask is None else w * mask[:, None, None, :].to(dt)


def relu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, activation: str = "relu",
                   alpha: float = 1.0, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ReLU attention on q (B, H, Nq, d), k, v (B, H, Nk, ·).

    Fast path: for positively homogeneous h (relu, relu2, identity) the scalars √d⁻¹ and L^(-alpha) are folded into
    q (Nq×d work instead of Nq×Nk); masked keys are zeroed in k and v (h(0) = 0 for those h), and h runs in place.
    Under fp16 the work runs in fp32.
    """
    check_qkv(q, k, v, "relu")
    _activation(activation)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "relu")
    degree = _HOMOGENEOUS_DEGREE.get(activation)
    dt = range_safe_dtype(q)
    if degree is None:
        weights = relu_weights(q, k, activation=activation, alpha=alpha, mask=mask)
        with no_autocast(q):
            return weights @ v.to(dt)
    with no_autocast(q):
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        q = q * (q.shape[-1] ** -0.5 * _length(k, mask).pow(-alpha / degree)).to(dt)
        logits = q @ apply_token_mask(k, mask).transpose(-2, -1)
        if activation == "relu":
            logits = logits.relu_()
        elif activation == "relu2":
            logits = logits.relu_().square()
        return logits @ apply_token_mask(v, mask)


def relu_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, activation: str = "relu",
                             alpha: float = 1.0, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Written as the paper states it: explicit weights, then weights @ v."""
    check_qkv(q, k, v, "relu")
    weights = relu_weights(q, k, activation=activation, alpha=alpha, mask=mask)
    return weights @ v.to(weights.dtype)


@register_attention("relu")
class ReLUAttention(TokenAttention):
    """ReLU attention with timm's ``Attention`` signature.

    Extra options: ``activation`` (h: relu, relu2, gelu, softplus, identity, relu6, sigmoid), ``alpha`` (the
    sequence-length exponent a, default 1). qk-LayerNorm is timm's ``qk_norm=True``; the gate is ``gated=True``.
    ``attn_weights`` is a hook point; when hooked, the explicit weights are materialized and passed through it.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, activation: str = "relu", alpha: float = 1.0,
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        _activation(activation)
        self.activation = activation
        self.alpha = alpha
        self.attn_weights = HookPoint()

    def attend(self, q, k, v, mask):
        if self.attn_weights.has_hooks or self.attn_drop.p > 0 and self.training:
            w = self.attn_weights(relu_weights(q, k, activation=self.activation, alpha=self.alpha, mask=mask))
            return self.attn_drop(w) @ v
        return relu_attention(q, k, v, activation=self.activation, alpha=self.alpha, mask=mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}, alpha={self.alpha}"
