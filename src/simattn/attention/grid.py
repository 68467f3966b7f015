"""The 2-D token grid of the kinds that work on it (``uses_grid``: SOFT, Agent, Nyströmformer, Linformer, CosFormer
and the grid-linear kinds; their module base is :class:`~simattn.attention.base.GridAttention`).

Geometry from the token count: :func:`infer_grid`, :func:`scripted_grid` for TorchScript, :func:`token_grid` either
way. Every token↔image layout of the kinds, each with its way back: one image per head (:func:`head_images`,
:func:`head_tokens`), one image of every head's channels (:func:`heads_image`, :func:`heads_tokens`,
:func:`add_heads_image`) and channels-last tokens of one image (:func:`tokens_image`, :func:`image_tokens`). The
images hold the grid tokens only; :func:`add_to_grid` adds tokens back behind the prefix tokens, which it leaves
unchanged. Landmarks pooled over the grid: :func:`pool_landmarks`.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ._common import eager

__all__ = ["infer_grid", "scripted_grid", "token_grid", "head_images", "head_tokens", "heads_image", "heads_tokens",
           "tokens_image", "image_tokens", "add_to_grid", "add_heads_image", "pool_landmarks"]


def _is_count(value, low: int) -> bool:
    """An integer >= low; symbolic sizes (``torch.export`` with dynamic shapes, tensors under ``torch.jit.trace``)
    pass unchecked."""
    if isinstance(value, (torch.SymInt, torch.Tensor)):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def infer_grid(n: int, grid_size: Optional[Tuple[int, int]] = None,
               num_prefix_tokens: Optional[int] = None, name: str = "soft") -> Tuple[Tuple[int, int], int]:
    """((H, W), number of prefix tokens) for n tokens: from ``grid_size`` or a square grid with 0 or 1 prefix tokens.
    Every kind that works on the 2-D token grid (``uses_grid``) finds it here; ``name`` heads its errors."""
    if num_prefix_tokens is not None and not _is_count(num_prefix_tokens, 0):
        raise ValueError(f"{name}: num_prefix_tokens={num_prefix_tokens!r}; allowed: an integer >= 0")
    if grid_size is not None:
        if not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2 or not all(_is_count(s, 1) for s in grid_size):
            raise ValueError(f"{name}: grid_size={grid_size!r}; allowed: (H, W), two integers >= 1")
        gh, gw = grid_size
        prefix = n - gh * gw
        if prefix < 0 or (num_prefix_tokens is not None and prefix != num_prefix_tokens):
            raise ValueError(f"{name}: {n} tokens do not fit grid {gh}x{gw} with {num_prefix_tokens or 0} prefix tokens")
        return (gh, gw), prefix
    for prefix in ((num_prefix_tokens,) if num_prefix_tokens is not None else (0, 1)):
        side = math.isqrt(max(n - prefix, 0))
        if side > 0 and side * side == n - prefix:
            return (side, side), prefix
    raise ValueError(f"{name}: cannot infer a square token grid from N={n}; pass grid_size=(H, W)")


def scripted_grid(n: int, grid_size: Optional[Tuple[int, int]],
                   num_prefix_tokens: Optional[int]) -> Tuple[Tuple[int, int], int]:
    """:func:`infer_grid` without its checks, for TorchScript (the eager path checks)."""
    if grid_size is not None:
        return grid_size, n - grid_size[0] * grid_size[1]
    prefix = 0 if num_prefix_tokens is None else num_prefix_tokens
    side = int(math.sqrt(n - prefix))
    if side * side != n - prefix and num_prefix_tokens is None:
        prefix = 1
        side = int(math.sqrt(n - 1))
    return (side, side), prefix


def token_grid(n: int, grid_size: Optional[Tuple[int, int]], num_prefix_tokens: Optional[int],
               name: str) -> Tuple[Tuple[int, int], int]:
    """:func:`infer_grid` eagerly, :func:`scripted_grid` under TorchScript."""
    if torch.jit.is_scripting():
        return scripted_grid(n, grid_size, num_prefix_tokens)
    else:
        return infer_grid(n, grid_size, num_prefix_tokens, name=name)


def _channels_last_on_cpu(images: torch.Tensor) -> torch.Tensor:
    """``images`` channels-last where they run eagerly on CPU, whose depthwise convs and poolings run several times
    faster so (a copy, cheaper than what it saves, where the tokens are not laid out so already: a batch of one
    gives the images a stride CPU's kernels do not take for channels-last); as they are elsewhere."""
    if torch.jit.is_scripting():  # TorchScript compiles only this branch
        return images
    else:
        return images.contiguous(memory_format=torch.channels_last) if images.is_cpu and eager() else images


def head_images(x: torch.Tensor, grid_size: Tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
    """The grid tokens of x (B, H, N, d) as one image per head (B·H, d, gh, gw), for filters shared by the heads
    (pooling, a conv of the head dim); channels-last on CPU, as :func:`heads_image`."""
    B, H, _, d = x.shape
    images = x[:, :, num_prefix_tokens:].reshape(B * H, grid_size[0], grid_size[1], d).permute(0, 3, 1, 2)
    return _channels_last_on_cpu(images)


def head_tokens(images: torch.Tensor, heads: int) -> torch.Tensor:
    """:func:`head_images`' layout back as tokens: (B·H, d, h, w) → (B, H, h·w, d)."""
    BH, d = images.shape[0], images.shape[1]
    return images.flatten(2).transpose(1, 2).reshape(BH // heads, heads, -1, d)


def heads_image(v: torch.Tensor, grid_size: Tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
    """The grid tokens of v (B, H, N, d) as one image of every head's channels (B, H·d, gh, gw), for a depthwise
    conv or a pooling over all of them; channels-last on CPU (:func:`_channels_last_on_cpu`)."""
    B, H, _, d = v.shape
    image = v[:, :, num_prefix_tokens:].permute(0, 1, 3, 2).reshape(B, H * d, grid_size[0], grid_size[1])
    return _channels_last_on_cpu(image)


def heads_tokens(image: torch.Tensor, heads: int) -> torch.Tensor:
    """:func:`heads_image`' layout back as tokens: (B, H·d, h, w) (or (B, H·d, h·w)) → (B, H, h·w, d)."""
    B, C = image.shape[0], image.shape[1]
    return image.reshape(B, heads, C // heads, -1).transpose(-2, -1)


def tokens_image(x: torch.Tensor, grid_size: Tuple[int, int]) -> torch.Tensor:
    """Grid tokens x (B, gh·gw, C), channels last, as an image (B, C, gh, gw)."""
    return x.reshape(x.shape[0], grid_size[0], grid_size[1], -1).permute(0, 3, 1, 2)


def image_tokens(image: torch.Tensor) -> torch.Tensor:
    """:func:`tokens_image`' layout back as tokens: (B, C, h, w) → (B, h·w, C)."""
    return image.flatten(2).transpose(1, 2)


def add_to_grid(x: torch.Tensor, tokens: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """x (B, H, P + n, d) with ``tokens`` (…, n, d) added to its n grid tokens, the P prefix tokens unchanged."""
    if num_prefix_tokens == 0:  # a pad by nothing would still copy
        return x + tokens
    return x + F.pad(tokens, [0, 0, num_prefix_tokens, 0])


def add_heads_image(out: torch.Tensor, image: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """out (B, H, N, d) with image (B, H·d, gh, gw) added to its grid tokens, the prefix tokens unchanged."""
    return add_to_grid(out, heads_tokens(image, out.shape[1]).to(out.dtype), num_prefix_tokens)


def pool_landmarks(x: torch.Tensor, grid_size: Tuple[int, int], ratio: int, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Landmarks by ratio×ratio stride-ratio average pooling of the grid tokens of x (B, H, N, d) → (B, H, m, d)."""
    grid = head_images(x, grid_size, num_prefix_tokens)
    return head_tokens(F.avg_pool2d(grid, ratio, ratio, ceil_mode=True) if ratio > 1 else grid, x.shape[1])
