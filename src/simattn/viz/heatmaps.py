"""Token-importance heatmaps (SimA paper Fig. 3 / A2) read from the attention modules' hook points.

SimA: ‖q̂‖₂ and ‖k̂‖₂ per token (l2 over all channels of all heads) from one block, through
``SimAAttention.qk_hook``; softmax (and ReLU) attention: the CLS token's attention to every patch (head mean)
through ``attn_weights``, or, for models without a class token, the mean attention each patch receives.
Prefix tokens (CLS, registers) are dropped, the rest is reshaped to the patch grid, upsampled bilinearly to the
image, and min-max normalized to [0, 1]. The model is only observed through forward hooks on those hook points.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..attention import HookPoint, XCAttention
from ..utils.io import atomic_path, save_figure

__all__ = ["TokenMaps", "hooked_blocks", "token_grid", "token_maps", "overlay", "save_overlay", "render_panels"]


@dataclass
class TokenMaps:
    """Heatmaps of one image: ``maps`` name → (H, W) array in [0, 1] at the image's resolution."""

    image: np.ndarray  # (H, W, 3) in [0, 1]
    maps: Dict[str, np.ndarray]
    block: int  # resolved (non-negative) block index
    num_blocks: int
    module: str  # the attention module's name in the model
    grids: Dict[str, Tuple[int, int]]  # per map: the token grid it was laid out on
    prefix_tokens: Dict[str, int]  # per map: leading tokens (CLS, …) dropped before the grid
    raw_range: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # min/max before normalization


#: hook attribute → maps it yields
_HOOKS = {"qk_hook": ("q_hat_norm", "k_hat_norm"), "attn_weights": ("attention",)}


def hooked_blocks(model: nn.Module) -> Tuple[str, List[Tuple[str, nn.Module]]]:
    """The attention modules to read, in model order, and their hook attribute: SimA's ``qk_hook`` if the model
    has any, else token-by-token ``attn_weights`` (softmax, ReLU; XCA's weights are channel-by-channel and skipped).
    Raises ValueError if the model exposes neither."""
    for attr in _HOOKS:
        found = [(name, m) for name, m in model.named_modules()
                 if isinstance(getattr(m, attr, None), HookPoint) and not isinstance(m, XCAttention)]
        if found:
            return attr, found
    raise ValueError(f"{type(model).__name__} has no attention module with a q̂/k̂ (qk_hook) or token attention "
                     "(attn_weights) hook point")


