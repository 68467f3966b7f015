"""Checkpoint tensors laid out for one token grid, resampled at load for a model built for another, as the authors'
code resizes them, so that a released 224 px checkpoint loads at any size its family takes.

- Absolute position embeddings (a class token, where there is one, kept as it is; the grid row-major): bicubic
  where the authors resize them at load (Agent's and InLine's ``load_pretrained``, DeiT's fine-tuning), bilinear where
  they resize them on every forward instead (PVT and the FLatten, SLAB and PolaFormer PVTs: ``_get_pos_embed``).
- The learned key encodings of FLatten, SLAB and PolaFormer (``positional_encoding``, (1, h·w, C)): bicubic
  (their ``load_pretrained``).
- Agent's row and column biases ((H, n, w) here): linear along the grid axis (its ``load_pretrained``). Its 7×7
  block biases keep their size: the model resizes them to the grid on every forward, as the released code does.
- Swin's relative position bias tables, for a larger window: bicubic over each head's (2w−1)×(2w−1) map (Swin's
  and the peers' ``load_pretrained``).

Every resize is ``F.interpolate`` with ``align_corners=False`` and no antialiasing, as in those repositories, in the
checkpoint's own dtype (half precision through fp32). :func:`resample_grids` does them all for a family's
``checkpoint_filter_fn`` and says in one line what it resampled, from which size to which.
"""
from __future__ import annotations

import logging
import math
from typing import Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["resample_pos_embed", "resample_key_encoding", "resample_agent_axis", "resample_rel_pos_table",
           "resample_grids", "pos_embed_mode"]

_logger = logging.getLogger("simattn.models")

#: the papers (``PAPERS`` keys of :mod:`simattn.models.released`, the first word of their models' names) whose code
#: resizes absolute position embeddings at load (bicubic); the others resize them on every forward (bilinear)
_BICUBIC_AT_LOAD = ("agent", "inline")


def _interpolate(x: torch.Tensor, size: Tuple[int, ...], mode: str) -> torch.Tensor:
    dtype = x.dtype
    work = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    return F.interpolate(work, size=size, mode=mode, align_corners=False).to(dtype)


def _square(tokens: int) -> Optional[int]:
    side = math.isqrt(max(tokens, 0))
    return side if side > 0 and side * side == tokens else None


def _side(tokens: int, what: str) -> int:
    side = _square(tokens)
    if side is None:
        raise ValueError(f"{what}: {tokens} grid tokens are not a square grid, the layout a checkpoint is trained in")
    return side


def resample_pos_embed(value: torch.Tensor, grid: Tuple[int, int], prefix: int, mode: str) -> torch.Tensor:
    """(1, prefix + s·s, C) → (1, prefix + h·w, C): the grid tokens as an s×s image, ``mode`` interpolation."""
    side = _side(value.shape[1] - prefix, "pos_embed")
    image = value[:, prefix:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    grid_tokens = _interpolate(image, tuple(grid), mode).permute(0, 2, 3, 1).flatten(1, 2)
    return torch.cat([value[:, :prefix], grid_tokens], dim=1)


def resample_key_encoding(value: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """A key encoding (1, s·s, C) → (1, h·w, C), bicubic."""
    return resample_pos_embed(value, grid, 0, "bicubic")


def resample_agent_axis(value: torch.Tensor, length: int) -> torch.Tensor:
    """Agent's row or column bias (H, n, w) → (H, n, length), linear."""
    return _interpolate(value, (length,), "linear")


def resample_rel_pos_table(value: torch.Tensor, length: int) -> torch.Tensor:
    """Swin's relative position bias table ((2w−1)², heads) → (length, heads), the (2w−1)×(2w−1) maps of each head
    bicubic (Swin's and the peers' ``load_pretrained``; timm's own filter uses another interpolator)."""
    side, target = _side(value.shape[0], "relative_position_bias_table"), _side(length, "relative_position_bias_table")
    maps = value.permute(1, 0).reshape(1, value.shape[1], side, side)
    return _interpolate(maps, (target, target), "bicubic").reshape(value.shape[1], length).permute(1, 0)


def pos_embed_mode(model: nn.Module) -> str:
    """How ``model``'s authors resize its absolute position embeddings: bicubic at load for the papers of
    :data:`_BICUBIC_AT_LOAD` (the first word of the model's name: ``agent_pvt_tiny``), else bilinear, as PVT's
    forward does."""
    architecture = str((getattr(model, "pretrained_cfg", None) or {}).get("architecture") or "")
    return "bicubic" if architecture.split("_")[0] in _BICUBIC_AT_LOAD else "bilinear"


def resample_grids(state_dict: Dict[str, torch.Tensor], model: nn.Module,
                   pos_embed: Optional[Mapping[str, Tuple[Tuple[int, int], int]]] = None,
                   mode: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """``state_dict`` (already in the model's names) with every grid-shaped tensor whose shape differs from the
    model's resampled to the model's grid: key encodings and Agent's row and column biases by the module that holds
    them, and the position embeddings ``pos_embed`` names (key → (grid, prefix tokens)) by ``mode`` (default
    :func:`pos_embed_mode`). Logs one line naming what was resampled, from which size to which."""
    own = dict(model.state_dict(keep_vars=True))
    modules = dict(model.named_modules())
    done: Dict[str, List[str]] = {}
    mode = mode or pos_embed_mode(model)
    out = dict(state_dict)
    for key, value in state_dict.items():
        target = own.get(key)
        if not torch.is_tensor(value) or target is None or value.shape == target.shape:
            continue
        owner, _, leaf = key.rpartition(".")
        module = modules.get(owner)
        if leaf == "positional_encoding" and getattr(module, "pos_grid", None):
            grid = tuple(module.pos_grid)
            out[key] = resample_key_encoding(value, grid)
            side = _side(value.shape[1], key)
            done.setdefault(f"key encodings {side}x{side} -> {grid[0]}x{grid[1]} (bicubic)", []).append(key)
        elif leaf in ("agent_row_bias", "agent_col_bias", "query_row_bias", "query_col_bias") and value.dim() == 3:
            out[key] = resample_agent_axis(value, target.shape[-1])
            done.setdefault(f"Agent's row/column biases {value.shape[-1]} -> {target.shape[-1]} (linear)",
                            []).append(key)
        elif leaf == "relative_position_bias_table" and value.dim() == 2:
            out[key] = resample_rel_pos_table(value, target.shape[0])
            source, dest = _side(value.shape[0], key), _side(target.shape[0], key)
            done.setdefault(f"relative position tables {source}x{source} -> {dest}x{dest} (bicubic)", []).append(key)
        elif pos_embed and key in pos_embed and _square(value.shape[1] - pos_embed[key][1]):
            # other layouts (DeiT's distillation token) are left to the family's own filter
            grid, prefix = pos_embed[key]
            out[key] = resample_pos_embed(value, grid, prefix, mode)
            side = _square(value.shape[1] - prefix)
            done.setdefault(f"position embeddings {side}x{side} -> {grid[0]}x{grid[1]} ({mode})", []).append(key)
    if done:
        _logger.warning("note: the checkpoint's grids resampled to the model's, as its authors' code does: %s",
                        "; ".join(f"{what} ({len(keys)} tensor{'s' * (len(keys) > 1)})"
                                  for what, keys in done.items()))
    return out
