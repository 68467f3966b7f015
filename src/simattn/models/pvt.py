"""PVT (v1): Pyramid Vision Transformer (Wang et al., ICCV 2021) with any attention kind, and the peers' PVT hybrids.

Four stages, each opened by a patch embedding (a conv of kernel = stride 4, 2, 2, 2, then LayerNorm), a learned
position embedding per stage and pre-norm blocks (LayerNorm eps 1e-6, MLP ratios 8/8/4/4). Keys and values of the
attention come from a spatial reduction of the token grid: a conv of kernel = stride ``sr_ratio`` (8, 4, 2, 1)
and a LayerNorm, so stage 1 attends from 56×56 queries to 7×7 keys at 224 px. PVT v1 has a class token in the last
stage (its position embedding has a slot for it), pooled after the final norm.

Every model takes ``attn_type=`` (any registered kind) and ``attn_kwargs=``: ``pvt_*`` is softmax (PVT itself),
``sima_pvt_*`` SimA (unpublished). The reduction needs a kind that takes keys of another length
(``supports_cross_length``) and does not lay the keys on the query grid (``attend_uses_grid``); any other kind
runs with ``sr_ratio`` 1 in every stage, with a one-line note, as every released hybrid below does.

The released hybrids, built as their code and configs build them: no class token, no reduction
(``PVT_LA_SR_RATIOS`` 1111), the last stage's tokens averaged into the head with no final norm (FLatten and
PolaFormer keep an unused ``norm`` in their checkpoints, which the filter leaves out), the kind in every block.
Parameters here = the released model's, built from its code (the README's figure where it gives one):

=====================  ==========================================================  ========  ==========
model                  configuration                                               params    README
=====================  ==========================================================  ========  ==========
pvt_{tiny,small}       PVT's own (whai362/PVT)                                     13.23M,   13.2M,
                                                                                   24.49M    24.5M
pvt_{medium,large}                                                                 44.21M,   44.2M,
                                                                                   61.37M    61.4M
agent_pvt_{tiny,small} agents 9/16/49/49, biases for each stage's 224-px grid      11.57M,   11.6M,
                       (56/28/14/7), 3×3 conv on V                                 20.64M    20.6M
agent_pvt_{medium,                                                                 35.92M,   35.9M,
large}                                                                             48.74M    48.7M
inline_pvt_{tiny,      heads 2/4/10/16 (head dim 32), 3×3 local branch, no key     12.03M,   12.0M,
small}                 encoding                                                    21.56M    21.6M
inline_pvt_{medium,                                                                37.62M,   37.6M,
large}                                                                             51.15M    50.2M
flatten_pvt_tiny       focusing factor 3, 5×5 conv on V, key encoding per stage    12.15M    (none)
polaformer_pvt_{tiny,  α 4, 5×5 conv on V, key encoding per stage, the gate        12.92M,   (none)
small}                                                                             23.16M
slab_pvt_tiny          simplified linear attention, 5×5 conv on V, key encoding,   12.16M    (none)
                       PRepBN in every norm
pvt_{tiny,small,       SLAB's softmax PVTs with PRepBN (its ``slab_pvt_*`` with    13.24M,   (none)
medium}_prepbn         ATTN_TYPE SSSS): reduction 8/4/2/1, hybrid layout           24.51M,
                                                                                   44.25M
=====================  ==========================================================  ========  ==========

The released FLatten and PolaFormer models count 1,024 more parameters: their unused final norm. SLAB's PRepBN is
``LinearNorm`` with its default 300,000 steps in every norm, the patch embeddings' and the reduction's included;
``prepbn_steps=0`` gives LayerNorm.

The authors' ImageNet-1k weights are tags (``pvt_tiny.in1k``, ``agent_pvt_medium.in1k_256``, ...): download, the
repository's evaluation transform, license, paper and the README's top-1 in each ``pretrained_cfg``; a tag builds the
model its weights were trained in (Agent-PVT-M at 256 px: position embeddings and agent biases on 64/32/16/8 grids).
InLine-PVT-L's README gives 50.2M; its released code builds 51.15M, as here.

Any input whose sides are multiples of 32 runs without a rebuild: the position embeddings are resized to each stage's
grid on every forward (bilinear, as PVT's ``_get_pos_embed``), Agent's biases and the key encodings by their
attention modules. ``agent_pvt_*(downstream_agents=[144, 256, 784, 784])`` pools that many agents per stage, the
ImageNet-shaped biases resized over the agents' square, as Agent's segmentation and detection configs
(``downstream_agent_shapes``) run the released weights.

:func:`checkpoint_filter_fn` maps the PVT authors' classification checkpoints (``patch_embed{i}``, ``pos_embed{i}``,
``block{i}``, ``cls_token``, separate ``q`` and ``kv``) and the hybrids' (Agent's ``an/na/ah/aw/ha/wa_bias``,
FLatten's and PolaFormer's ``scale``, PolaFormer's ``qg``, SLAB's ``warm``/``iter``/``total_step`` counters) onto
these models.
"""
from __future__ import annotations

