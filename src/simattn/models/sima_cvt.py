"""CvT (Convolutional vision Transformer, Wu et al. 2021) with SimA attention, and the pyramid skeleton it shares
with the SOFT family (:mod:`simattn.models.soft_vit`).

CvT-13 / CvT-21: three stages (dims 64/192/384, heads 1/3/6), each opened by a convolutional token embedding
(7×7 stride 4, then 3×3 stride 2, each followed by LayerNorm); inside every block q, k and v come from a depthwise
3×3 conv + BatchNorm on the token grid followed by a linear map, with key/value stride 2, so the attention runs
from N query tokens to about N/4 key tokens. There is no position embedding; a CLS token joins in the last stage
only (it skips the convolutions and goes straight to the linear maps). SimA normalizes q over the query tokens and
k over the shorter key sequence and picks its matmul order from both lengths.

Every model takes ``attn_type=`` (any registered attention kind) and ``attn_kwargs=``: the CvT attention is the
registry class with CvT's convolutional projection mixed in (:func:`cvt_attention_class`), so each kind keeps its
own ``attend`` (its parameters, e.g. XCA's temperature, and its hook points, e.g. SimA's ``qk_hook``).
Kinds that need equal query and key lengths (``xca``, ``soft``) fail with a ValueError unless built with
``kv_stride=1``. ``attn_type='softmax'`` is CvT itself, and :func:`checkpoint_filter_fn` maps the official CvT
checkpoint layout (``stage{i}.…``, separate ``proj_q/proj_k/proj_v``) onto these models. Note that the official
CvT scales its softmax logits by 1/√C (the full stage width); the registry's softmax uses the usual 1/√d.

Deviation from the official recipe: ``drop_path_rate`` rises linearly over all blocks (timm's rule) instead of
being set per stage (official CvT-13: 0 / 0 / 0.1).
"""
from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint

from ..attention import TokenAttention, attention_class
from ..utils.io import extract_state_dict

__all__ = [
    "GridBlock", "PyramidStage", "PyramidTransformer", "tokens_to_nchw",
    "ConvProjection", "cvt_attention_class", "ConvEmbed", "CvT", "checkpoint_filter_fn",
]

Grid = Tuple[int, int]


# ---------------------------------------------------------------------------------------------------------------------
# Pyramid skeleton shared with soft_vit: stages of (token embedding → optional CLS / position embedding → blocks).
# ---------------------------------------------------------------------------------------------------------------------

def tokens_to_nchw(tokens: torch.Tensor, grid: Grid, num_prefix_tokens: int = 0) -> torch.Tensor:
    """(B, P + H·W, C) tokens → the (B, C, H, W) feature map of the grid tokens (prefix tokens such as CLS dropped)."""
    grid_tokens = tokens[:, num_prefix_tokens:]
    return grid_tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[-1], grid[0], grid[1])


def _takes_kwarg(fn: Optional[Callable], name: str) -> bool:
    """Whether ``fn`` names ``name`` as a parameter (``**kwargs`` does not count)."""
    return fn is not None and name in inspect.signature(fn).parameters


class GridBlock(nn.Module):
    """Pre-norm transformer block on the tokens of a 2-D grid: ``x + attn(norm1 x)``, ``x + mlp(norm2 x)``.

    Attention modules that need the grid (CvT's convolutional projection, SOFT's landmark pooling) receive
    ``grid_size=(H, W)``; the others are called as plain token attention.
    """

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
        # Decided once here, not per call: which attentions want the grid.
        self.attn_takes_grid = _takes_kwarg(self.attn.forward, "grid_size") or \
            _takes_kwarg(getattr(self.attn, "attend", None), "grid_size")

    def forward(self, x: torch.Tensor, grid_size: Grid) -> torch.Tensor:
        attn_kwargs = {"grid_size": grid_size} if self.attn_takes_grid else {}
        x = x + self.drop_path1(self.attn(self.norm1(x), **attn_kwargs))
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
    """

    def __init__(self, patch_embed: nn.Module, blocks: Sequence[nn.Module], dim: int, *, class_token: bool = False,
                 pos_embed_grid: Optional[Grid] = None, pos_drop: float = 0.) -> None:
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

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        """(B, C_in, H, W) → ((B, P + H'·W', C) tokens, (H', W'))."""
        x, grid = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + resample_abs_pos_embed(self.pos_embed, list(grid), list(self.pos_embed_grid),
                                           num_prefix_tokens=self.num_prefix_tokens)
        x = self.pos_drop(x)
        for block in self.blocks:
            x = checkpoint(block, x, grid) if self.grad_checkpointing and self.training else block(x, grid)
        return x, grid


class PyramidTransformer(nn.Module):
    """timm's model API for a stack of :class:`PyramidStage`: the last stage's tokens are normalized
    (``forward_features``) and pooled (CLS token or grid average) into the classifier (``forward_head``).

    ``forward_intermediates`` / ``features_only=True`` give each stage's grid as a (B, C, H, W) map (CLS dropped).
    Inputs must have ``in_chans`` channels and sides that are positive multiples of ``size_divisor`` (the total
    stride), so every stage's map has exactly 1/4, 1/8, … of the input size.
    """

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
        """ValueError unless both sides are positive multiples of the total stride."""
        d = self.size_divisor
        if height <= 0 or width <= 0 or height % d or width % d:
            raise ValueError(f"{type(self).__name__}: input size {height}x{width} does not fit: height and width must "
                             f"be positive multiples of {d} (the total stride)")

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"{type(self).__name__}: expected input of shape (B, {self.in_chans}, H, W), "
                             f"got {tuple(x.shape)}")
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

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = self._check_pool(global_pool)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → normalized last-stage tokens (B, P + N, C), CLS first when the model has one."""
        self._check_input(x)
        for stage in self.stages:
            tokens, grid = stage(x)
            x = tokens_to_nchw(tokens, grid, stage.num_prefix_tokens)
        return self.norm(tokens)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

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


