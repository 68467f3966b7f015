"""Mask R-CNN (torchvision) with FPN on a registered transformer backbone (SimA DeiT, XCiT-SimA, ...)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from torch import nn

from .backbone import PyramidBackbone

__all__ = ["build_body", "build_mask_rcnn", "DETECTOR", "DETECTION_TASK", "load_detector", "detector_config"]

#: the name a detector's weights record gives its network (not a timm model: simattn detect rebuilds it)
DETECTOR = "mask_rcnn"
#: the task a detector's record names (boxes and instance masks)
DETECTION_TASK = "instance_segmentation"


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
        report = load_initial_weights(body, model["backbone_weights"], model_name=name,
                                      partial=model.get("backbone_weights_partial", False),
                                      partial_option="model.backbone_weights_partial=true")
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


def _record_of_state(state: Mapping[str, Any]):
    """The weights record of a ``simattn detect`` train state: the recipe's ``model`` section, the categories
    (class 0 is the background) and a palette to draw them with."""
    from ..data.segmentation import color_palette
    from ..models.weights import WeightsRecord
    categories = (state.get("task_state") or {}).get("categories") or []
    classes = ["background", *[str(c.get("name", c.get("id"))) for c in categories]]
    return WeightsRecord(model=DETECTOR, model_kwargs=dict(state.get("model_kwargs") or {}),
                         num_classes=len(classes), producer="simattn detect",
                         extra={"task": DETECTION_TASK, "classes": classes,
                                "category_ids": [c.get("id") for c in categories],
                                "palette": [list(map(int, c)) for c in color_palette(len(classes))]})


def load_detector(path: Union[str, Path], use_ema: bool = False) -> Optional[Tuple[nn.Module, Any]]:
    """``(detector in eval mode, its weights record)`` from a ``simattn detect`` ``last.pth`` or a
    ``.safetensors`` file with a detection record (``local-dir:``/``hf-hub:`` folders too); None for weights of
    another task."""
    from ..models.sources import resolve_source
    from ..utils.io import load_weights
    source = resolve_source(path)
    path = source.path
    if path.suffix == ".safetensors" or source.tag is not None:
        record = source.record
        if record is None or record.extra.get("task") != DETECTION_TASK:
            return None
    else:
        state = source.checkpoint()
        if state.get("task") != "simattn detect":
            return None
        record = _record_of_state(state)
    section = {k: v for k, v in record.model_kwargs.items() if k != "num_classes"}
    # the detector's weights replace everything, so the backbone's own initial weights are not loaded
    model = build_mask_rcnn(dict(section, backbone_weights=None), int(record.num_classes))
    load_weights(model, path, use_ema=use_ema, checkpoint=source.checkpoint())
    record.model_kwargs = section
    return model.eval(), record


def detector_config(model: nn.Module, record) -> Dict[str, Any]:
    """The ``config.json`` of a detector's folder, in timm's layout (timm cannot build it: simattn detect does)."""
    section = record.model_kwargs
    body = model.backbone.body
    size = section.get("max_size")
    return {"architecture": DETECTOR, "num_classes": record.num_classes, "num_features": model.backbone.out_channels,
            "label_names": record.extra["classes"], "model_args": section,
            "pretrained_cfg": {"input_size": [3, size, size] if size else None,
                               "mean": list(body.pretrained_cfg["mean"]), "std": list(body.pretrained_cfg["std"]),
                               "num_classes": record.num_classes},
            **{k: record.extra[k] for k in ("task", "category_ids", "palette")}}
