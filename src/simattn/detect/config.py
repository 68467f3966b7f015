"""``simattn detect`` options: :class:`DetectConfig`, the engine's options (with the detection recipe's defaults) and
the sections of Mask R-CNN: the network, the COCO-layout data, its step schedule and its evaluation. The defaults
are XCiT-S12/16 → SimA with Mask R-CNN on COCO (the SimA paper's Table 4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Union

from ..engine.config import EngineConfig
from ..utils.recipe import PROB, check_path, option, section, task_defaults

__all__ = ["DetectConfig"]


@dataclass
class DetectModel:
    backbone: str = option("sima_small_12_p16")
    backbone_kwargs: Dict[str, Any] = option(factory=dict, help="extra timm.create_model arguments",
                                             belongs_to=("backbone",))
    backbone_weights: Optional[str] = option(None, "classification or DINO weights (.pth / .safetensors)",
                                             check=check_path, belongs_to=("backbone",))
    backbone_weights_partial: bool = option(False, "start from backbone_weights even where they leave tensors of "
                                                   "the backbone at their initialization")
    drop_path_rate: float = option(0.05, low=0.0, high=1.0, high_open=True)
    out_indices: List[int] = option(factory=lambda: [3, 5, 7, 11], help="blocks 4, 6, 8, 12 (1-based)", low=0,
                                    length=4)
    strides: List[int] = option(factory=lambda: [4, 8, 16, 32], low=1, length=4)
    fpn_channels: int = option(256, low=1)
    box_head_dim: int = option(1024, low=1)
    mask_head_channels: int = option(256, low=1)
    min_size: Union[int, List[int]] = option(800, "a list gives multi-scale training", low=1)
    max_size: int = option(1333, low=1)
    maskrcnn: Dict[str, Any] = option(factory=dict, help="extra torchvision MaskRCNN arguments "
                                                         "(rpn_batch_size_per_image, ...)")


@dataclass
class DetectData:
    train_images: Optional[str] = option(None, check=check_path)
    train_annotations: Optional[str] = option(None, check=check_path)
    val_images: Optional[str] = option(None, check=check_path)
    val_annotations: Optional[str] = option(None, check=check_path)
    hflip_prob: float = option(0.5, **PROB)


@dataclass
class DetectSchedule:
    """The learning rate of detection: a linear warm-up over updates, then steps down after given epochs (the
    engine's ``sched`` options are not used)."""
    warmup_steps: int = option(500, low=0)
    warmup_ratio: float = option(0.001, "warm-up starts at lr × this", low=0.0, high=1.0)
    lr_decay_epochs: List[int] = option(factory=lambda: [27, 33], help="1-based epochs after which the lr is "
                                        "multiplied by lr_decay_rate", low=0)
    lr_decay_rate: float = option(0.1, low=0.0, high=1.0, low_open=True)


@dataclass
class DetectEval:
    batch_size: int = option(2, low=1)


@dataclass
@task_defaults(epochs=36, batch_size=16, lr=1e-4, amp=True, workers=4, pin_memory=True, log_interval=0)
class DetectConfig(EngineConfig):
    """Every ``simattn detect`` option: the engine's (an absolute ``lr``) and Mask R-CNN's sections."""

    model: DetectModel = section(DetectModel)
    data: DetectData = section(DetectData)
    schedule: DetectSchedule = section(DetectSchedule)
    eval: DetectEval = section(DetectEval)

    #: keys of earlier recipes whose option has another name now (the unknown-key error names it)
    renamed: ClassVar[Dict[str, str]] = {"train.optimizer": "opt", "train.save_every": "checkpoint_every_epochs",
                                         "eval.every": "eval_every_epochs", "train.max_steps": "max_updates"}

    def check_run(self) -> "DetectConfig":
        """:meth:`validate` and the backbone (a model timm knows, its shared options in range): the checks of the
        run and of ``--print-config``."""
        self.validate()
        from ..models.factory import check_model
        check_model(self.model.backbone, self.model.backbone_kwargs)
        return self