import logging
import re
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model

from ._build import LoadsThroughSimattn, build_family_model
from ._kinds import kind_options
from .prepbn import PRepBN
from .released import (PAPERS, POLAFORMER_HUB, SLAB_RELEASES, TSINGHUA, downstream_agents, released_names,
                       with_tag_args)
from .resample import resample_grids
from ..attention import TokenAttention, attention_class, get_attention_class
from ..attention._common import fx_call_whole, fx_tracing
from ._pyramid import (Grid, GridBlock, PyramidStage, PyramidTransformer, check_size_fits, drop_path_rates,
                       tokens_to_nchw)

__all__ = ["PatchEmbed", "SpatialReduction", "sr_attention_class", "PyramidVisionTransformer", "checkpoint_filter_fn"]

_logger = logging.getLogger("simattn.models")

#: the patch embeddings' strides: total strides 4, 8, 16, 32
PATCH_STRIDES = (4, 2, 2, 2)
#: an input of another size gets each stage's position embedding resampled on every forward as PVT's code does
#: (``_get_pos_embed``, and Agent's downstream backbones): bilinear, align_corners=False, no antialiasing
_PER_FORWARD_RESIZE = {"interpolation": "bilinear", "antialias": False}


class PatchEmbed(nn.Module):
    """PVT's patch embedding: a conv of kernel = stride ``patch_size``, then LayerNorm (eps 1e-5, as released)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size)
        self.norm = norm_layer(dim)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        x = self.proj(x)
        grid = (x.shape[-2], x.shape[-1])
        return self.norm(x.flatten(2).transpose(1, 2)), grid


class SpatialReduction(TokenAttention):
    """PVT's spatial-reduction attention, mixed into a registry kind by :func:`sr_attention_class`.

    q comes from the tokens, k and v from the grid reduced by a conv of kernel = stride ``sr_ratio`` and a LayerNorm
    (``sr``, ``sr_norm``), prefix tokens (a class token) put back in front unreduced; each through its slice of the
    fused ``qkv``. The kind's own ``attend`` combines them (Nq ≠ Nk). ``forward(x, grid_size=(H, W))``.
    """

    uses_grid = True

    def __init__(self, dim: int, num_heads: int = 8, *, sr_ratio: int = 2, prepbn_steps: int = 0, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if not isinstance(sr_ratio, int) or isinstance(sr_ratio, bool) or sr_ratio < 2:
            raise ValueError(f"{type(self).__name__}: sr_ratio={sr_ratio!r}; allowed: an integer >= 2")
        if not self.supports_cross_length or not self.separate_qk or self.attend_uses_grid:
            raise ValueError(f"PVT attention {self.attn_name!r} cannot take spatially reduced keys; build it with "
                             "sr_ratio 1")
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.sr_ratio = sr_ratio
        self.sr = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio, **dd)
        self.sr_norm = PRepBN(dim, steps=prepbn_steps, **dd) if prepbn_steps else nn.LayerNorm(dim, **dd)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        if not torch.jit.is_scripting():
            traced = fx_call_whole(self, (x,), dict(attn_mask=attn_mask, is_causal=is_causal, grid_size=grid_size))
            if traced is not None:
                return traced
            self._check_call(x, attn_mask, is_causal)
            if not fx_tracing() and (grid_size is None or attn_mask is not None or is_causal):
                raise ValueError(f"{type(self).__name__}: forward needs grid_size=(H, W) and takes no mask or "
                                 "causal attention (the keys are pooled over the grid)")
        assert grid_size is not None
        B, N, C = x.shape
        H, W = grid_size
        prefix = N - H * W
        reduced = self.sr(tokens_to_nchw(x, (H, W), prefix)).flatten(2).transpose(1, 2)
        reduced = self.sr_norm(reduced)
        if prefix > 0:
            reduced = torch.cat([x[:, :prefix], reduced], dim=1)
        bias = self.qkv.bias
        q = F.linear(x, self.qkv.weight[:C], None if bias is None else bias[:C])
        kv = F.linear(reduced, self.qkv.weight[C:], None if bias is None else bias[C:])
        q = self.q_norm(q.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2))
        k, v = kv.reshape(B, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = self._attend(q, self.k_norm(k), v, None, False, grid_size)
        return self._output(out, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sr_ratio={self.sr_ratio}"


def sr_attention_class(base: Type[nn.Module], sr_ratio: int, prepbn_steps: int = 0) -> Type[nn.Module]:
    """``base`` (a registry kind, options bound) with PVT's spatial reduction (its norm SLAB's PRepBN for
    ``prepbn_steps`` > 0); ``base`` itself for ratio 1."""
    if sr_ratio == 1:
        return base
    mixed = type(f"SR{base.__name__}", (SpatialReduction, base), {"__module__": __name__})
    return attention_class(mixed, sr_ratio=sr_ratio, **({"prepbn_steps": prepbn_steps} if prepbn_steps else {}))


def reduces_keys(kind: Union[str, Type[nn.Module]]) -> bool:
    """Whether PVT's spatial reduction fits kind: keys of another length, not laid out on the query grid."""
    cls = get_attention_class(kind)
    return bool(cls.supports_cross_length and cls.separate_qk and not cls.attend_uses_grid)


