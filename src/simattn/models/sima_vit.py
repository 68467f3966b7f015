"""DeiT/ViT backbones with softmax-free attention: SimA DeiT (paper Table 1) and the ReLU-attention ViTs.

Built on timm's ``VisionTransformer`` (with a clear error for bad input sizes, and big_vision's optional tanh
pre-logits layer) and ``attn_layer``; every model takes ``attn_type=`` (any registered attention kind) and
``attn_kwargs=`` (that kind's options), so ``attn_type='softmax'`` is DeiT itself. ``num_heads=1`` gives the
single-head variant and ``act_layer='relu'`` the variant with no exp at inference. Any input size divisible by the
patch size works: the learned position embedding is resampled on the fly (``dynamic_img_size``).

The ReLU-attention ViT-S models (Wortsman et al.) follow big_vision's two ViT configs, which differ in the head:
``relu_vit_small_patch{32,16,8}_224`` is ``vit_i1k`` (class token added after the learned position embedding,
token pooling, Linear + tanh pre-logits layer) and ``relu_vit_small_patch{32,16,8}_gap_224`` is ``vit_i21k``
(no class token, global average pooling, no pre-logits layer; default head of 21843 classes, tag ``in21k``).

The peers' released ImageNet-1k DeiT weights (Agent, InLine, SLAB and SLAB's PRepBN softmax DeiT) are tags
(``agent_deit_tiny_patch16_224.in1k``, ...): each builds the model its weights were trained in, and
:func:`checkpoint_filter_fn` maps the released files (:mod:`simattn.models.released`).
"""
from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import get_device_dtype
from timm.models import generate_default_cfgs, register_model
from timm.models._manipulate import checkpoint_seq, named_apply
from timm.models.vision_transformer import VisionTransformer, get_init_weights_vit
from timm.models.vision_transformer import checkpoint_filter_fn as _timm_vit_filter

from ._build import LoadsThroughSimattn, build_family_model
from ._checks import image_batch_error
from ._kinds import kind_options
from ..attention import attention_class, check_count, fx_tracing
from .prepbn import PRepBN, RepBN
from .released import PAPERS, SLAB_RELEASES, TSINGHUA, released_to_simattn
from .resample import resample_grids

__all__ = ["SoftmaxFreeViT", "checkpoint_filter_fn"]


