"""Linformer (Wang et al., 2020): softmax attention over keys and values projected to a shorter length.

head = softmax(Q (E K)ᵀ / √d) (F V) with E, F (m × N) learned projections along the token axis, m ≪ N: linear in N,
with N·m exps per head (SimA's Table 2: HN). Two forms of E and F:

- ``seq_len=N`` (the paper, and lucidrains' port): dense (proj_len × N) matrices, so the module takes exactly N
  tokens (a class token included). Init uniform(±1/√proj_len) as lucidrains'.
- default, on the 2-D token grid (SOFT's Table 1 setting): SOFT runs Linformer in its pyramid as PVT's spatial
  reduction, which it calls a special case of Linformer, with the reduction ratio equal to its own per stage
  (sampling 8×8, 4×4, 2×2, so m = 49 at 224 px). Here E is that reduction in Linformer's own terms: each projected
  key is a learned weighted sum of one ratio×ratio window of keys (weights shared by the channels and heads, one
  set for E and one for F, initialised to the window mean; windows clipped at the grid's edge), i.e. E is the
  block-structured m × N matrix of the windows. It takes any grid: DeiT's (square, inferred after 0 or 1 class
  tokens), XCiT's and the pyramid's (passed as ``grid_size``); prefix (class) tokens keep their own key and value.
  PVT's reduction is a ratio×ratio conv mixing channels too (dim²·ratio² weights, about 2M more in SOFT-Tiny than
  SOFT's 13M): SOFT's released code (fudan-zvg/SOFT) holds PVT's ``Attention(sr_ratio)`` but not its comparison
  runs, so the channel-mixing variant is not reproduced.

``share_kv=True`` uses E for the values too (the paper's key-value sharing). Masks are not supported: E mixes the
tokens, and the paper defines none.

Released code: lucidrains/linformer ``LinformerSelfAttention`` (einsum ``bnd,nk->bkd`` with its ``proj_k`` (N, m),
i.e. Eᵀ). Checked on fixed inputs and projections (B 2, H 3, N 20, d 16, m 7, fp64) with its q/k/v/out linears
set to identity: max |ours − released| = 6.7e-16 (the reference too).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._common import acc_dtype, check_count, check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .base import GridReducedAttention
from .reference import linformer_reference as linformer_attention_reference
from .grid import head_images, heads_tokens
from .softmax import softmax_attention

__all__ = ["linformer_attention", "linformer_attention_reference", "window_projection", "LinformerAttention"]


def _check_projection(name: str, proj: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    n_k, heads = k.shape[-2], k.shape[1]
    if not torch.is_tensor(proj) or proj.dim() not in (2, 3) or proj.shape[-1] != n_k \
            or (proj.dim() == 3 and proj.shape[0] != heads):
        shape = tuple(proj.shape) if torch.is_tensor(proj) else type(proj).__name__
        raise ValueError(f"linformer: {name} must have shape (m, Nk) = (m, {n_k}) or (H, m, Nk) = ({heads}, m, "
                         f"{n_k}), got {shape}")
    if proj.device != q.device:
        raise ValueError(f"linformer: {name} is on {proj.device} but q is on {q.device}; allowed: one device")


def linformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, proj_k: torch.Tensor,
                        proj_v: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Linformer on q (B, H, Nq, d), k, v (B, H, Nk, ·) with projections E = ``proj_k``, F = ``proj_v`` (m, Nk) or
    (H, m, Nk) (F = E when None): softmax(q (E k)ᵀ · scale) (F v), the softmax through the ``softmax`` kind's op."""
    if mask is not None:
        raise ValueError("linformer: token masks are not supported (the projection mixes the tokens)")
    check_qkv(q, k, v, "linformer")
    _check_projection("proj_k", proj_k, q, k)
    if proj_v is not None:
        _check_projection("proj_v", proj_v, q, k)
    k_proj, v_proj = _project(k, v, proj_k, proj_k if proj_v is None else proj_v)
    return softmax_attention(q, k_proj, v_proj, scale=scale)


