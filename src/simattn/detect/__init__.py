"""Detection and instance segmentation: torchvision's Mask R-CNN with FPN on a SimA (or any registered) backbone.

``simattn detect shapes|train|eval`` is the command line (:mod:`simattn.detect.cli`). pycocotools is imported only
when annotations are read or evaluated.
"""
from .backbone import PyramidBackbone, scale_adapter
from .data import CocoInstances, collate_detection
from .evaluate import evaluate_coco
from .model import build_body, build_mask_rcnn
from .shapes import make_shapes_dataset
from .config import DetectConfig
from .train import evaluate_checkpoint, train

__all__ = ["PyramidBackbone", "scale_adapter", "CocoInstances", "collate_detection", "evaluate_coco", "build_body",
           "build_mask_rcnn", "make_shapes_dataset", "DetectConfig", "evaluate_checkpoint", "train"]