class SoftmaxFreeViT(LoadsThroughSimattn, VisionTransformer):
    """timm's ``VisionTransformer`` with a clear ValueError for inputs the patching cannot take, and an optional
    pre-logits layer.

    ``representation_size``: a ``Linear(embed_dim, representation_size)`` + tanh between the pooled features and
    the classifier (``pre_logits.fc``), big_vision's ``rep_size``; ``True`` means ``embed_dim`` (as in big_vision,
    whose ``vit_i1k`` config sets ``rep_size=True``); timm's own ViT has no such layer.
    ``forward_head(pre_logits=True)`` returns its output. Everything else (blocks, pooling, intermediates,
    features) is timm's; the attention comes from ``attn_layer``.
    """

    def __init__(self, *, representation_size: Union[int, bool, None] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.in_chans: int = getattr(getattr(self.patch_embed, "proj", None), "in_channels", kwargs.get("in_chans", 3))
        self.pre_logits: nn.Module = nn.Identity()
        if representation_size is True:
            representation_size = self.embed_dim
        if representation_size not in (None, False) and (
                not isinstance(representation_size, int) or representation_size < 1):
            raise ValueError(f"representation_size must be a positive int, True (= embed_dim) or None, "
                             f"got {representation_size!r}")
        if representation_size:
            dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
            self.pre_logits = nn.Sequential(OrderedDict(
                fc=nn.Linear(self.embed_dim, representation_size, **dd), act=nn.Tanh()))
            self.head_hidden_size = representation_size
            if self.num_classes > 0 and representation_size != self.embed_dim:
                self.head = nn.Linear(representation_size, self.num_classes, **dd)
            if kwargs.get("weight_init") != "skip":  # timm's init rule for the layers built here too
                init = get_init_weights_vit(self.weight_init_mode, needs_reset=False)
                named_apply(init, self.pre_logits, name="pre_logits")
                init(self.head, name="head")

    def _check_input(self, x: torch.Tensor) -> None:
        if fx_tracing():
            return
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise image_batch_error(type(self).__name__, self.in_chans, x.shape)
        ph, pw = self.patch_embed.patch_size
        if x.shape[-2] % ph or x.shape[-1] % pw:
            raise ValueError(f"input size {tuple(x.shape[-2:])} is not divisible by patch size {(ph, pw)}")
        if x.shape[-2] < 2 * ph or x.shape[-1] < 2 * pw:
            raise ValueError(f"input size {tuple(x.shape[-2:])} makes fewer than 2x2 patches of {(ph, pw)} px; the "
                             f"attention needs a grid: feed at least {(2 * ph, 2 * pw)} px or build the model with a "
                             "smaller patch_size")

    def forward_features(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                         is_causal: bool = False) -> torch.Tensor:
        # timm's VisionTransformer.forward_features after the input check, written out: TorchScript has no super()
        if not torch.jit.is_scripting():
            self._check_input(x)
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.patch_drop(x)
        x = self.norm_pre(x)
        if attn_mask is not None or is_causal:
            for blk in self.blocks:
                x = blk(x, attn_mask=attn_mask, is_causal=is_causal)
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    @torch.jit.ignore
    def forward_intermediates(self, x, *args, **kwargs):
        self._check_input(x)
        return super().forward_intermediates(x, *args, **kwargs)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.fc_norm(self.pool(x))
        x = self.head_drop(self.pre_logits(x))
        return x if pre_logits else self.head(x)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        super().reset_classifier(num_classes, global_pool)
        if num_classes > 0 and self.head_hidden_size != self.embed_dim:
            self.head = nn.Linear(self.head_hidden_size, num_classes, **get_device_dtype(self))
            self.head.train(self.training)

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        if prune_head:
            self.pre_logits = nn.Identity()
            self.head_hidden_size = self.embed_dim
        return super().prune_intermediate_layers(indices, prune_norm, prune_head)


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: VisionTransformer) -> Dict[str, Any]:
    """Map DeiT/ViT checkpoints (timm, DeiT official, big_vision npz already converted) onto these models.

    Uses timm's ViT filter (position-embedding resampling, patch-embed resizing, DeiT distillation tokens);
    the softmax-free kinds keep timm's parameter names, so the same weights load into any ``attn_type`` that has
    the same parameters. ``pre_logits.*`` passes through: timm's filter drops it (its own weights have no such
    layer), but here it is the tanh layer of the function, so a model without one reports it as unexpected.
    The released Agent, InLine, SLAB and PRepBN DeiT files are mapped first (:mod:`simattn.models.released`); key
    encodings and Agent's biases of another grid are resampled as the authors' code does
    (:mod:`simattn.models.resample`).
    """
    state_dict = released_to_simattn(state_dict, model)
    if getattr(model, "pos_embed", None) is not None:
        # bicubic without antialiasing, as DeiT's and the peers' fine-tuning code resize it (before timm's filter,
        # which would resize it antialiased)
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        state_dict = resample_grids(state_dict, model, {"pos_embed": (tuple(model.patch_embed.grid_size), prefix)},
                                    mode="bicubic")
    kept = {k: v for k, v in state_dict.items() if k.startswith("pre_logits.")}
    out = _timm_vit_filter({k: v for k, v in state_dict.items() if k not in kept}, model)
    return {**out, **kept}


