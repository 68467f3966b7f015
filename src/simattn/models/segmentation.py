"""Semantic segmentation networks: any registered backbone → four feature maps (strides 4, 8, 16, 32) → a decoder
(Semantic FPN or UperNet, as mmseg builds them) → per-pixel class logits at the input size.

The four maps (:class:`FeaturePyramid`), as XCiT's dense-prediction code makes them:

- a plain transformer (DeiT, XCiT, ReLU-ViT, UFO-ViT: every block at the patch stride) gives the token maps of four
  blocks, each resampled to one level by 2× transposed convolutions (finer), identity or max pooling (coarser);
  for patch 16 that is ConvT-BN-GELU-ConvT, ConvT, identity, MaxPool(2), channels staying at ``embed_dim``;
- a pyramid (CvT, SOFT) gives its stages; a level no stage has (CvT stops at stride 16) is pooled or upsampled
  from the nearest stage the same way.

Decoders are mmseg's, composed of torchvision's and smp's layers where these are the same network: Semantic FPN
(:class:`SemanticFPNDecoder`: torchvision's ``FeaturePyramidNetwork``, which is mmseg's ``FPN`` neck, and mmseg's
``FPNHead``) and UperNet (smp's ``UPerNetDecoder``: mmseg's ``UPerHead``, PPM + FPN, with a LayerNorm on each level,
which mmseg's Swin backbones apply to their outputs), followed by dropout, a 1×1 classifier at stride 4 and a
bilinear upsampling to the input. UperNet adds an auxiliary FCN head on the
stride-16 level while training (its loss is weighted by the task). In ``train()`` mode with an auxiliary head the
forward returns ``(logits, aux_logits)``; otherwise the logits alone (what export and evaluation take).

Registered with timm as ``semantic_fpn`` and ``upernet``: ``create_model('semantic_fpn',
backbone='sima_deit_small_patch16_224', num_classes=150, attn_type='softmax')``; keyword arguments the segmenter
does not take go to the backbone, so ``attn_type`` swaps the attention as it does for a classifier.

The released ADE20K models are tags (``semantic_fpn.agent_pvt_tiny_ade20k``, ...): a tag builds the network of the
authors' mmseg config, and :func:`checkpoint_filter_fn` maps mmseg's files (``backbone.*`` through the backbone
family's own filter, ``neck.*``, ``decode_head.*``, ``auxiliary_head.*``) onto it.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model
from torchvision.ops import Conv2dNormActivation, FeaturePyramidNetwork

from ..attention import eager
from .released import PAPERS, TSINGHUA, unwrap, with_tag_args

__all__ = ["scale_adapter", "FeaturePyramid", "FCNHead", "Segmenter", "LEVEL_STRIDES", "HEADS",
           "evenly_spaced_blocks"]

#: the output strides of the four levels every decoder takes
LEVEL_STRIDES = (4, 8, 16, 32)
#: registered segmenter name → decoder
HEADS = {"semantic_fpn": "fpn", "upernet": "upernet"}


def scale_adapter(channels: int, in_stride: int, out_stride: int,
                  norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d) -> nn.Module:
    """Resample a (B, C, H, W) map from ``in_stride`` to ``out_stride`` (their ratio must be a power of 2):
    chained 2× transposed convs with norm + GELU between them to go finer, max pooling to go coarser."""
    steps = math.log2(in_stride / out_stride)
    if steps != int(steps):
        raise ValueError(f"pyramid stride {out_stride} is not a power-of-2 rescale of the backbone stride {in_stride}")
    steps = int(steps)
    if steps == 0:
        return nn.Identity()
    if steps < 0:
        return nn.MaxPool2d(kernel_size=2 ** -steps, stride=2 ** -steps)
    layers: List[nn.Module] = []
    for i in range(steps):
        if i:
            layers += [norm_layer(channels), nn.GELU()]
        layers.append(nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2))
    return nn.Sequential(*layers)


def evenly_spaced_blocks(depth: int, count: int = 4) -> List[int]:
    """``count`` block indices spread evenly over ``depth`` blocks, the last block included (12 → 2, 5, 8, 11)."""
    if depth < count:
        raise ValueError(f"a plain backbone needs at least {count} blocks for {count} feature levels, it has {depth}")
    return [round(depth * (k + 1) / count) - 1 for k in range(count)]


def _is_pyramid(feature_info: Sequence[Dict[str, Any]]) -> bool:
    return len({int(f["reduction"]) for f in feature_info}) > 1


def _source_for(reductions: Sequence[int], stride: int) -> int:
    """The tapped feature a level is made from: the one at that stride, else the nearest finer one (pooled down),
    else the coarsest (upsampled)."""
    finer = [i for i, r in enumerate(reductions) if r <= stride]
    return max(finer, key=lambda i: reductions[i]) if finer else min(range(len(reductions)),
                                                                      key=lambda i: reductions[i])


class FeaturePyramid(nn.Module):
    """A timm backbone as maps at ``strides`` (default 4, 8, 16, 32): see the module docstring.

    Args:
        body: a timm model with ``forward_intermediates`` and ``feature_info`` (built with ``num_classes=0``). Blocks
            after the last tapped one, its final norm and head are pruned (they would get no gradient, which DDP
            rejects).
        out_indices: blocks (plain) or stages (pyramid) to tap, increasing; a plain backbone needs one per level,
            default four evenly spaced blocks; a pyramid defaults to all its stages.
        strides: output stride of each level.
        norm_layer: the norm between transposed convs.
        channels_last: eager forwards give the levels in channels-last layout (same values). The transposed convs
            and the convolutions of a decoder after them run 1.5-3× faster so (oneDNN on CPU, cuDNN on GPU).
    """

    def __init__(self, body: nn.Module, out_indices: Optional[Sequence[int]] = None,
                 strides: Sequence[int] = LEVEL_STRIDES,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d, channels_last: bool = False) -> None:
        super().__init__()
        if not hasattr(body, "forward_intermediates") or not getattr(body, "feature_info", None):
            raise ValueError(f"{type(body).__name__} has no forward_intermediates/feature_info; a dense-prediction "
                             "backbone must be a timm model that supports features")
        depth = len(body.feature_info)
        pyramid = _is_pyramid(body.feature_info)
        if out_indices is None:
            out_indices = list(range(depth)) if pyramid else evenly_spaced_blocks(depth, len(strides))
        out_indices = [int(i) for i in out_indices]
        if sorted(set(out_indices)) != out_indices or out_indices[0] < 0 or out_indices[-1] >= depth:
            raise ValueError(f"out_indices {out_indices} must be increasing {'stage' if pyramid else 'block'} "
                             f"indices in [0, {depth})")
        info = [body.feature_info[i] for i in out_indices]
        reductions = [int(f["reduction"]) for f in info]
        if pyramid:
            sources = [_source_for(reductions, s) for s in strides]
        elif len(out_indices) != len(strides):
            raise ValueError(f"{len(out_indices)} out_indices for {len(strides)} levels: a plain backbone taps "
                             "one block per level")
        else:
            sources = list(range(len(strides)))
        if hasattr(body, "prune_intermediate_layers"):
            body.prune_intermediate_layers(out_indices, prune_norm=True, prune_head=True)
        self.body = body
        self.out_indices = out_indices
        self.sources = sources
        self.strides = [int(s) for s in strides]
        self.channels = [int(info[i]["num_chs"]) for i in sources]
        self.adapters = nn.ModuleList(scale_adapter(info[i]["num_chs"], reductions[i], s, norm_layer)
                                      for i, s in zip(sources, self.strides))
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        feats = self.body.forward_intermediates(x, indices=self.out_indices, intermediates_only=True,
                                                output_fmt="NCHW")
        if self.channels_last and eager():
            feats = [f.contiguous(memory_format=torch.channels_last) for f in feats]
        return [adapt(feats[i]) for adapt, i in zip(self.adapters, self.sources)]


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> nn.Module:
    """mmcv's ``ConvModule`` with a norm: conv without bias, BatchNorm (SyncBN under DDP), ReLU; torchvision's
    block, so its tensors are ``0.weight`` and ``1.*`` where mmseg's are ``conv.weight`` and ``bn.*``."""
    return Conv2dNormActivation(in_channels, out_channels, kernel_size, padding=kernel_size // 2, inplace=False)


class FPNHead(nn.Module):
    """Semantic FPN's head (Kirillov et al.; mmseg's ``FPNHead``): per level, 3×3 conv-BN-ReLU blocks, one per
    2× step down to the finest level's stride (at least one), each followed by a 2× bilinear upsampling on the
    coarser levels; the levels summed at the finest stride."""

    def __init__(self, in_channels: Sequence[int], channels: int, strides: Sequence[int]) -> None:
        super().__init__()
        self.scale_heads = nn.ModuleList()
        for level_channels, stride in zip(in_channels, strides):
            steps = max(1, int(math.log2(stride) - math.log2(strides[0])))
            layers: List[nn.Module] = []
            for k in range(steps):
                layers.append(conv_bn_relu(level_channels if k == 0 else channels, channels, 3))
                if stride != strides[0]:
                    layers.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False))
            self.scale_heads.append(nn.Sequential(*layers))

    def forward(self, levels: List[torch.Tensor]) -> torch.Tensor:
        out = self.scale_heads[0](levels[0])
        for head, level in zip(self.scale_heads[1:], levels[1:]):
            out = out + head(level)
        return out


