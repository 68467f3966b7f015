"""Semantic segmentation: a segmenter (:mod:`simattn.models.segmentation`) trained and scored by mIoU as a task of
the engine.

``simattn segment -c RECIPE`` is the command line (:mod:`.cli`); :mod:`.metrics` holds the scores (one confusion
matrix summed over images and ranks), :mod:`.inference` the whole-image / sliding-window / flip / multi-scale
prediction, :mod:`.evaluate` the scoring of a network or deployed file on a dataset with saved predictions, and
:mod:`.task` the training run.
"""
from .config import SegmentConfig
from .metrics import confusion_matrix, scores

__all__ = ["SegmentConfig", "confusion_matrix", "scores"]