def _create(variant: str, pretrained: bool = False, *, attn_type: str = "sima",
            attn_kwargs: Optional[Dict[str, Any]] = None, own_attn: Optional[Tuple[str, Dict[str, Any]]] = None,
            layout: Optional[Dict[str, Any]] = None, **kwargs) -> VisionTransformer:
    """``own_attn``: the kind the model is made for and its options (which fall away for another ``attn_type``);
    ``layout``: facts of the token layout beside the prefix tokens, for the kinds that take them."""
    kwargs.setdefault("dynamic_img_size", True)
    own_kind, own_options = own_attn or (attn_type, None)
    # the prefix tokens are known here: a grid that is not square fails clearly instead of being guessed
    layout = {"num_prefix_tokens": int(kwargs.get("class_token", True)) + int(kwargs.get("reg_tokens") or 0),
              **(layout or {})}
    options = kind_options(variant, own_kind, own_options, attn_type, attn_kwargs, layout)
    model = build_family_model(SoftmaxFreeViT, variant, pretrained, kwargs, checkpoint_filter_fn, 3,
                               attn_layer=attention_class(attn_type, **options))
    model.attn_type = attn_type
    return model


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 1.0,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
        **kwargs,
    }


# The peers' released DeiT checkpoints, with their repositories' evaluation transform: resize to a square of
# int(256 / 224 · size) px (timm's crop_mode 'squash'), center crop, bicubic, ImageNet mean/std. Their repositories
# state no license (license None).


def _released(paper: str, url: str, top1: float, size: int = 224, **kwargs) -> Dict[str, Any]:
    paper_ids, paper_name, origin = PAPERS[paper]
    # the file loads through simattn's one loader (LoadsThroughSimattn)
    return _cfg(url=url, custom_load=True, input_size=(3, size, size), crop_pct=0.875, crop_mode="squash",
                license=None,
                paper_ids=paper_ids, paper_name=paper_name, origin_url=origin,
                notes=(f"top-1 {top1} on ImageNet-1k val at {size} px, as reported by the authors",), **kwargs)


_RELEASED = {
    "agent_deit_tiny_patch16_224.in1k": _released("agent", TSINGHUA.format("57e0904221824ee7b7af"), 74.9),
    "agent_deit_small_patch16_224.in1k": _released("agent", TSINGHUA.format("fdd43304372541db8ea7"), 80.5),
    "inline_deit_tiny_patch16_224.in1k": _released("inline", TSINGHUA.format("1d6b8191ad6d4114b291"), 74.5),
    "inline_deit_small_patch16_224.in1k_288": _released("inline", TSINGHUA.format("2f3898b07e9247f3beb3"), 80.2,
                                                         size=288),
    "slab_deit_tiny_patch16_224.in1k": _released("slab", SLAB_RELEASES.format("slab_deit_tiny.pth"), 74.3),
    "slab_deit_small_patch16_224.in1k": _released("slab", SLAB_RELEASES.format("slab_deit_small.pth"), 80.0),
    "prepbn_deit_tiny_patch16_224.in1k": _released("slab", SLAB_RELEASES.format("deit_tiny_prepbn.pth"), 73.6),
    "prepbn_deit_small_patch16_224.in1k": _released("slab", SLAB_RELEASES.format("deit_small_prepbn.pth"), 80.2),
}

# What a tag builds beyond its model's defaults: the model its weights were trained in (InLine-DeiT-S at 288 px, its
# position embedding 1 + 18x18 tokens; SLAB-DeiT with PRepBN's 60,000 steps in every norm). Arguments given win.
_TAG_ARGS = {
    "inline_deit_small_patch16_224.in1k_288": dict(img_size=288),
    "slab_deit_tiny_patch16_224.in1k": dict(prepbn_steps=60000),
    "slab_deit_small_patch16_224.in1k": dict(prepbn_steps=60000),
}


def _tag_arg(variant: str, kwargs: Dict[str, Any], name: str, default: Any) -> Any:
    """``name`` as given in ``kwargs``, else as the tag asks (timm passes a tag as ``pretrained_cfg``)."""
    tag = kwargs.get("pretrained_cfg")
    asked = _TAG_ARGS.get(f"{variant}.{tag}", {}) if isinstance(tag, str) else {}
    return kwargs.get(name, asked.get(name, default))


