"""Which implementation runs a call of a point-wise activation kind (``sigmoid``, ``relu``): its torch ops or the
flash-style Triton kernels (:mod:`simattn.attention.activation_triton`). Decided without importing Triton, so CPU
calls never load it."""
from __future__ import annotations

from typing import Optional

import torch

from ._common import check_backend, kernels_chosen, triton_refusal

__all__ = ["TRITON_ACTIVATIONS", "activation_refusal", "runs_triton"]

#: the h the kernels compute (``activation_triton.TRITON_H``)
TRITON_ACTIVATIONS = ("relu", "sigmoid")


def activation_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: str) -> Optional[str]:
    """Why the kernels cannot take this call (None where they can): h, then the Triton limits of ``_common``."""
    if activation not in TRITON_ACTIVATIONS:
        return f"computes h = {' or '.join(TRITON_ACTIVATIONS)}, got activation={activation!r}"
    return triton_refusal(q, k, v)


def runs_triton(owner: str, backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                activation: str) -> bool:
    """Whether the kernels run this call of checked q, k, v (:func:`~simattn.attention._common.kernels_chosen`)."""
    check_backend(owner, backend)
    return kernels_chosen(owner, backend, q, lambda: activation_refusal(q, k, v, activation))