def _project(k: torch.Tensor, v: torch.Tensor, proj_k: torch.Tensor,
             proj_v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """E k and F v, each a sum over the N tokens, in fp32 (fp64 for fp64 inputs); returned in the dtype the
    softmax's matmuls run in."""
    dt, acc = matmul_dtype(k), acc_dtype(k)
    with no_autocast(k):
        return (torch.matmul(proj_k.to(acc), k.to(acc)).to(dt), torch.matmul(proj_v.to(acc), v.to(acc)).to(dt))


def window_projection(x: torch.Tensor, grid_size: Tuple[int, int], weights: torch.Tensor,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
    """E x for the window form of E: x (B, H, P + h·w, d) → (B, H, P + m, d), prefix tokens kept, then per
    ratio×ratio window of the grid (``weights`` (ratio, ratio); windows clipped at the edge) the weighted sum of its
    tokens, row-major."""
    B, H, _, d = x.shape
    gh, gw = grid_size
    ratio = weights.shape[-1]
    # one image per channel of each head, for the one filter all of them share
    grid = head_images(x, grid_size, num_prefix_tokens).reshape(B * H * d, 1, gh, gw)
    grid = F.pad(grid, [0, (ratio - gw % ratio) % ratio, 0, (ratio - gh % ratio) % ratio])
    reduced = F.conv2d(grid, weights.to(grid.dtype).reshape(1, 1, ratio, ratio), stride=ratio)
    reduced = heads_tokens(reduced.reshape(B, H * d, -1), H)
    return torch.cat([x[:, :, :num_prefix_tokens], reduced.to(x.dtype)], dim=2)


@register_attention("linformer")
class LinformerAttention(GridReducedAttention):
    """Linformer with timm's ``Attention`` signature (module docstring for the two forms).

    Options: ``ratio`` (window side of the grid form; the SOFT pyramid sets SOFT's per stage), ``seq_len`` and
    ``proj_len`` (the dense form: N tokens projected to ``proj_len``, default N // ratio²), ``share_kv`` (F = E),
    ``num_prefix_tokens`` (grid form; None = infer 0 or 1; :class:`~simattn.attention.base.GridAttention`).
    Parameters ``proj_k`` (and ``proj_v`` unless shared): (ratio, ratio) window weights, or (proj_len, seq_len)
    matrices. The softmax runs as the ``softmax`` kind's (fused SDPA); ``attn_drop`` is not supported."""

    def __init__(self, dim: int, num_heads: int = 8, *, seq_len: Optional[int] = None,
                 proj_len: Optional[int] = None, share_kv: bool = False, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        name, ratio = type(self).__name__, self.ratio
        if not isinstance(share_kv, bool):
            raise ValueError(f"{name}: share_kv={share_kv!r}; allowed: True or False")
        self.dense = seq_len is not None
        if self.dense:
            self.seq_len = check_count(name, "seq_len", seq_len)
            proj_len = max(1, seq_len // ratio ** 2) if proj_len is None else check_count(name, "proj_len", proj_len)
            shape = (proj_len, seq_len)
        else:
            if proj_len is not None:
                raise ValueError(f"{name}: proj_len={proj_len!r} needs seq_len (the dense form); the grid form "
                                 f"projects each ratio×ratio window to one token")
            self.seq_len = 0
            shape = (ratio, ratio)
        self.proj_len = shape[0]
        self.proj_k = nn.Parameter(self._init_projection(shape))
        self.proj_v = None if share_kv else nn.Parameter(self._init_projection(shape))

    def _init_projection(self, shape: Tuple[int, int]) -> torch.Tensor:
        if self.dense:
            bound = 1 / math.sqrt(shape[0])
            return torch.empty(shape).uniform_(-bound, bound)
        return torch.full(shape, 1.0 / (shape[0] * shape[1]))  # the window mean

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        proj_v = self.proj_v if self.proj_v is not None else self.proj_k
        if torch.jit.is_scripting():  # the softmax kind's autocast handling is Python
            if self.dense:
                k, v = torch.matmul(self.proj_k.to(k.dtype), k), torch.matmul(proj_v.to(v.dtype), v)
            else:
                grid, prefix = self.token_grid(k.shape[-2], grid_size)
                k, v = window_projection(k, grid, self.proj_k, prefix), window_projection(v, grid, proj_v, prefix)
            return F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            return self._attend_python(q, k, v, proj_v, grid_size)

    def _attend_python(self, q, k, v, proj_v, grid_size):
        if self.dense:
            if k.shape[-2] != self.seq_len:
                raise ValueError(f"{type(self).__name__}: built for seq_len={self.seq_len} tokens (dense "
                                 f"projection), got {k.shape[-2]}; allowed: exactly {self.seq_len}")
            return linformer_attention(q, k, v, proj_k=self.proj_k, proj_v=proj_v, scale=self.scale)
        check_qkv(q, k, v, "linformer", same_length=True)
        grid, prefix = self.token_grid(k.shape[-2], grid_size)
        k = window_projection(k, grid, self.proj_k, prefix)
        v = window_projection(v, grid, proj_v, prefix)
        return softmax_attention(q, k, v, scale=self.scale)

    def extra_repr(self) -> str:
        form = f"seq_len={self.seq_len}, proj_len={self.proj_len}" if self.dense else f"ratio={self.ratio}"
        return f"{super().extra_repr()}, {form}"
