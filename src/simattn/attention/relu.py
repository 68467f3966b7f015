"""ReLU (point-wise) attention (Wortsman et al.): weights L^(-a) · h(q kᵀ / √d) with L the key length, no softmax."""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from ..kernels import pointwise as pointwise_kernels
from ._common import (HookPoint, acc_dtype, apply_token_mask, check_finite, check_qkv,
                      check_token_mask, no_autocast, range_safe_dtype)
from ._registry import register_attention
from .backends import EVERYWHERE, Call, Policy, check_backend, dispatch, register_policy, triton_limits
from .base import TokenAttention
from .reference import relu_reference as relu_attention_reference

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
#: h that evaluate an exp-like function on every score (gelu's erf, softplus, sigmoid)
_EXP_LIKE_H = ("gelu", "softplus", "sigmoid")
# h(c·x) = c^p · h(x) for c > 0: the scale can be folded into the small operand instead of the N×N matrix.
_HOMOGENEOUS_DEGREE = {"relu": 1, "identity": 1, "relu2": 2}


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"relu attention: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") from None


def _scripted_h(x: torch.Tensor, name: str) -> torch.Tensor:
    """h of :data:`ACTIVATIONS` by name, for TorchScript (which cannot call a dict of Python callables)."""
    if name == "relu":
        return F.relu(x)
    if name == "relu2":
        return F.relu(x).square()
    if name == "gelu":
        return F.gelu(x)
    if name == "softplus":
        return F.softplus(x)
    if name == "relu6":
        return F.relu6(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    return x  # identity


def _length(k: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-example key length L (B, 1, 1, 1): the kept tokens when masked."""
    dtype = torch.promote_types(k.dtype, torch.float32)
    if mask is None:
        # counted from k, not a Python number, so an exported graph keeps the key length symbolic
        return k.new_ones(k.shape[-2], dtype=dtype).sum().reshape(1, 1, 1, 1)
    return mask.sum(-1).clamp_min(1).to(dtype).reshape(-1, 1, 1, 1)


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    """Output dtype: the input's own without autocast; under autocast the autocast dtype, fp16 lifted to fp32 because
    the output (unnormalized: up to |q||k||v|·L^(1-a)/√d) can exceed fp16's range."""
    return range_safe_dtype(t) if torch.is_autocast_enabled(t.device.type) else t.dtype


def relu_weights(q: torch.Tensor, k: torch.Tensor, *, activation: str = "relu", alpha: float = 1.0,
                 mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The explicit (B, H, Nq, Nk) weights L^(-alpha) · h(q kᵀ/√d); masked keys get weight 0.

    Computed in fp32 (fp64 for fp64 inputs) even under autocast: the scores overflow fp16 for large activations,
    and in bf16 their rounding flips the sign tests of relu-like h near 0, which the gradient feels."""
    h = _activation(activation)
    check_finite("relu", "alpha", alpha)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "relu", k.device)
    with no_autocast(q):
        q, k = q.to(acc_dtype(q)), k.to(acc_dtype(k))
        w = h((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5) * _length(k, mask).pow(-alpha)
        return w if mask is None else w * mask[:, None, None, :].to(w.dtype)


def relu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, activation: str = "relu",
                   alpha: float = 1.0, mask: Optional[torch.Tensor] = None, backend: str = "auto") -> torch.Tensor:
    """ReLU attention on q (B, H, Nq, d), k, v (B, H, Nk, ·).

    ``backend``: 'triton' runs h = relu or sigmoid as flash-style Triton kernels, forward and backward, with no
    N×N tensor (:mod:`simattn.kernels.pointwise.launch`); 'auto' does so on CUDA where they take the call and
    runs torch elsewhere, for the other h and in exported graphs; 'torch' never.

    Torch path: for positively homogeneous h (relu, relu2, identity) the scalars √d⁻¹ and L^(-alpha) are folded into
    q (Nq×d work instead of Nq×Nk); masked keys are zeroed in k and v (h(0) = 0 for those h), and h runs in place.
    Everything runs in fp32 under autocast (see :func:`relu_weights`); the output is fp32 under fp16 autocast
    (it is unnormalized and can exceed fp16's range), the autocast dtype under bf16.
    """
    check_qkv(q, k, v, "relu")
    _activation(activation)
    check_finite("relu", "alpha", alpha)
    mask = check_token_mask(mask, k.shape[0], k.shape[-2], "relu", k.device)
    return dispatch("relu", backend, Call(q, k, v, extra=activation), _out_dtype(q), _relu_triton, _relu_fp32, q, k,
                    v, activation, alpha, mask)


def _relu_triton(dt: torch.dtype, q, k, v, activation: str, alpha: float,
                 mask: Optional[torch.Tensor]) -> torch.Tensor:
    return pointwise_kernels.activation_triton(q, k, v, activation=activation, bias=0.0, alpha=alpha, mask=mask,
                                               out_dtype=dt)


def _relu_fp32(q, k, v, activation: str, alpha: float, mask: Optional[torch.Tensor]) -> torch.Tensor:
    degree = _HOMOGENEOUS_DEGREE.get(activation)
    if degree is None:
        weights = relu_weights(q, k, activation=activation, alpha=alpha, mask=mask)
        return weights @ v.to(weights.dtype)
    acc = acc_dtype(q)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    q = q * (q.shape[-1] ** -0.5 * _length(k, mask).pow(-alpha / degree))
    logits = q @ apply_token_mask(k, mask).transpose(-2, -1)
    if activation == "relu":
        logits = logits.relu_()
    elif activation == "relu2":
        logits = logits.relu_().square()
    return logits @ apply_token_mask(v, mask)


#: the h the point-wise kernels compute (:data:`simattn.kernels.pointwise.launch.TRITON_H`), named here without
#: importing Triton, so CPU calls never load it
TRITON_ACTIVATIONS = ("relu", "sigmoid")


def _relu_takes_triton(call: Call) -> Optional[str]:
    """The point-wise kernels compute h = relu or sigmoid (``call.extra``: h's name)."""
    if call.extra not in TRITON_ACTIVATIONS:
        return f"computes h = {' or '.join(TRITON_ACTIVATIONS)}, got activation={call.extra!r}"
    return triton_limits(call.q, call.k, call.v)


register_policy("relu", Policy({"triton": _relu_takes_triton}, why=EVERYWHERE + " (h = relu or sigmoid)"))


@register_attention("relu")
class ReLUAttention(TokenAttention):
    """ReLU attention with timm's ``Attention`` signature.

    Extra options: ``activation`` (h: relu, relu2, gelu, softplus, identity, relu6, sigmoid), ``alpha`` (the
    sequence-length exponent a, default 1), ``backend`` ('auto' | 'torch' | 'triton', :func:`relu_attention`).
    qk-LayerNorm is timm's ``qk_norm=True``; the gate is ``gated=True``.
    ``attn_weights`` is a hook point; when hooked, or when ``attn_drop`` is active (training), the explicit weights
    are materialized, passed through it and dropped.

    Precision: scores, h and the L^(-a) scale run in fp32 under autocast. The output is unnormalized (it grows
    like |q||k||v|/√d), so without qk-LayerNorm large activations can exceed fp16's range in the layers after
    it, and gradients with respect to fp16 tensors overflow where their true values exceed 65504: the method's
    range, not round-off. The published qk-LayerNorm (``qk_norm=True``) bounds the scores.
    """

    exp_complexity = "0"
    supports_attn_drop = True

    def __init__(self, dim: int, num_heads: int = 8, *, activation: str = "relu", alpha: float = 1.0,
                 backend: str = "auto", **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        _activation(activation)
        check_finite(type(self).__name__, "alpha", alpha)
        self.activation = activation
        self.alpha = alpha
        self.backend = check_backend(type(self).__name__, "relu", backend)
        if activation in _EXP_LIKE_H:
            self.exp_complexity = "HN²"
        self.attn_weights = HookPoint()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # the explicit weights in fp32; autocast handling and the hook point are Python
            acc = torch.promote_types(q.dtype, torch.float32)
            logits = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * q.shape[-1] ** -0.5
            w = _scripted_h(logits, self.activation) * _length(k, mask).pow(-self.alpha)
            if mask is not None:
                w = w * mask[:, None, None, :].to(w.dtype)
            return (self.attn_drop(w) @ v.to(acc)).to(v.dtype)
        else:
            return self._attend_python(q, k, v, mask)

    def _attend_python(self, q, k, v, mask):
        if self.attn_weights.has_hooks or self.attn_drop.p > 0 and self.training:
            w = self.attn_weights(relu_weights(q, k, activation=self.activation, alpha=self.alpha, mask=mask))
            with no_autocast(v):
                return (self.attn_drop(w) @ v.to(w.dtype)).to(_out_dtype(v))
        return relu_attention(q, k, v, activation=self.activation, alpha=self.alpha, mask=mask,
                              backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}, alpha={self.alpha}"
