"""XCiT backbones with SimA (the official SimA model zoo), and the XCiT layout any attention kind plugs into.

:class:`XCiTBackbone` is XCiT's layout (conv stem with BatchNorm, positional encoding, blocks of
attention → LPI → MLP with layer scale, two class-attention layers, final LayerNorm) where the token attention is
the registry module named by ``attn_type`` (``simattn.attention``), so ``attn_type='xca'`` is XCiT itself and
``attn_type='sima'`` is SimA's network; hook points such as ``SimAAttention.qk_hook`` are reachable as
``model.blocks[i].attn.qk_hook``. Class attention is softmax (CaiT/XCiT) or, for SimA, softmax-free as in the
official code: q and k of all tokens (CLS included) are l1-normalized over tokens (eps 1e-6) and the CLS query's
dot products with every key weight the values. The UFO-ViT family (``ufo_vit.py``) is the same backbone with
XNorm attention and a learned positional encoding.

Registered models keep the official names: ``sima_{nano,tiny,small}_12_p{16,8}`` and
``sima_{tiny,small,medium,large}_24_p{16,8}``, and SimA's Table 2 baselines in XCiT-S12/16:
``efficient_xcit_small_12_p16`` (Efficient Attention) and ``cosformer_xcit_small_12_p16`` (CosFormer without
re-weighting; a kind is looked up when the model is built). Every one takes ``attn_type=``, ``attn_kwargs=`` (that
kind's options) and ``cls_attn_type=`` ('softmax' | 'sima'; default 'sima' for SimA, softmax otherwise).
Any input size that is a multiple of the patch size works (the Fourier encoding is recomputed per grid).

Checkpoints: :func:`checkpoint_filter_fn` maps the official SimA/XCiT layout (``pos_embeder.``, fused
class-attention ``qkv``, held under ``model``) and timm's XCiT layout (``pos_embed.``, split q/k/v,
``attn.temperature``) onto these models; keys that still do not fit are reported by name by
``simattn.utils.io.load_weights``.
"""
import math
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import nn

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, get_device_dtype, register_notrace_module, resample_abs_pos_embed, to_2tuple, \
    trunc_normal_
from timm.models import checkpoint, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models.cait import ClassAttn
from timm.models.xcit import LPI, ClassAttentionBlock as _TimmClassAttentionBlock, ConvPatchEmbed, \
    PositionalEncodingFourier

from ._build import build_family_model
from ._checks import image_batch_error
from ..attention import HookPoint, attention_class, fx_call_whole, fx_tracing, no_autocast
from ..attention.sima import sima_l1_norms
from ..attention.softmax import softmax_weights
from ._head import TokenPoolHead
from ._kinds import kind_options

# FX records the resampling as one call: it branches on sizes in Python
torch.fx.wrap("resample_abs_pos_embed")

__all__ = [
    "XCiTBackbone", "XCiTBlock", "ClassAttention", "ClassAttentionBlock", "sima_class_attention_weights",
    "checkpoint_filter_fn", "create_xcit_backbone", "xcit_cfg", "CLASS_ATTENTION_KINDS", "POS_EMBED_TYPES",
]

CLASS_ATTENTION_KINDS = ("softmax", "sima")
POS_EMBED_TYPES = ("fourier", "learned", "none")
_PATCH_SIZES = (8, 16)  # the conv stems XCiT defines


