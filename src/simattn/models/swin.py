"""Swin Transformer (v1) backbones with softmax-free attention: SimA-Swin and the released Swin hybrids of the newer
kinds (Agent-, FLatten-, InLine-, SLAB- and PolaFormer-Swin-T).

Built on timm's ``SwinTransformer`` (its patch embedding, stages, ``PatchMerging``, window attention, head, intermediates
and features): a model names which stages run its attention kind. Those stages' blocks (:class:`GridSwinBlock`) attend
over the whole stage grid, with no windows and no shift, as the released hybrids do (their ``window_size`` 56 at
224 px is each stage's resolution); the other stages keep Swin's shifted-window softmax attention with relative
position bias (window 7). ``attn_type='softmax'`` is Swin itself: window attention in every stage, the network of
timm's ``swin_{tiny,small,base}_patch4_window7_224`` (timm's Swin weights load, same logits). ``attn_type=`` any
other kind runs it in the model's kind stages (SimA-Swin: all four); a model's own kind options fall away for
another kind with a note, its layout (each stage's grid for a key encoding, no prefix tokens) goes to any kind that
takes it.

The released configurations (their ``cfgs/*_swin_t.yaml`` and model files), Swin-T's 96 channels, depths (2, 2, 6, 2)
and heads (3, 6, 12, 24):

- Agent-Swin-T (LeapLabTHU/Agent-Attention ``agent_swin``, ``AAAB``): agent attention in stages 1-3 with 9, 16 and 49
  agents, its biases learned on the stage grids 56, 28 and 14, 3×3 conv on V.
- FLatten-Swin-T (LeapLabTHU/FLatten-Transformer ``flatten_swin``, ``LLSS``): stages 1-2, focusing factor 3, 5×5
  conv on V, key encoding on the stage grid.
- InLine-Swin-T (LeapLabTHU/InLine ``inline_swin``, ``IIIS``): stages 1-3, 3×3 local branch.
- SLAB-Swin-T (xinghaochen/SLAB ``SlabSwinTransformer``, ``LLSS``): stages 1-2, 5×5 conv on V, key encoding; every
  norm is PRepBN (LayerNorm, eps 1e-5, handed over to RepBN in 60,000 steps; ``prepbn_steps=0`` keeps LayerNorm).
- PolaFormer-Swin-T (ZacharyMeng/PolaFormer ``pola_swin``, ``LLSS``): stages 1-2, α 4, 5×5 conv on V, key encoding.

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
from torch import nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._manipulate import named_apply
from timm.models.swin_transformer import SwinTransformer
from timm.models.swin_transformer import checkpoint_filter_fn as _timm_swin_filter
from timm.models.vision_transformer import get_init_weights_vit

from ._checks import check_model_kwargs, image_batch_error
from ._kinds import kind_options
from ..attention import attention_class, get_attention_class
from ..attention._common import check_count, fx_tracing
from .prepbn import PRepBN

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


class TokenPRepBN(PRepBN):
    """:class:`~.prepbn.PRepBN` on timm's Swin maps (B, H, W, C) as on (B, H·W, C) tokens, the released layout."""

    @property
    def weight(self) -> torch.Tensor:
        """LayerNorm's weight: timm's Swin block reads a norm's ``weight`` for the device and dtype of its mask."""
        return self.norm1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # PRepBN.forward on the tokens, written out: TorchScript has no super()
        shape = x.shape
        x = x.reshape(shape[0], -1, shape[-1])
        if not self.training:
            return self.norm2(x).reshape(shape)
        warming = self.warmup_left > 0
        lam = torch.where(warming, torch.ones_like(self.steps_left, dtype=x.dtype),
                          self.steps_left.to(x.dtype) * (self.r0 / self.steps))
        with torch.no_grad():
            self.steps_left.sub_((~warming & (self.steps_left > 0)).to(self.steps_left.dtype))
            self.warmup_left.sub_(warming.to(self.warmup_left.dtype))
        return (lam * self.norm1(x) + (1 - lam) * self.norm2(x)).reshape(shape)


