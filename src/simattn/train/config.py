"""Training options: one flat dataclass, filled from defaults < a YAML recipe < command-line flags.

Recipes are YAML files with the field names below as keys. ``-c`` takes a file path or the name of a shipped recipe
(``simattn.configs``, e.g. ``sima_deit_small`` or ``digits_cpu``). Every field is also a flag
(``model_kwargs`` → ``--model-kwargs '{depth: 2}'``); flag values are parsed as YAML so lists and dicts work.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml

from ..utils.io import read_yaml_mapping

__all__ = ["TrainConfig", "load_config", "find_recipe", "list_recipes", "add_config_arguments", "overrides_from_args",
           "scaled_lr"]

def _recipe_dir():
    # package data (pyproject: simattn = ["configs/*.yaml"]); repo-root configs/ links to the same files
    return resources.files("simattn") / "configs"


def _opt(default: Any = None, help: str = "", factory=None, const: Any = None):
    """A dataclass field whose ``help`` becomes the flag's ``--help`` text; ``const`` is the flag's value when it is
    given without one."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help, "const": const})


@dataclass
class TrainConfig:
    """Every option of ``simattn train`` (each is a recipe key and a ``--flag``)."""

    # --- model
    model: str = _opt("sima_deit_tiny_patch16_224", "registered model name (timm.create_model)")
    model_kwargs: Dict[str, Any] = _opt(factory=dict, help="extra create_model kwargs (img_size, attn_type, ...)")
    num_classes: Optional[int] = _opt(None, "classifier size; None = the dataset's class count (a mismatch is an error)")
    drop_path: float = _opt(0.0, "stochastic depth rate")
    drop: float = _opt(0.0, "dropout rate")

    # --- data
    dataset: str = _opt("digits", "digits (embedded) | folder/imagenet (root/<split>/<class>/<img>) | cifar10 | cifar100")
    data_dir: Optional[str] = _opt(None, "dataset root (not used by digits)")
    train_split: str = _opt("train", "split (sub-folder) to train on")
    val_split: str = _opt("val", "split to evaluate on")
    img_size: Optional[int] = _opt(None, "input resolution; None = model_kwargs.img_size or the model's default")
    workers: int = _opt(0, "data-loader worker processes per rank")
    pin_memory: bool = _opt(False, "pin host memory for faster GPU copies")

    # --- augmentation (timm.data.create_transform, timm.data.Mixup, timm.data.RepeatAugSampler)
    scale: List[float] = _opt(factory=lambda: [0.08, 1.0], help="RandomResizedCrop area range")
    ratio: List[float] = _opt(factory=lambda: [3 / 4, 4 / 3], help="RandomResizedCrop aspect range")
    hflip: float = _opt(0.5, "horizontal flip probability")
    vflip: float = _opt(0.0, "vertical flip probability")
    color_jitter: float = _opt(0.4, "color jitter strength (ignored when aa is set)")
    aa: Optional[str] = _opt(None, "timm auto-augment string, e.g. rand-m9-mstd0.5-inc1")
    interpolation: Optional[str] = _opt(None, "bicubic | bilinear | ...; None = the model's default")
    mean: Optional[List[float]] = _opt(None, "None = the model's default")
    std: Optional[List[float]] = _opt(None, "None = the model's default")
    crop_pct: Optional[float] = _opt(None, "evaluation center-crop ratio; None = the model's default")
    reprob: float = _opt(0.0, "random erasing probability")
    remode: str = _opt("pixel", "random erasing fill: pixel | rand | const")
    recount: int = _opt(1, "random erasing regions per image")
    aug_repeats: int = _opt(0, "repeated augmentation (RepeatAugSampler) copies per image; 0 = off")
    mixup: float = _opt(0.0, "mixup alpha (0 = off)")
    cutmix: float = _opt(0.0, "cutmix alpha (0 = off)")
    mixup_prob: float = _opt(1.0, "probability of mixing a batch")
    mixup_switch_prob: float = _opt(0.5, "probability of cutmix instead of mixup when both are on")
    mixup_mode: str = _opt("batch", "batch | pair | elem")
    smoothing: float = _opt(0.1, "label smoothing")

    # --- optimization (timm.optim.create_optimizer_v2, timm.scheduler.create_scheduler_v2)
    epochs: int = _opt(10, "training epochs")
    batch_size: int = _opt(64, "per process")
    grad_accum_steps: int = _opt(1, "micro-batches per optimizer update")
    steps_per_epoch: Optional[int] = _opt(None, "cap on optimizer updates per epoch (quick runs); None = full epochs")
    opt: str = _opt("adamw", "optimizer name (timm.optim)")
    opt_eps: Optional[float] = _opt(None, "optimizer epsilon; None = the optimizer's default")
    opt_betas: Optional[List[float]] = _opt(None, "optimizer betas; None = the optimizer's default")
    momentum: float = _opt(0.9, "SGD-style momentum")
    weight_decay: float = _opt(0.05, "weight decay (not applied to norms, biases, tokens)")
    lr: Optional[float] = _opt(None, "absolute learning rate; None = lr_base scaled by the global batch")
    lr_base: float = _opt(5e-4, "learning rate at a global batch of lr_base_size")
    lr_base_size: int = _opt(512, "global batch at which lr_base applies")
    lr_base_scale: str = _opt("linear", "linear | sqrt")
    sched: str = _opt("cosine", "schedule name (timm.scheduler): cosine | step | ... | none")
    sched_on_updates: bool = _opt(False, "step the schedule every update instead of every epoch")
    warmup_epochs: float = _opt(5, "linear warmup length")
    warmup_lr: float = _opt(1e-6, "learning rate at the start of warmup")
    min_lr: float = _opt(1e-5, "floor of the decayed learning rate")
    cooldown_epochs: int = _opt(0, "epochs at min_lr after the schedule")
    clip_grad: Optional[float] = _opt(None, "gradient clipping threshold; None = off")
    clip_mode: str = _opt("norm", "norm | value | agc")
    model_ema: bool = _opt(False, "keep an EMA of the weights (timm ModelEmaV3)")
    model_ema_decay: float = _opt(0.9998, "EMA decay per update")
    model_ema_warmup: bool = _opt(False, "ramp the EMA decay up over the first updates")

    # --- precision and speed
    device: Optional[str] = _opt(None, "cpu | cuda; None = cuda when available")
    amp: bool = _opt(False, "autocast mixed precision")
    amp_dtype: str = _opt("float16", "float16 (with loss scaling) | bfloat16")
    grad_checkpointing: bool = _opt(False, "recompute activations in backward (model.set_grad_checkpointing)")
    channels_last: bool = _opt(False, "channels_last memory format for model and inputs")
    compile: bool = _opt(False, "torch.compile the model")
    sync_bn: bool = _opt(False, "SyncBatchNorm across ranks (CUDA only)")
    threads: Optional[int] = _opt(None, "CPU intra-op threads per process; None = torch's default")

    # --- run, checkpoints, output
    output: str = _opt("runs/train", "run folder: last.pth, best/final .safetensors, metrics.jsonl, summary.json")
    resume: Optional[str] = _opt(None, "checkpoint to continue; 'auto' (or the bare flag) = <output>/last.pth",
                                 const="auto")
    overwrite: bool = _opt(False, "start afresh even if <output> already holds a run")
    checkpoint_every_steps: int = _opt(0, "also write last.pth every K updates (0 = only at epoch ends)")
    eval_every_epochs: int = _opt(1, "evaluate every N epochs (and always after the last)")
    log_interval: int = _opt(50, "updates between progress lines / JSON step records")
    seed: int = _opt(0, "base seed (each rank adds its rank)")
    recipe: Optional[str] = _opt(None, "the recipe this config came from (informational)")

    def to_dict(self) -> Dict[str, Any]:
        """Plain types only (lists, dicts, str, numbers): safe for JSON, YAML and weights_only checkpoints."""
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        """Raise a one-line ValueError for options that cannot work."""
        for name in ("epochs", "batch_size", "grad_accum_steps", "lr_base_size", "eval_every_epochs", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1 or null, got {self.steps_per_epoch}")
        if self.checkpoint_every_steps < 0:
            raise ValueError(f"checkpoint_every_steps must be >= 0, got {self.checkpoint_every_steps}")
        if self.amp_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"amp_dtype must be 'float16' or 'bfloat16', got {self.amp_dtype!r}")
        if self.lr_base_scale not in ("linear", "sqrt"):
            raise ValueError(f"lr_base_scale must be 'linear' or 'sqrt', got {self.lr_base_scale!r}")
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"model_kwargs must be a mapping, got {self.model_kwargs!r}")
        for name in ("scale", "ratio"):
            if len(getattr(self, name)) != 2:
                raise ValueError(f"{name} must be two numbers [low, high], got {getattr(self, name)!r}")
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _coerce(name: str, value: Any) -> Any:
    """Bring a YAML/CLI value to the field's type (YAML 1.1 reads '5e-4' as a string, for instance)."""
    hint = _HINTS[name]
    optional = type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ValueError(f"option {name!r} cannot be null")
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    origin = typing.get_origin(base) or base
    try:
        if origin is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
                return value.lower() in ("true", "yes", "1")
            if not isinstance(value, bool):
                raise TypeError
            return value
        if origin is int:
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)
        if origin is float:
            return float(value)
        if origin is str:
            return str(value)
        if origin is list:
            if not isinstance(value, (list, tuple)):
                raise TypeError
            return [float(v) for v in value]
        if origin is dict:
            if not isinstance(value, Mapping):
                raise TypeError
            return dict(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name!r}: cannot use {value!r} as {getattr(base, '__name__', base)}") from None
    return value


