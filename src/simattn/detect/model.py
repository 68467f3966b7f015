"""Mask R-CNN (torchvision) with FPN on a registered transformer backbone (SimA DeiT, XCiT-SimA, ...)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from .backbone import PyramidBackbone

__all__ = ["build_body", "build_mask_rcnn"]


def build_body(model: Mapping[str, Any]) -> nn.Module:
    """The backbone of a detection recipe's ``model`` section, started from ``backbone_weights`` if given.

    Weights may be a classification checkpoint or safetensors file (its classifier is dropped), a DINO
    ``backbone.safetensors``, or official/timm weights; position embeddings are resized to the
    backbone's grid (:func:`~simattn.models.factory.load_initial_weights`, whose report is printed).
    """
    from ..models.factory import create_model, load_initial_weights
    name = model["backbone"]
    body = create_model(name, num_classes=0, drop_path_rate=model["drop_path_rate"], **model["backbone_kwargs"])
    if model["backbone_weights"]:
        report = load_initial_weights(body, model["backbone_weights"], model_name=name)
        print(f"backbone initial weights: {report.summary()}", flush=True)
    return body


def build_mask_rcnn(model: Mapping[str, Any], num_classes: int) -> nn.Module:
    """torchvision ``MaskRCNN`` on a :class:`PyramidBackbone`; images are normalized with the backbone's mean/std
    and resized by torchvision (``min_size`` may be a list: a random choice per batch while training).

    The box head (two FC layers of ``box_head_dim``) and mask head (four 3×3 convs of ``mask_head_channels``) are
    torchvision's; their widths are recipe options (torchvision's defaults are 1024 and 256).
    """
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    if num_classes < 2:
        raise ValueError(f"num_classes counts the background and must be >= 2, got {num_classes}")
    body = build_body(model)
    backbone = PyramidBackbone(body, model["out_indices"], model["strides"], model["fpn_channels"])
    box_dim, mask_dim = model["box_head_dim"], model["mask_head_channels"]
    roi_size = 7  # torchvision's box RoIAlign output size
    min_size = model["min_size"]
    return MaskRCNN(backbone, num_classes=None,
                    min_size=tuple(min_size) if isinstance(min_size, (list, tuple)) else min_size,
                    max_size=model["max_size"], image_mean=list(body.pretrained_cfg["mean"]),
                    image_std=list(body.pretrained_cfg["std"]),
                    box_head=TwoMLPHead(backbone.out_channels * roi_size ** 2, box_dim),
                    box_predictor=FastRCNNPredictor(box_dim, num_classes),
                    mask_head=MaskRCNNHeads(backbone.out_channels, (mask_dim,) * 4, 1),
                    mask_predictor=MaskRCNNPredictor(mask_dim, mask_dim, num_classes),
                    **model["maskrcnn"])