def stage_attention(variant: str, attn_type: str, attn_kwargs: Optional[Dict[str, Any]],
                    own_attn: Optional[Tuple[str, Sequence[Dict[str, Any]]]], sr_ratios: Sequence[int],
                    layouts: Sequence[Dict[str, Any]], prepbn_steps: int = 0
                    ) -> Tuple[List[Type[nn.Module]], Tuple[int, ...]]:
    """Each stage's attention class and the reduction ratios used: the model's own options per stage where
    ``attn_type`` is its own kind, else only the layout (one note for what falls away); ratio 1 everywhere, with a
    note, for a kind the reduction does not fit."""
    own_kind, own_options = own_attn or (attn_type, [{} for _ in sr_ratios])
    same = get_attention_class(attn_type) is get_attention_class(own_kind)
    sr_ratios = tuple(sr_ratios)
    if any(r > 1 for r in sr_ratios) and not reduces_keys(attn_type):
        _logger.warning("note: %s with attn_type=%r: the kind takes no spatially reduced keys; sr_ratios %s -> 1 in "
                        "every stage (as the released hybrid PVTs)", variant, attn_type, list(sr_ratios))
        sr_ratios = tuple(1 for _ in sr_ratios)
    layers = []
    for i, (ratio, layout) in enumerate(zip(sr_ratios, layouts)):
        own = own_options[i] if same or i == 0 else None  # a note once, not per stage
        options = kind_options(variant, own_kind, own, attn_type, attn_kwargs, layout)
        layers.append(sr_attention_class(attention_class(attn_type, **options), ratio, prepbn_steps))
    return layers, sr_ratios


