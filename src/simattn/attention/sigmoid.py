"""Sigmoid attention (Ramapuram et al., ICLR 2025): weights σ(q kᵀ/√d + b), each in (0, 1), no normalization.

With b = −log n (n the key length, the paper's choice), a key whose logit is near 0 gets weight ≈ 1/n, as under a
softmax of n equal logits; larger logits are not damped by the others, so the row sums are free. The paper pairs it
with qk-LayerNorm and LayerScale for stable training (its "best practices"), which the models here set; the kind
itself is the weighting. One sigmoid per query-key pair: SimA's Table 2 class HN². The ``relu`` kind's
``activation='sigmoid'`` is another method (Wortsman et al.: σ(q kᵀ/√d) scaled by L^(-a), no bias).

A key mask removes keys (weight 0) and n counts the kept keys, so a masked call equals one on the kept tokens.
Scores and sigmoid run in fp32 (fp64 for fp64 inputs) under autocast; the output is unnormalized (up to n·|v|), so
under fp16 autocast it is returned in fp32, as the ``relu`` kind's. ``backend='triton'`` (``'auto'`` on CUDA) runs
it as flash-style Triton kernels, forward and backward, with no N×N tensor (:mod:`simattn.kernels.pointwise.launch`).

Released code (apple/ml-sigmoid-attention, ``attention_simulator/layers/attention.py`` ``Attention`` with
``activations.unnormalized_sigmoid_attention`` and ``attn_bias = −log n``, its temperature at 0): run on fixed
inputs (B 2, N 20, dim 48, 3 heads, fp64, qk-LayerNorm, with and without a key mask) with its parameters copied
into this module: max |ours − released| = 0 on the module output, of magnitude 14, once its b buffer holds −log n
in fp64 (it builds the buffer in fp32: 2.9e-7 as released); the reference: 8.9e-15. Its mask fills removed logits
with −max before the sigmoid (weight 0, as here), but its b is a fixed buffer; here b follows the kept keys (the
masked check gives every example the same count).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..kernels import pointwise as pointwise_kernels
from ._common import HookPoint, acc_dtype, check_finite, check_qkv, check_token_mask, no_autocast, range_safe_dtype
from .backends import EVERYWHERE, Call, Policy, check_backend, dispatch, register_policy, takes_triton
from ._registry import register_attention
from .base import TokenAttention
from .reference import sigmoid_reference as sigmoid_attention_reference

__all__ = ["sigmoid_attention", "sigmoid_attention_reference", "sigmoid_weights", "SigmoidAttention"]


def _bias(k: torch.Tensor, mask: Optional[torch.Tensor], bias: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """b per example (B, 1, 1, 1): the given number, or −log n with n the (kept) key count."""
    if bias is not None:
        return torch.full((1, 1, 1, 1), bias, dtype=dtype, device=k.device)
    if mask is None:
        # counted from k, not a Python number, so an exported graph keeps the key length symbolic
        return -k.new_ones(k.shape[-2], dtype=dtype).sum().log().reshape(1, 1, 1, 1)
    return -mask.sum(-1).clamp_min(1).to(dtype).log().reshape(-1, 1, 1, 1)


def _weights(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], bias: Optional[float]) -> torch.Tensor:
    """σ(q kᵀ/√d + b) in fp32 (fp64 for fp64 inputs), removed keys 0; no checks (TorchScript runs this too)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(acc) * q.shape[-1] ** -0.5) @ k.to(acc).transpose(-2, -1)
    w = torch.sigmoid(logits + _bias(k, mask, bias, acc))
    return w if mask is None else w * mask[:, None, None, :].to(acc)


def _check(q: torch.Tensor, k: torch.Tensor, bias: Optional[float], mask: Optional[torch.Tensor]):
    if bias is not None:
        check_finite("sigmoid", "bias", bias)
    return check_token_mask(mask, k.shape[0], k.shape[-2], "sigmoid", k.device)