_BIG_VISION = dict(crop_pct=0.875, interpolation="bilinear", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

default_cfgs = generate_default_cfgs({
    # No SimA weights were ever published: these configs describe the recipes (crop 1.0 as in the paper).
    "sima_deit_tiny_patch16_224": _cfg(),
    "sima_deit_small_patch16_224": _cfg(),
    "sima_deit_base_patch16_224": _cfg(),
    # The recipes in configs/ (DeiT's crop 0.875 evaluation); the authors' weights are tags of some (below).
    **{f"{kind}_deit_{size}_patch16_224": _cfg(crop_pct=0.875) for size in ("tiny", "small")
       for kind in ("agent", "sigmoid", "flatten", "inline", "slab", "polaformer", "prepbn")},
    **_RELEASED,
    # big_vision's ViT input pipeline: inputs in [-1, 1], bilinear resize, resize 256 / crop 224.
    **{f"relu_vit_small_patch{p}_224.in1k": _cfg(**_BIG_VISION) for p in (32, 16, 8)},
    **{f"relu_vit_small_patch{p}_gap_224.in21k": _cfg(num_classes=21843, **_BIG_VISION) for p in (32, 16, 8)},
})
# The untagged names stay the recipes' defaults (timm would make the first cfg with weights the default): a tag asks
# for weights, and builds the model they were trained in.
for _name in {tag.split(".")[0] for tag in _RELEASED}:
    default_cfgs[_name].tags.remove("")
    default_cfgs[_name].tags.appendleft("")


@register_model
def sima_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-Ti with SimA attention (dim 192, 3 heads, depth 12)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, attn_type="sima")
    return _create("sima_deit_tiny_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def sima_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S → SimA of the paper (dim 384, 6 heads, depth 12; 22.05M params, 79.8% top-1)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, attn_type="sima")
    return _create("sima_deit_small_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def sima_deit_base_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-B with SimA attention (dim 768, 12 heads, depth 12)."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, attn_type="sima")
    return _create("sima_deit_base_patch16_224", pretrained, **dict(args, **kwargs))


# ReLU-attention ViT-S (Wortsman et al.): ReLU/seqlen attention with qk-LayerNorm in big_vision's ViT-S.
# big_vision's vit_i1k config: learned position embedding on the patches only (the class token is appended after
# it: no_embed_class), class-token pooling after the final LayerNorm, Linear(dim, dim) + tanh pre-logits layer.
@register_model
def relu_vit_small_patch32_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/32, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i1k head (class token, tanh pre-logits)."""
    model_args = dict(patch_size=32, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=True, no_embed_class=True, global_pool="token", fc_norm=False,
                      representation_size=True, attn_type="relu")
    return _create("relu_vit_small_patch32_224", pretrained, **dict(model_args, **kwargs))


@register_model
def relu_vit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i1k head (class token, tanh pre-logits)."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=True, no_embed_class=True, global_pool="token", fc_norm=False,
                      representation_size=True, attn_type="relu")
    return _create("relu_vit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def relu_vit_small_patch8_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/8, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i1k head (class token, tanh pre-logits)."""
    model_args = dict(patch_size=8, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=True, no_embed_class=True, global_pool="token", fc_norm=False,
                      representation_size=True, attn_type="relu")
    return _create("relu_vit_small_patch8_224", pretrained, **dict(model_args, **kwargs))


# big_vision's vit_i21k config: learned position embedding, no class token, global average pooling of the
# final-LayerNorm tokens straight into the classifier (timm's "gap" ViTs).
@register_model
def relu_vit_small_patch32_gap_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/32, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i21k head (average pooling, no class token)."""
    model_args = dict(patch_size=32, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=False, global_pool="avg", fc_norm=False, attn_type="relu")
    return _create("relu_vit_small_patch32_gap_224", pretrained, **dict(model_args, **kwargs))


@register_model
def relu_vit_small_patch16_gap_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i21k head (average pooling, no class token)."""
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=False, global_pool="avg", fc_norm=False, attn_type="relu")
    return _create("relu_vit_small_patch16_gap_224", pretrained, **dict(model_args, **kwargs))