class SemanticFPNDecoder(nn.Module):
    """Semantic FPN's decoder: the FPN neck (torchvision's ``FeaturePyramidNetwork``: 1×1 laterals, top-down
    nearest upsampling and sums, 3×3 output convs; mmseg's ``FPN`` with ``num_outs`` = the levels) and
    :class:`FPNHead`; per-pixel features at the finest level's stride."""

    def __init__(self, in_channels: Sequence[int], pyramid_channels: int, segmentation_channels: int,
                 strides: Sequence[int]) -> None:
        super().__init__()
        self.fpn = FeaturePyramidNetwork(list(in_channels), pyramid_channels)
        self.head = FPNHead([pyramid_channels] * len(in_channels), segmentation_channels, strides)

    def forward(self, levels: List[torch.Tensor]) -> torch.Tensor:
        pyramid = self.fpn(OrderedDict((str(i), level) for i, level in enumerate(levels)))
        return self.head(list(pyramid.values()))


class FCNHead(nn.Sequential):
    """The auxiliary head of UperNet (mmseg's FCNHead with one conv): 3×3 conv-BN-ReLU, dropout, 1×1 classifier."""

    def __init__(self, in_channels: int, channels: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__(conv_bn_relu(in_channels, channels, 3), nn.Dropout2d(dropout),
                         nn.Conv2d(channels, num_classes, 1))


class Segmenter(nn.Module):
    """Backbone → :class:`FeaturePyramid` → smp decoder → classifier; logits (B, num_classes, H, W).

    Args:
        backbone: a registered model name (built with ``num_classes=0`` and ``backbone_kwargs``).
        num_classes: classes to predict (the ignore label is not one).
        head: 'fpn' (Semantic FPN) or 'upernet'.
        out_indices: see :class:`FeaturePyramid`.
        decoder_channels: FPN pyramid width / UperNet channels (256 in XCiT's configs).
        segmentation_channels: Semantic FPN's per-level head width (128).
        dropout: before the classifier (0.1).
        aux_head: UperNet's auxiliary FCN head on the stride-16 level (default: on for UperNet).
        aux_channels: its width (256).
        drop_path_rate: the backbone's stochastic depth.
        **backbone_kwargs: the backbone's own options (``img_size``, ``attn_type``, ``patch_size``, ...).
    """

    #: its filter maps a whole segmentation checkpoint (mmseg's ``backbone.*`` beside its heads), not a backbone
    maps_whole_checkpoints = True
    #: the segmenter's own options among its kwargs (the rest are its backbone's): a recipe's keep when another
    #: backbone replaces its own
    own_options = ("head", "decoder_channels", "segmentation_channels", "dropout", "aux_head", "aux_channels")

    def __init__(self, backbone: str, num_classes: int, head: str = "fpn",
                 out_indices: Optional[Sequence[int]] = None, decoder_channels: int = 256,
                 segmentation_channels: int = 128, dropout: float = 0.1, aux_head: Optional[bool] = None,
                 aux_channels: int = 256, drop_path_rate: float = 0.0, **backbone_kwargs: Any) -> None:
        super().__init__()
        from .factory import create_model
        from ..utils.extras import require
        if head not in ("fpn", "upernet"):
            raise ValueError(f"unknown segmentation head {head!r}; expected fpn or upernet")
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        body = create_model(backbone, num_classes=0, drop_path_rate=drop_path_rate, **backbone_kwargs)
        self.backbone_name = backbone
        self.num_classes = int(num_classes)
        self.head = head
        self.attn_type = getattr(body, "attn_type", None)
        self.pretrained_cfg = dict(getattr(body, "pretrained_cfg", {}) or {})
        self.pretrained_cfg.update(num_classes=self.num_classes, classifier=("classifier.1", "aux_head.2"))
        self.neck = FeaturePyramid(body, out_indices, channels_last=True)
        if head == "fpn":
            self.decoder = SemanticFPNDecoder(self.neck.channels, decoder_channels, segmentation_channels,
                                              self.neck.strides)
            head_channels = segmentation_channels
        else:
            require("segmentation_models_pytorch", "the upernet segmentation head")
            from segmentation_models_pytorch.decoders.upernet.decoder import UPerNetDecoder
            # smp's decoders index features from stride 1: two placeholder levels (stride 1 and 2) come first
            self.decoder = UPerNetDecoder([3, 0, *self.neck.channels], encoder_depth=5,
                                          decoder_channels=decoder_channels)
            for norm in self.decoder.feature_norms:  # the levels' norms: mmseg's Swin backbones' (torch's eps)
                norm.eps = 1e-5
            head_channels = decoder_channels
        self.num_features = head_channels  # the per-pixel features the classifier takes (timm's num_features)
        self.classifier = nn.Sequential(nn.Dropout2d(dropout), nn.Conv2d(head_channels, self.num_classes, 1))
        use_aux = head == "upernet" if aux_head is None else bool(aux_head)
        self.aux_head = FCNHead(self.neck.channels[2], aux_channels, self.num_classes) if use_aux else None

    @property
    def backbone(self) -> nn.Module:
        return self.neck.body

    def forward(self, x: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        height, width = x.shape[-2], x.shape[-1]
        # any input size: zeros at the bottom and right up to the coarsest level's stride (mmseg's size_divisor),
        # the logits cropped back; an input that fits (every exported one) gets no op
        stride = max(LEVEL_STRIDES)
        pad_h, pad_w = (stride - height % stride) % stride, (stride - width % stride) % stride
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        size = x.shape[-2:]
        levels = self.neck(x)
        if self.head == "fpn":
            out = self.decoder(levels)
        else:
            out = self.decoder([x, x, *levels])  # the placeholders are skipped by the decoder
        logits = self.classifier(out)
        if eager():  # back to NCHW (the channels-last levels carry through): users get NCHW logits
            logits = logits.contiguous()
        logits = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)[..., :height, :width]
        if self.training and self.aux_head is not None:
            level = levels[2] if self.head == "fpn" else self.decoder.feature_norms[2](levels[2])  # UperNet's norm
            aux = F.interpolate(self.aux_head(level), size=size, mode="bilinear", align_corners=False)
            return logits, aux[..., :height, :width]
        return logits


# --- checkpoints -----------------------------------------------------------------------------------------------------
#: mmseg's module names (the authors' ``{'meta', 'state_dict'}`` files) → this segmenter's, for each head; mmcv's
#: ConvModule ``conv``/``bn`` are torchvision's block ``0``/``1``, and UperNet's FPN levels run coarse to fine in smp
_MMSEG_NAMES = {
    "fpn": [
        (r"^neck\.lateral_convs\.(\d+)\.conv\.", r"decoder.fpn.inner_blocks.\1.0."),
        (r"^neck\.fpn_convs\.(\d+)\.conv\.", r"decoder.fpn.layer_blocks.\1.0."),
        (r"^decode_head\.scale_heads\.(\d+)\.(\d+)\.conv\.", r"decoder.head.scale_heads.\1.\2.0."),
        (r"^decode_head\.scale_heads\.(\d+)\.(\d+)\.bn\.", r"decoder.head.scale_heads.\1.\2.1."),
    ],
    "upernet": [
        (r"^decode_head\.psp_modules\.(\d+)\.1\.conv\.", r"decoder.psp.blocks.\1.1.0."),
        (r"^decode_head\.psp_modules\.(\d+)\.1\.bn\.", r"decoder.psp.blocks.\1.1.1."),
        (r"^decode_head\.bottleneck\.conv\.", "decoder.psp.out_conv.0."),
        (r"^decode_head\.bottleneck\.bn\.", "decoder.psp.out_conv.1."),
        (r"^decode_head\.fpn_bottleneck\.conv\.", "decoder.fusion_block.0."),
        (r"^decode_head\.fpn_bottleneck\.bn\.", "decoder.fusion_block.1."),
        (r"^backbone\.norm(\d)\.", r"decoder.feature_norms.\1."),  # Swin's norms of its outputs
    ],
}
_MMSEG_HEADS = [
    (r"^decode_head\.conv_seg\.", "classifier.1."),
    (r"^auxiliary_head\.convs\.0\.conv\.", "aux_head.0.0."),
    (r"^auxiliary_head\.convs\.0\.bn\.", "aux_head.0.1."),
    (r"^auxiliary_head\.conv_seg\.", "aux_head.2."),
]


def _upernet_level(match: "re.Match[str]", laterals: int) -> str:
    """mmseg's UPerHead lateral / FPN conv ``i`` (fine to coarse) is smp's block ``laterals - 1 - i``."""
    block = "fpn_lateral_blocks.{}.conv_norm_relu" if match[1] == "lateral_convs" else "fpn_conv_blocks.{}"
    part = "0" if match[3] == "conv" else "1"
    return f"decoder.{block.format(laterals - 1 - int(match[2]))}.{part}."


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: "Segmenter") -> Dict[str, torch.Tensor]:
    """Map a segmentation checkpoint onto :class:`Segmenter`: mmseg's (``backbone.*`` through the backbone
    family's own filter, ``neck.*`` (FPN), ``decode_head.*``, ``auxiliary_head.*``; :data:`_MMSEG_NAMES`) or this
    layout, which passes through (its backbone part through the family's filter too)."""
    from .factory import checkpoint_filter_for
    state_dict = unwrap(state_dict)
    body, body_prefix = model.backbone, "neck.body."
    rules = _MMSEG_NAMES[model.head] + _MMSEG_HEADS
    levels = len(model.neck.channels)
    out: Dict[str, torch.Tensor] = {}
    backbone: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        new = key
        for pattern, repl in rules:
            new = re.sub(pattern, repl, new)
        found = re.match(r"^decode_head\.(lateral_convs|fpn_convs)\.(\d+)\.(conv|bn)\.", new)
        if found and model.head == "upernet":
            new = _upernet_level(found, levels - 1) + new[found.end():]  # the coarsest level is the PPM's
        if new.startswith("backbone."):
            backbone[new[len("backbone."):]] = value
        elif new.startswith(body_prefix):
            backbone[new[len(body_prefix):]] = value
        else:
            out[new] = value
    filter_fn = checkpoint_filter_for(body)
    if filter_fn is not None and backbone:
        backbone = filter_fn(backbone, body)
    return {**{body_prefix + k: v for k, v in backbone.items()}, **out}


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    # mmseg's ADE20K pipeline: ImageNet's mean and std on 0-255 RGB, the shorter side resized to 512 (of 2048x512)
    return {"url": "", "num_classes": 150, "input_size": (3, 512, 512), "crop_pct": 1.0, "interpolation": "bilinear",
            "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD, "first_conv": "",
            "classifier": ("classifier.1", "aux_head.2"), **kwargs}


