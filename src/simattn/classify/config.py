"""``simattn train`` options: :class:`TrainConfig`, the engine's options and the model, data and augmentation
options of image classification.

Recipes are YAML files with the field names of :class:`TrainConfig` as keys (:mod:`simattn.utils.recipe` reads and
checks them; every field is also a flag, ``--batch-size 32``, and a ``--set`` key). ``-c`` takes a file path or the
name of a shipped recipe (``sima_deit_small``, ``digits_cpu``).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional

from ..engine.config import EngineConfig, scaled_lr
from ..utils.recipe import (INTERPOLATIONS, PROB, check_auto_augment, check_path, find_recipe, list_recipes,
                            load_recipe, option, quoted)

__all__ = ["TrainConfig", "load_config", "find_recipe", "list_recipes", "scaled_lr"]


def _datasets():
    from ..data.factory import DATASETS
    return list(DATASETS)


def _datasets_on_disk():
    return [name for name in _datasets() if name != "digits"]


@dataclass
class TrainConfig(EngineConfig):
    """Every option of ``simattn train``: the engine's, and the data, augmentation and model options of image
    classification (each is a recipe key and a ``--flag``)."""

    model: str = option("sima_deit_tiny_patch16_224", "registered model name (timm.create_model)")
    model_kwargs: Dict[str, Any] = option(factory=dict, help="extra create_model kwargs (img_size, attn_type, ...)",
                                          belongs_to=("model",))

    num_classes: Optional[int] = option(None, "classifier size; None = the dataset's class count (a mismatch is an "
                                            "error)", low=1, belongs_to=("dataset",))
    initial_checkpoint: Optional[str] = option(None, "weights to start from (a classification checkpoint or "
                                                   "safetensors of any layout the model family reads); the "
                                                   "classifier is re-initialized when its size differs",
                                               check=check_path, belongs_to=("model",))
    initial_checkpoint_partial: bool = option(False, "start from initial_checkpoint even where it leaves tensors of "
                                                     "the network body at their initialization (they train from "
                                                     "scratch; the summary says how many came from the file)")
    initial_checkpoint_ema: bool = option(False, "start from initial_checkpoint's EMA weights (its model_ema or "
                                                 "state_dict_ema entry) rather than its model entry, which the "
                                                 "authors evaluate and is the default")
    drop_path: float = option(0.0, "stochastic depth rate", low=0.0, high=1.0, high_open=True)
    drop: float = option(0.0, "dropout rate", low=0.0, high=1.0, high_open=True)
    dataset: str = option("digits", "digits (embedded) | folder/imagenet (root/<split>/<class>/<img>) | cifar10 | "
                                  "cifar100 | wds (shards; data_dir: folder, brace pattern or pipe: URL) | hfds "
                                  "(saved Hugging Face dataset)", choices=_datasets)
    data_dir: Optional[str] = option(None, "dataset root (not used by digits)", check=check_path,
                                     belongs_to=("dataset", _datasets_on_disk))
    train_split: str = option("train", "split (sub-folder) to train on")
    val_split: str = option("val", "split to evaluate on")
    img_size: Optional[int] = option(None, "the data's input resolution; None = model_kwargs.img_size or the "
                                           "model's default. The model is built at model_kwargs.img_size (set it too "
                                           "to build it at this size)", low=1)
    scale: List[float] = option(factory=lambda: [0.08, 1.0], help="RandomResizedCrop area range", low=0.0, high=1.0,
                              low_open=True, length=2)
    ratio: List[float] = option(factory=lambda: [3 / 4, 4 / 3], help="RandomResizedCrop aspect range", low=0.0,
                              low_open=True, length=2)
    hflip: float = option(0.5, "horizontal flip probability", **PROB)
    vflip: float = option(0.0, "vertical flip probability", **PROB)
    color_jitter: float = option(0.4, "color jitter strength (ignored when aa is set)", low=0.0)
    aa: Optional[str] = option(None, "timm auto-augment string, e.g. rand-m9-mstd0.5-inc1", check=check_auto_augment)
    interpolation: Optional[str] = option(None, "bicubic | bilinear | ...; None = the model's default",
                                        choices=INTERPOLATIONS)
    mean: Optional[List[float]] = option(None, "None = the model's default", length=3)
    std: Optional[List[float]] = option(None, "None = the model's default", low=0.0, low_open=True, length=3)
    crop_pct: Optional[float] = option(None, "evaluation center-crop ratio; None = the model's default", low=0.0,
                                     high=1.0, low_open=True)
    reprob: float = option(0.0, "random erasing probability", **PROB)
    remode: str = option("pixel", "random erasing fill: pixel | rand | const", choices=["pixel", "rand", "const"])
    recount: int = option(1, "random erasing regions per image", low=1)
    mixup: float = option(0.0, "mixup alpha (0 = off)", low=0.0)
    cutmix: float = option(0.0, "cutmix alpha (0 = off)", low=0.0)
    mixup_prob: float = option(1.0, "probability of mixing a batch", **PROB)
    mixup_switch_prob: float = option(0.5, "probability of cutmix instead of mixup when both are on", **PROB)
    mixup_mode: str = option("batch", "batch | pair | elem", choices=["batch", "pair", "elem"])
    smoothing: float = option(0.1, "label smoothing", low=0.0, high=1.0, high_open=True)

    #: whether ``model_kwargs`` build the trained network (a conversion's student takes its teacher's instead)
    model_kwargs_build_the_model: ClassVar[bool] = True

    def validate(self) -> "TrainConfig":
        """Check every option and the ones that depend on each other (a one-line ValueError)."""
        super().validate()
        for flag in ("initial_checkpoint_partial", "initial_checkpoint_ema"):
            if getattr(self, flag) and not self.initial_checkpoint:
                raise ValueError(f"--{flag.replace('_', '-')} ({flag}) says how to load --initial-checkpoint, "
                                 "which is not given: name the weights to start from, or drop it")
        if self.initial_checkpoint and self.resume:
            raise ValueError("--initial-checkpoint and --resume exclude each other: a resumed run continues from its "
                             "checkpoint's weights; drop one")
        for name in ("scale", "ratio"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"option {name!r}: got {quoted(getattr(self, name))}; allowed: [low, high] with "
                                 "low <= high")
        built = self.model_kwargs.get("img_size") if isinstance(self.model_kwargs, dict) else None
        if self.model_kwargs_build_the_model and self.img_size is not None and built is not None \
                and built != self.img_size:
            # the network would be built for one size and fed another: neither silently wins
            raise ValueError(f"options 'img_size' (--img-size) {quoted(self.img_size)} and 'model_kwargs.img_size' "
                             f"(--model-kwargs img_size=) {quoted(built)} disagree: the model is built for one and the "
                             "data is fed at the other; give one of them, or the same size to both")
        return self

    def check_run(self) -> "TrainConfig":
        """:meth:`validate`, then what the run checks before it builds anything: a model timm knows, its kwargs in
        their declared ranges, a data directory for data on disk."""
        self.validate()
        from ..models.factory import check_model, check_patch_grid
        check_model(self.model, self.model_kwargs if self.model_kwargs_build_the_model else None)
        if self.model_kwargs_build_the_model:
            size = self.img_size or self.model_kwargs.get("img_size")
            self._note_grid_change(check_patch_grid(self.model, self.model_kwargs, size), size)
        if self.data_dir is None and self.dataset in _datasets_on_disk():
            raise ValueError(f"dataset {self.dataset!r} is read from disk and needs a data directory: give --data-dir "
                             "DIR (data_dir in a recipe), or --dataset digits for the embedded data")
        return self

    def _note_grid_change(self, tokens: Optional[int], size: Optional[int]) -> None:
        """One line where the model replaces its recipe's with a token grid more than 4× larger or smaller: the
        recipe's sizes were chosen for its own model (a 16 px digit recipe gives a 16 px-patch model one patch)."""
        if tokens is None or not self.recipe or int(os.environ.get("RANK", "0")):
            return
        from ..models.factory import patch_grid
        from ..utils.recipe import resolve_recipe
        own = resolve_recipe(type(self), self.recipe).config()
        if own.model == self.model:
            return
        grid = patch_grid(own.model, own.model_kwargs, own.img_size or own.model_kwargs.get("img_size"))
        if grid is not None and not 1 / 4 <= tokens / (grid[0] * grid[1]) <= 4:
            print(f"note: {self.model} makes {tokens} patch tokens of a {size or 'default-size'} px input where "
                  f"recipe {self.recipe}'s {own.model} makes {grid[0] * grid[1]}: its sizes were not chosen for "
                  "this model; set img_size or model_kwargs (patch_size) for a comparable grid",
                  file=sys.stderr, flush=True)


def load_config(recipe: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Defaults, then the YAML ``recipe`` (a path or shipped name), then ``overrides``; every option checked.

    A recipe may start from another with ``base: <recipe>`` and change a few keys. ``model_kwargs`` in
    ``overrides`` is merged into the recipe's (``null`` empties it).
    """
    return load_recipe(TrainConfig, recipe, overrides)
