"""Semantic segmentation networks: any registered backbone → four feature maps (strides 4, 8, 16, 32) → a decoder
from segmentation_models_pytorch (Semantic FPN or UperNet) → per-pixel class logits at the input size.

The four maps (:class:`FeaturePyramid`), as XCiT's dense-prediction code makes them:

- a plain transformer (DeiT, XCiT, ReLU-ViT, UFO-ViT: every block at the patch stride) gives the token maps of four
  blocks, each resampled to one level by 2× transposed convolutions (finer), identity or max pooling (coarser);
  for patch 16 that is ConvT-BN-GELU-ConvT, ConvT, identity, MaxPool(2), channels staying at ``embed_dim``;
- a pyramid (CvT, SOFT) gives its stages; a level no stage has (CvT stops at stride 16) is pooled or upsampled
  from the nearest stage the same way.

Decoders are smp's own (``FPNDecoder``: the Panoptic/Semantic FPN branch; ``UPerNetDecoder``: PPM + FPN), followed
by a 1×1 classifier at stride 4 and a bilinear upsampling to the input. UperNet adds an auxiliary FCN head on the
stride-16 level while training (its loss is weighted by the task). In ``train()`` mode with an auxiliary head the
forward returns ``(logits, aux_logits)``; otherwise the logits alone (what export and evaluation take).

Registered with timm as ``semantic_fpn`` and ``upernet``: ``create_model('semantic_fpn',
backbone='sima_deit_small_patch16_224', num_classes=150, attn_type='softmax')``; keyword arguments the segmenter
does not take go to the backbone, so ``attn_type`` swaps the attention as it does for a classifier.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from timm.models import register_model

from ..attention._common import eager

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
        if hasattr(body, "for_dense_prediction"):  # a family whose dense-prediction layout differs (Swin's windows)
            body.for_dense_prediction()
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


class _AddMerge(nn.Module):
    """smp's FPN merge (``add``) as chained adds: its ``stack(...).sum(0)`` is a strided reduction that is several
    times slower than elementwise adds on channels-last maps, and the sum is the same."""

    def forward(self, x: List[torch.Tensor]) -> torch.Tensor:
        out = x[0]
        for level in x[1:]:
            out = out + level
        return out


class FCNHead(nn.Sequential):
    """The auxiliary head of UperNet (mmseg's FCNHead with one conv): 3×3 conv-BN-ReLU, dropout, 1×1 classifier."""

    def __init__(self, in_channels: int, channels: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__(nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                         nn.ReLU(inplace=True), nn.Dropout2d(dropout), nn.Conv2d(channels, num_classes, 1))


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
        require("segmentation_models_pytorch", f"the {head} segmentation head")
        from segmentation_models_pytorch.decoders.fpn.decoder import FPNDecoder
        from segmentation_models_pytorch.decoders.upernet.decoder import UPerNetDecoder

        body = create_model(backbone, num_classes=0, drop_path_rate=drop_path_rate, **backbone_kwargs)
        self.backbone_name = backbone
        self.num_classes = int(num_classes)
        self.head = head
        self.attn_type = getattr(body, "attn_type", None)
        self.pretrained_cfg = dict(getattr(body, "pretrained_cfg", {}) or {})
        self.pretrained_cfg.update(num_classes=self.num_classes)
        self.neck = FeaturePyramid(body, out_indices, channels_last=True)
        # smp's decoders index features from stride 1: two placeholder levels (stride 1 and 2) come first
        encoder_channels = [3, 0, *self.neck.channels]
        if head == "fpn":
            self.decoder = FPNDecoder(encoder_channels, encoder_depth=5, pyramid_channels=decoder_channels,
                                      segmentation_channels=segmentation_channels, dropout=0.0)
            self.decoder.merge = _AddMerge()
            head_channels = segmentation_channels
        else:
            self.decoder = UPerNetDecoder(encoder_channels, encoder_depth=5, decoder_channels=decoder_channels)
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
            aux = F.interpolate(self.aux_head(levels[2]), size=size, mode="bilinear", align_corners=False)
            return logits, aux[..., :height, :width]
        return logits


def _create(head: str, **kwargs: Any) -> Segmenter:
    for key in ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        value = kwargs.pop(key, None)
        if key == "pretrained" and value:
            raise ValueError("segmenters take no pretrained weights; start the backbone from a file")
    if "backbone" not in kwargs:
        raise ValueError(f"a {head} segmenter needs backbone=<registered model name>")
    kwargs.setdefault("num_classes", 150)
    return Segmenter(head=HEADS[head], **kwargs)


@register_model
def semantic_fpn(**kwargs: Any) -> Segmenter:
    """Semantic FPN (Kirillov et al., smp's FPN decoder) on ``backbone``."""
    return _create("semantic_fpn", **kwargs)


@register_model
def upernet(**kwargs: Any) -> Segmenter:
    """UperNet (PPM + FPN, smp's decoder) with an auxiliary FCN head on ``backbone``."""
    return _create("upernet", **kwargs)