def token_grid(num_tokens: int, image_hw: Tuple[int, int],
               num_prefix_tokens: Optional[int] = None) -> Tuple[int, Tuple[int, int]]:
    """(prefix tokens, (grid h, grid w)) for a block's token count: the leading prefix tokens are dropped and the
    rest must tile the image's aspect ratio. ``num_prefix_tokens`` (the model's) is tried first."""
    h, w = image_hw
    candidates = ([num_prefix_tokens] if num_prefix_tokens is not None else []) + list(range(0, 9))
    for prefix in candidates:
        n = num_tokens - prefix
        if n <= 0:
            continue
        gh = max(1, round(math.sqrt(n * h / w)))
        if n % gh == 0 and abs(gh / (n // gh) - h / w) <= 0.05 * h / w:  # tolerance: rounded patch counts
            return prefix, (gh, n // gh)
    raise ValueError(f"cannot lay {num_tokens} tokens out on a grid for a {h}x{w} image")


def _upsample_minmax(values: torch.Tensor, grid: Tuple[int, int], size: Tuple[int, int]) -> np.ndarray:
    m = F.interpolate(values.float().reshape(1, 1, *grid), size=size, mode="bilinear", align_corners=False)[0, 0]
    lo, hi = m.min(), m.max()
    return ((m - lo) / (hi - lo)).numpy() if hi > lo else torch.zeros_like(m).numpy()


def token_maps(model: nn.Module, x: torch.Tensor, image: np.ndarray, block: int = -1) -> TokenMaps:
    """Heatmaps for one normalized input ``x`` (1, 3, H, W) from attention block ``block`` (negative counts from
    the end; the default is the last). ``image`` is the (H, W, 3) crop shown underneath."""
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f"token_maps expects one image of shape (1, 3, H, W), got {tuple(x.shape)}")
    attr, blocks = hooked_blocks(model)
    if not -len(blocks) <= block < len(blocks):
        raise ValueError(f"block {block} is out of range: the model has {len(blocks)} attention blocks with a "
                         f"{attr} hook point (valid: {-len(blocks)} to {len(blocks) - 1})")
    index = block % len(blocks)
    name, module = blocks[index]
    captured: Dict[str, object] = {}

    def keep(_module, _args, output):
        captured["out"] = output

    handle = getattr(module, attr).register_forward_hook(keep)
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        handle.remove()
    if "out" not in captured:
        raise ValueError(f"block {index} ({name}) did not run its {attr} hook point in the forward pass")

    size = tuple(x.shape[-2:])
    model_prefix = getattr(model, "num_prefix_tokens", None)
    raw: Dict[str, torch.Tensor] = {}
    grids: Dict[str, Tuple[int, int]] = {}
    prefixes: Dict[str, int] = {}
    if attr == "qk_hook":
        # q̂ and k̂ may have different token counts (CvT's strided key projection): each gets its own grid
        for key, t in zip(("q_hat_norm", "k_hat_norm"), captured["out"]):
            prefixes[key], grids[key] = token_grid(t.shape[-2], size, model_prefix)
            # l2 over every channel of every head: (B, H, N, d) → (N,)
            raw[key] = t[0, :, prefixes[key]:].transpose(0, 1).flatten(1).norm(dim=-1)
    else:
        weights = captured["out"][0]  # (H, Nq, Nk)
        prefix_k, grid = token_grid(weights.shape[-1], size, model_prefix)
        # one query row (class attention) or a CLS query in front: the CLS row; otherwise what each patch receives
        prefix_q = 1 if weights.shape[-2] == 1 else token_grid(weights.shape[-2], size, model_prefix)[0]
        key = "cls_attention" if prefix_q else "mean_attention_received"
        raw[key] = weights[:, 0, prefix_k:].mean(0) if prefix_q else weights[:, :, prefix_k:].mean(dim=(0, 1))
        grids[key], prefixes[key] = grid, prefix_k
    return TokenMaps(image=image, maps={k: _upsample_minmax(v, grids[k], size) for k, v in raw.items()},
                     block=index, num_blocks=len(blocks), module=name, grids=grids, prefix_tokens=prefixes,
                     raw_range={k: (float(v.min()), float(v.max())) for k, v in raw.items()})


def overlay(image: np.ndarray, heat: np.ndarray, alpha: float = 0.5, cmap: str = "jet") -> np.ndarray:
    """Blend a [0, 1] heatmap (through ``cmap``) over an (H, W, 3) [0, 1] image → uint8 (H, W, 3)."""
    from matplotlib import colormaps

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    colored = colormaps[cmap](heat)[..., :3]
    return (255 * ((1 - alpha) * image + alpha * colored)).clip(0, 255).round().astype(np.uint8)


def save_overlay(image: np.ndarray, heat: np.ndarray, path: str | Path, alpha: float = 0.5,
                 cmap: str = "jet") -> Path:
    """Write the overlay at the image's own resolution as a PNG (atomically)."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(overlay(image, heat, alpha, cmap)).save(tmp, format="PNG")
    return path


_TITLES = {"q_hat_norm": "‖q̂‖₂ per token", "k_hat_norm": "‖k̂‖₂ per token",
           "cls_attention": "CLS attention", "mean_attention_received": "mean attention received"}


def render_panels(result: TokenMaps, path: str | Path, *, title: str = "", alpha: float = 0.5, cmap: str = "jet",
                  panel_inches: float = 3.0, dpi: int = 100) -> Tuple[int, int]:
    """Image and each heatmap overlay side by side (with a colour bar) as one PNG; returns its (width, height) in
    pixels, which is fixed: (1 + maps) × panel_inches × dpi wide, (panel_inches + 0.6) × dpi high."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels: Sequence[Tuple[str, Optional[np.ndarray]]] = [("image", None), *result.maps.items()]
    fig = Figure(figsize=(panel_inches * len(panels), panel_inches + 0.6), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    shown = None
    for ax, (name, heat) in zip(axes, panels):
        ax.imshow(result.image)
        if heat is not None:
            shown = ax.imshow(heat, cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
        ax.set_title(_TITLES.get(name, name), fontsize=10)
        ax.axis("off")
    if shown is not None:  # one shared scale: every map is min-max normalized to [0, 1]
        fig.colorbar(shown, ax=list(axes[1:]), shrink=0.8, pad=0.01)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    save_figure(fig, path, dpi=dpi, close=False)
    width, height = fig.canvas.get_width_height()
    return width, height