def sima_class_attention_weights(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """SimA's class-attention weights (B, H, 1, N): q̂₀ · k̂ⱼ with q̂, k̂ l1-normalized over all N tokens.

    q, k are (B, H, N, d) with the CLS token at index 0. As in SimA's blocks, the normalization is folded into the
    CLS query (q₀ / s_q / s_k, each norm dividing on its own, so no intermediate leaves fp16's range where the
    result does not), so q̂ and k̂ are never materialized; computed in fp32 (norms over many tokens) even under
    autocast.
    """
    with no_autocast(q):
        return _sima_cls_weights(q, k, eps)


def _sima_cls_weights(q: torch.Tensor, k: torch.Tensor, eps: float) -> torch.Tensor:
    s_q, s_k = sima_l1_norms(q, eps), sima_l1_norms(k, eps)  # (B, H, d), fp32 (fp64 for fp64 inputs)
    q_cls = q[:, :, :1].to(s_q.dtype) / s_q.unsqueeze(-2) / s_k.unsqueeze(-2)
    return q_cls @ k.to(s_q.dtype).transpose(-2, -1)


@register_notrace_module  # SimA's kind folds norms in fp32 with autocast checks in Python
class ClassAttention(ClassAttn):
    """Class attention (the CLS query over all tokens) with timm's parameters (``q``, ``k``, ``v``, ``proj``).

    ``kind='softmax'``: CaiT/XCiT's softmax(q₀kᵀ/√d) (timm's fused path unless observed). ``kind='sima'``: the
    official SimA class attention, softmax-free (see :func:`sima_class_attention_weights`). Both kinds drop
    entries of the (B, H, 1, N) weights with ``attn_drop`` in training, as the official code does;
    ``attn_weights`` is a hook point on those weights.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.,
                 proj_drop: float = 0., *, kind: str = "softmax", eps: float = 1e-6, **dd) -> None:
        if kind not in CLASS_ATTENTION_KINDS:
            raise ValueError(f"unknown class attention {kind!r}; expected one of {', '.join(CLASS_ATTENTION_KINDS)}")
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop, **dd)
        self.kind = kind
        self.eps = eps
        self.attn_weights = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) with the CLS token first → the new CLS token (B, 1, C)."""
        if not torch.jit.is_scripting():
            traced = fx_call_whole(self, (x,), {})
            if traced is not None:
                return traced
        B, N, C = x.shape
        k = self.k(x).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
        v = self.v(x).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
        if torch.jit.is_scripting():  # the weights as such; autocast handling and the hook point are Python
            if self.kind == "sima":
                q = self.q(x).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
                weights = _sima_cls_weights(q, k, self.eps)
            else:
                q = self.q(x[:, :1]).reshape(B, 1, self.num_heads, C // self.num_heads).transpose(1, 2)
                weights = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x_cls = (self.attn_drop(weights) @ v.to(weights.dtype)).to(v.dtype)
        else:
            x_cls = self._attend_python(x, k, v)
        x_cls = x_cls.transpose(1, 2).reshape(B, 1, C)
        return self.proj_drop(self.proj(x_cls))

    def _attend_python(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        if self.kind == "sima":
            # Every token's query is needed: the l1 norms over tokens scale the CLS query.
            q = self.q(x).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
            weights = self.attn_weights(sima_class_attention_weights(q, k, self.eps))
            with no_autocast(v):  # weights lie in [-d, d]: keep the product in fp32
                return (self.attn_drop(weights) @ v.to(weights.dtype)).to(v.dtype)
        q = self.q(x[:, :1]).reshape(B, 1, self.num_heads, C // self.num_heads).transpose(1, 2)
        if self.fused_attn and not self.attn_weights.has_hooks:  # timm's fused path
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.)
        weights = self.attn_weights(softmax_weights(q, k, scale=self.scale))
        return self.attn_drop(weights) @ v

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, num_heads={self.num_heads}"


class ClassAttentionBlock(_TimmClassAttentionBlock):
    """timm's XCiT class-attention block (layer scale, ``tokens_norm``) with :class:`ClassAttention` inside."""

    def __init__(self, dim: int, num_heads: int, *, kind: str = "softmax", qkv_bias: bool = False,
                 attn_drop: float = 0., proj_drop: float = 0., device=None, dtype=None, **kwargs) -> None:
        dd = {"device": device, "dtype": dtype}
        super().__init__(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop, **dd, **kwargs)
        # timm's block hard-wires its ClassAttn; swap in ours (same parameter names, so timm weights still fit).
        self.attn = ClassAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop,
                                   kind=kind, **dd)


class XCiTBlock(nn.Module):
    """x += γ₁·attn(LN₁x); x += γ₃·LPI(LN₃x); x += γ₂·MLP(LN₂x) — XCiT's block with any registry attention.

    Parameter names are XCiT's (``norm1 attn norm3 local_mp norm2 mlp gamma1 gamma3 gamma2``), so official and
    timm XCiT weights map one to one. ``attn_layer`` is a registry class (``simattn.attention.attention_class``).
    """

    __constants__ = ["attn_uses_grid"]  # TorchScript compiles only the call that is made

    def __init__(self, dim: int, num_heads: int, attn_layer: Type[nn.Module], mlp_ratio: float = 4.,
                 qkv_bias: bool = False, proj_drop: float = 0., attn_drop: float = 0., drop_path: float = 0.,
                 act_layer: Type[nn.Module] = nn.GELU, norm_layer: Type[nn.Module] = nn.LayerNorm,
                 eta: float = 1., device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = attn_layer(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop,
                               proj_drop=proj_drop, **dd)
        # Kinds that use the 2-D token grid (SOFT's landmark pooling) take it as ``grid_size``.
        self.attn_uses_grid = bool(getattr(self.attn, "uses_grid", False))
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm3 = norm_layer(dim, **dd)
        self.local_mp = LPI(in_features=dim, act_layer=act_layer, **dd)
        self.drop_path3 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop,
                       **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.gamma1 = nn.Parameter(eta * torch.ones(dim, **dd))
        self.gamma3 = nn.Parameter(eta * torch.ones(dim, **dd))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim, **dd))

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        if self.attn_uses_grid:  # a constant in TorchScript, so the other call is not compiled
            x = x + self.drop_path1(self.gamma1 * self.attn(self.norm1(x), grid_size=(H, W)))
        else:
            x = x + self.drop_path1(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path3(self.gamma3 * self.local_mp(self.norm3(x), H, W))
        x = x + self.drop_path2(self.gamma2 * self.mlp(self.norm2(x)))
        return x


class XCiTBackbone(TokenPoolHead, nn.Module):
    """XCiT's network with a pluggable token attention (``attn_type``) and class attention (``cls_attn_type``).

    Args:
        img_size: default input size (sets the learned positional encoding's grid; any multiple of the patch
            size runs).
        patch_size: 16 or 8 (XCiT's conv stems: four or three 3×3 stride-2 conv + BatchNorm, GELU between).
        attn_type: a registered attention kind (``simattn.list_attentions()``) or class; ``attn_kwargs`` its
            options (e.g. ``{'order': 'kv_first'}`` for SimA).
        cls_attn_type: 'softmax' or 'sima'; None picks 'sima' for SimA and 'softmax' for every other kind.
        pos_embed_type: 'fourier' (XCiT/SimA, recomputed for any grid), 'learned' (UFO-ViT, resampled for other
            grids) or 'none'.
        eta: layer-scale initial value; tokens_norm: normalize all tokens (not only CLS) in class attention.
        dynamic_img_size: take any input size that is a multiple of the patch size (a learned positional
            encoding is resampled to each input's grid); False takes ``img_size`` only (see :meth:`set_input_size`).
        drop_path_rate: stochastic depth, constant across the blocks as in the official code (class attention
            has none).
    """

    __constants__ = ["learned_pos_embed"]  # TorchScript compiles only the positional encoding in use

    def __init__(
            self,
            img_size: Union[int, Tuple[int, int]] = 224,
            patch_size: int = 16,
            in_chans: int = 3,
            num_classes: int = 1000,
            global_pool: str = "token",
            embed_dim: int = 768,
            depth: int = 12,
            num_heads: int = 12,
            mlp_ratio: float = 4.,
            qkv_bias: bool = True,
            attn_type: Union[str, Type[nn.Module]] = "sima",
            attn_kwargs: Optional[Dict[str, Any]] = None,
            cls_attn_type: Optional[str] = None,
            cls_attn_layers: int = 2,
            pos_embed_type: str = "fourier",
            drop_rate: float = 0.,
            pos_drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            attn_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            act_layer: Optional[Type[nn.Module]] = None,
            norm_layer: Optional[Type[nn.Module]] = None,
            eta: float = 1.,
            tokens_norm: bool = False,
            dynamic_img_size: bool = True,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if patch_size not in _PATCH_SIZES:
            raise ValueError(f"XCiT conv stem supports patch_size 8 or 16, got {patch_size}")
        if global_pool not in ("", "avg", "token"):
            raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if pos_embed_type not in POS_EMBED_TYPES:
            raise ValueError(f"unknown pos_embed_type {pos_embed_type!r}; expected one of {', '.join(POS_EMBED_TYPES)}")
        img_size = to_2tuple(img_size)
        if img_size[0] % patch_size or img_size[1] % patch_size:
            raise ValueError(f"img_size {img_size} must be a multiple of the patch size {patch_size}")
        attn_layer = attention_class(attn_type, **(attn_kwargs or {}))
        self.attn_type = attn_layer.attn_name
        if cls_attn_type is None:
            cls_attn_type = "sima" if self.attn_type == "sima" else "softmax"
        if cls_attn_type not in CLASS_ATTENTION_KINDS:
            raise ValueError(f"unknown cls_attn_type {cls_attn_type!r}; expected one of {', '.join(CLASS_ATTENTION_KINDS)}")
        self.cls_attn_type = cls_attn_type
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        act_layer = act_layer or nn.GELU

        self.num_classes = num_classes
        self.in_chans = in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.global_pool = global_pool
        self.grad_checkpointing = False
        self.patch_size = patch_size
        self.img_size = img_size
        self.grid_size = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.dynamic_img_size = dynamic_img_size
        self.num_prefix_tokens = 1

        self.patch_embed = ConvPatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                          embed_dim=embed_dim, act_layer=act_layer, **dd)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd))
        self.pos_embed_type = pos_embed_type
        self.learned_pos_embed = pos_embed_type == "learned"
        if pos_embed_type == "fourier":
            self.pos_embed = PositionalEncodingFourier(dim=embed_dim, **dd)
        elif pos_embed_type == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.grid_size[0] * self.grid_size[1], embed_dim, **dd))
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(p=pos_drop_rate)

        self.blocks = nn.ModuleList([
            XCiTBlock(embed_dim, num_heads, attn_layer, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                      proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=drop_path_rate,
                      act_layer=act_layer, norm_layer=norm_layer, eta=eta, **dd)
            for _ in range(depth)])
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self.cls_attn_blocks = nn.ModuleList([
            ClassAttentionBlock(embed_dim, num_heads, kind=cls_attn_type, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, act_layer=act_layer,
                                norm_layer=norm_layer, eta=eta, tokens_norm=tokens_norm, **dd)
            for _ in range(cls_attn_layers)])
        self.norm = norm_layer(embed_dim, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()

        trunc_normal_(self.cls_token, std=.02)
        if pos_embed_type == "learned":
            trunc_normal_(self.pos_embed, std=.02)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    # ---- timm contract -------------------------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """Full names of parameters exempt from weight decay: class token, positional encoding, and whatever the
        attention modules declare (XCA's temperature, XNorm's γ)."""
        names = {n for n, _ in self.named_parameters() if n == "cls_token" or n.startswith("pos_embed")}
        for prefix, module in self.named_modules():
            if module is not self and hasattr(module, "no_weight_decay"):
                names |= {f"{prefix}.{n}" for n in module.no_weight_decay()}
        return names

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r"^cls_token|pos_embed|patch_embed",
            blocks=r"^blocks\.(\d+)",
            cls_attn_blocks=[(r"^cls_attn_blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("", "avg", "token"):
                raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
            if global_pool == "token" and self.cls_attn_blocks is None:
                raise ValueError("token pooling needs the class token, which was pruned")
            self.global_pool = global_pool
        dd = get_device_dtype(self)
        self.head = nn.Linear(self.num_features, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    @torch.jit.ignore
    def set_input_size(self, img_size: Union[int, Tuple[int, int]], dynamic_img_size: bool = False) -> None:
        """Lay the model out for ``img_size``: a learned positional encoding is resampled to its grid once, here,
        and with ``dynamic_img_size=False`` inputs of that size only are taken, with no resampling in forward."""
        img_size = to_2tuple(img_size)
        p = self.patch_size
        if img_size[0] % p or img_size[1] % p or min(img_size) < p:
            raise ValueError(f"img_size {img_size} must be a positive multiple of the patch size {p}")
        grid_size = (img_size[0] // p, img_size[1] // p)
        if isinstance(self.pos_embed, nn.Parameter) and grid_size != self.grid_size:
            with torch.no_grad():
                resampled = resample_abs_pos_embed(self.pos_embed, new_size=list(grid_size),
                                                   old_size=list(self.grid_size), num_prefix_tokens=0)
            self.pos_embed = nn.Parameter(resampled, requires_grad=self.pos_embed.requires_grad)
        self.img_size, self.grid_size, self.dynamic_img_size = img_size, grid_size, dynamic_img_size

    # ---- forward pieces ------------------------------------------------------------------------------------
    def _pos_encoding(self, Hp: int, Wp: int) -> Optional[torch.Tensor]:
        """(1, Hp·Wp, C) positional encoding for a Hp×Wp grid."""
        if self.pos_embed is None:
            return None
        if self.learned_pos_embed:
            if not self.dynamic_img_size:  # fixed input size (checked): no resampling op in a captured graph
                return self.pos_embed
            return resample_abs_pos_embed(self.pos_embed, new_size=[Hp, Wp],
                                          old_size=[self.grid_size[0], self.grid_size[1]], num_prefix_tokens=0)
        return self.pos_embed(1, Hp, Wp).flatten(2).transpose(1, 2)

    def _check_input(self, x: torch.Tensor) -> None:
        if fx_tracing():
            return
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise image_batch_error(type(self).__name__, self.in_chans, x.shape)
        H, W = x.shape[-2:]
        p = self.patch_size
        if H % p or W % p or H < p or W < p:
            raise ValueError(f"{type(self).__name__}: input size {H}x{W} must be a positive multiple of the patch "
                             f"size {p}")
        if not self.dynamic_img_size and (H, W) != self.img_size:
            raise ValueError(f"{type(self).__name__}: input size {H}x{W} differs from the fixed input size "
                             f"{self.img_size[0]}x{self.img_size[1]} (dynamic_img_size=False)")

    def _embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Images (B, C, H, W) → patch tokens (B, N, C) with positions added, and the grid (Hp, Wp)."""
        if not torch.jit.is_scripting():
            self._check_input(x)
        x, (Hp, Wp) = self.patch_embed(x)
        pos = self._pos_encoding(Hp, Wp)
        if pos is not None:
            x = x + pos.to(x.dtype)
        return self.pos_drop(x), (Hp, Wp)

    def _run(self, block: nn.Module, *args) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint(block, *args)
        return block(*args)

    def forward_cls(self, x: torch.Tensor, return_cls: bool = False):
        """Prepend the class token and run the class-attention blocks; ``return_cls`` also returns the CLS token
        after each block (un-normalized)."""
        x, cls_outputs = self._forward_cls(x)
        return (x, cls_outputs) if return_cls else x

    def _forward_cls(self, x: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        cls_outputs: List[torch.Tensor] = []
        for blk in self.cls_attn_blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
            cls_outputs.append(x[:, 0])
        return x, cls_outputs

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images → normalized tokens (B, 1 + N, C), CLS first (patch tokens only once class attention is pruned)."""
        x, (Hp, Wp) = self._embed(x)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, Hp, Wp)
            else:
                x = blk(x, Hp, Wp)
        if self.cls_attn_blocks is not None:
            x, _ = self._forward_cls(x)
        return self.norm(x)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            return_prefix_tokens: bool = False,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = "NCHW",
            intermediates_only: bool = False,
    ) -> Union[List[Any], Tuple[torch.Tensor, List[Any]]]:
        """Patch tokens after the chosen blocks (int = last n, list = those indices, None = all); the arguments
        are those of timm's ``VisionTransformer.forward_intermediates`` (its masks and dict output aside).

        ``output_fmt`` 'NCHW' gives (B, C, Hp, Wp) maps, 'NLC' (B, N, C) tokens; ``norm`` applies the final norm.
        ``return_prefix_tokens`` makes each intermediate a (features, prefix tokens (B, 1, C)) pair, as timm's ViT
        does (segmentation_models_pytorch's DPT asks for them): the class token joins only in class attention, so
        its state after any block is the learned ``cls_token`` itself (normalized too with ``norm``). Without a
        class token (pruned head), or under TorchScript, the intermediates stay plain tensors, as in timm.
        Returns the intermediates alone, or (final normalized tokens, intermediates).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        B = x.shape[0]
        x, (Hp, Wp) = self._embed(x)
        blocks = self.blocks[:max_index + 1] if stop_early or intermediates_only else self.blocks
        intermediates = []
        for i, blk in enumerate(blocks):
            x = self._run(blk, x, Hp, Wp)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        if output_fmt == "NCHW":
            intermediates = [y.reshape(B, Hp, Wp, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if not torch.jit.is_scripting() and return_prefix_tokens and self.cls_token is not None:
            cls = self.cls_token.expand(B, -1, -1)
            cls = self.norm(cls) if norm else cls
            intermediates = [(y, cls) for y in intermediates]
        if intermediates_only:
            return intermediates
        if self.cls_attn_blocks is not None:
            x = self.forward_cls(x)
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last wanted index (and the class-attention head) for feature extraction."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.cls_attn_blocks = None
            self.cls_token = None
            self.num_prefix_tokens = 0
            self.reset_classifier(0, "")
        return take_indices

    def forward_linear_probe_features(self, x: torch.Tensor) -> torch.Tensor:
        """The XCiT/SimA linear-probe features (B, 4·C): the CLS outputs of the last two class-attention layers and
        the average-pooled patch tokens of the last two attention blocks, each after the final norm (as DINO's
        ``get_intermediate_layers`` normalizes)."""
        if self.cls_attn_blocks is None or len(self.cls_attn_blocks) < 2 or len(self.blocks) < 2:
            raise ValueError("linear-probe features need at least 2 blocks and 2 class-attention layers")
        x, (Hp, Wp) = self._embed(x)
        last_blocks = []
        for i, blk in enumerate(self.blocks):
            x = self._run(blk, x, Hp, Wp)
            if i >= len(self.blocks) - 2:
                last_blocks.append(self.norm(x).mean(dim=1))
        _, cls_outputs = self.forward_cls(x, return_cls=True)
        return torch.cat([self.norm(c) for c in cls_outputs[-2:]] + last_blocks, dim=-1)


# ---- checkpoints ---------------------------------------------------------------------------------------------
def checkpoint_filter_fn(state_dict: Dict[str, Any], model: XCiTBackbone) -> Dict[str, torch.Tensor]:
    """Map official SimA / official XCiT / timm XCiT state dicts onto :class:`XCiTBackbone` names.

    Unwraps ``model``; renames ``pos_embeder.`` → ``pos_embed.``; splits a fused class-attention ``qkv`` into
    ``q``/``k``/``v``; resamples a learned positional encoding to the model's grid. Nothing is dropped silently:
    e.g. ``attn.temperature`` from an XCA checkpoint stays and is reported as unexpected by a SimA model.
    """
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    own = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        if key.startswith("pos_embeder."):
            key = "pos_embed." + key[len("pos_embeder."):]
        if key.startswith("cls_attn_blocks.") and ".attn.qkv." in key and key.replace(".qkv.", ".q.") in own:
            for name, part in zip("qkv", value.chunk(3, dim=0)):
                out[key.replace(".qkv.", f".{name}.")] = part.contiguous()
            continue
        if key == "pos_embed" and key in own and isinstance(model.pos_embed, nn.Parameter) \
                and value.shape != own[key].shape and value.dim() == 3:
            old = int(math.isqrt(value.shape[1]))
            value = resample_abs_pos_embed(value, new_size=model.grid_size, old_size=(old, old), num_prefix_tokens=0)
        out[key] = value
    return out


def create_xcit_backbone(variant: str, pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """Build a registered :class:`XCiTBackbone` variant through timm (pretrained cfg, features_only, filter)."""
    return build_family_model(XCiTBackbone, variant, pretrained, kwargs, checkpoint_filter_fn, 3)


def xcit_cfg(**kwargs) -> Dict[str, Any]:
    """timm pretrained cfg for XCiT-layout models (224, bicubic, ImageNet mean/std, real first conv/classifier)."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 1.0,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj.0.0", "classifier": "head",
        "license": "apache-2.0", **kwargs,
    }


# (dim, depth, heads, eta, tokens_norm) per size, from the official model zoo.
_SIZES = {
    "nano_12": (128, 12, 4, 1.0, False),
    "tiny_12": (192, 12, 4, 1.0, True),
    "small_12": (384, 12, 8, 1.0, True),
    "tiny_24": (192, 24, 4, 1e-5, True),
    "small_24": (384, 24, 8, 1e-5, True),
    "medium_24": (512, 24, 8, 1e-5, True),
    "large_24": (768, 24, 16, 1e-5, True),
}

# No SimA weights were ever published: the configs describe the evaluation (224, crop 1.0, bicubic).
default_cfgs = generate_default_cfgs({
    **{f"sima_{size}_p{p}": xcit_cfg() for size in _SIZES for p in (16, 8)},
    "efficient_xcit_small_12_p16": xcit_cfg(),
    "cosformer_xcit_small_12_p16": xcit_cfg(),
})


def _size_args(size: str, patch_size: int) -> Dict[str, Any]:
    """The constructor arguments of one of :data:`_SIZES` at ``patch_size``."""
    dim, depth, heads, eta, tokens_norm = _SIZES[size]
    return dict(patch_size=patch_size, embed_dim=dim, depth=depth, num_heads=heads, eta=eta, tokens_norm=tokens_norm)


def _sima(size: str, patch_size: int, pretrained: bool, kwargs: Dict[str, Any]) -> XCiTBackbone:
    args = dict(_size_args(size, patch_size), attn_type="sima")
    return create_xcit_backbone(f"sima_{size}_p{patch_size}", pretrained, **dict(args, **kwargs))


@register_model
def sima_nano_12_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-N12/16 with SimA (dim 128, 4 heads, depth 12)."""
    return _sima("nano_12", 16, pretrained, kwargs)


@register_model
def sima_nano_12_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-N12/8 with SimA (dim 128, 4 heads, depth 12)."""
    return _sima("nano_12", 8, pretrained, kwargs)


@register_model
def sima_tiny_12_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-T12/16 with SimA (dim 192, 4 heads, depth 12)."""
    return _sima("tiny_12", 16, pretrained, kwargs)


@register_model
def sima_tiny_12_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-T12/8 → SimA of the paper (6.71M params, 79.4% top-1)."""
    return _sima("tiny_12", 8, pretrained, kwargs)


@register_model
def sima_small_12_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S12/16 → SimA of the paper (26.25M params, 82.1% top-1)."""
    return _sima("small_12", 16, pretrained, kwargs)


@register_model
def sima_small_12_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S12/8 with SimA (dim 384, 8 heads, depth 12)."""
    return _sima("small_12", 8, pretrained, kwargs)


@register_model
def sima_tiny_24_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-T24/16 → SimA of the paper (12.12M params, 79.8% top-1)."""
    return _sima("tiny_24", 16, pretrained, kwargs)


@register_model
def sima_tiny_24_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-T24/8 with SimA (dim 192, 4 heads, depth 24)."""
    return _sima("tiny_24", 8, pretrained, kwargs)


@register_model
def sima_small_24_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S24/16 with SimA (dim 384, 8 heads, depth 24)."""
    return _sima("small_24", 16, pretrained, kwargs)


@register_model
def sima_small_24_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S24/8 with SimA (dim 384, 8 heads, depth 24)."""
    return _sima("small_24", 8, pretrained, kwargs)


@register_model
def sima_medium_24_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-M24/16 with SimA (dim 512, 8 heads, depth 24)."""
    return _sima("medium_24", 16, pretrained, kwargs)


@register_model
def sima_medium_24_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-M24/8 with SimA (dim 512, 8 heads, depth 24)."""
    return _sima("medium_24", 8, pretrained, kwargs)


@register_model
def sima_large_24_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-L24/16 with SimA (dim 768, 16 heads, depth 24)."""
    return _sima("large_24", 16, pretrained, kwargs)


@register_model
def sima_large_24_p8(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-L24/8 with SimA (dim 768, 16 heads, depth 24)."""
    return _sima("large_24", 8, pretrained, kwargs)


def _xcit_small_12_p16_with(kind: str, variant: str, pretrained: bool, kwargs: Dict[str, Any],
                            attn_kwargs: Optional[Dict[str, Any]] = None) -> XCiTBackbone:
    """XCiT-S12/16's network with token attention ``kind`` and softmax class attention (SimA's Table 2); another
    ``attn_type`` leaves ``kind``'s own ``attn_kwargs`` out."""
    args = {**_size_args("small_12", 16), "attn_type": kind, **kwargs}
    args["attn_kwargs"] = kind_options(variant, kind, attn_kwargs, args["attn_type"], args.get("attn_kwargs"))
    return create_xcit_backbone(variant, pretrained, **args)


@register_model
def efficient_xcit_small_12_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S12/16 with Efficient Attention (SimA Table 2: 80.9% top-1)."""
    return _xcit_small_12_p16_with("efficient", "efficient_xcit_small_12_p16", pretrained, kwargs)


@register_model
def cosformer_xcit_small_12_p16(pretrained: bool = False, **kwargs) -> XCiTBackbone:
    """XCiT-S12/16 with CosFormer without re-weighting (SimA Table 2: 76.1% top-1)."""
    return _xcit_small_12_p16_with("cosformer", "cosformer_xcit_small_12_p16", pretrained, kwargs,
                                   attn_kwargs={"reweight": False})
