"""Swin Transformer (v1) backbones with softmax-free attention: SimA-Swin and the released Swin hybrids of the newer
kinds (Agent-, FLatten-, InLine-, SLAB- and PolaFormer-Swin at the sizes their authors released: T, S, B).

Built on timm's ``SwinTransformer`` (its patch embedding, stages, ``PatchMerging``, window attention, head, intermediates
and features): a model names which stages run its attention kind. Those stages' blocks (:class:`GridSwinBlock`) attend
over the whole stage grid, with no windows and no shift, as the released hybrids do (their ``window_size`` 56 at
224 px is each stage's resolution); the other stages keep Swin's shifted-window softmax attention with relative
position bias (window 7). ``attn_type='softmax'`` is Swin itself: window attention in every stage, the network of
timm's ``swin_{tiny,small,base}_patch4_window7_224`` (timm's Swin weights load, same logits). ``attn_type=`` any
other kind runs it in the model's kind stages (SimA-Swin: all four); a model's own kind options fall away for
another kind with a note, its layout (each stage's grid for a key encoding, no prefix tokens) goes to any kind that
takes it. Any input size that is a multiple of the patch size runs (``dynamic_img_size=False``: ``img_size`` only, as
timm's Swin); ``forward_intermediates`` gives NCHW maps per stage, ``features_only`` NHWC ones as timm's Swin.

The released configurations (their ``cfgs/*_swin_{t,s,b}.yaml`` and model files; Swin-T/S/B's channels, depths and
heads; the stages that run the kind in the authors' letters, ``M2`` a stage whose first 2 blocks run it):

- Agent-Swin (LeapLabTHU/Agent-Attention ``agent_swin``; T ``AAAB``, S ``AABB``, B ``AAMB2``): 9, 16 and 49 agents
  in stages 1-3, biases learned on the stage grids (56, 28, 14 at 224 px), 3×3 conv on V.
- FLatten-Swin (LeapLabTHU/FLatten-Transformer ``flatten_swin``; ``LLSS``): focusing factor 3, 5×5 conv on V, key
  encoding on the stage grid.
- InLine-Swin (LeapLabTHU/InLine ``inline_swin``; T ``IIIS``, S ``IISS``, B ``IIMS2``): 3×3 local branch.
- SLAB-Swin T and S (xinghaochen/SLAB ``SlabSwinTransformer``; ``LLSS``): 5×5 conv on V, key encoding; every norm
  is PRepBN (LayerNorm, eps 1e-5, handed over to RepBN in 60,000 steps; ``prepbn_steps=0`` keeps LayerNorm).
- PolaFormer-Swin (ZacharyMeng/PolaFormer ``pola_swin``; ``LLSS``): α 4, 5×5 conv on V, key encoding, gate.

Each has the released code's parameter count, and the released code's logits with its weights mapped here (fp64,
every tensor moved off its initialization: within 1e-14, SLAB within its own rounding sensitivity).

The authors' weights are tags (``.in1k``; PolaFormer's on the Hugging Face Hub). Those fine-tuned at a higher
resolution (Agent-Swin-S at 288 px, Agent-Swin-B and FLatten-Swin-B at 384: ``.in1k_288``, ``.in1k_384``) build their
model at that size, the kind stages over its grids and the softmax stages' windows grown as the released code grows
them.

SimA-Swin (no one has published it) runs SimA in all four stages over the stage grid. Swin has no absolute position
embedding: its positions are the softmax windows' relative bias, which the kind stages do not have (the hybrids' own
encodings aside), so a kind without one sees positions only through the patch merging.

:func:`checkpoint_filter_fn` maps timm's and the Swin authors' layout (timm's own filter) and the hybrids' released key
names (Agent's ``an``/``na``/``ah``/``aw``/``ha``/``wa`` biases, PolaFormer's ``qkvg``, FLatten's and PolaFormer's
``scale``, SLAB's ``LinearNorm`` counters) onto these models.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.models import generate_default_cfgs, register_model
from timm.models._manipulate import named_apply
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, window_partition, window_reverse
from timm.models.swin_transformer import checkpoint_filter_fn as _timm_swin_filter
from timm.models.vision_transformer import get_init_weights_vit

from ._build import LoadsThroughSimattn, build_family_model
from ._checks import image_batch_error
from ._kinds import kind_options
from ..attention import attention_class, get_attention_class
from ..attention._common import check_count, fx_tracing
from .prepbn import PRepBN
from .released import (PAPERS, POLAFORMER_HUB, SLAB_RELEASES, TSINGHUA, downstream_agents, released_names,
                       with_tag_args)
from .resample import resample_grids

__all__ = ["SoftmaxFreeSwin", "GridSwinBlock", "checkpoint_filter_fn"]


class GridSwinBlock(nn.Module):
    """A Swin block whose attention sees the whole stage grid: ``x + attn(norm1 x)``, ``x + mlp(norm2 x)`` on
    (B, H, W, C) maps, with timm's block's parameter names. Made from a timm ``SwinTransformerBlock``, whose norms,
    MLP and stochastic depth it keeps; the attention is a kind's module (``attn_layer``, timm's ``Attention``
    signature), given ``grid_size=(H, W)`` where it uses the grid."""

    __constants__ = ["attn_uses_grid"]

    def __init__(self, block: nn.Module, attn_layer: Type[nn.Module]) -> None:
        super().__init__()
        window = block.attn
        self.dim = block.dim
        self.input_resolution = block.input_resolution
        self.norm1 = block.norm1
        self.attn = attn_layer(self.dim, num_heads=window.num_heads, qkv_bias=window.qkv.bias is not None,
                               attn_drop=window.attn_drop.p, proj_drop=window.proj_drop.p)
        self.drop_path1 = block.drop_path1
        self.norm2 = block.norm2
        self.mlp = block.mlp
        self.drop_path2 = block.drop_path2
        self.attn_uses_grid = bool(getattr(self.attn, "uses_grid", False))

    def set_input_size(self, feat_size: Tuple[int, int], window_size: Tuple[int, int],
                       always_partition: Optional[bool] = None) -> None:
        """timm's stage calls this on a new input size: the whole grid is attended at any size."""
        self.input_resolution = feat_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        y = self.norm1(x).reshape(B, H * W, C)
        if self.attn_uses_grid:  # a constant in TorchScript, so the other call is not compiled
            y = self.attn(y, grid_size=(H, W))
        else:
            y = self.attn(y)
        x = x + self.drop_path1(y.reshape(B, H, W, C))
        x = x.reshape(B, H * W, C)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x.reshape(B, H, W, C)


