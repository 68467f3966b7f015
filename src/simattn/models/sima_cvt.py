"""CvT (Convolutional vision Transformer, Wu et al. 2021) with SimA attention, and the pyramid skeleton it shares
with the SOFT family (:mod:`simattn.models.soft_vit`).

CvT-13 / CvT-21: three stages (dims 64/192/384, heads 1/3/6), each opened by a convolutional token embedding
(7×7 stride 4, then 3×3 stride 2, each followed by LayerNorm); inside every block q, k and v come from a depthwise
3×3 conv + BatchNorm on the token grid followed by a linear map, with key/value stride 2, so the attention runs
from N query tokens to about N/4 key tokens. There is no position embedding; a CLS token joins in the last stage
only (it skips the convolutions and goes straight to the linear maps). The MLPs use QuickGELU as the official
code does. SimA normalizes q over the query tokens and
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

import re
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import get_act_layer
from timm.models import generate_default_cfgs, register_model

from ..attention import TokenAttention, attention_class, fx_tracing
from ..utils.io import extract_state_dict
from ._build import build_family_model
from ._pyramid import Grid, GridBlock, PyramidStage, PyramidTransformer, drop_path_rates

__all__ = [
    "ConvProjection", "cvt_attention_class", "ConvEmbed", "CvT", "checkpoint_filter_fn",
]

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

    ``forward(x, grid_size=(H, W))`` takes x (B, P + H·W, C) with the grid tokens in row-major order.
    """

    uses_grid = True
    fuses_projection = False  # q, k, v come from the convolutions (project_grid), never the fused projection

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
        if kv_stride != 1 and not self.supports_cross_length:
            raise ValueError(f"CvT attention {self.attn_name!r} needs equal query and key lengths, so it cannot use "
                             f"key/value stride {kv_stride}; build the model with kv_stride=1")

    def _project(self, conved: torch.Tensor, chunk: int, prefix: torch.Tensor) -> torch.Tensor:
        """The conv's output map, prefix tokens put back in front, then this chunk of ``qkv`` → (B, heads, N', d)."""
        n_chunks = 3 if self.separate_qk else 2
        weight = self.qkv.weight.chunk(n_chunks)[chunk]
        bias = self.qkv.bias.chunk(n_chunks)[chunk] if self.qkv.bias is not None else None
        tokens = conved.flatten(2).transpose(1, 2)
        if prefix.shape[1] > 0:  # only the CLS stage; an empty cat would still copy every token
            tokens = torch.cat([prefix, tokens], dim=1)
        B, N, _ = tokens.shape
        return F.linear(tokens, weight, bias).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def project_grid(self, x: torch.Tensor,
                     grid_size: Optional[Tuple[int, int]]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, P + H·W, C) → q (B, heads, P + H·W, d), k, v (B, heads, P + H'·W', d)."""
        assert grid_size is not None  # checked (check_call); refines the type for TorchScript
        B, N, C = x.shape
        H, W = grid_size
        num_prefix = N - H * W
        if not torch.jit.is_scripting():
            if not fx_tracing() and num_prefix < 0:
                raise ValueError(f"{type(self).__name__}: {N} tokens do not cover a {H}x{W} grid")
        prefix = x[:, :num_prefix]
        grid_img = x[:, num_prefix:].transpose(1, 2).reshape(B, C, H, W)
        q = self.q_norm(self._project(self.conv_proj_q(grid_img), 0, prefix))
        if self.conv_proj_k is None:  # q = k (SOFT)
            return q, q, self._project(self.conv_proj_v(grid_img), 1, prefix)
        k = self.k_norm(self._project(self.conv_proj_k(grid_img), 1, prefix))
        return q, k, self._project(self.conv_proj_v(grid_img), 2, prefix)

    def check_call(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                   grid_size: Optional[Tuple[int, int]] = None) -> None:
        """``grid_size`` is required, masks and causal attention are not supported (the convolutions mix
        tokens)."""
        if fx_tracing():
            return
        super().check_call(x, attn_mask, is_causal, grid_size)
        if grid_size is None:
            raise ValueError(f"{type(self).__name__}: forward needs grid_size=(H, W), the token grid")
        if attn_mask is not None or is_causal:
            raise ValueError(f"{type(self).__name__}: masks and causal attention are not supported (the "
                             "convolutional projection mixes neighbouring tokens)")

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
        act_layer: MLP activation (name or class); the official CvT code uses QuickGELU.
    """

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "token", embed_dims: Sequence[int] = (64, 192, 384),
                 depths: Sequence[int] = (1, 2, 10), num_heads: Sequence[int] = (1, 3, 6), mlp_ratio: float = 4.,
                 patch_sizes: Sequence[int] = (7, 3, 3), patch_strides: Sequence[int] = (4, 2, 2),
                 patch_paddings: Sequence[int] = (2, 1, 1), kernel_size: int = 3, kv_stride: int = 2,
                 qkv_bias: bool = True, class_token: bool = True, attn_type: str = "sima",
                 attn_kwargs: Optional[Dict[str, Any]] = None, act_layer: Union[str, Type[nn.Module]] = "quick_gelu",
                 drop_rate: float = 0., pos_drop_rate: float = 0., proj_drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.) -> None:
        per_stage = (embed_dims, depths, num_heads, patch_sizes, patch_strides, patch_paddings)
        if len({len(p) for p in per_stage}) != 1:
            raise ValueError("CvT: embed_dims, depths, num_heads and patch_sizes/strides/paddings need one entry per "
                             f"stage, got lengths {[len(p) for p in per_stage]}")
        attn_layer = cvt_attention_class(attn_type, attn_kwargs, kernel_size=kernel_size, kv_stride=kv_stride)
        norm_layer, act_layer = nn.LayerNorm, get_act_layer(act_layer)
        stages, reductions, reduction, in_dim = [], [], 1, in_chans
        last = len(embed_dims) - 1
        for i, (dim, rates) in enumerate(zip(embed_dims, drop_path_rates(depths, drop_path_rate))):
            reduction *= patch_strides[i]
            reductions.append(reduction)
            blocks = [GridBlock(dim, num_heads[i], attn_layer, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=rate,
                                act_layer=act_layer, norm_layer=norm_layer) for rate in rates]
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
    return build_family_model(CvT, variant, pretrained, kwargs, checkpoint_filter_fn, (0, 1, 2))


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (14, 14), "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "stages.0.patch_embed.proj", "classifier": "head",
        "license": "apache-2.0", **kwargs,
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