class SoftmaxFreeSwin(SwinTransformer):
    """timm's ``SwinTransformer`` whose stages ``i`` with ``stage_attn[i]`` (an attention class) run that kind over
    the whole stage grid (:class:`GridSwinBlock`); the stages with None keep Swin's shifted-window softmax. A clear
    ValueError for inputs that are not image batches of the model's size (any size that is a multiple of the patch
    size with ``dynamic_img_size=True``)."""

    def __init__(self, *, stage_attn: Sequence[Optional[Type[nn.Module]]] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        if len(stage_attn) not in (0, len(self.layers)):
            raise ValueError(f"{type(self).__name__}: stage_attn names {len(stage_attn)} stages, the model has "
                             f"{len(self.layers)}")
        init = get_init_weights_vit(self.weight_init_mode, needs_reset=False)
        for i, attn_layer in enumerate(stage_attn):
            if attn_layer is None:
                continue
            stage = self.layers[i]
            stage.blocks = nn.Sequential(*[GridSwinBlock(block, attn_layer) for block in stage.blocks])
            if kwargs.get("weight_init") != "skip":  # timm's init rule for the attention built here too
                for j, block in enumerate(stage.blocks):
                    named_apply(init, block.attn, name=f"layers.{i}.blocks.{j}.attn")

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
def _unwrap(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The weights of a training script's file: its ``model`` / ``state_dict`` entry, ``module.`` prefixes off."""
    for key in ("model", "state_dict"):
        if isinstance(state_dict.get(key), dict):
            state_dict = state_dict[key]
    return {k[7:] if k.startswith("module.") else k: v for k, v in state_dict.items()}


def _agent_bias(name: str, v: torch.Tensor) -> Tuple[str, torch.Tensor]:
    """Agent-Swin's bias tensors (``an``/``na`` (h, n, 7, 7); ``ah`` (1, h, n, W, 1), ``aw`` (1, h, n, 1, W),
    ``ha`` (1, h, W, 1, n), ``wa`` (1, h, 1, W, n)) as AgentAttention's (h, n, 7, 7) and (h, n, W)."""
    if name == "an_bias":
        return "agent_block_bias", v
    if name == "na_bias":
        return "query_block_bias", v
    if name == "ah_bias":
        return "agent_row_bias", v[0, :, :, :, 0]
    if name == "aw_bias":
        return "agent_col_bias", v[0, :, :, 0, :]
    if name == "ha_bias":
        return "query_row_bias", v[0, :, :, 0, :].transpose(-2, -1)
    return "query_col_bias", v[0, :, 0, :, :].transpose(-2, -1)


_AGENT_BIASES = ("an_bias", "na_bias", "ah_bias", "aw_bias", "ha_bias", "wa_bias")


def _released_keys(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The released hybrids' names mapped onto the kinds' modules (the rest as they are)."""
    out: Dict[str, Any] = {}
    for k, v in state_dict.items():
        head, _, name = k.rpartition(".")
        if head.endswith(".attn") and name in _AGENT_BIASES:
            name, v = _agent_bias(name, v)
        elif head.endswith(".attn.qkvg"):  # PolaFormer: q, k, v and the gate in one projection
            dim = v.shape[0] // 4
            out[f"{head[:-5]}.qkv.{name}"], out[f"{head[:-5]}.g.{name}"] = v[:3 * dim], v[3 * dim:]
            continue
        elif head.endswith(".attn") and name == "scale":  # FLatten's and PolaFormer's learned feature scale
            name = "feature_scale"
        elif name in ("warm", "iter", "total_step") and v.dim() == 0:  # SLAB's LinearNorm counters
            if name == "total_step":
                continue
            name = "warmup_left" if name == "warm" else "steps_left"
        out[f"{head}.{name}" if head else name] = v
    return out


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: SwinTransformer) -> Dict[str, Any]:
    """Map Swin checkpoints onto these models: timm's layout and the Swin authors' (downsampling at a stage's end,
    ``head``, buffers left out, relative position tables resized: timm's own filter), each released hybrid's key
    names (module docstring), and a training script's wrapper (``model``, ``state_dict``, ``module.``)."""
    return _timm_swin_filter(_released_keys(_unwrap(state_dict)), model)


# ---- building ----------------------------------------------------------------------------------------------------
_SOFTMAX_NOTE = "Swin's window attention takes no attn_kwargs"


def _stage_grids(img_size: Union[int, Sequence[int]], patch_size: int, stages: int) -> List[Tuple[int, int]]:
    img = to_2tuple(img_size)
    grid = (img[0] // patch_size, img[1] // patch_size)
    return [((grid[0] + 2 ** i - 1) // 2 ** i, (grid[1] + 2 ** i - 1) // 2 ** i) for i in range(stages)]


def _stage_layers(variant: str, attn_type: Any, attn_kwargs: Optional[Dict[str, Any]], own_kind: str,
                  own_options: Sequence[Dict[str, Any]], kind_stages: Sequence[bool],
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
            kind_stages: Sequence[bool] = (True, True, True, True), key_encoding: bool = False,
            **kwargs) -> SwinTransformer:
    """``own_attn``: the kind the model is made for and its options per kind stage; ``kind_stages``: which stages
    run the kind; ``key_encoding``: whether the model's own kind has a key encoding on each stage's grid (the grid
    goes to every kind that takes ``pos_grid`` only then)."""
    check_model_kwargs(variant, kwargs)
    depths = kwargs.get("depths", (2, 2, 6, 2))
    out_indices = kwargs.pop("out_indices", tuple(range(len(depths))))
    if len(kind_stages) != len(depths):
        kind_stages = tuple(kind_stages[:len(depths)]) + (False,) * max(0, len(depths) - len(kind_stages))
    own_kind, own_options = own_attn or (attn_type, ())
    grids = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4), len(depths))
    if not key_encoding:
        grids = [None] * len(depths)
    stage_attn = _stage_layers(variant, attn_type, attn_kwargs, own_kind, own_options, kind_stages, grids)
    model = build_model_with_cfg(
        SoftmaxFreeSwin, variant, pretrained,
        stage_attn=stage_attn,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(flatten_sequential=True, out_indices=out_indices),
        **kwargs,
    )
    model.attn_type = attn_type
    return model


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.9,
        "interpolation": "bicubic", "fixed_input_size": True, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head.fc", **kwargs,
    }


# The released hybrids were evaluated as the Swin authors' code evaluates (resize 256 / crop 224, bicubic: crop 0.875).
default_cfgs = generate_default_cfgs({
    # No SimA-Swin weights exist: a recipe's evaluation (Swin's crop 0.9).
    **{f"sima_swin_{size}_patch4_window7_224": _cfg(license="mit") for size in ("tiny", "small", "base")},
    **{f"{kind}_swin_tiny_patch4_window7_224": _cfg(crop_pct=0.875)
       for kind in ("agent", "flatten", "inline", "slab")},
    "polaformer_swin_tiny_patch4_window7_224": _cfg(crop_pct=0.875, license="mit"),
})

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


def _agent_windows(kwargs: Dict[str, Any]) -> List[int]:
    """Agent's row and column biases are learned on each stage's grid at ``img_size`` (the longer side)."""
    grids = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4),
                         len(kwargs.get("depths", _TINY["depths"])))
    return [max(g) for g in grids]


@register_model
def agent_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Agent-Swin-T: agent attention in stages 1-3 (9, 16, 49 agents; 3×3 conv on V), Swin's window softmax in
    stage 4 (paper: 29M params, 4.5G FLOPs, 82.6% top-1)."""
    args = dict(_TINY, **kwargs)
    windows = _agent_windows(args)
    own = [dict(agent_num=n, window=w, dwc_kernel=3) for n, w in zip((9, 16, 49), windows)]
    return _create("agent_swin_tiny_patch4_window7_224", pretrained, attn_type=args.pop("attn_type", "agent"),
                   own_attn=("agent", own), kind_stages=(True, True, True, False), **args)


def _grid_linear(variant: str, pretrained: bool, kind: str, stages: Sequence[bool], kwargs: Dict[str, Any],
                 key_encoding: bool = True, **attn: Any) -> SwinTransformer:
    args = dict(_TINY, **kwargs)
    return _create(variant, pretrained, attn_type=args.pop("attn_type", kind), own_attn=(kind, [attn] * 4),
                   kind_stages=stages, key_encoding=key_encoding, **args)


_LLSS = (True, True, False, False)


@register_model
def flatten_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """FLatten-Swin-T: focused linear attention in stages 1-2 (focusing factor 3, 5×5 conv on V, key encoding),
    Swin's window softmax in stages 3-4 (paper: 29M params, 4.5G FLOPs, 82.1% top-1)."""
    return _grid_linear("flatten_swin_tiny_patch4_window7_224", pretrained, "flatten", _LLSS, kwargs,
                        focusing_factor=3.0, dwc_kernel=5)


@register_model
def inline_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """InLine-Swin-T: InLine attention in stages 1-3 (3×3 local branch), Swin's window softmax in stage 4
    (paper: 30M params, 4.5G FLOPs, 82.4% top-1)."""
    return _grid_linear("inline_swin_tiny_patch4_window7_224", pretrained, "inline", (True, True, True, False),
                        kwargs, key_encoding=False, local_kernel=3)


@register_model
def slab_swin_tiny_patch4_window7_224(pretrained: bool = False, prepbn_steps: int = 60000,
                                      **kwargs) -> SwinTransformer:
    """SLAB-Swin-T: simplified linear attention in stages 1-2 (5×5 conv on V, key encoding), Swin's window
    softmax in stages 3-4; every norm PRepBN over ``prepbn_steps`` training steps (the released 60,000; 0 keeps
    LayerNorm) (paper: 81.8% top-1)."""
    if check_count("slab_swin_tiny_patch4_window7_224", "prepbn_steps", prepbn_steps, low=0):
        kwargs = dict(kwargs, norm_layer=partial(TokenPRepBN, steps=prepbn_steps, eps=1e-5))
    return _grid_linear("slab_swin_tiny_patch4_window7_224", pretrained, "slab", _LLSS, kwargs, dwc_kernel=5)


@register_model
def polaformer_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """PolaFormer-Swin-T: polarity-aware linear attention in stages 1-2 (α 4, 5×5 conv on V, key encoding, gate),
    Swin's window softmax in stages 3-4 (paper: 82.6% top-1)."""
    return _grid_linear("polaformer_swin_tiny_patch4_window7_224", pretrained, "polaformer", _LLSS, kwargs,
                        alpha=4.0, dwc_kernel=5)