class PyramidVisionTransformer(LoadsThroughSimattn, PyramidTransformer):
    """PVT v1 with a pluggable attention kind (softmax by default: PVT itself).

    Args:
        img_size: the input size the position embeddings (and grid-bound kind options) are laid out for; a
            multiple of 32, at least 64 (the last stage needs a 2×2 grid).
        embed_dims, depths, num_heads, mlp_ratios, sr_ratios: per stage.
        class_token: a class token in the last stage (PVT v1); ``global_pool`` 'token' pools it, 'avg' the grid.
        final_norm: LayerNorm before pooling (the released hybrids have none).
        key_encoding: give kinds that take ``pos_grid`` (a learned key encoding) each stage's grid.
        prepbn_steps: S > 0 makes every norm (blocks, patch embeddings, final) SLAB's PRepBN, handing LayerNorm over
            to RepBN in S training steps; 0 keeps LayerNorm.
        attn_type, attn_kwargs: the kind and its options; ``own_attn`` (kind, options per stage): the kind the
            model is made for and its options, which fall away for another ``attn_type``.
    """

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "token", embed_dims: Sequence[int] = (64, 128, 320, 512),
                 depths: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (1, 2, 5, 8),
                 mlp_ratios: Sequence[float] = (8, 8, 4, 4), sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 qkv_bias: bool = True, class_token: bool = True, final_norm: bool = True, key_encoding: bool = True,
                 attn_type: str = "softmax", attn_kwargs: Optional[Dict[str, Any]] = None,
                 own_attn: Optional[Tuple[str, Sequence[Dict[str, Any]]]] = None, prepbn_steps: int = 0,
                 model_name: str = "pvt",
                 drop_rate: float = 0., pos_drop_rate: float = 0., proj_drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.) -> None:
        per_stage = (embed_dims, depths, num_heads, mlp_ratios, sr_ratios)
        if {len(p) for p in per_stage} != {len(PATCH_STRIDES)}:
            raise ValueError(f"{model_name}: embed_dims, depths, num_heads, mlp_ratios and sr_ratios need "
                             f"{len(PATCH_STRIDES)} entries (one per stage), got {[len(p) for p in per_stage]}")
        if any(not isinstance(r, int) or r < 1 for r in sr_ratios):
            raise ValueError(f"{model_name}: sr_ratios={list(sr_ratios)}; allowed: integers >= 1")
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        reductions = [4 * 2 ** i for i in range(len(PATCH_STRIDES))]
        check_size_fits(model_name, *img_size, reductions[-1])
        if min(img_size) < 2 * reductions[-1]:
            raise ValueError(f"{model_name}: img_size={img_size} makes fewer than 2x2 patches in the last stage; "
                             f"allowed: sides >= {2 * reductions[-1]}")
        grids = [(img_size[0] // r, img_size[1] // r) for r in reductions]
        last = len(PATCH_STRIDES) - 1
        layouts = [dict(num_prefix_tokens=int(class_token and i == last), **(
            dict(pos_grid=grids[i]) if key_encoding else {})) for i in range(len(grids))]
        attn_layers, sr_ratios = stage_attention(model_name, attn_type, attn_kwargs, own_attn, sr_ratios, layouts,
                                                 prepbn_steps)
        norm_layer = partial(PRepBN, steps=prepbn_steps) if prepbn_steps else _layer_norm
        embed_norm = norm_layer if prepbn_steps else nn.LayerNorm
        stages, in_dim = [], in_chans
        for i, (dim, rates) in enumerate(zip(embed_dims, drop_path_rates(depths, drop_path_rate))):
            blocks = [GridBlock(dim, num_heads[i], attn_layers[i], mlp_ratio=mlp_ratios[i], qkv_bias=qkv_bias,
                                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=rate,
                                norm_layer=norm_layer) for rate in rates]
            stages.append(PyramidStage(PatchEmbed(in_dim, dim, PATCH_STRIDES[i], embed_norm), blocks, dim,
                                       class_token=class_token and i == last, pos_embed_grid=grids[i],
                                       pos_drop=pos_drop_rate, pos_embed_resize=_PER_FORWARD_RESIZE))
            in_dim = dim
        super().__init__(stages, embed_dims, reductions, in_chans=in_chans, num_classes=num_classes,
                         global_pool=global_pool, drop_rate=drop_rate, norm_layer=norm_layer)
        if not final_norm:
            self.norm = nn.Identity()
        self.img_size = img_size
        self.sr_ratios = sr_ratios
        self.attn_type = attn_type
        self.init_weights()

    def _check_input(self, x: torch.Tensor) -> None:
        super()._check_input(x)
        if not fx_tracing() and min(x.shape[-2], x.shape[-1]) < 2 * self.size_divisor:
            raise ValueError(f"{type(self).__name__}: input size {tuple(x.shape[-2:])} makes fewer than 2x2 patches "
                             f"in the last stage; allowed: sides >= {2 * self.size_divisor}")


def _layer_norm(dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=1e-6)


# --- checkpoints -----------------------------------------------------------------------------------------------------
_STAGE_KEYS = re.compile(r"^(patch_embed|pos_embed|block|pos_drop)(\d)(.*)$")
def _released_key(key: str, last: int) -> str:
    """A released PVT key in this layout (attention parameters aside)."""
    if key == "cls_token":
        return f"stages.{last}.cls_token"
    match = _STAGE_KEYS.match(key)
    if not match:
        return key
    part, stage, rest = match[1], int(match[2]) - 1, match[3]
    if part == "block":
        return f"stages.{stage}.blocks{rest}"
    return f"stages.{stage}.{part}{rest}"


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: PyramidVisionTransformer) -> Dict[str, torch.Tensor]:
    """Map a checkpoint onto :class:`PyramidVisionTransformer`: unwraps ``model`` / ``state_dict`` and DDP
    prefixes; converts the released PVT layout (the PVT authors' and the hybrids': ``patch_embed{i}``,
    ``pos_embed{i}``, ``block{i}.{j}``, ``cls_token``; attention ``q`` + ``kv`` (PolaFormer ``qg``: q and the gate)
    into the fused ``qkv``, ``norm`` of the reduction into ``sr_norm``, Agent's biases, FLatten's and PolaFormer's
    ``scale`` into ``feature_scale``); leaves out a final ``norm`` the model does not have (the hybrids keep an
    unused one); resamples the position embeddings, key encodings and Agent's biases of another grid as the authors'
    code does (:mod:`simattn.models.resample`). This layout passes through."""
    state_dict = released_names(state_dict)
    last = len(model.stages) - 1
    own = model.state_dict()
    out: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        key = _released_key(key, last)
        key = key.replace(".attn.norm.", ".attn.sr_norm.")  # the reduction's norm (LayerNorm or SLAB's PRepBN)
        match = re.match(r"^(.*\.attn)\.(q|kv|qg)\.(weight|bias)$", key)
        if match:
            attn, part, kind = match[1], match[2], match[3]
            if part == "qg":  # PolaFormer: q, then the gate g
                q, g = value.chunk(2)
                out[f"{attn}.g.{kind}"] = g
                out.setdefault(f"{attn}.qkv.{kind}", {})["q"] = q
                continue
            else:
                out.setdefault(f"{attn}.qkv.{kind}", {})[part] = value
                continue
        if key.startswith("norm.") and key not in own:
            continue
        out[key] = value
    for key, value in list(out.items()):
        if isinstance(value, dict):
            out[key] = torch.cat([value[p] for p in ("q", "kv") if p in value])
    stages = {f"stages.{i}.pos_embed": (tuple(stage.pos_embed_grid), stage.num_prefix_tokens)
              for i, stage in enumerate(model.stages) if stage.pos_embed is not None}
    return resample_grids(out, model, pos_embed=stages)


def _create(variant: str, pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    return build_family_model(PyramidVisionTransformer, variant, pretrained, kwargs, checkpoint_filter_fn,
                              (0, 1, 2, 3), model_name=variant)


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "stages.0.patch_embed.proj", "classifier": "head",
        "license": "apache-2.0", **kwargs,
    }


_NAMES = ("pvt_tiny", "pvt_small", "pvt_medium", "pvt_large", "sima_pvt_tiny", "sima_pvt_small",
          "agent_pvt_tiny", "agent_pvt_small", "agent_pvt_medium", "agent_pvt_large",
          "inline_pvt_tiny", "inline_pvt_small", "inline_pvt_medium", "inline_pvt_large", "flatten_pvt_tiny",
          "slab_pvt_tiny", "pvt_tiny_prepbn", "pvt_small_prepbn", "pvt_medium_prepbn",
          "polaformer_pvt_tiny", "polaformer_pvt_small")

# The released checkpoints and their repositories' evaluation transform: resize int(256 / 224 * size) px, centre
# crop, bicubic, ImageNet mean/std. The PVT authors' (DeiT's code) and SLAB's resize the shorter side (timm's
# crop_mode 'center'), LeapLabTHU's and PolaFormer's (Swin's code) to a square ('squash'). Licenses as the
# repositories state them: PVT Apache-2.0, PolaFormer MIT, the others none.
_TRANSFORM = {"pvt": ("center", "apache-2.0"), "slab": ("center", None), "agent": ("squash", None),
              "inline": ("squash", None), "flatten": ("squash", None), "polaformer": ("squash", "mit")}
PVT_RELEASES = "https://github.com/whai362/PVT/releases/download/v2/{}"


def _released(paper: str, top1: float, size: int = 224, **source: Any) -> Dict[str, Any]:
    paper_ids, paper_name, origin = PAPERS[paper]
    crop_mode, license_ = _TRANSFORM[paper]
    # a url's file loads through simattn's one loader (LoadsThroughSimattn), as the Hub's through timm's filter
    return _cfg(**source, custom_load=bool(source.get("url")), input_size=(3, size, size),
                pool_size=(size // 32, size // 32), crop_mode=crop_mode,
                license=license_, paper_ids=paper_ids, paper_name=paper_name, origin_url=origin,
                notes=(f"top-1 {top1} on ImageNet-1k val at {size} px, as reported by the authors",))


def _tsinghua(paper: str, key: str, top1: float, size: int = 224) -> Dict[str, Any]:
    return _released(paper, top1, size, url=TSINGHUA.format(key))


_RELEASED = {
    **{f"pvt_{size}.in1k": _released("pvt", top1, url=PVT_RELEASES.format(f"pvt_{size}.pth"))
       for size, top1 in (("tiny", 75.1), ("small", 79.8), ("medium", 81.2), ("large", 81.7))},
    "agent_pvt_tiny.in1k": _tsinghua("agent", "13fdf0e0a7c5498c934f", 78.4),
    "agent_pvt_small.in1k": _tsinghua("agent", "36b8be9a8863456685a3", 82.2),
    "agent_pvt_medium.in1k": _tsinghua("agent", "4d00ecacf18b45f9b88c", 83.4),
    "agent_pvt_medium.in1k_256": _tsinghua("agent", "654df734121643b19c52", 83.8, size=256),
    "agent_pvt_large.in1k": _tsinghua("agent", "040cfe0cfbbe4762ad09", 83.7),
    "inline_pvt_tiny.in1k": _tsinghua("inline", "90ac52b1555b401eb5e6", 78.2),
    "inline_pvt_small.in1k": _tsinghua("inline", "1ab953b2479d433080a3", 82.0),
    "inline_pvt_medium.in1k": _tsinghua("inline", "a72aec31e6084bc0a280", 83.2),
    "inline_pvt_large.in1k": _tsinghua("inline", "efd91318ba964f01b288", 83.6),
    "flatten_pvt_tiny.in1k": _tsinghua("flatten", "3ab1d773f19d45648690", 77.8),
    "slab_pvt_tiny.in1k": _released("slab", 76.5, url=SLAB_RELEASES.format("slab_pvt_tiny.pth")),
    **{f"pvt_{size}_prepbn.in1k": _released("slab", top1, url=SLAB_RELEASES.format(f"pvt_{size}_prepbn.pth"))
       for size, top1 in (("tiny", 76.0), ("small", 80.1), ("medium", 81.7))},
    **{f"polaformer_pvt_{size}.in1k": _released("polaformer", top1, hf_hub_id=POLAFORMER_HUB,
                                                  hf_hub_filename=f"pola_pvt_{size}.pth")
       for size, top1 in (("tiny", 78.8), ("small", 81.9))},
}
# What a tag builds beyond its model's defaults: the model its weights were trained in (Agent-PVT-M at 256 px: its
# position embeddings and agent biases laid out for the 64/32/16/8 grids). Arguments given win.
_TAG_ARGS = {"agent_pvt_medium.in1k_256": dict(img_size=256)}

default_cfgs = generate_default_cfgs({
    **{name: _cfg() for name in _NAMES},
    **_RELEASED,
})
# The untagged names stay the recipes' defaults (timm would make the first cfg with weights the default): a tag asks
# for weights, and builds the model they were trained in.
for _name in {tag.split(".")[0] for tag in _RELEASED}:
    default_cfgs[_name].tags.remove("")
    default_cfgs[_name].tags.appendleft("")


_DEPTHS = {"tiny": (2, 2, 2, 2), "small": (3, 4, 6, 3), "medium": (3, 4, 18, 3), "large": (3, 8, 27, 3)}


def _pvt(variant: str, pretrained: bool, size: str, kwargs: Dict[str, Any], **args: Any) -> PyramidVisionTransformer:
    args = dict(depths=_DEPTHS[size], **args)
    return _create(variant, pretrained, **dict(args, **with_tag_args(variant, kwargs, _TAG_ARGS)))


@register_model
def pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Tiny (depths 2/2/2/2; 13.2M params, paper: 75.1 %)."""
    return _pvt("pvt_tiny", pretrained, "tiny", kwargs)


@register_model
def pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Small (depths 3/4/6/3; 24.5M params, paper: 79.8 %)."""
    return _pvt("pvt_small", pretrained, "small", kwargs)


@register_model
def pvt_medium(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Medium (depths 3/4/18/3; 44.2M params, paper: 81.2 %)."""
    return _pvt("pvt_medium", pretrained, "medium", kwargs)


@register_model
def pvt_large(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Large (depths 3/8/27/3; 61.4M params, paper: 81.7 %)."""
    return _pvt("pvt_large", pretrained, "large", kwargs)


@register_model
def sima_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Tiny with SimA attention on the spatially reduced keys (unpublished)."""
    return _pvt("sima_pvt_tiny", pretrained, "tiny", kwargs, attn_type="sima")


@register_model
def sima_pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Small with SimA attention on the spatially reduced keys (unpublished)."""
    return _pvt("sima_pvt_small", pretrained, "small", kwargs, attn_type="sima")


#: the released hybrids' layout: no class token, no reduction, the last tokens averaged with no final norm
_HYBRID = dict(class_token=False, global_pool="avg", final_norm=False, sr_ratios=(1, 1, 1, 1))


def _agent(variant: str, pretrained: bool, size: str, kwargs: Dict[str, Any]) -> PyramidVisionTransformer:
    kwargs = with_tag_args(variant, kwargs, _TAG_ARGS)
    img = kwargs.get("img_size", 224)
    side = img if isinstance(img, int) else img[0]
    run = downstream_agents(variant, kwargs.pop("downstream_agents", None), 4)
    own = [dict(agent_num=n, window=max(1, side // r), **run[i]) for i, (n, r) in enumerate(zip((9, 16, 49, 49),
                                                                                                 (4, 8, 16, 32)))]
    return _pvt(variant, pretrained, size, kwargs, attn_type="agent", own_attn=("agent", own), **_HYBRID)


@register_model
def agent_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """Agent-PVT-T: agents 9/16/49/49, no reduction, 3×3 conv on V (11.6M params, paper: 78.4 %)."""
    return _agent("agent_pvt_tiny", pretrained, "tiny", kwargs)


@register_model
def agent_pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """Agent-PVT-S: agents 9/16/49/49, no reduction, 3×3 conv on V (20.6M params, paper: 82.2 %)."""
    return _agent("agent_pvt_small", pretrained, "small", kwargs)


@register_model
def agent_pvt_medium(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """Agent-PVT-M: agents 9/16/49/49, no reduction, 3×3 conv on V (35.9M params, paper: 83.4 %; 256 px: 83.8 %)."""
    return _agent("agent_pvt_medium", pretrained, "medium", kwargs)


@register_model
def agent_pvt_large(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """Agent-PVT-L: agents 9/16/49/49, no reduction, 3×3 conv on V (48.7M params, paper: 83.7 %)."""
    return _agent("agent_pvt_large", pretrained, "large", kwargs)


def _grid_linear(variant: str, pretrained: bool, size: str, kwargs: Dict[str, Any], kind: str,
                 **args: Any) -> PyramidVisionTransformer:
    options = {k: args.pop(k) for k in list(args) if k not in ("num_heads", "key_encoding", "prepbn_steps")}
    return _pvt(variant, pretrained, size, kwargs, attn_type=kind, own_attn=(kind, [options] * 4), **_HYBRID,
                **args)


@register_model
def inline_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """InLine-PVT-T: heads 2/4/10/16, 3×3 local branch, no reduction (12.0M params, paper: 78.2 %)."""
    return _grid_linear("inline_pvt_tiny", pretrained, "tiny", kwargs, "inline", num_heads=(2, 4, 10, 16),
                        key_encoding=False, local_kernel=3)


@register_model
def inline_pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """InLine-PVT-S: heads 2/4/10/16, 3×3 local branch, no reduction (paper: 82.0 %)."""
    return _grid_linear("inline_pvt_small", pretrained, "small", kwargs, "inline", num_heads=(2, 4, 10, 16),
                        key_encoding=False, local_kernel=3)


@register_model
def inline_pvt_medium(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """InLine-PVT-M: heads 2/4/10/16, 3×3 local branch, no reduction (37.6M params, paper: 83.2 %)."""
    return _grid_linear("inline_pvt_medium", pretrained, "medium", kwargs, "inline", num_heads=(2, 4, 10, 16),
                        key_encoding=False, local_kernel=3)


@register_model
def inline_pvt_large(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """InLine-PVT-L: heads 2/4/10/16, 3×3 local branch, no reduction (50.2M params, paper: 83.6 %)."""
    return _grid_linear("inline_pvt_large", pretrained, "large", kwargs, "inline", num_heads=(2, 4, 10, 16),
                        key_encoding=False, local_kernel=3)


@register_model
def flatten_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """FLatten-PVT-T: focusing factor 3, 5×5 conv on V, key encoding, no reduction (paper: 77.8 %)."""
    return _grid_linear("flatten_pvt_tiny", pretrained, "tiny", kwargs, "flatten", focusing_factor=3.0,
                        dwc_kernel=5)


@register_model
def slab_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """SLAB-PVT-T: simplified linear attention, 5×5 conv on V, key encoding, PRepBN in every norm (300,000 steps, as
    released; ``prepbn_steps=0``: LayerNorm), no reduction (paper: 76.5 %)."""
    return _grid_linear("slab_pvt_tiny", pretrained, "tiny", kwargs, "slab", dwc_kernel=5, prepbn_steps=300000)


# SLAB's softmax PVTs with PRepBN (its slab_pvt_* with ATTN_TYPE SSSS): the reduction 8/4/2/1 with a PRepBN norm, the
# hybrids' layout otherwise (no class token, average pooling, no final norm)
_PREPBN = dict(_HYBRID, sr_ratios=(8, 4, 2, 1), prepbn_steps=300000)


@register_model
def pvt_tiny_prepbn(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """SLAB's PVT-T with PRepBN: softmax, no class token, average pooling (paper: 76.0 %)."""
    return _pvt("pvt_tiny_prepbn", pretrained, "tiny", kwargs, **_PREPBN)


@register_model
def pvt_small_prepbn(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """SLAB's PVT-S with PRepBN: softmax, no class token, average pooling (paper: 80.1 %)."""
    return _pvt("pvt_small_prepbn", pretrained, "small", kwargs, **_PREPBN)


@register_model
def pvt_medium_prepbn(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """SLAB's PVT-M with PRepBN: softmax, no class token, average pooling (paper: 81.7 %)."""
    return _pvt("pvt_medium_prepbn", pretrained, "medium", kwargs, **_PREPBN)


@register_model
def polaformer_pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PolaFormer-PVT-T: α 4, 5×5 conv on V, key encoding, gate, no reduction (paper: 78.8 %)."""
    return _grid_linear("polaformer_pvt_tiny", pretrained, "tiny", kwargs, "polaformer", alpha=4.0, dwc_kernel=5)


@register_model
def polaformer_pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PolaFormer-PVT-S: α 4, 5×5 conv on V, key encoding, gate, no reduction (paper: 81.9 %)."""
    return _grid_linear("polaformer_pvt_small", pretrained, "small", kwargs, "polaformer", alpha=4.0,
                        dwc_kernel=5)
