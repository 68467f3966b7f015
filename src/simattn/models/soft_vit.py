"""SOFT pyramid backbones (Lu et al., NeurIPS 2021, Table 2): softmax-free Gaussian-kernel attention with a Nyström
approximation in stages 1-3 and ordinary softmax attention with a CLS token in stage 4.

Architecture (paper): head dim 32, MLP ratio 4, m = 49 landmarks (bottleneck tokens) per SOFT layer, i.e. pooling
ratios 8/4/2 in stages 1-3 at 224 px (ratio 1 = full attention in stage 4); the stem is three 3×3 conv-BN-ReLU
units with strides 2, 1, 2 (64 channels out, 32 inside, as in the released code; convs without bias since BN
follows) and every later stage opens with one 3×3 stride-2 conv-BN-ReLU. Each stage adds a learned position
embedding (CLS slot included in stage 4), resampled to the input's grid. Blocks are pre-norm (LayerNorm eps 1e-6).

==========  ==============  =========  ===========  ========  ================================
model       dims            heads      depths       params    params without the V conv
==========  ==============  =========  ===========  ========  ================================
soft_tiny   64,128,320,512  2,4,10,16  1,2,3,2      12.98M    12.96M   (paper: 13M)
soft_small  64,128,320,512  2,4,10,16  1,3,7,4      24.00M    23.96M   (paper: 24M)
soft_medium 64,128,288,512  2,4,9,16   1,3,29,5     45.67M    45.57M   (paper: 45M)
soft_large  64,128,320,512  2,4,10,16  1,3,40,5     64.56M    64.41M   (paper: 64M)
soft_huge   64,128,352,512  2,4,11,16  1,5,49,5     86.94M    86.75M   (paper: 87M)
==========  ==============  =========  ===========  ========  ================================

Choices where the paper and the released code differ, and why:

- Depths follow the paper's Table 2. The released code's ``soft_small`` has 20 blocks in stage 3, not 7, which
  gives 38.7M parameters instead of the published 24M.
- The released code adds a depthwise k×k conv on V (k = 9/5/3 in stages 1-3) to the attention output. It costs
  under 0.2% of the parameters (table above), so both choices are within 5% of the published sizes; it is on by
  default (``v_conv_kernels=(9, 5, 3)``, as in the code that produced the published accuracies) and
  ``v_conv_kernels=(0, 0, 0)`` turns it off. Here it is a per-channel depthwise conv
  (:class:`simattn.attention.SoftAttention` ``v_conv_kernel``), where the released code shares one per-head
  kernel across a head's channels.
- Landmarks are average-pooled (the paper's ablation prefers pooling). ``attn_kwargs={'landmarks': 'conv'}`` gives
  the released code's learned landmarks: one ratio×ratio stride-ratio conv (head dim to head dim, no bias) shared
  by the heads, then LayerNorm and GELU, on q / d^¼; SOFT-Tiny then has 13.09M parameters (paper Table 4b: 13.07M).
- The landmark kernel's inverse is the released code's Newton–Raphson (M + 0.01·I, its step size, 20 steps),
  which produced the published numbers; ``attn_kwargs={'newton_init': 'paper'}`` gives the paper's
  (:mod:`simattn.attention.soft`).
- The released SOFT blocks are post-norm; these are pre-norm like the stage-4 blocks and the rest of timm.

Pooling ratios are fixed at build time from ``img_size`` (so that m ≤ ``num_landmarks``, exactly 49 at 224);
inputs of other sizes keep them, so m grows or shrinks with the input. Inputs must be multiples of 32.

``attn_type=`` (any registered kind) replaces the SOFT attention of stages 1-3, as in the paper's Table 1, where
every baseline runs in the Tiny architecture; ``last_attn_type=`` (default ``'softmax'``) sets stage 4. Kinds that
reduce the key grid (``takes_reduction_ratio``: Linformer, Nyströmformer) get SOFT's per-stage ratio.
Table 1's rows are registered: ``soft_tiny_softmax`` (Transformer), ``soft_tiny_linformer``, ``soft_tiny_performer``,
``soft_tiny_nystrom``, and ``soft_tiny`` itself; a kind is looked up when the model is built, so an entry point
whose kind is not registered fails then, naming the known kinds.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple, Type, Union

import torch
from torch import nn

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ConvNormAct, get_act_layer, resample_abs_pos_embed
from timm.models import generate_default_cfgs, register_model

from ..attention import SoftAttention, attention_class, get_attention_class
from ..utils.io import extract_state_dict
from ._build import build_family_model
from ._pyramid import GridBlock, PyramidStage, PyramidTransformer, check_size_fits, drop_path_rates

__all__ = ["ConvStemEmbed", "SoftViT", "checkpoint_filter_fn"]

STEM_STRIDES = (2, 1, 2)


class ConvStemEmbed(nn.Module):
    """3×3 conv-BN-ReLU units (timm ``ConvNormAct``) whose output grid becomes the stage's tokens."""

    def __init__(self, in_chans: int, dim: int, strides: Sequence[int], mid_chans: Optional[int] = None) -> None:
        super().__init__()
        chans = [in_chans] + [mid_chans or dim] * (len(strides) - 1) + [dim]
        self.proj = nn.Sequential(*[ConvNormAct(chans[i], chans[i + 1], 3, stride=stride, act_layer=nn.ReLU)
                                    for i, stride in enumerate(strides)])

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[-2], x.shape[-1])