@register_model
def relu_vit_small_patch8_gap_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/8, ReLU/seqlen attention, qk-LayerNorm; big_vision vit_i21k head (average pooling, no class token)."""
    model_args = dict(patch_size=8, embed_dim=384, depth=12, num_heads=6, qk_norm=True, pos_embed="learn",
                      class_token=False, global_pool="avg", fc_norm=False, attn_type="relu")
    return _create("relu_vit_small_patch8_gap_224", pretrained, **dict(model_args, **kwargs))


# Agent-DeiT (Han et al., ECCV 2024; the released agent_deit_{tiny,small}): agent attention in every block (agent_layer
# = depth for T and S), 49 agents (7×7 pooling), agent biases learned on the 14×14 grid of 224 px / 16 px patches
# (resized for other grids), 3×3 depthwise conv on V; DeiT's layout otherwise (class token, qkv bias).
_AGENT = dict(attn_type="agent", own_attn=("agent", {"agent_num": 49, "window": 14}))


@register_model
def agent_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-T with agent attention (paper: 6.0M params, 1.2 GFLOPs, 74.9% top-1)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, **_AGENT)
    return _create("agent_deit_tiny_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def agent_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S with agent attention (paper: 22.7M params, 4.4 GFLOPs, 80.5% top-1)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, **_AGENT)
    return _create("agent_deit_small_patch16_224", pretrained, **dict(args, **kwargs))


# Sigmoid-attention DeiT (Ramapuram et al., ICLR 2025): σ(qkᵀ/√d − log n) in every block with the paper's stabilizers
# for vision, qk-LayerNorm and LayerScale (timm's init_values; 1e-4 here, CaiT's init for this depth range is
# larger, the paper's text gives none). The paper reports ViT-B/16, not DeiT-T/S: these are DeiT's sizes.
_SIGMOID = dict(attn_type="sigmoid", qk_norm=True, init_values=1e-4)


@register_model
def sigmoid_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-T with sigmoid attention, qk-LayerNorm and LayerScale."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, **_SIGMOID)
    return _create("sigmoid_deit_tiny_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def sigmoid_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S with sigmoid attention, qk-LayerNorm and LayerScale."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, **_SIGMOID)
    return _create("sigmoid_deit_small_patch16_224", pretrained, **dict(args, **kwargs))


# The linear kinds on the grid in DeiT. Their depthwise conv on V (kernel 5) and, for FLatten, SLAB and PolaFormer,
# the learned key encoding of their released modules (built for the grid of ``img_size``, resampled for others).
# FLatten's and PolaFormer's papers have no DeiT models (Swin, PVT, CSwin): DeiT's layout with the class token, which
# joins the attention but not the grid's conv and encoding, as in InLine's released DeiT.
def _grid_linear(variant: str, pretrained: bool, kind: str, args: Dict[str, Any], kwargs: Dict[str, Any],
                 **attn: Any) -> VisionTransformer:
    args = {**args, "attn_type": kind, **kwargs}
    if _tag_arg(variant, kwargs, "img_size", None) is not None:
        args["img_size"] = _tag_arg(variant, kwargs, "img_size", None)
    layout = {}
    if attn.pop("key_encoding", True):
        img = args.get("img_size", 224)
        img = (img, img) if isinstance(img, int) else tuple(img)
        patch = args["patch_size"]
        layout["pos_grid"] = (img[0] // patch, img[1] // patch)
    return _create(variant, pretrained, own_attn=(kind, attn), layout=layout, **args)


@register_model
def flatten_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-T with FLatten attention: focusing factor 3, 5×5 conv on V, key encoding (6.19M params)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _grid_linear("flatten_deit_tiny_patch16_224", pretrained, "flatten", args, kwargs,
                        focusing_factor=3.0, dwc_kernel=5)


@register_model
def flatten_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S with FLatten attention: focusing factor 3, 5×5 conv on V, key encoding (23.0M params)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _grid_linear("flatten_deit_small_patch16_224", pretrained, "flatten", args, kwargs,
                        focusing_factor=3.0, dwc_kernel=5)


# InLine-DeiT (the released inline_deit_{tiny,small}): InLine attention in every block with its 3×3 local branch;
# T has 6 heads of 32 channels, S is 320 wide with 10 heads (the paper's InLine-DeiT-S, not DeiT-S's 384).
@register_model
def inline_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """InLine-DeiT-T: dim 192, 6 heads, 3×3 local branch (6.48M params; paper: 6.5M, 74.5% top-1)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=6)
    return _grid_linear("inline_deit_tiny_patch16_224", pretrained, "inline", args, kwargs,
                        key_encoding=False, local_kernel=3)


