"""PRepBN: SLAB's progressive re-parameterized BatchNorm (Guo et al., ICML 2024), a norm layer for the DeiT family.

RepBN(x) = BN(x) + αx over the channels of (B, N, C) tokens (α learned, 1 at initialization), which folds into one
BatchNorm, and so into the next linear layer, at inference. PRepBN trains with LayerNorm and hands over to RepBN:

    y = λ·LN(x) + (1 − λ)·RepBN(x),   λ = r₀ · (steps left) / steps,

λ falling linearly from r₀ to 0 over ``steps`` training calls (after ``warmup`` calls of LayerNorm alone); in eval
mode RepBN alone. The released SLAB-DeiT (``LinearNorm`` of xinghaochen/SLAB, ``classification/models/prepbn.py``)
uses it for every norm of the network with no warm-up, r₀ = 1 and 60,000 steps, LayerNorm's eps 1e-6. The schedule
counts calls, not epochs: runs much shorter than ``steps`` end with λ near 1 and evaluate a RepBN that trained
little (set ``steps`` for the run's length).
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import check_count

__all__ = ["RepBN", "PRepBN"]


class RepBN(nn.Module):
    """BN(x) + αx on tokens (B, N, C), BatchNorm over C with statistics over B and N: the released code's
    ``BatchNorm1d`` on the (B, C, N) view of the tokens.

    Not a ``BatchNorm2d`` on a (B, C, N, 1) view: torch's CPU batch-norm backward (2.14.1) is wrong for a 4-D input
    with a size-1 spatial dim when the input and the incoming gradient are stored in different layouts, which
    tokens reach in both orders (a conv's output flattened is channel-major, a linear layer's gradient token-major).
    On 3-D inputs it is right in every layout. ``--sync_bn`` converts the ``BatchNorm1d`` (SyncBatchNorm takes
    (B, C, N)); :func:`~simattn.models.export_ready.revert_sync_batchnorm` gives it back, as
    :attr:`sync_bn_reverts_to` says."""

    #: the class :func:`~simattn.models.export_ready.revert_sync_batchnorm` gives this module's ``bn`` back as
    sync_bn_reverts_to = nn.BatchNorm1d

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, device=device, dtype=dtype))
        self.bn = nn.BatchNorm1d(dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x.transpose(1, 2)).transpose(1, 2) + self.alpha * x


class PRepBN(nn.Module):
    """LayerNorm handed over to :class:`RepBN` during training (module docstring). ``steps``: training calls over
    which λ falls to 0; ``warmup``: calls of LayerNorm alone before; ``r0``: λ's start. The calls left are buffers,
    so a resumed run continues the schedule."""

    def __init__(self, dim: int, steps: int = 60000, warmup: int = 0, r0: float = 1.0, eps: float = 1e-6,
                 device=None, dtype=None) -> None:
        super().__init__()
        check_count("PRepBN", "steps", steps)
        check_count("PRepBN", "warmup", warmup, low=0)
        if not 0 <= r0 <= 1:
            raise ValueError(f"PRepBN: r0={r0!r}; allowed: a number in [0, 1]")
        self.steps, self.r0 = steps, float(r0)
        self.register_buffer("warmup_left", torch.tensor(warmup, device=device))
        self.register_buffer("steps_left", torch.tensor(steps, device=device))
        self.norm1 = nn.LayerNorm(dim, eps=eps, device=device, dtype=dtype)
        self.norm2 = RepBN(dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blend(x)

    def blend(self, x: torch.Tensor) -> torch.Tensor:
        """RepBN in eval mode; in training LayerNorm and RepBN mixed by the schedule, which takes one step."""
        if not self.training:
            return self.norm2(x)
        # tensor arithmetic, no Python branch on the counters: graph capture sees one training graph
        warming = self.warmup_left > 0
        lam = torch.where(warming, torch.ones_like(self.steps_left, dtype=x.dtype),
                          self.steps_left.to(x.dtype) * (self.r0 / self.steps))
        with torch.no_grad():
            self.steps_left.sub_((~warming & (self.steps_left > 0)).to(self.steps_left.dtype))
            self.warmup_left.sub_(warming.to(self.warmup_left.dtype))
        return lam * self.norm1(x) + (1 - lam) * self.norm2(x)

    def extra_repr(self) -> str:
        return f"steps={self.steps}, r0={self.r0}"