# ---------------------------------------------------------------------------------------------------------------------
# CvT
# ---------------------------------------------------------------------------------------------------------------------

def _dw_conv_bn(dim: int, kernel_size: int, stride: int) -> nn.Sequential:
    """CvT's 'dw_bn' projection: depthwise conv (no bias) + BatchNorm (official parameter names conv / bn)."""
    return nn.Sequential(OrderedDict(
        conv=nn.Conv2d(dim, dim, kernel_size, stride=stride, padding=kernel_size // 2, groups=dim, bias=False),
        bn=nn.BatchNorm2d(dim),
    ))


class ConvProjection(TokenAttention):
    """CvT's convolutional projection, mixed into a registry attention class by :func:`cvt_attention_class`.

    q comes from a stride-1 depthwise conv + BN of the token grid, k and v from stride-``kv_stride`` ones; each then
    goes through its slice of the fused linear ``qkv`` (so parameter names stay the registry's). Prefix tokens (CLS)
    skip the convs. The kind's own ``attend(q, k, v, mask)`` combines them, so with ``kv_stride`` > 1 it sees
    Nq ≠ Nk: kinds that cannot (XCA, and SOFT whose q = k) raise a ValueError at construction.

    ``forward(x, grid_size)`` takes x (B, P + H·W, C) with the grid tokens in row-major order.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, kernel_size: int = 3, kv_stride: int = 2, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if kernel_size < 1 or kernel_size % 2 == 0 or kv_stride < 1:
            raise ValueError(f"{type(self).__name__}: kernel_size must be odd and positive and kv_stride >= 1, "
                             f"got kernel_size={kernel_size}, kv_stride={kv_stride}")
        self.kernel_size, self.kv_stride = kernel_size, kv_stride
        if not self.separate_qk and kv_stride != 1:
            raise ValueError(f"CvT attention {self.attn_name!r} shares one projection for q and k, so keys cannot "
                             f"be strided (kv_stride={kv_stride}); build the model with kv_stride=1")
        self.conv_proj_q = _dw_conv_bn(dim, kernel_size, 1)
        self.conv_proj_k = _dw_conv_bn(dim, kernel_size, kv_stride) if self.separate_qk else None
        self.conv_proj_v = _dw_conv_bn(dim, kernel_size, kv_stride)
        self.attend_takes_grid = _takes_kwarg(self.attend, "grid_size")
        if kv_stride != 1:
            self._check_unequal_lengths()

    def _check_unequal_lengths(self) -> None:
        """Fail at build time, not at the first forward, for kinds that need as many keys as queries."""
        q = torch.zeros(1, self.num_heads, 4, self.head_dim)
        kv = torch.zeros(1, self.num_heads, 1, self.head_dim)
        try:
            with torch.no_grad():
                self.attend(q, kv, kv, None)
        except (ValueError, RuntimeError) as e:  # RuntimeError: a kind whose matmuls reject the shapes
            raise ValueError(f"CvT attention {self.attn_name!r} needs equal query and key lengths, so it cannot use "
                             f"key/value stride {self.kv_stride}; build the model with kv_stride=1 "
                             f"({str(e).splitlines()[0]})") from None

    def _project(self, conv: nn.Module, chunk: int, grid_img: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """conv on the grid, prefix tokens put back in front, then this chunk of ``qkv`` → (B, heads, N', d)."""
        n_chunks = 3 if self.separate_qk else 2
        weight = self.qkv.weight.chunk(n_chunks)[chunk]
        bias = self.qkv.bias.chunk(n_chunks)[chunk] if self.qkv.bias is not None else None
        tokens = torch.cat([prefix, conv(grid_img).flatten(2).transpose(1, 2)], dim=1)
        B, N, _ = tokens.shape
        return F.linear(tokens, weight, bias).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def project_grid(self, x: torch.Tensor, grid_size: Grid) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, P + H·W, C) → q (B, heads, P + H·W, d), k, v (B, heads, P + H'·W', d)."""
        B, N, C = x.shape
        H, W = grid_size
        num_prefix = N - H * W
        if num_prefix < 0:
            raise ValueError(f"{type(self).__name__}: {N} tokens do not cover a {H}x{W} grid")
        prefix = x[:, :num_prefix]
        grid_img = x[:, num_prefix:].transpose(1, 2).reshape(B, C, H, W)
        q = self.q_norm(self._project(self.conv_proj_q, 0, grid_img, prefix))
        if not self.separate_qk:
            return q, q, self._project(self.conv_proj_v, 1, grid_img, prefix)
        k = self.k_norm(self._project(self.conv_proj_k, 1, grid_img, prefix))
        return q, k, self._project(self.conv_proj_v, 2, grid_img, prefix)

    def forward(self, x: torch.Tensor, grid_size: Grid, **attend_kwargs) -> torch.Tensor:  # type: ignore[override]
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__}: expected x of shape (B, N, {self.dim}), got {tuple(x.shape)}")
        B, N, C = x.shape
        q, k, v = self.project_grid(x, grid_size)
        if self.attend_takes_grid:  # e.g. SOFT pools its landmarks on the grid (q keeps stride 1)
            attend_kwargs.setdefault("grid_size", tuple(grid_size))
        out = self.attend(q, k, v, None, **attend_kwargs)
        out = self.norm(out.transpose(1, 2).reshape(B, N, C))
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(out))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_size={self.kernel_size}, kv_stride={self.kv_stride}"


def cvt_attention_class(attn_type: Union[str, Type[nn.Module]] = "sima", attn_kwargs: Optional[Dict[str, Any]] = None,
                        *, kernel_size: int = 3, kv_stride: int = 2) -> Type[nn.Module]:
    """The registry class for ``attn_type`` (options ``attn_kwargs`` bound) with CvT's convolutional projection,
    as a named class with timm's Attention constructor signature."""
    base = attention_class(attn_type, **(attn_kwargs or {}))
    if not issubclass(base, TokenAttention):
        raise ValueError(f"CvT needs a TokenAttention kind, got {base.__name__}")
    mixed = type(f"ConvProj{base.__name__}", (ConvProjection, base), {"__module__": __name__})
    return attention_class(mixed, kernel_size=kernel_size, kv_stride=kv_stride)


class ConvEmbed(nn.Module):
    """CvT's convolutional token embedding: a strided conv, then LayerNorm over the channels of each token."""

    def __init__(self, in_chans: int, dim: int, kernel_size: int, stride: int, padding: int,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size, stride=stride, padding=padding)
        self.norm = norm_layer(dim)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        x = self.proj(x)
        grid = (x.shape[-2], x.shape[-1])
        return self.norm(x.flatten(2).transpose(1, 2)), grid


class CvT(PyramidTransformer):
    """Convolutional vision Transformer with a pluggable attention kind (SimA by default).

    Args:
        img_size: nominal input size (checked to fit the total stride; CvT has no position embedding, so any
            fitting size runs).
        embed_dims, depths, num_heads: per stage.
        patch_sizes, patch_strides, patch_paddings: the convolutional token embeddings.
        kernel_size, kv_stride: the depthwise-conv q/k/v projection (q always stride 1).
        attn_type, attn_kwargs: attention kind from :mod:`simattn.attention` and its options.
        class_token: CLS token in the last stage (pooled by ``global_pool='token'``).
    """

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "token", embed_dims: Sequence[int] = (64, 192, 384),
                 depths: Sequence[int] = (1, 2, 10), num_heads: Sequence[int] = (1, 3, 6), mlp_ratio: float = 4.,
                 patch_sizes: Sequence[int] = (7, 3, 3), patch_strides: Sequence[int] = (4, 2, 2),
                 patch_paddings: Sequence[int] = (2, 1, 1), kernel_size: int = 3, kv_stride: int = 2,
                 qkv_bias: bool = True, class_token: bool = True, attn_type: str = "sima",
                 attn_kwargs: Optional[Dict[str, Any]] = None, drop_rate: float = 0., pos_drop_rate: float = 0.,
                 proj_drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.) -> None:
        per_stage = (embed_dims, depths, num_heads, patch_sizes, patch_strides, patch_paddings)
        if len({len(p) for p in per_stage}) != 1:
            raise ValueError("CvT: embed_dims, depths, num_heads and patch_sizes/strides/paddings need one entry per "
                             f"stage, got lengths {[len(p) for p in per_stage]}")
        attn_layer = cvt_attention_class(attn_type, attn_kwargs, kernel_size=kernel_size, kv_stride=kv_stride)
        norm_layer = nn.LayerNorm
        stages, reductions, reduction, in_dim = [], [], 1, in_chans
        last = len(embed_dims) - 1
        for i, (dim, rates) in enumerate(zip(embed_dims, drop_path_rates(depths, drop_path_rate))):
            reduction *= patch_strides[i]
            reductions.append(reduction)
            blocks = [GridBlock(dim, num_heads[i], attn_layer, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=rate,
                                norm_layer=norm_layer) for rate in rates]
            embed = ConvEmbed(in_dim, dim, patch_sizes[i], patch_strides[i], patch_paddings[i], norm_layer)
            stages.append(PyramidStage(embed, blocks, dim, class_token=class_token and i == last,
                                       pos_drop=pos_drop_rate))
            in_dim = dim
        super().__init__(stages, embed_dims, reductions, in_chans=in_chans, num_classes=num_classes,
                         global_pool=global_pool, drop_rate=drop_rate, norm_layer=norm_layer)
        self.attn_type = attn_type
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.check_img_size(*img_size)
        self.img_size = img_size
        self.init_weights()


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: CvT) -> Dict[str, torch.Tensor]:
    """Map a checkpoint onto :class:`CvT`: unwraps ``model`` / ``state_dict`` entries and DDP prefixes, and converts
    the official CvT layout (``stage{i}.…``, ``attn.proj_q/proj_k/proj_v``) to ``stages.{i}.…`` and the fused
    ``attn.qkv``. Checkpoints already in this layout pass through unchanged."""
    state_dict = extract_state_dict(state_dict)
    out: Dict[str, torch.Tensor] = {}
    split_qkv: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        key = re.sub(r"^stage(\d+)\.", r"stages.\1.", key)
        match = re.match(r"^(.*\.attn)\.proj_([qkv])\.(weight|bias)$", key)
        if match:
            split_qkv.setdefault((match[1], match[3]), {})[match[2]] = value
        else:
            out[key] = value
    for (prefix, kind), parts in split_qkv.items():
        out[f"{prefix}.qkv.{kind}"] = torch.cat([parts[name] for name in "qkv" if name in parts])
    return out