def _ade20k(key: str, miou: float, iterations: str) -> Dict[str, Any]:
    paper_ids, paper_name, origin = PAPERS["agent"]
    return _cfg(url=TSINGHUA.format(key), custom_load=True, license=None, paper_ids=paper_ids, paper_name=paper_name,
                origin_url=origin, notes=(f"mIoU {miou} on ADE20K val (single scale, {iterations} iterations), as "
                                          "reported by the authors",))


#: Agent Attention's ADE20K models (its downstream/segmentation README and configs): Semantic FPN (40k iterations)
#: and UperNet (160k), the backbones as their configs build them: the agents pooled to the downstream grids of the
#: config's name (12-16-28-28, 9-12-14-7), the biases resized to them
default_cfgs = generate_default_cfgs({
    "semantic_fpn.agent_pvt_tiny_ade20k": _ade20k("5e7bf988b4b74efe8654", 40.18, "40k"),
    "semantic_fpn.agent_pvt_small_ade20k": _ade20k("11332fa565e443678e4c", 44.18, "40k"),
    "semantic_fpn.agent_pvt_large_ade20k": _ade20k("0da8b58581214f85974f", 46.52, "40k"),
    "upernet.agent_swin_tiny_ade20k": _ade20k("280481ee38024bce8364", 46.68, "160k"),
    "semantic_fpn": _cfg(),
    "upernet": _cfg(),
})
# The untagged names stay the defaults (timm would make the first tag with weights the default): a tag asks for
# weights, and builds the network they were trained in.
for _name in HEADS:
    default_cfgs[_name].tags.remove("")
    default_cfgs[_name].tags.appendleft("")
