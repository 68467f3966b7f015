"""``simattn segment`` options: :class:`SegmentConfig`, the engine's options (with the segmentation recipe's
defaults) and those of semantic segmentation: the network, the dataset and its joint transforms, the loss and the
evaluation. Defaults follow XCiT's ADE20K Semantic FPN config (AdamW lr 6e-5, weight decay 0.01, poly schedule of
power 1 with a linear warm-up, 512×512 crops)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..engine.config import EngineConfig
from ..utils.recipe import PROB, check_path, option, quoted, section, task_defaults


def _segmenter_options():
    from ..models.segmentation import Segmenter
    return Segmenter.own_options

__all__ = ["SegmentConfig", "SegmentEval", "SEGMENT_DATASETS"]

#: dataset names :func:`simattn.data.segmentation.create_segmentation_dataset` reads
SEGMENT_DATASETS = ["digits", "ade20k", "voc", "cityscapes", "folder", "wds", "hfds"]
ON_DISK = [name for name in SEGMENT_DATASETS if name != "digits"]  # the embedded digit scenes need no folder


@dataclass
class SegmentEval:
    """How validation predicts each image (mmseg's test modes)."""
    mode: str = option("whole", "whole image, or sliding windows of crop_size and stride", choices=["whole", "slide"])
    crop_size: Optional[List[int]] = option(None, "slide windows [h, w]; None = the training crop_size", low=1,
                                            length=2, belongs_to=("mode", "slide"))
    stride: List[int] = option(factory=lambda: [341, 341], help="slide stride [h, w]", low=1, length=2,
                               belongs_to=("mode", "slide"))
    flip: bool = option(False, "also predict the mirrored image and average")
    scales: List[float] = option(factory=lambda: [1.0], help="image scales to average (multi-scale testing)",
                                 low=0.0, low_open=True)


@dataclass
@task_defaults(epochs=64, batch_size=2, lr=6e-5, weight_decay=0.01, sched="poly", decay_rate=1.0,
               sched_on_updates=True, warmup_epochs=1.2, warmup_lr=6e-11, min_lr=0.0, workers=4, log_interval=50)
class SegmentConfig(EngineConfig):
    """Every ``simattn segment`` option: the engine's and semantic segmentation's (each a recipe key and a flag)."""

    model: str = option("semantic_fpn", "segmenter: semantic_fpn | upernet", choices=["semantic_fpn", "upernet"])
    model_kwargs: Dict[str, Any] = option(factory=lambda: {"backbone": "sima_small_12_p16"},
                                          help="create_model kwargs: backbone (a registered model), its options "
                                               "(img_size, attn_type, out_indices, ...) and the head's "
                                               "(decoder_channels, ...); another backbone drops the recipe's "
                                               "backbone options (a note)",
                                          choice_key="backbone", keeps=_segmenter_options)
    initial_checkpoint: Optional[str] = option(None, "backbone weights to start from (classification or DINO "
                                                   "weights of any layout the backbone family reads)",
                                               check=check_path)
    initial_checkpoint_partial: bool = option(False, "start from initial_checkpoint even where it leaves tensors of "
                                                     "the backbone at their initialization (they train from "
                                                     "scratch; the summary says how many came from the file)")
    initial_checkpoint_ema: bool = option(False, "start from initial_checkpoint's EMA weights (its model_ema or "
                                                 "state_dict_ema entry) rather than its model entry, which the "
                                                 "authors evaluate and is the default")
    drop_path: float = option(0.1, "the backbone's stochastic depth rate", low=0.0, high=1.0, high_open=True)
    aux_loss_weight: float = option(0.4, "weight of the auxiliary head's loss (UperNet)", low=0.0)

    dataset: str = option("digits", "digits (embedded digit scenes) | ade20k | voc | cityscapes | folder | wds "
                                     "(shards) | hfds (saved Hugging Face dataset: image + mask columns)",
                          choices=SEGMENT_DATASETS)
    data_dir: Optional[str] = option(None, "dataset root in its standard layout (not used by digits)",
                                     check=check_path, belongs_to=("dataset", *ON_DISK))
    train_split: str = option("train", "split to train on")
    val_split: str = option("val", "split to evaluate on")
    dataset_kwargs: Dict[str, Any] = option(factory=dict, help="the reader's own options (digits: canvas, "
                                                               "num_train, num_val; folder, hfds: classes_file)",
                                            belongs_to=("dataset",))
    crop_size: List[int] = option(factory=lambda: [512, 512], help="training crop [h, w]", low=1, length=2)
    img_scale: List[int] = option(factory=lambda: [2048, 512], help="resize bound [long side, short side] before the "
                                  "random ratio (and at test time)", low=1, length=2)
    ratio_range: List[float] = option(factory=lambda: [0.5, 2.0], help="random rescale ratio [low, high]", low=0.0,
                                      low_open=True, length=2)
    cat_max_ratio: float = option(0.75, "largest share one class may take of a crop (re-cropped up to 10 times)",
                                  low=0.0, high=1.0, low_open=True)
    hflip: float = option(0.5, "horizontal flip probability", **PROB)
    photometric: bool = option(True, "random brightness, contrast, saturation and hue")
    eval: SegmentEval = section(SegmentEval)

    def validate(self) -> "SegmentConfig":
        super().validate()
        for flag in ("initial_checkpoint_partial", "initial_checkpoint_ema"):
            if getattr(self, flag) and not self.initial_checkpoint:
                raise ValueError(f"--{flag.replace('_', '-')} ({flag}) says how to load --initial-checkpoint, "
                                 "which is not given: name the weights to start from, or drop it")
        if self.ratio_range[0] > self.ratio_range[1]:
            raise ValueError(f"option 'ratio_range': got {quoted(self.ratio_range)}; allowed: [low, high] with "
                             "low <= high")
        if not isinstance(self.model_kwargs, dict) or not self.model_kwargs.get("backbone"):
            raise ValueError(f"option 'model_kwargs': got {quoted(self.model_kwargs)}; it needs backbone=<a "
                             "registered model> (--model-kwargs backbone=sima_deit_small_patch16_224)")
        if self.dataset != "digits" and not self.data_dir:
            raise ValueError(f"--dataset {self.dataset} needs --data-dir DIR (the dataset root; recipe key data_dir)")
        return self

    def check_run(self) -> "SegmentConfig":
        """:meth:`validate`, the backbone (a model timm knows, its shared options in range) and the segmenter built on
        the meta device: the checks of the run and of ``--print-config``."""
        self.validate()
        import torch

        from ..models.factory import check_model, create_model
        check_model(self.model_kwargs["backbone"], {k: v for k, v in self.model_kwargs.items() if k != "backbone"})
        with torch.device("meta"):  # the whole network, built without memory: options its parts refuse fail here
            create_model(self.model, **self.model_kwargs)
        return self