def sigmoid_weights(q: torch.Tensor, k: torch.Tensor, *, bias: Optional[float] = None,
                    mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The explicit (B, H, Nq, Nk) weights σ(q kᵀ/√d + b), b = −log n unless ``bias``; removed keys get 0. In fp32
    (fp64 for fp64 inputs) even under autocast: fp16 scores overflow, and bf16 scores are off by |q||k|·2⁻⁸."""
    mask = _check(q, k, bias, mask)
    with no_autocast(q):
        return _weights(q, k, mask, bias)


def sigmoid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[float] = None,
                      mask: Optional[torch.Tensor] = None, backend: str = "auto") -> torch.Tensor:
    """Sigmoid attention on q (B, H, Nq, d), k, v (B, H, Nk, ·): σ(q kᵀ/√d + b) v with b = −log n (n the kept
    keys) unless ``bias``; ``mask`` (B, Nk) removes keys. Under autocast the output is autocast's dtype, fp16 lifted
    to fp32 (it is unnormalized). ``backend``: 'auto' (the Triton kernels on CUDA where they take the call, torch
    elsewhere and in exported graphs), 'torch' or 'triton' (:mod:`simattn.attention.backends`)."""
    check_qkv(q, k, v, "sigmoid")
    mask = _check(q, k, bias, mask)
    out_dtype = range_safe_dtype(q) if torch.is_autocast_enabled(q.device.type) else v.dtype
    return dispatch("sigmoid", backend, Call(q, k, v), out_dtype, _sigmoid_triton, _sigmoid_fp32, q, k, v, bias,
                    mask)


def _sigmoid_triton(dt: torch.dtype, q, k, v, bias: Optional[float], mask: Optional[torch.Tensor]) -> torch.Tensor:
    return pointwise_kernels.activation_triton(q, k, v, activation="sigmoid", bias=bias, mask=mask, out_dtype=dt)


def _sigmoid_fp32(q, k, v, bias: Optional[float], mask: Optional[torch.Tensor]) -> torch.Tensor:
    return _weights(q, k, mask, bias) @ v.to(acc_dtype(v))


register_policy("sigmoid", Policy({"triton": takes_triton}, why=EVERYWHERE))


@register_attention("sigmoid")
class SigmoidAttention(TokenAttention):
    """Sigmoid attention with timm's ``Attention`` signature.

    Options ``bias``: b (None = −log n, the paper's); ``backend`` ('auto' | 'torch' | 'triton',
    :func:`sigmoid_attention`). qk-LayerNorm is timm's ``qk_norm=True``. ``attn_weights`` is a hook point on the
    weights; ``attn_drop`` drops them in training.
    """

    exp_complexity = "HN²"
    supports_attn_drop = True

    def __init__(self, dim: int, num_heads: int = 8, *, bias: Optional[float] = None, backend: str = "auto",
                 **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if bias is not None:
            check_finite(type(self).__name__, "bias", bias)
        self.bias = None if bias is None else float(bias)
        self.backend = check_backend(type(self).__name__, "sigmoid", backend)
        self.attn_weights = HookPoint()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # autocast handling and the hook point are Python
            w = _weights(q, k, mask, self.bias)
            return (self.attn_drop(w) @ v.to(w.dtype)).to(v.dtype)
        else:
            return self._attend_python(q, k, v, mask)

    def _attend_python(self, q, k, v, mask):
        if self.attn_weights.has_hooks or self.attn_drop.p > 0 and self.training:
            w = self.attn_weights(sigmoid_weights(q, k, bias=self.bias, mask=mask))
            out_dtype = range_safe_dtype(v) if torch.is_autocast_enabled(v.device.type) else v.dtype
            with no_autocast(v):
                return (self.attn_drop(w) @ v.to(w.dtype)).to(out_dtype)
        return sigmoid_attention(q, k, v, bias=self.bias, mask=mask, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bias={'-log n' if self.bias is None else self.bias}"