def _create_cvt(variant: str, pretrained: bool = False, **kwargs) -> CvT:
    out_indices = kwargs.pop("out_indices", (0, 1, 2))
    return build_model_with_cfg(
        CvT, variant, pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (14, 14), "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "stages.0.patch_embed.proj", "classifier": "head",
        "license": "mit", **kwargs,
    }


default_cfgs = generate_default_cfgs({
    # No SimA CvT weights were published; the configs describe the input pipeline.
    "sima_cvt_13": _cfg(),
    "sima_cvt_21": _cfg(),
})


@register_model
def sima_cvt_13(pretrained: bool = False, **kwargs) -> CvT:
    """CvT-13 with SimA attention (dims 64/192/384, heads 1/3/6, depths 1/2/10; about 20M params; paper: 81.4%)."""
    args = dict(embed_dims=(64, 192, 384), depths=(1, 2, 10), num_heads=(1, 3, 6), attn_type="sima")
    return _create_cvt("sima_cvt_13", pretrained, **dict(args, **kwargs))


@register_model
def sima_cvt_21(pretrained: bool = False, **kwargs) -> CvT:
    """CvT-21 with SimA attention (dims 64/192/384, heads 1/3/6, depths 1/4/16; about 32M params)."""
    args = dict(embed_dims=(64, 192, 384), depths=(1, 4, 16), num_heads=(1, 3, 6), attn_type="sima")
    return _create_cvt("sima_cvt_21", pretrained, **dict(args, **kwargs))
