"""The pyramid skeleton shared by the CvT and SOFT families: stages of (token embedding → optional CLS / position
embedding → blocks of attention + MLP on a token grid), with timm's model API (features, intermediates, heads)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn

from timm.layers import DropPath, Mlp, resample_abs_pos_embed, trunc_normal_
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint

from ..attention import fx_tracing
from ._checks import image_batch_error
from ._head import TokenPoolHead



def resize_pos_embed(pos_embed: torch.Tensor, grid: Grid, old_grid: Grid, num_prefix_tokens: int,
                     interpolation: str) -> torch.Tensor:
    """A (1, P + h·w, C) position embedding laid out for ``old_grid`` resized to ``grid``: 'bicubic' is timm's
    ``resample_abs_pos_embed`` (antialiased, in fp32); 'bilinear' is ``F.interpolate`` without antialiasing,
    align_corners=False, in the embedding's dtype (fp32 for half precision), as PVT's dense-prediction code."""
    if interpolation == "bicubic":
        return resample_abs_pos_embed(pos_embed, [grid[0], grid[1]], [old_grid[0], old_grid[1]],
                                      num_prefix_tokens=num_prefix_tokens)
    if (grid[0], grid[1]) == (old_grid[0], old_grid[1]):
        return pos_embed
    prefix, tokens = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    image = tokens.reshape(1, old_grid[0], old_grid[1], -1).permute(0, 3, 1, 2)
    work = image.float() if image.dtype in (torch.float16, torch.bfloat16) else image
    image = F.interpolate(work, size=[grid[0], grid[1]], mode=interpolation, align_corners=False).to(image.dtype)
    return torch.cat([prefix, image.flatten(2).transpose(1, 2)], dim=1)


# FX records the resampling as one call: it branches on sizes in Python
torch.fx.wrap("resize_pos_embed")

__all__ = ["Grid", "GridBlock", "PyramidStage", "PyramidTransformer", "tokens_to_nchw", "check_size_fits",
           "drop_path_rates"]

Grid = Tuple[int, int]



def tokens_to_nchw(tokens: torch.Tensor, grid: Grid, num_prefix_tokens: int = 0) -> torch.Tensor:
    """(B, P + H·W, C) tokens → the (B, C, H, W) map of the grid tokens (prefix tokens such as CLS dropped)."""
    grid_tokens = tokens[:, num_prefix_tokens:]
    return grid_tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[-1], grid[0], grid[1])


def check_size_fits(owner: str, height: int, width: int, divisor: int) -> None:
    """ValueError naming ``owner`` unless height and width are positive multiples of ``divisor`` (a total stride)."""
    if height <= 0 or width <= 0 or height % divisor or width % divisor:
        raise ValueError(f"{owner}: input size {height}x{width} does not fit: height and width must be positive "
                         f"multiples of {divisor} (the total stride)")


class GridBlock(nn.Module):
    """Pre-norm transformer block on the tokens of a 2-D grid: ``x + attn(norm1 x)``, ``x + mlp(norm2 x)``.

    Attention modules that use the grid (``uses_grid``: CvT's convolutional projection, SOFT's landmark pooling)
    receive ``grid_size=(H, W)``; the others are called as plain token attention.
    """

    __constants__ = ["attn_uses_grid"]  # TorchScript compiles only the call that is made

    def __init__(self, dim: int, num_heads: int, attn_layer: Type[nn.Module], mlp_ratio: float = 4.,
                 qkv_bias: bool = True, proj_drop: float = 0., attn_drop: float = 0., drop_path: float = 0.,
                 act_layer: Type[nn.Module] = nn.GELU, norm_layer: Callable[[int], nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn_layer(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.attn_uses_grid = bool(getattr(self.attn, "uses_grid", False))

    def forward(self, x: torch.Tensor, grid_size: Grid) -> torch.Tensor:
        if self.attn_uses_grid:  # a constant in TorchScript, so the other call is not compiled
            x = x + self.drop_path1(self.attn(self.norm1(x), grid_size=grid_size))
        else:
            x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class PyramidStage(nn.Module):
    """One stage: ``patch_embed`` (NCHW → tokens, grid), then an optional CLS token and learned position embedding
    (resampled to the input's grid), then the blocks.

    Args:
        patch_embed: module mapping a (B, C_in, H, W) map to ((B, N, C) tokens, (H', W')).
        blocks: :class:`GridBlock` list.
        class_token: prepend a learned CLS token (it takes part in attention but not in the grid).
        pos_embed_grid: grid size (H', W') at the model's ``img_size`` for a learned position embedding
            (CLS slot included); None for no position embedding.
        pos_embed_interpolation: how it is resampled to another input's grid in forward ('bicubic': timm's,
            antialiased; 'bilinear': without antialiasing, align_corners=False).
    """

    def __init__(self, patch_embed: nn.Module, blocks: Sequence[nn.Module], dim: int, *, class_token: bool = False,
                 pos_embed_grid: Optional[Grid] = None, pos_drop: float = 0.,
                 pos_embed_interpolation: str = "bicubic") -> None:
        super().__init__()
        self.patch_embed = patch_embed
        self.num_prefix_tokens = int(class_token)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        self.pos_embed_grid = tuple(pos_embed_grid) if pos_embed_grid is not None else None
        self.pos_embed = nn.Parameter(torch.zeros(
            1, self.num_prefix_tokens + pos_embed_grid[0] * pos_embed_grid[1], dim)) if pos_embed_grid else None
        self.pos_drop = nn.Dropout(pos_drop)
        self.blocks = nn.ModuleList(blocks)
        self.grad_checkpointing = False
        # False: inputs have the grid pos_embed_grid, and the position embedding is added as it is
        self.dynamic_img_size = True
        # how the position embedding follows another input grid in forward: timm's antialiased bicubic, or a
        # family's own ('bilinear' for PVT, whose dense-prediction code resizes so)
        self.pos_embed_interpolation = pos_embed_interpolation

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        """(B, C_in, H, W) → ((B, P + H'·W', C) tokens, (H', W'))."""
        x, grid = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            if self.dynamic_img_size:
                x = x + resize_pos_embed(self.pos_embed, grid, self.pos_embed_grid, self.num_prefix_tokens,
                                         self.pos_embed_interpolation)
            else:
                x = x + self.pos_embed
        x = self.pos_drop(x)
        for block in self.blocks:
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x = checkpoint(block, x, grid)
            else:
                x = block(x, grid)
        return x, grid


class PyramidTransformer(TokenPoolHead, nn.Module):
    """timm's model API for a stack of :class:`PyramidStage`: the last stage's tokens are normalized
    (``forward_features``) and pooled (CLS token or grid average) into the classifier (``forward_head``).

    ``forward_intermediates`` / ``features_only=True`` give each stage's grid as a (B, C, H, W) map (CLS dropped).
    Inputs must have ``in_chans`` channels and sides that are positive multiples of ``size_divisor`` (the total
    stride), so every stage's map has exactly 1/4, 1/8, … of the input size.
    """

    __jit_unused_properties__ = ["dynamic_img_size"]

    def __init__(self, stages: Sequence[PyramidStage], dims: Sequence[int], reductions: Sequence[int], *,
                 in_chans: int, num_classes: int, global_pool: str, drop_rate: float,
                 norm_layer: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.size_divisor = reductions[-1]
        self.stages = nn.ModuleList(stages)
        self.num_prefix_tokens = self.stages[-1].num_prefix_tokens
        self.num_features = self.head_hidden_size = self.embed_dim = dims[-1]
        self.global_pool = self._check_pool(global_pool)
        self.norm = norm_layer(dims[-1])
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=d, reduction=r, module=f"stages.{i}")
                             for i, (d, r) in enumerate(zip(dims, reductions))]

    def init_weights(self) -> None:
        """Truncated-normal (std 0.02) linear weights, zero biases; CLS and position embeddings likewise."""
        for name, param in self.named_parameters():
            if name.endswith(("cls_token", "pos_embed")):
                trunc_normal_(param, std=.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def check_img_size(self, height: int, width: int) -> None:
        """ValueError unless both sides are positive multiples of the total stride (and, with a fixed input size,
        equal to it)."""
        check_size_fits(type(self).__name__, height, width, self.size_divisor)
        if not self.dynamic_img_size and (height, width) != tuple(self.img_size):
            raise ValueError(f"{type(self).__name__}: input size {height}x{width} differs from the fixed input size "
                             f"{self.img_size[0]}x{self.img_size[1]} (set_input_size(dynamic_img_size=False))")

    @property
    def dynamic_img_size(self) -> bool:
        """Whether any input size that fits the total stride runs (position embeddings resampled per input)."""
        return all(stage.dynamic_img_size for stage in self.stages)

    @torch.jit.ignore
    def set_input_size(self, img_size: Union[int, Tuple[int, int]], dynamic_img_size: bool = False) -> None:
        """Lay the model out for ``img_size``: position embeddings are resampled to each stage's grid once, here,
        and with ``dynamic_img_size=False`` inputs of that size only are taken, with no resampling in forward."""
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        check_size_fits(type(self).__name__, *img_size, self.size_divisor)
        for stage, info in zip(self.stages, self.feature_info):
            grid = (img_size[0] // info["reduction"], img_size[1] // info["reduction"])
            if stage.pos_embed is not None and grid != stage.pos_embed_grid:
                with torch.no_grad():
                    resampled = resize_pos_embed(stage.pos_embed, grid, stage.pos_embed_grid,
                                                 stage.num_prefix_tokens, stage.pos_embed_interpolation)
                stage.pos_embed = nn.Parameter(resampled, requires_grad=stage.pos_embed.requires_grad)
                stage.pos_embed_grid = grid
            if not dynamic_img_size:  # key encodings on the stage grid (FLatten, SLAB, PolaFormer): fixed too
                for module in stage.blocks.modules():
                    if hasattr(module, "set_pos_grid"):
                        module.set_pos_grid(grid)
            stage.dynamic_img_size = dynamic_img_size
        self.img_size = img_size

    def _check_input(self, x: torch.Tensor) -> None:
        if fx_tracing():
            return
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise image_batch_error(type(self).__name__, self.in_chans, x.shape)
        self.check_img_size(x.shape[-2], x.shape[-1])

    def _check_pool(self, global_pool: str) -> str:
        if global_pool not in ("token", "avg", ""):
            raise ValueError(f"{type(self).__name__}: global_pool must be 'token', 'avg' or '', got {global_pool!r}")
        if global_pool == "token" and self.num_prefix_tokens == 0:
            raise ValueError(f"{type(self).__name__}: global_pool='token' needs a CLS token in the last stage")
        return global_pool

    # --- timm API ----------------------------------------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {name for name, _ in self.named_parameters() if name.endswith(("cls_token", "pos_embed"))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r"^stages\.0\.(?:patch_embed|pos_embed|cls_token)",
            blocks=r"^stages\.(\d+)" if coarse else [
                (r"^stages\.(\d+)\.(?:patch_embed|pos_embed|cls_token)", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = self._check_pool(global_pool)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → normalized last-stage tokens (B, P + N, C), CLS first when the model has one."""
        if not torch.jit.is_scripting():
            self._check_input(x)
        tokens = x
        for stage in self.stages:
            tokens, grid = stage(x)
            x = tokens_to_nchw(tokens, grid, stage.num_prefix_tokens)
        return self.norm(tokens)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = "NCHW",
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """Per-stage features (timm's contract).

        Args:
            indices: stages to return: the last n if an int, all if None, else these indices (negative from the end).
            norm: apply the final norm to the last stage's features.
            stop_early: stop after the last requested stage.
            output_fmt: ``'NCHW'`` (B, C, H, W) maps or ``'NLC'`` (B, H·W, C) grid tokens (CLS left out either way).
            intermediates_only: return only the list of features.
        Returns:
            The features, or (final normalized tokens as from ``forward_features``, features).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"{type(self).__name__}: output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        self._check_input(x)
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last = len(self.stages) - 1
        stages = self.stages[:max_index + 1] if stop_early else self.stages
        intermediates = []
        for i, stage in enumerate(stages):
            tokens, grid = stage(x)
            x = tokens_to_nchw(tokens, grid, stage.num_prefix_tokens)
            if i in take_indices:
                feat = self.norm(tokens) if norm and i == last else tokens
                intermediates.append(tokens_to_nchw(feat, grid, stage.num_prefix_tokens) if output_fmt == "NCHW"
                                     else feat[:, stage.num_prefix_tokens:])
        if intermediates_only:
            return intermediates
        return (self.norm(tokens) if i == last else tokens), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the stages after the last requested one (and the norm / head that no longer fit)."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        self.stages = self.stages[:max_index + 1]
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
            self.num_prefix_tokens = self.stages[-1].num_prefix_tokens
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_head or prune_end:
            self.reset_classifier(0, "")
        return take_indices


def drop_path_rates(depths: Sequence[int], drop_path_rate: float) -> List[List[float]]:
    """Stochastic-depth rates rising linearly over all blocks, split per stage."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]  # no tensors: works on the meta device
    out, start = [], 0
    for depth in depths:
        out.append(rates[start:start + depth])
        start += depth
    return out