class DenseSwinBlock(SwinTransformerBlock):
    """timm's window block as mmseg's Swin (and Agent's downstream Swin) runs it at any input size: the normalized
    map padded at the bottom and right to whole windows first, then shifted (timm shifts, then pads), the shift
    mask laid over the padded map, the output cropped back. On a map of whole windows both are the same."""

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        pad_h = (self.window_size[0] - H % self.window_size[0]) % self.window_size[0]
        pad_w = (self.window_size[1] - W % self.window_size[1]) % self.window_size[1]
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        shift = self.shift_size[0] > 0 or self.shift_size[1] > 0
        if shift:
            x = torch.roll(x, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        mask = self.get_attn_mask(x) if self.dynamic_mask else self.attn_mask
        windows = self.attn(window_partition(x, self.window_size).view(-1, self.window_area, C), mask=mask)
        x = window_reverse(windows.view(-1, self.window_size[0], self.window_size[1], C), self.window_size,
                           x.shape[1], x.shape[2])
        if shift:
            x = torch.roll(x, shifts=(self.shift_size[0], self.shift_size[1]), dims=(1, 2))
        return x[:, :H, :W].contiguous()


class TokenPRepBN(PRepBN):
    """:class:`~.prepbn.PRepBN` on timm's Swin maps (B, H, W, C) as on (B, H·W, C) tokens, the released layout."""

    @property
    def weight(self) -> torch.Tensor:
        """LayerNorm's weight: timm's Swin block reads a norm's ``weight`` for the device and dtype of its mask."""
        return self.norm1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # PRepBN on the tokens (through blend: TorchScript has no super())
        shape = x.shape
        return self.blend(x.reshape(shape[0], -1, shape[-1])).reshape(shape)


class SoftmaxFreeSwin(LoadsThroughSimattn, SwinTransformer):
    """timm's ``SwinTransformer`` whose stages ``i`` with ``stage_attn[i]`` (an attention class) run that kind over
    the whole stage grid (:class:`GridSwinBlock`) in their first ``kind_blocks[i]`` blocks (all where None or not
    given, as the released hybrids' ``M`` stages mix); the other blocks keep Swin's shifted-window softmax. A clear
    ValueError for inputs that are not image batches of the model's size (any size that is a multiple of the patch
    size with ``dynamic_img_size=True``)."""

    #: why an exported graph keeps one input size: the tracers fix the windows' masks and the stage grids to the
    #: export size (onnxruntime fails at another), so ``simattn export`` fixes it from the start
    fixed_size_export = "Swin's shifted-window masks and stage grids are traced at the export size"

    def __init__(self, *, stage_attn: Sequence[Optional[Type[nn.Module]]] = (),
                 kind_blocks: Sequence[Optional[int]] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        if len(stage_attn) not in (0, len(self.layers)):
            raise ValueError(f"{type(self).__name__}: stage_attn names {len(stage_attn)} stages, the model has "
                             f"{len(self.layers)}")
        init = get_init_weights_vit(self.weight_init_mode, needs_reset=False)
        for i, attn_layer in enumerate(stage_attn):
            if attn_layer is None:
                continue
            stage = self.layers[i]
            count = kind_blocks[i] if i < len(kind_blocks) and kind_blocks[i] is not None else len(stage.blocks)
            stage.blocks = nn.Sequential(*[GridSwinBlock(block, attn_layer) if j < count else block
                                           for j, block in enumerate(stage.blocks)])
            if kwargs.get("weight_init") != "skip":  # timm's init rule for the attention built here too
                for j in range(min(count, len(stage.blocks))):
                    named_apply(init, stage.blocks[j].attn, name=f"layers.{i}.blocks.{j}.attn")

    @torch.jit.ignore
    def for_dense_prediction(self) -> None:
        """Lay the model out as Swin's and the peers' segmentation and detection backbones run (mmseg/mmdet): every
        window block pads its map to whole windows, then shifts (:class:`DenseSwinBlock`), at any input size, where
        the classifier shrinks a window to a smaller stage grid and drops its shift (Swin-T's last stage at 224 px)."""
        self.set_input_size(always_partition=True)
        for stage in self.layers:
            for block in stage.blocks:
                if type(block) is SwinTransformerBlock:
                    block.__class__ = DenseSwinBlock

    def _check_input(self, x: torch.Tensor) -> None:
        if fx_tracing():
            return
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise image_batch_error(type(self).__name__, self.in_chans, x.shape)
        size, patch = tuple(x.shape[-2:]), tuple(self.patch_embed.patch_size)
        if not self.dynamic_img_size and size != tuple(self.patch_embed.img_size):
            raise ValueError(f"{type(self).__name__}: input size {size} differs from the model's "
                             f"{tuple(self.patch_embed.img_size)}; build it with img_size={size[0]} or "
                             "dynamic_img_size=True")
        if size[0] % patch[0] or size[1] % patch[1] or size[0] < 2 * patch[0] or size[1] < 2 * patch[1]:
            raise ValueError(f"{type(self).__name__}: input size {size} must be a multiple of the patch size "
                             f"{patch} with at least 2x2 patches")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        # timm's SwinTransformer.forward_features after the input check, written out: TorchScript has no super()
        if not torch.jit.is_scripting():
            self._check_input(x)
        x = self.patch_embed(x)
        x = self.layers(x)
        return self.norm(x)

    @torch.jit.ignore
    def forward_intermediates(self, x, *args, **kwargs):
        self._check_input(x)
        return super().forward_intermediates(x, *args, **kwargs)


# ---- released checkpoints ----------------------------------------------------------------------------------------
def _released_keys(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """PolaFormer-Swin's fused ``qkvg`` projection as ``qkv`` and the gate ``g`` (the rest as they are)."""
    out: Dict[str, Any] = {}
    for k, v in state_dict.items():
        head, _, name = k.rpartition(".")
        if head.endswith(".attn.qkvg"):  # PolaFormer: q, k, v and the gate in one projection
            dim = v.shape[0] // 4
            out[f"{head[:-5]}.qkv.{name}"], out[f"{head[:-5]}.g.{name}"] = v[:3 * dim], v[3 * dim:]
            continue
        out[k] = v
    return out


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: SwinTransformer) -> Dict[str, Any]:
    """Map Swin checkpoints onto these models: timm's layout and the Swin authors' (downsampling at a stage's end,
    ``head``, buffers left out: timm's own filter), each released hybrid's key names (module docstring), and a
    training script's wrapper (``model``, ``state_dict``, ``module.``); the relative position tables of a larger
    window, the kind stages' key encodings and Agent's biases of another grid resampled as the authors' code does
    (:mod:`simattn.models.resample`)."""
    # resampled before timm's filter, which would resize the relative position tables with another interpolator
    return _timm_swin_filter(resample_grids(_released_keys(released_names(state_dict)), model), model)


# ---- building ----------------------------------------------------------------------------------------------------
_SOFTMAX_NOTE = "Swin's window attention takes no attn_kwargs"


def _stage_grids(img_size: Union[int, Sequence[int]], patch_size: int, stages: int) -> List[Tuple[int, int]]:
    img = to_2tuple(img_size)
    grid = (img[0] // patch_size, img[1] // patch_size)
    return [((grid[0] + 2 ** i - 1) // 2 ** i, (grid[1] + 2 ** i - 1) // 2 ** i) for i in range(stages)]


def _stage_layers(variant: str, attn_type: Any, attn_kwargs: Optional[Dict[str, Any]], own_kind: str,
                  own_options: Sequence[Dict[str, Any]], kind_stages: Sequence[Union[bool, int]],
                  grids: Sequence[Tuple[int, int]]) -> List[Optional[Type[nn.Module]]]:
    """Each stage's attention class: None (Swin's window softmax) in every stage for softmax, else the kind in the
    kind stages with its options there (the model's own per stage where it is the model's kind)."""
    if get_attention_class(attn_type) is get_attention_class("softmax"):
        if attn_kwargs:
            raise ValueError(f"{variant}: attn_type='softmax' is {_SOFTMAX_NOTE} (got {sorted(attn_kwargs)})")
        return [None] * len(kind_stages)
    layers: List[Optional[Type[nn.Module]]] = []
    noted = False
    for i, (uses_kind, grid) in enumerate(zip(kind_stages, grids)):
        if not uses_kind:
            layers.append(None)
            continue
        own = own_options[i] if i < len(own_options) else {}
        same = get_attention_class(attn_type) is get_attention_class(own_kind)
        # another kind's note once, not once per stage
        options = kind_options(variant, own_kind, own if same or not noted else None, attn_type, attn_kwargs,
                               {"num_prefix_tokens": 0, "pos_grid": grid})
        noted = True
        layers.append(attention_class(attn_type, **options))
    return layers


def _create(variant: str, pretrained: bool = False, *, attn_type: str = "sima",
            attn_kwargs: Optional[Dict[str, Any]] = None, own_attn: Optional[Tuple[str, Sequence[Dict]]] = None,
            kind_stages: Sequence[Union[bool, int]] = (True, True, True, True), key_encoding: bool = False,
            **kwargs) -> SwinTransformer:
    """``own_attn``: the kind the model is made for and its options per kind stage; ``kind_stages``: which stages
    run the kind (True: every block, an int n: the first n blocks, the released ``M`` stages); ``key_encoding``: whether the model's own kind has a key encoding on each stage's grid (the grid
    goes to every kind that takes ``pos_grid`` only then)."""
    # any input size that is a multiple of the patch size, as every family here (timm's Swin: its own size only);
    # the shifted windows' masks are then made per input, the same values at img_size
    kwargs.setdefault("dynamic_img_size", True)
    depths = kwargs.get("depths", (2, 2, 6, 2))
    if len(kind_stages) != len(depths):
        kind_stages = tuple(kind_stages[:len(depths)]) + (False,) * max(0, len(depths) - len(kind_stages))
    own_kind, own_options = own_attn or (attn_type, ())
    grids = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4), len(depths))
    if not key_encoding:
        grids = [None] * len(depths)
    stage_attn = _stage_layers(variant, attn_type, attn_kwargs, own_kind, own_options, kind_stages, grids)
    model = build_family_model(SoftmaxFreeSwin, variant, pretrained, kwargs, checkpoint_filter_fn,
                               tuple(range(len(depths))), getter=False, levels=len(depths), stage_attn=stage_attn,
                               kind_blocks=[None if s is True else int(s) for s in kind_stages])
    model.attn_type = attn_type
    return model


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.9,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head.fc", **kwargs,
    }




# The evaluation transforms of their Swin-style code: resize int(256 / 224 · 224) px, centre crop 224, bicubic;
# LeapLabTHU's resize to a square (timm's crop_mode 'squash'), SLAB's the shorter side ('center').
def _released(paper: str, url: str, top1: float, size: int = 224, **source: Any) -> Dict[str, Any]:
    paper_ids, paper_name, origin = PAPERS[paper]
    crop = dict(crop_pct=0.875, crop_mode="center" if paper == "slab" else "squash") if size == 224 else \
        dict(crop_pct=1.0, crop_mode="squash")  # fine-tuned at a higher resolution: TEST.CROP False, a plain resize
    # a url's file loads through simattn's one loader (LoadsThroughSimattn), as the Hub's through timm's filter
    return _cfg(url=url, custom_load=bool(url), input_size=(3, size, size), pool_size=(size // 32, size // 32), **crop,
                license="mit" if paper == "polaformer" else None, paper_ids=paper_ids, paper_name=paper_name,
                origin_url=origin, notes=(f"top-1 {top1} on ImageNet-1k val at {size} px, as reported by the authors",),
                **source)


_RELEASED = {
    **{f"agent_swin_{size}_patch4_window7_224.in1k": _released("agent", TSINGHUA.format(key), top1)
       for size, key, top1 in (("tiny", "a2ddc1190c224f768a41", 82.6), ("small", "f607172c9fea4d6e99bb", 83.7),
                               ("base", "4fcd2d0114bb490483c3", 84.0))},
    **{f"flatten_swin_{size}_patch4_window7_224.in1k": _released("flatten", TSINGHUA.format(key), top1)
       for size, key, top1 in (("tiny", "e1518e76703e4e57a7f2", 82.1), ("small", "94188e52af354bf4a88b", 83.5),
                               ("base", "7a9e5186bad04e7fb3a9", 83.8))},
    **{f"inline_swin_{size}_patch4_window7_224.in1k": _released("inline", TSINGHUA.format(key), top1)
       for size, key, top1 in (("tiny", "32810869fcc34410966b", 82.4), ("small", "e9657fd247c04c7cb1a1", 83.6),
                               ("base", "bf23564bb64c420aafe1", 84.1))},
    "slab_swin_tiny_patch4_window7_224.in1k": _released("slab", SLAB_RELEASES.format("slab_swin_tiny.pth"), 81.8),
    "slab_swin_small_patch4_window7_224.in1k": _released("slab", SLAB_RELEASES.format("slab_swin_small.pth"), 83.6),
    **{f"polaformer_swin_{size}_patch4_window7_224.in1k": _released(
        "polaformer", "", top1, hf_hub_id=POLAFORMER_HUB, hf_hub_filename=f"pola_swin_{size}_patch4_224.pth")
       for size, top1 in (("tiny", 82.6), ("small", 83.6), ("base", 83.8))},
    "agent_swin_small_patch4_window7_224.in1k_288": _released("agent", TSINGHUA.format("09760394e93b4046a25e"), 84.1,
                                                              size=288),
    "agent_swin_base_patch4_window7_224.in1k_384": _released("agent", TSINGHUA.format("bb84ee9058954706a557"), 84.9,
                                                             size=384),
    "flatten_swin_base_patch4_window7_224.in1k_384": _released("flatten", TSINGHUA.format("0d0330cf2e5249f1abb6"),
                                                               85.0, size=384),
}
# What a tag builds beyond its model's defaults: the model its weights were fine-tuned in. The kind stages span each
# stage's grid at that size; the softmax stages' windows grow with it (Agent's max(7, grid / 8): 9 at 288 px, 12 at
# 384; FLatten's 12 past 224), clamped to a stage's grid where it is smaller, as the released code does. Arguments
# given win.
_TAG_ARGS = {
    "agent_swin_small_patch4_window7_224.in1k_288": dict(img_size=288, window_size=9),
    "agent_swin_base_patch4_window7_224.in1k_384": dict(img_size=384, window_size=12),
    "flatten_swin_base_patch4_window7_224.in1k_384": dict(img_size=384, window_size=12),
}

default_cfgs = generate_default_cfgs({
    # No SimA-Swin weights exist: a recipe's evaluation (Swin's crop 0.9).
    **{f"sima_swin_{size}_patch4_window7_224": _cfg(license="mit") for size in ("tiny", "small", "base")},
    # The untagged names: the recipes' evaluation (crop 0.875); the authors' weights are tags.
    **{f"{kind}_swin_{size}_patch4_window7_224": _cfg(crop_pct=0.875)
       for kind in ("agent", "flatten", "inline") for size in ("tiny", "small", "base")},
    **{f"slab_swin_{size}_patch4_window7_224": _cfg(crop_pct=0.875) for size in ("tiny", "small")},
    **{f"polaformer_swin_{size}_patch4_window7_224": _cfg(crop_pct=0.875, license="mit")
       for size in ("tiny", "small", "base")},
    **_RELEASED,
})
# The untagged names stay the recipes' defaults (timm would make the first cfg with weights the default): a tag asks
# for weights.
for _name in {tag.split(".")[0] for tag in _RELEASED}:
    default_cfgs[_name].tags.remove("")
    default_cfgs[_name].tags.appendleft("")

_TINY = dict(patch_size=4, window_size=7, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_SMALL = dict(_TINY, depths=(2, 2, 18, 2))
_BASE = dict(_TINY, embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))


@register_model
def sima_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-T with SimA in every stage over the stage grid; ``attn_type='softmax'`` is Swin-T (28.3M params)."""
    return _create("sima_swin_tiny_patch4_window7_224", pretrained, **dict(_TINY, **kwargs))


@register_model
def sima_swin_small_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-S with SimA in every stage over the stage grid; ``attn_type='softmax'`` is Swin-S (49.6M params)."""
    return _create("sima_swin_small_patch4_window7_224", pretrained, **dict(_SMALL, **kwargs))


@register_model
def sima_swin_base_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-B with SimA in every stage over the stage grid; ``attn_type='softmax'`` is Swin-B (87.8M params)."""
    return _create("sima_swin_base_patch4_window7_224", pretrained, **dict(_BASE, **kwargs))


def _agent(variant: str, pretrained: bool, size: Dict[str, Any], stages: Sequence[Union[bool, int]],
           kwargs: Dict[str, Any]) -> SwinTransformer:
    """Agent-Swin: 9, 16, 49 agents in stages 1-3; the row and column biases learned on each stage's grid at
    ``img_size`` (the longer side); 3×3 conv on V. ``downstream_agents``: see :func:`.released.downstream_agents`."""
    args = dict(size, **with_tag_args(variant, kwargs, _TAG_ARGS))
    grids = _stage_grids(args.get("img_size", 224), args.get("patch_size", 4), len(args["depths"]))
    run = downstream_agents(variant, args.pop("downstream_agents", None), len(args["depths"]))
    own = [dict(agent_num=n, window=max(g), dwc_kernel=3, **run[i]) for i, (n, g) in enumerate(zip((9, 16, 49),
                                                                                                  grids))]
    return _create(variant, pretrained, attn_type=args.pop("attn_type", "agent"), own_attn=("agent", own),
                   kind_stages=stages, **args)


@register_model
def agent_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Agent-Swin-T (AAAB): agent attention in stages 1-3, Swin's window softmax in stage 4 (28.90M params;
    README: 29M, 4.5G FLOPs, 82.6% top-1)."""
    return _agent("agent_swin_tiny_patch4_window7_224", pretrained, _TINY, (True, True, True, False), kwargs)


@register_model
def agent_swin_small_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Agent-Swin-S (AABB): agent attention in stages 1-2 (README: 50M params, 8.7G FLOPs, 83.7% top-1)."""
    return _agent("agent_swin_small_patch4_window7_224", pretrained, _SMALL, (True, True, False, False), kwargs)


@register_model
def agent_swin_base_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Agent-Swin-B (AAMB2): agent attention in stages 1-2 and the first 2 blocks of stage 3 (README: 88M params,
    15.4G FLOPs, 84.0% top-1)."""
    return _agent("agent_swin_base_patch4_window7_224", pretrained, _BASE, (True, True, 2, False), kwargs)


def _grid_linear(variant: str, pretrained: bool, kind: str, size: Dict[str, Any],
                 stages: Sequence[Union[bool, int]], kwargs: Dict[str, Any], key_encoding: bool = True,
                 **attn: Any) -> SwinTransformer:
    args = dict(size, **with_tag_args(variant, kwargs, _TAG_ARGS))
    return _create(variant, pretrained, attn_type=args.pop("attn_type", kind), own_attn=(kind, [attn] * 4),
                   kind_stages=stages, key_encoding=key_encoding, **args)


_LLSS = (True, True, False, False)
_FLATTEN = dict(focusing_factor=3.0, dwc_kernel=5)


@register_model
def flatten_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """FLatten-Swin-T (LLSS): focused linear attention in stages 1-2 (focusing factor 3, 5×5 conv on V, key
    encoding), Swin's window softmax in stages 3-4 (29.19M params; 82.1% top-1)."""
    return _grid_linear("flatten_swin_tiny_patch4_window7_224", pretrained, "flatten", _TINY, _LLSS, kwargs,
                        **_FLATTEN)


@register_model
def flatten_swin_small_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """FLatten-Swin-S (LLSS) (83.5% top-1)."""
    return _grid_linear("flatten_swin_small_patch4_window7_224", pretrained, "flatten", _SMALL, _LLSS, kwargs,
                        **_FLATTEN)


@register_model
def flatten_swin_base_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """FLatten-Swin-B (LLSS) (83.8% top-1)."""
    return _grid_linear("flatten_swin_base_patch4_window7_224", pretrained, "flatten", _BASE, _LLSS, kwargs,
                        **_FLATTEN)


@register_model
def inline_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """InLine-Swin-T (IIIS): InLine attention in stages 1-3 (3×3 local branch), Swin's window softmax in stage 4
    (29.22M params; README: 30M, 4.5G FLOPs, 82.4% top-1)."""
    return _grid_linear("inline_swin_tiny_patch4_window7_224", pretrained, "inline", _TINY,
                        (True, True, True, False), kwargs, key_encoding=False, local_kernel=3)


@register_model
def inline_swin_small_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """InLine-Swin-S (IISS): InLine attention in stages 1-2 (README: 50M params, 8.7G FLOPs, 83.6% top-1)."""
    return _grid_linear("inline_swin_small_patch4_window7_224", pretrained, "inline", _SMALL, _LLSS, kwargs,
                        key_encoding=False, local_kernel=3)


@register_model
def inline_swin_base_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """InLine-Swin-B (IIMS2): InLine attention in stages 1-2 and the first 2 blocks of stage 3 (README: 88M
    params, 15.4G FLOPs, 84.1% top-1)."""
    return _grid_linear("inline_swin_base_patch4_window7_224", pretrained, "inline", _BASE, (True, True, 2, False),
                        kwargs, key_encoding=False, local_kernel=3)


def _slab(variant: str, pretrained: bool, size: Dict[str, Any], prepbn_steps: int,
          kwargs: Dict[str, Any]) -> SwinTransformer:
    """SLAB-Swin (LLSS): every norm PRepBN over ``prepbn_steps`` training steps (the released 60,000, LayerNorm's
    eps 1e-5; 0 keeps LayerNorm)."""
    if check_count(variant, "prepbn_steps", prepbn_steps, low=0):
        kwargs = dict(kwargs, norm_layer=partial(TokenPRepBN, steps=prepbn_steps, eps=1e-5))
    return _grid_linear(variant, pretrained, "slab", size, _LLSS, kwargs, dwc_kernel=5)


@register_model
def slab_swin_tiny_patch4_window7_224(pretrained: bool = False, prepbn_steps: int = 60000,
                                      **kwargs) -> SwinTransformer:
    """SLAB-Swin-T: simplified linear attention in stages 1-2 (5×5 conv on V, key encoding), Swin's window
    softmax in stages 3-4, PRepBN norms (29.22M params; 81.8% top-1)."""
    return _slab("slab_swin_tiny_patch4_window7_224", pretrained, _TINY, prepbn_steps, kwargs)


@register_model
def slab_swin_small_patch4_window7_224(pretrained: bool = False, prepbn_steps: int = 60000,
                                       **kwargs) -> SwinTransformer:
    """SLAB-Swin-S (83.6% top-1)."""
    return _slab("slab_swin_small_patch4_window7_224", pretrained, _SMALL, prepbn_steps, kwargs)


_POLA = dict(alpha=4.0, dwc_kernel=5)


@register_model
def polaformer_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """PolaFormer-Swin-T (LLSS): polarity-aware linear attention in stages 1-2 (α 4, 5×5 conv on V, key encoding,
    gate), Swin's window softmax in stages 3-4 (29.29M params; 82.6% top-1)."""
    return _grid_linear("polaformer_swin_tiny_patch4_window7_224", pretrained, "polaformer", _TINY, _LLSS, kwargs,
                        **_POLA)


@register_model
def polaformer_swin_small_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """PolaFormer-Swin-S (LLSS) (83.6% top-1)."""
    return _grid_linear("polaformer_swin_small_patch4_window7_224", pretrained, "polaformer", _SMALL, _LLSS,
                        kwargs, **_POLA)


@register_model
def polaformer_swin_base_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """PolaFormer-Swin-B (LLSS) (83.8% top-1)."""
    return _grid_linear("polaformer_swin_base_patch4_window7_224", pretrained, "polaformer", _BASE, _LLSS, kwargs,
                        **_POLA)
