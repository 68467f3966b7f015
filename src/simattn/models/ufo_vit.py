"""UFO-ViT (Song, 2021): the XCiT-like backbone with XNorm attention and a learned positional encoding.

Per the UFO-ViT slides the network is XCiT's layout — conv patch embedding, learnable positional encoding,
multi-head UFO (XNorm) module, LPI (3×3 depthwise convs), MLP, class attention — so it is
:class:`~simattn.models.sima_xcit.XCiTBackbone` with ``attn_type='xnorm'`` (``XNormAttention``) and
``pos_embed_type='learned'`` (resampled bicubically for other input sizes). Class attention is softmax (CaiT/XCiT);
``attn_type=`` swaps in any other registered kind.

Sizes. The paper gives only params/FLOPs (T 10M/1.9G, S 21M/3.7G, M 37M/7.0G, L 21M/14.3G, XL 37M/27.4G at 224),
not widths or depths. They were derived by keeping XCiT's widths and head counts (dim 192 → 4 heads, dim 384 →
8 heads, mlp ratio 4, 2 class-attention layers) and solving for depth: one dim-384 block is ~1.78M params and
~0.35 GMACs at 196 tokens, so XCiT-S12/16 (26.3M/4.8G) minus 3 blocks gives S and plus 6 gives M; dim 192 at
depth 20 gives T. L and XL have S's and M's params at ~4× the FLOPs, i.e. the same networks with patch 8
(4× tokens). Layer scale follows XCiT's rule (eta 1.0 at depth ≤ 12, 1e-5 for deeper nets); tokens_norm as in
XCiT's non-nano models. Measured with this code (params at 1000 classes; multiply-adds of matmuls and convs at
224×224 from ``torch.utils.flop_counter``, the convention of the published "FLOPs"):

============  =====  =====  =====  =====  ============  ============
model         dim    depth  heads  patch  params        GMACs
============  =====  =====  =====  =====  ============  ============
ufo_vit_tiny   192    20     4      16    10.34M (10)   1.96 (1.9)
ufo_vit_small  384     9     8      16    20.95M (21)   3.72 (3.7)
ufo_vit_medium 384    18     8      16    37.01M (37)   6.92 (7.0)
ufo_vit_large  384     9     8       8    21.13M (21)   14.33 (14.3)
ufo_vit_xlarge 384    18     8       8    37.20M (37)   27.13 (27.4)
============  =====  =====  =====  =====  ============  ============

(published numbers in parentheses). No UFO-ViT weights or code were published.
"""
from __future__ import annotations

from typing import Any, Dict

from timm.models import generate_default_cfgs, register_model

from .sima_xcit import XCiTBackbone, checkpoint_filter_fn, create_xcit_backbone, xcit_cfg

__all__ = ["checkpoint_filter_fn"]

# (dim, depth, heads, patch, eta) per size; derivation in the module docstring.
_SIZES = {
    "tiny": (192, 20, 4, 16, 1e-5),
    "small": (384, 9, 8, 16, 1.0),
    "medium": (384, 18, 8, 16, 1e-5),
    "large": (384, 9, 8, 8, 1.0),
    "xlarge": (384, 18, 8, 8, 1e-5),
}

default_cfgs = generate_default_cfgs({f"ufo_vit_{size}": xcit_cfg(crop_pct=0.875) for size in _SIZES})


def _ufo(size: str, pretrained: bool, kwargs: Dict[str, Any]) -> XCiTBackbone:
    dim, depth, heads, patch_size, eta = _SIZES[size]
    args = dict(patch_size=patch_size, embed_dim=dim, depth=depth, num_heads=heads, eta=eta, tokens_norm=True,
                attn_type="xnorm", pos_embed_type="learned")
    # checkpoint_filter_fn (shared with SimA-XCiT) also resamples the learned positional encoding to the grid.
    return create_xcit_backbone(f"ufo_vit_{size}", pretrained, **dict(args, **kwargs))


@register_model
def ufo_vit_tiny(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """UFO-ViT-T: dim 192, depth 20, 4 heads, patch 16 (10.3M params, 1.96 GMACs; published 10M/1.9G)."""
    return _ufo("tiny", pretrained, kwargs)


@register_model
def ufo_vit_small(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """UFO-ViT-S: dim 384, depth 9, 8 heads, patch 16 (21.0M params, 3.72 GMACs; published 21M/3.7G)."""
    return _ufo("small", pretrained, kwargs)


@register_model
def ufo_vit_medium(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """UFO-ViT-M: dim 384, depth 18, 8 heads, patch 16 (37.0M params, 6.92 GMACs; published 37M/7.0G)."""
    return _ufo("medium", pretrained, kwargs)


@register_model
def ufo_vit_large(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """UFO-ViT-L: UFO-ViT-S at patch 8 (21.1M params, 14.3 GMACs; published 21M/14.3G)."""
    return _ufo("large", pretrained, kwargs)


@register_model
def ufo_vit_xlarge(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """UFO-ViT-XL: UFO-ViT-M at patch 8 (37.2M params, 27.1 GMACs; published 37M/27.4G)."""
    return _ufo("xlarge", pretrained, kwargs)
