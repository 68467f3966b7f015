"""DeiT/ViT backbones with softmax-free attention: SimA DeiT (paper Table 1) and the ReLU-attention ViTs.

Built on timm's ``VisionTransformer`` (with a clear error for bad input sizes) and ``attn_layer``; every model takes ``attn_type=`` (any registered attention
kind) and ``attn_kwargs=`` (that kind's options), so ``attn_type='softmax'`` is DeiT itself. ``num_heads=1`` gives
the single-head variant and ``act_layer='relu'`` the variant with no exp at inference. Any input size divisible by
the patch size works: the learned position embedding is resampled on the fly (``dynamic_img_size``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn as _timm_vit_filter

from ..attention import attention_class

__all__ = ["SoftmaxFreeViT", "checkpoint_filter_fn"]


class SoftmaxFreeViT(VisionTransformer):
    """timm's ``VisionTransformer`` with a clear ValueError for inputs the patching cannot take.

    Everything else (blocks, heads, intermediates, features) is timm's; the attention comes from ``attn_layer``.
    """

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4:
            raise ValueError(f"{type(self).__name__}: expected an image batch (B, C, H, W), got shape {tuple(x.shape)}")
        ph, pw = self.patch_embed.patch_size
        if x.shape[-2] % ph or x.shape[-1] % pw:
            raise ValueError(f"input size {tuple(x.shape[-2:])} is not divisible by patch size {(ph, pw)}")

    def forward_features(self, x, *args, **kwargs):
        self._check_input(x)
        return super().forward_features(x, *args, **kwargs)

    def forward_intermediates(self, x, *args, **kwargs):
        self._check_input(x)
        return super().forward_intermediates(x, *args, **kwargs)


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: VisionTransformer) -> Dict[str, Any]:
    """Map DeiT/ViT checkpoints (timm, DeiT official, big_vision npz already converted) onto these models.

    Uses timm's ViT filter (position-embedding resampling, patch-embed resizing, DeiT distillation tokens);
    the softmax-free kinds keep timm's parameter names, so the same weights load into any ``attn_type`` that has
    the same parameters.
    """
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    return _timm_vit_filter(state_dict, model)


def _create(variant: str, pretrained: bool = False, *, attn_type: str = "sima",
            attn_kwargs: Optional[Dict[str, Any]] = None, **kwargs) -> VisionTransformer:
    kwargs.setdefault("dynamic_img_size", True)
    out_indices = kwargs.pop("out_indices", 3)
    model = build_model_with_cfg(
        SoftmaxFreeViT, variant, pretrained,
        attn_layer=attention_class(attn_type, **(attn_kwargs or {})),
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )
    model.attn_type = attn_type
    return model


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 1.0,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    # No SimA weights were ever published: these configs describe the recipes (crop 1.0 as in the paper).
    "sima_deit_tiny_patch16_224": _cfg(),
    "sima_deit_small_patch16_224": _cfg(),
    "sima_deit_base_patch16_224": _cfg(),
    "relu_vit_small_patch32_224": _cfg(crop_pct=0.875, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "relu_vit_small_patch16_224": _cfg(crop_pct=0.875, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "relu_vit_small_patch8_224": _cfg(crop_pct=0.875, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
})


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


def _relu_vit(variant: str, patch_size: int, pretrained: bool, kwargs) -> VisionTransformer:
    # Wortsman et al.: big_vision ViT-S (global average pooling, no class token), ReLU/seqlen attention with
    # qk-LayerNorm. The learned position embedding stands in for big_vision's fixed sincos one.
    args = dict(patch_size=patch_size, embed_dim=384, depth=12, num_heads=6, qk_norm=True, class_token=False,
                global_pool="avg", fc_norm=False, attn_type="relu")
    return _create(variant, pretrained, **dict(args, **kwargs))


@register_model
def relu_vit_small_patch32_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/32 with ReLU/seqlen attention and qk-LayerNorm (Wortsman et al.)."""
    return _relu_vit("relu_vit_small_patch32_224", 32, pretrained, kwargs)


@register_model
def relu_vit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 with ReLU/seqlen attention and qk-LayerNorm (Wortsman et al.)."""
    return _relu_vit("relu_vit_small_patch16_224", 16, pretrained, kwargs)


@register_model
def relu_vit_small_patch8_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/8 with ReLU/seqlen attention and qk-LayerNorm (Wortsman et al.)."""
    return _relu_vit("relu_vit_small_patch8_224", 8, pretrained, kwargs)