@register_model
def inline_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """InLine-DeiT-S: dim 320, 10 heads, 3×3 local branch (16.7M params)."""
    args = dict(patch_size=16, embed_dim=320, depth=12, num_heads=10)
    return _grid_linear("inline_deit_small_patch16_224", pretrained, "inline", args, kwargs,
                        key_encoding=False, local_kernel=3)


# SLAB-DeiT (the released deit_{tiny,small}_patch16_224_linear_repbn): no class token, the final norm's tokens
# averaged into the head, position embedding on the patches; simplified linear attention with a 5×5 conv on V and
# the key encoding in every block. ``prepbn_steps=S`` makes every norm PRepBN handing LayerNorm over to RepBN in S
# training steps (the released models: 60,000, which their tags ``.in1k`` build); 0 (default) keeps LayerNorm.
_SLAB = dict(class_token=False, global_pool="avg", fc_norm=False)


def _slab(variant: str, pretrained: bool, args: Dict[str, Any], kwargs: Dict[str, Any],
          prepbn_steps: Optional[int]) -> VisionTransformer:
    if prepbn_steps is None:
        prepbn_steps = _tag_arg(variant, kwargs, "prepbn_steps", 0)
    if check_count(variant, "prepbn_steps", prepbn_steps, low=0):
        args = dict(args, norm_layer=partial(PRepBN, steps=prepbn_steps))
    return _grid_linear(variant, pretrained, "slab", args, kwargs, dwc_kernel=5)


@register_model
def slab_deit_tiny_patch16_224(pretrained: bool = False, prepbn_steps: Optional[int] = None,
                               **kwargs) -> VisionTransformer:
    """SLAB-DeiT-T: simplified linear attention, no class token, average pooling (6.19M params; 6.20M with
    PRepBN)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, **_SLAB)
    return _slab("slab_deit_tiny_patch16_224", pretrained, args, kwargs, prepbn_steps)


@register_model
def slab_deit_small_patch16_224(pretrained: bool = False, prepbn_steps: Optional[int] = None,
                               **kwargs) -> VisionTransformer:
    """SLAB-DeiT-S: simplified linear attention, no class token, average pooling (22.97M params; 22.99M with
    PRepBN)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, **_SLAB)
    return _slab("slab_deit_small_patch16_224", pretrained, args, kwargs, prepbn_steps)


# PRepBN softmax DeiT (SLAB's deit_{tiny,small}_patch16_224_repbn): DeiT itself (class token, softmax attention,
# token pooling) with SLAB's norms, built as its released code builds them: T with RepBN in every norm, S with
# PRepBN in every norm over its code's default 300,000 steps. In eval mode both are RepBN alone.
@register_model
def prepbn_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-T with RepBN in every norm and softmax attention (5.72M params; authors: 73.6% top-1)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, norm_layer=RepBN, attn_type="softmax")
    return _create("prepbn_deit_tiny_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def prepbn_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S with PRepBN (300,000 steps) in every norm and softmax attention (22.07M params; authors: 80.2%)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, norm_layer=partial(PRepBN, steps=300000),
                attn_type="softmax")
    return _create("prepbn_deit_small_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def polaformer_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-T with PolaFormer attention: α 4, 5×5 conv on V, key encoding, gate (6.64M params)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _grid_linear("polaformer_deit_tiny_patch16_224", pretrained, "polaformer", args, kwargs,
                        alpha=4.0, dwc_kernel=5)


@register_model
def polaformer_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S with PolaFormer attention: α 4, 5×5 conv on V, key encoding, gate (24.8M params)."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _grid_linear("polaformer_deit_small_patch16_224", pretrained, "polaformer", args, kwargs,
                        alpha=4.0, dwc_kernel=5)