_PVT_AGENTS = ((12, 12), (16, 16), (28, 28), (28, 28))
_TAG_ARGS = {
    **{f"semantic_fpn.agent_pvt_{size}_ade20k": dict(backbone=f"agent_pvt_{size}", num_classes=150,
                                                     agent_grids=_PVT_AGENTS, decoder_channels=256,
                                                     segmentation_channels=128)
       for size in ("tiny", "small", "large")},
    # always_partition: the last stage keeps Swin's shifted windows at every size, as mmseg's Swin (timm drops the
    # shift where the grid at img_size is no larger than the window, 7×7 at 224 px, as Swin's ImageNet code)
    "upernet.agent_swin_tiny_ade20k": dict(backbone="agent_swin_tiny_patch4_window7_224", always_partition=True,
                                           num_classes=150,
                                           agent_grids=((9, 9), (12, 12), (14, 14)), decoder_channels=512,
                                           aux_channels=256),
}


def _create(head: str, **kwargs: Any) -> Segmenter:
    """A segmenter; a tag (``semantic_fpn.agent_pvt_tiny_ade20k``) builds the network its weights were trained in
    and, with ``pretrained=True``, loads them through the one loader (strict)."""
    kwargs = with_tag_args(head, kwargs, _TAG_ARGS)
    tag, pretrained = kwargs.pop("pretrained_cfg", None), kwargs.pop("pretrained", False)
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    kwargs.pop("cache_dir", None)
    if "backbone" not in kwargs:
        raise ValueError(f"a {head} segmenter needs backbone=<registered model name>")
    kwargs.setdefault("num_classes", 150)
    name = f"{head}.{tag}" if isinstance(tag, str) and tag else head
    if pretrained:
        from .sources import pretrained_tag
        if not overlay.get("file") and not pretrained_tag(name):
            import timm
            raise ValueError(f"{name} has no pretrained weights: name a tag "
                             f"({', '.join(timm.list_pretrained(head + '.*'))}) or start the backbone from a file "
                             "(--initial-checkpoint)")
    model = Segmenter(head=HEADS[head], **kwargs)
    if pretrained:
        from .factory import load_initial_weights
        load_initial_weights(model, overlay.get("file") or name, strict=True)
    return model


@register_model
def semantic_fpn(**kwargs: Any) -> Segmenter:
    """Semantic FPN (Kirillov et al.; mmseg's FPN neck and FPNHead) on ``backbone``."""
    return _create("semantic_fpn", **kwargs)


@register_model
def upernet(**kwargs: Any) -> Segmenter:
    """UperNet (PPM + FPN; mmseg's UPerHead, smp's decoder) with an auxiliary FCN head on ``backbone``."""
    return _create("upernet", **kwargs)
