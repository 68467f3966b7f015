"""The module skeleton of the linear kinds that work on the 2-D token grid: FLatten, InLine, SLAB and PolaFormer.

Their released modules share two pieces around the attention itself, both on the grid tokens only (prefix tokens,
a class token, take part in the attention but not in the grid's convolutions and encodings):

- ``dwc``: a depthwise k×k convolution of V over the grid, added to the attention's output; one filter bank of the
  head dim, shared by all heads (their ``Conv2d(d, d, k, groups=d)`` on (B·H, d, H, W)). FLatten calls it the rank
  restoration module.
- ``positional_encoding``: a learned (1, H·W, C) encoding added to k (zero at initialization). Built for the grid
  ``pos_grid``; other grids get it resampled bicubically on every forward (align_corners=False, no antialiasing:
  the authors' resize of these encodings at load), or once for a fixed input size (``set_pos_grid``, before export).

The grid, the prefix tokens and the flags (neither piece fits a token mask or keys of another length) are
:class:`~simattn.attention.base.GridAttention`'s, the layouts :mod:`~simattn.attention.grid`'s; a kind adds its
feature maps and product (:meth:`GridLinearAttention.core`) and its own options.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ._common import check_count, check_positive
from .backends import check_backend
from .base import GridAttention
from .grid import add_to_grid, head_images, head_tokens, image_tokens, tokens_image

__all__ = ["GridLinearAttention", "key_position", "per_channel"]


def per_channel(owner: str, name: str, value, q: torch.Tensor):
    """A per-channel option of q (B, H, N, d) (FLatten's and PolaFormer's scale, PolaFormer's power): a finite
    number > 0, or a tensor on q's device with one value per channel (H·d values, e.g. shaped (H, d) or the released
    (1, 1, H·d)), returned shaped (1, H, 1, d). A one-line ValueError otherwise. Shapes only, no values: reading them
    would wait for the GPU."""
    if not torch.is_tensor(value):
        return check_positive(owner, name, value)
    H, d = q.shape[1], q.shape[-1]
    if value.device != q.device:
        raise ValueError(f"{owner}: {name} is on {value.device} but q is on {q.device}; allowed: one device")
    if value.numel() != H * d:
        raise ValueError(f"{owner}: {name} has shape {tuple(value.shape)}; expected one value per channel: "
                         f"{H} heads x {d} = {H * d} values, e.g. shaped ({H}, {d})")
    return value.reshape(1, H, 1, d)


def resample_encoding(encoding: torch.Tensor, pos_grid: Tuple[int, int], grid: Tuple[int, int]) -> torch.Tensor:
    """A learned (1, Hp·Wp, C) encoding of grid ``pos_grid`` on ``grid``: bicubic, align_corners=False, no
    antialiasing (itself where the grids agree)."""
    if grid[0] == pos_grid[0] and grid[1] == pos_grid[1]:
        return encoding
    return image_tokens(F.interpolate(tokens_image(encoding, pos_grid), size=(grid[0], grid[1]), mode="bicubic",
                                      align_corners=False))


def key_position(k: torch.Tensor, encoding: torch.Tensor, pos_grid: Tuple[int, int], grid: Tuple[int, int],
                 prefix: int) -> torch.Tensor:
    """k (B, H, N, d) with the learned (1, Hp·Wp, C) ``encoding`` of grid ``pos_grid`` added to its grid tokens
    (resampled where the grid differs: :func:`resample_encoding`)."""
    encoding = resample_encoding(encoding, pos_grid, grid)
    return add_to_grid(k, encoding.reshape(1, grid[0] * grid[1], k.shape[1], k.shape[-1]).transpose(1, 2), prefix)


class GridLinearAttention(GridAttention):
    """A linear kind with the grid pieces above. Options: ``dwc_kernel`` (the depthwise conv on V; 0 = none),
    ``pos_grid`` ((H, W) of the key position encoding; None = none), ``backend`` ('auto' | 'torch' | 'triton', the
    kind's functional op's) and the base's ``num_prefix_tokens`` (None = infer 0 or 1). ``forward(x, grid_size=(H,
    W))`` for non-square grids. No weight matrix is formed, so ``attn_drop > 0`` is rejected.

    A kind supplies its core twice: :meth:`core`, its functional op (autocast, backends), and :meth:`core_plain`,
    the same math on inputs already in the accumulation dtype, for TorchScript (whose autocast handling is
    Python's); :meth:`attend` puts either between the key position and the value conv."""

    exp_complexity = "0"
    layout_options = ("num_prefix_tokens", "pos_grid")

    def __init__(self, dim: int, num_heads: int = 8, *, dwc_kernel: int = 5,
                 pos_grid: Optional[Sequence[int]] = None, backend: str = "auto", **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        name = type(self).__name__
        self.backend = check_backend(name, self.attn_name, backend)
        check_count(name, "dwc_kernel", dwc_kernel, low=0)
        if dwc_kernel % 2 == 0 and dwc_kernel:
            raise ValueError(f"{name}: dwc_kernel={dwc_kernel}; allowed: 0 (none) or an odd kernel size")
        if pos_grid is not None and (not isinstance(pos_grid, (tuple, list)) or len(pos_grid) != 2):
            raise ValueError(f"{name}: pos_grid={pos_grid!r}; allowed: None or (H, W), two integers >= 1")
        self.dwc_kernel = dwc_kernel
        d = self.head_dim
        self.dwc = nn.Conv2d(d, d, dwc_kernel, padding=dwc_kernel // 2, groups=d) if dwc_kernel else None
        self.pos_grid: Tuple[int, int] = (0, 0)
        if pos_grid is not None:
            gh, gw = (check_count(name, "pos_grid", s) for s in pos_grid)
            self.pos_grid = (gh, gw)
            self.positional_encoding = nn.Parameter(torch.zeros(1, gh * gw, dim))
        else:
            self.register_parameter("positional_encoding", None)

    @torch.jit.ignore
    def set_pos_grid(self, grid: Tuple[int, int]) -> None:
        """Resample the key encoding to ``grid`` once, here, as the forward would: inputs of that grid then add it
        as it is, with no resampling op (a graph exported at one size)."""
        encoding = self.positional_encoding
        if encoding is None or tuple(grid) == tuple(self.pos_grid):
            return
        with torch.no_grad():
            resampled = resample_encoding(encoding, self.pos_grid, (int(grid[0]), int(grid[1])))
        self.positional_encoding = nn.Parameter(resampled, requires_grad=encoding.requires_grad)
        self.pos_grid = (int(grid[0]), int(grid[1]))

    def add_key_position(self, k: torch.Tensor, grid: Tuple[int, int], prefix: int) -> torch.Tensor:
        encoding = self.positional_encoding
        if encoding is None:
            return k
        return key_position(k, encoding, self.pos_grid, grid, prefix)

    def add_value_conv(self, out: torch.Tensor, v: torch.Tensor, grid: Tuple[int, int], prefix: int) -> torch.Tensor:
        dwc = self.dwc
        if dwc is None:
            return out
        return add_to_grid(out, head_tokens(dwc(head_images(v, grid, prefix)), self.num_heads).to(out.dtype), prefix)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """The kind's attention on q, k, v (B, H, N, d) through its functional op."""
        raise NotImplementedError

    def core_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """:meth:`core`'s math on q, k, v in the accumulation dtype, without autocast handling (TorchScript)."""
        raise NotImplementedError

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        grid, prefix = self.token_grid(k.shape[-2], grid_size)
        k = self.add_key_position(k, grid, prefix)
        if torch.jit.is_scripting():
            acc = torch.promote_types(q.dtype, torch.float32)
            out = self.core_plain(q.to(acc), k.to(acc), v.to(acc)).to(v.dtype)
        else:
            out = self.core(q, k, v)
        return self.add_value_conv(out, v, grid, prefix)

    def extra_repr(self) -> str:
        pos = f", pos_grid={self.pos_grid}" if self.positional_encoding is not None else ""
        return f"{super().extra_repr()}, dwc_kernel={self.dwc_kernel}{pos}"
