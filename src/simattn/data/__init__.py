"""Datasets: the embedded default (scikit-learn's handwritten digits) and readers for standard on-disk layouts
(ImageFolder ``train/`` + ``val/``, torchvision's CIFAR-10/100 binary files); for semantic segmentation the embedded
digit scenes and readers for ADE20K, Pascal VOC, Cityscapes and image/mask folders."""
from .cifar import cifar_dataset
from .digits import DigitsDataset, digits_tensors
from .factory import DATASETS, create_dataset, dataset_classes
from .folder import SkippingImageFolder, collate_skipping_unreadable, image_folder
from .segmentation import SEG_DATASETS, SegmentationDataset, create_segmentation_dataset
from . import hfds, shards  # noqa: F401  (register their segmentation readers)

__all__ = [
    "DigitsDataset", "digits_tensors", "DATASETS", "create_dataset", "dataset_classes", "image_folder",
    "SkippingImageFolder", "collate_skipping_unreadable", "cifar_dataset",
    "SEG_DATASETS", "SegmentationDataset", "create_segmentation_dataset",
]