def landmark_ratios(grids: Sequence[Tuple[int, int]], num_landmarks: int) -> Tuple[int, ...]:
    """Pooling ratio per grid so that a √m × √m landmark grid covers it (ratio = ⌈side / √m⌉)."""
    side = math.isqrt(max(num_landmarks, 0))
    if num_landmarks < 1 or side * side != num_landmarks:
        raise ValueError(f"SoftViT: num_landmarks must be a perfect square (the landmarks form a grid), "
                         f"got {num_landmarks}")
    return tuple(max(1, math.ceil(max(grid) / side)) for grid in grids)


class SoftViT(PyramidTransformer):
    """SOFT pyramidal vision transformer (4 stages; SOFT attention in stages 1-3, softmax + CLS in stage 4).

    Args:
        img_size: input size the position embeddings and landmark ratios are laid out for (multiple of 32).
        embed_dims, depths, num_heads: per stage.
        mlp_ratio: MLP expansion (paper: 4).
        num_landmarks: m, the bottleneck tokens per SOFT layer at ``img_size``.
        sr_ratios: explicit pooling ratios for stages 1-3 (default: from ``img_size`` and ``num_landmarks``).
        v_conv_kernels: depthwise conv on V in stages 1-3 (0 = none).
        stem_chans: channels inside the stem.
        attn_type, attn_kwargs: attention of stages 1-3 and its options (SOFT's ratio / V conv are filled in).
            ``attn_drop_rate > 0`` needs kinds with a weight matrix (SOFT has none and rejects it).
        last_attn_type, last_attn_kwargs: attention of stage 4.
        act_layer: MLP activation (name or class).
    """

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "token", embed_dims: Sequence[int] = (64, 128, 320, 512),
                 depths: Sequence[int] = (1, 2, 3, 2), num_heads: Sequence[int] = (2, 4, 10, 16),
                 mlp_ratio: float = 4., num_landmarks: int = 49, sr_ratios: Optional[Sequence[int]] = None,
                 v_conv_kernels: Sequence[int] = (9, 5, 3), stem_chans: int = 32, qkv_bias: bool = True,
                 attn_type: str = "soft", attn_kwargs: Optional[Dict[str, Any]] = None,
                 last_attn_type: str = "softmax", last_attn_kwargs: Optional[Dict[str, Any]] = None,
                 act_layer: Union[str, Type[nn.Module]] = "gelu", drop_rate: float = 0., pos_drop_rate: float = 0.,
                 proj_drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.) -> None:
        num_stages = len(embed_dims)
        if num_stages < 2 or len(depths) != num_stages or len(num_heads) != num_stages:
            raise ValueError(f"SoftViT: embed_dims, depths and num_heads need one entry per stage (at least 2), got "
                             f"{len(embed_dims)}, {len(depths)}, {len(num_heads)}")
        if len(v_conv_kernels) != num_stages - 1 or (sr_ratios is not None and len(sr_ratios) != num_stages - 1):
            raise ValueError(f"SoftViT: v_conv_kernels and sr_ratios need one entry per SOFT stage "
                             f"({num_stages - 1}), got {len(v_conv_kernels)} and "
                             f"{None if sr_ratios is None else len(sr_ratios)}")
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        reductions = [math.prod(STEM_STRIDES) * 2 ** i for i in range(num_stages)]
        check_size_fits("SoftViT", *img_size, reductions[-1])  # the position embeddings are laid out for it
        grids = [(img_size[0] // r, img_size[1] // r) for r in reductions]
        sr_ratios = tuple(sr_ratios) if sr_ratios is not None else landmark_ratios(grids[:-1], num_landmarks)
        attn_cls = get_attention_class(attn_type)
        is_soft = issubclass(attn_cls, SoftAttention)
        reduces = getattr(attn_cls, "takes_reduction_ratio", False)
        norm_layer, act_layer = _layer_norm, get_act_layer(act_layer)

        stages, in_dim = [], in_chans
        for i, (dim, rates) in enumerate(zip(embed_dims, drop_path_rates(depths, drop_path_rate))):
            last = i == num_stages - 1
            if last:
                attn_layer = attention_class(last_attn_type, **(last_attn_kwargs or {}))
            else:
                # the per-stage options first, so the caller's attn_kwargs win: the reduction ratio for every kind
                # that reduces the key grid (Linformer's and Nyströmformer's equal SOFT's, as in SOFT's Table 1)
                stage_options = dict(ratio=sr_ratios[i], num_prefix_tokens=0) if reduces else {}
                if is_soft:
                    stage_options["v_conv_kernel"] = v_conv_kernels[i]
                attn_layer = attention_class(attn_type, **{**stage_options, **(attn_kwargs or {})})
            blocks = [GridBlock(dim, num_heads[i], attn_layer, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=rate,
                                act_layer=act_layer, norm_layer=norm_layer) for rate in rates]
            embed = ConvStemEmbed(in_dim, dim, STEM_STRIDES if i == 0 else (2,), mid_chans=stem_chans)
            stages.append(PyramidStage(embed, blocks, dim, class_token=last, pos_embed_grid=grids[i],
                                       pos_drop=pos_drop_rate))
            in_dim = dim
        super().__init__(stages, embed_dims, reductions, in_chans=in_chans, num_classes=num_classes,
                         global_pool=global_pool, drop_rate=drop_rate, norm_layer=norm_layer)
        self.img_size = img_size
        self.sr_ratios = sr_ratios
        self.attn_type = attn_type
        self.init_weights()


def _layer_norm(dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=1e-6)


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: SoftViT) -> Dict[str, torch.Tensor]:
    """Map a checkpoint onto :class:`SoftViT`: unwraps ``model`` / ``state_dict`` entries and DDP prefixes, and
    resamples position embeddings laid out for another ``img_size`` (square grids) to this model's."""
    state_dict = extract_state_dict(state_dict)
    own = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        if key.endswith("pos_embed") and key in own and value.shape != own[key].shape:
            stage = model.stages[int(key.split(".")[1])]
            value = resample_abs_pos_embed(value, list(stage.pos_embed_grid), num_prefix_tokens=stage.num_prefix_tokens)
        out[key] = value
    return out


def _create_soft(variant: str, pretrained: bool = False, **kwargs) -> SoftViT:
    return build_family_model(SoftViT, variant, pretrained, kwargs, checkpoint_filter_fn, (0, 1, 2, 3))


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "stages.0.patch_embed.proj.0.conv", "classifier": "head",
        "license": "apache-2.0", **kwargs,
    }