def _check_keys(keys, where: str) -> None:
    for key in keys:
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown option {key!r} in {where}{hint}")


def list_recipes() -> List[str]:
    """Names of the training recipes shipped in the package (``-c NAME``); other tools' YAML files that live in
    the same folder (self-supervised, detection) are left out."""
    names = []
    for entry in _recipe_dir().iterdir():
        if entry.name.endswith(".yaml"):
            try:
                data = yaml.safe_load(entry.read_text())
            except yaml.YAMLError:
                continue
            if isinstance(data, Mapping) and all(k in _FIELDS or k == "base" for k in data):
                names.append(entry.name[:-5])
    return sorted(names)


def find_recipe(recipe: str) -> Path:
    """A recipe file from a path or a shipped recipe name (with or without ``.yaml``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    shipped = _recipe_dir() / f"{name}.yaml"
    if str(path.parent) in ("", ".", "configs") and shipped.is_file():
        return Path(str(shipped))
    raise FileNotFoundError(f"recipe {recipe!r} not found: not a file, nor a shipped recipe "
                            f"({', '.join(list_recipes())})")


def _read_recipe(recipe: str, chain: tuple = ()) -> Dict[str, Any]:
    """A recipe's values, after those of its ``base:`` recipe (a shipped name or a path relative to it)."""
    path = find_recipe(recipe)
    if path.resolve() in chain:
        raise ValueError(f"recipe {path} inherits from itself (base: chain {' -> '.join(map(str, chain))})")
    loaded = read_yaml_mapping(path)
    base = loaded.pop("base", None)
    _check_keys(loaded, f"recipe {path}")
    values: Dict[str, Any] = {}
    if base is not None:
        name = str(base) if str(base).endswith(".yaml") else f"{base}.yaml"
        sibling = path.parent / name
        values = _read_recipe(str(sibling) if sibling.is_file() else str(base), chain + (path.resolve(),))
    values.update(loaded)
    return values