default_cfgs = generate_default_cfgs({
    # The released SOFT weights use another layout (post-norm blocks, per-head landmark convs): none are mapped.
    "soft_tiny": _cfg(),
    "soft_small": _cfg(),
    "soft_medium": _cfg(),
    "soft_large": _cfg(),
    "soft_huge": _cfg(),
    **{f"soft_tiny_{kind}": _cfg() for kind in ("softmax", "linformer", "performer", "nystrom")},
})


#: SOFT-Tiny's pyramid, shared by Table 1's baselines
_TINY = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 2, 3, 2))


@register_model
def soft_tiny(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT-Tiny (dims 64/128/320/512, depths 1/2/3/2; 13M params, paper: 79.3%)."""
    return _create_soft("soft_tiny", pretrained, **dict(_TINY, **kwargs))


@register_model
def soft_small(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT-Small per the paper's Table 2 (depths 1/3/7/4; the released code has 20 in stage 3; 24M, 82.2%)."""
    args = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 3, 7, 4))
    return _create_soft("soft_small", pretrained, **dict(args, **kwargs))


@register_model
def soft_medium(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT-Medium (dims 64/128/288/512, depths 1/3/29/5; 45M params, paper: 82.9%)."""
    args = dict(embed_dims=(64, 128, 288, 512), num_heads=(2, 4, 9, 16), depths=(1, 3, 29, 5))
    return _create_soft("soft_medium", pretrained, **dict(args, **kwargs))


@register_model
def soft_large(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT-Large (dims 64/128/320/512, depths 1/3/40/5; 64M params, paper: 83.1%)."""
    args = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 3, 40, 5))
    return _create_soft("soft_large", pretrained, **dict(args, **kwargs))