def load_config(recipe: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Defaults, then the YAML ``recipe`` (a path or shipped name), then ``overrides``; validated.

    A recipe may start from another with ``base: <recipe>`` and change a few keys. ``model_kwargs`` in
    ``overrides`` is merged into the recipe's.
    """
    values: Dict[str, Any] = {}
    if recipe is not None:
        values.update(_read_recipe(recipe))
        values["recipe"] = str(recipe)
    if overrides:
        _check_keys(overrides, "overrides")
        for key, value in overrides.items():
            # model_kwargs merge: override one kwarg, keep the recipe's others
            if key == "model_kwargs" and isinstance(value, Mapping) and isinstance(values.get(key), Mapping):
                value = {**values[key], **value}
            values[key] = value
    cfg = TrainConfig(**{k: _coerce(k, v) for k, v in values.items()})
    return cfg.validate()


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field (``--batch-size``), all defaulting to 'not given' so the recipe's value stands."""
    group = parser.add_argument_group("recipe options (override the YAML recipe)")
    for name, f in _FIELDS.items():
        flag = "--" + name.replace("_", "-")
        hint = _HINTS[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_ = f"{f.metadata.get('help', '')} (default {default!r})".lstrip()
        if hint is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_)
        else:
            const = f.metadata.get("const")
            group.add_argument(flag, dest=name, type=_parse_flag_value, default=argparse.SUPPRESS,
                               help=help_,
                               **({"nargs": "?", "const": const} if const is not None else {}))


def _parse_flag_value(text: str) -> Any:
    # YAML so that '[0.5, 1.0]', '{depth: 2}', 'null' and numbers all work; plain words stay strings
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def overrides_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    """The recipe options given on the command line."""
    return {k: v for k, v in vars(args).items() if k in _FIELDS}


def scaled_lr(cfg: TrainConfig, world_size: int = 1) -> float:
    """``cfg.lr`` if set, else ``lr_base × (global batch / lr_base_size)`` (or its square root), global batch =
    batch_size × world_size × grad_accum_steps (the recipes' ``lr 5e-4 × total_batch/512``)."""
    if cfg.lr is not None:
        return cfg.lr
    ratio = cfg.batch_size * world_size * cfg.grad_accum_steps / cfg.lr_base_size
    return cfg.lr_base * (ratio ** 0.5 if cfg.lr_base_scale == "sqrt" else ratio)