@register_model
def soft_huge(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT-Huge (dims 64/128/352/512, depths 1/5/49/5; 87M params, paper: 83.3%)."""
    args = dict(embed_dims=(64, 128, 352, 512), num_heads=(2, 4, 11, 16), depths=(1, 5, 49, 5))
    return _create_soft("soft_huge", pretrained, **dict(args, **kwargs))


def _soft_tiny_with(kind: str, pretrained: bool, kwargs: Dict[str, Any]) -> SoftViT:
    """SOFT-Tiny's pyramid with ``kind`` in stages 1-3: the baselines of SOFT's Table 1."""
    args = dict(_TINY, attn_type=kind)
    return _create_soft(f"soft_tiny_{kind}", pretrained, **dict(args, **kwargs))


@register_model
def soft_tiny_softmax(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT's Tiny pyramid with softmax attention: Table 1's Transformer (13M, 3.9G, 79.1%)."""
    return _soft_tiny_with("softmax", pretrained, kwargs)


@register_model
def soft_tiny_linformer(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT's Tiny pyramid with Linformer, reduction = SOFT's pooling ratio: Table 1 (13M, 1.9G, 78.2%)."""
    return _soft_tiny_with("linformer", pretrained, kwargs)


@register_model
def soft_tiny_performer(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT's Tiny pyramid with Performer (FAVOR+): Table 1 (13M, 2.2G, 76.1%)."""
    return _soft_tiny_with("performer", pretrained, kwargs)


@register_model
def soft_tiny_nystrom(pretrained: bool = False, **kwargs) -> SoftViT:
    """SOFT's Tiny pyramid with Nyströmformer, landmarks 2-D average-pooled: Table 1 (13M, 2.0G, 78.6%)."""
    return _soft_tiny_with("nystrom", pretrained, kwargs)
