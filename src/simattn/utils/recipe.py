"""Recipes of every command: one typed schema per task and one loader for all of them.

A recipe is a YAML mapping of options. Each task has a schema that lists every option with its type, default,
help text and allowed values (a range, a list of choices, or a check such as timm's auto-augment parser):

- ``simattn train``: :class:`TrainConfig`, a flat dataclass (every field is also a ``--flag``);
- ``simattn ssl``: :data:`SSL_SCHEMA`, nested sections (``model``, ``head``, ``data``, ``train``, ``eval``);
- ``simattn detect``: :data:`DETECT_SCHEMA`, nested sections (``model``, ``data``, ``train``, ``eval``).

:func:`load_recipe` reads defaults < a recipe file (a path or the name of a recipe shipped in ``simattn/configs``,
which may start from another with ``base: NAME``) < overrides (``--set key=value`` items, parsed with
:func:`simattn.utils.options.parse_assignments`), and checks every value. Bad input is a one-line ValueError that
names the option, the value and what is allowed. Options whose default is an empty mapping (``model_kwargs``,
``model.kwargs``) are free-form keyword arguments for a library call; overrides merge into them key by key and
``null`` empties them.

``output``, ``resume`` and ``overwrite`` say where a run goes, not what it does: they are left out of the
``config.yaml`` a run writes (:func:`recipe_to_save`), so that file is a recipe for a new run as it is.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Opt", "TrainConfig", "SSL_SCHEMA", "DETECT_SCHEMA", "RUN_KEYS", "RecipeDefaults", "load_recipe",
           "merge_recipe", "parse_overrides", "find_recipe", "list_recipes", "recipe_to_save", "recipe_name",
           "defaults_of", "specs_of", "check_value", "add_recipe_arguments", "recipe_from_args", "scaled_lr"]

#: keys that say where a run writes, not what it does (never saved into a run's config.yaml)
RUN_KEYS = ("output", "resume", "overwrite")


# ----- one option ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Opt:
    """One recipe option: its default, type and allowed values.

    ``low``/``high`` bound numbers (and each number of a list), inclusive unless ``low_open``/``high_open``;
    ``choices`` is a list or a function returning one; ``check(value)`` returns None or says what is wrong;
    ``length`` fixes a list's length; ``allowed`` overrides the generated "allowed: ..." text.
    """
    default: Any = None
    help: str = ""
    type: Any = None
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    choices: Union[Sequence[Any], Callable[[], Sequence[Any]], None] = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    length: Optional[int] = None
    allowed: Optional[str] = None
    const: Any = None  # the value of a bare ``--flag`` (train flags)

    @property
    def hint(self) -> Any:
        if self.type is not None:
            return self.type
        if self.default is None:
            return Any
        if isinstance(self.default, list):
            inner = type(self.default[0]) if self.default else Any
            return List[inner]
        if isinstance(self.default, dict):
            return Dict[str, Any]
        return type(self.default)

    def choice_list(self) -> Optional[List[Any]]:
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    def describe(self) -> str:
        """What the option accepts, for error messages."""
        if self.allowed:
            return self.allowed
        choices = self.choice_list()
        if choices is not None:
            text = "one of " + ", ".join(str(c) for c in choices)
        else:
            text = _describe_type(self.hint)
            if self.low is not None or self.high is not None:
                text += " " + _describe_range(self)
        if self.length is not None:
            text += f" ({self.length} values)"
        if _nullable(self.hint):
            text += ", or null"
        return text


def _nullable(hint: Any) -> bool:
    return typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)


def _describe_type(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        return " or ".join(_describe_type(a) for a in args if a is not type(None))
    if origin in (list, List):
        return f"a list of {_describe_type(args[0]).replace('a ', '').replace('an ', '')}s" if args else "a list"
    if origin in (dict, Dict) or hint is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, "any value")


def _describe_range(spec: Opt) -> str:
    lo, hi = spec.low, spec.high
    if lo is not None and hi is not None:
        return f"in {'(' if spec.low_open else '['}{lo:g}, {hi:g}{')' if spec.high_open else ']'}"
    if lo is not None:
        return f"{'>' if spec.low_open else '>='} {lo:g}"
    return f"{'<' if spec.high_open else '<='} {hi:g}"


class _Bad(ValueError):
    pass


def _coerce(hint: Any, value: Any) -> Any:
    """``value`` as type ``hint`` (YAML 1.1 reads ``5e-4`` as a string: such strings are numbers), or _Bad."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return _coerce(alt, value)
            except _Bad:
                continue
        raise _Bad
    if hint is Any:
        return value
    if value is None:
        raise _Bad
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Bad
    if hint is int:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Bad
    if hint is float:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise _Bad from None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        raise _Bad
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Bad
    if origin in (list, List) or hint is list:
        if not isinstance(value, (list, tuple)):
            raise _Bad
        return [_coerce(args[0], v) for v in value] if args else list(value)
    if origin in (dict, Dict) or hint is dict:
        if not isinstance(value, Mapping):
            raise _Bad
        return dict(value)
    return value


def _numbers(value: Any) -> List[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


def check_value(name: str, spec: Opt, value: Any) -> Any:
    """``value`` for option ``name`` brought to its type and checked; a one-line ValueError otherwise."""
    def bad(extra: str = "") -> ValueError:
        return ValueError(f"option {name!r}: got {value!r}; allowed: {spec.describe()}{extra}")

    try:
        out = _coerce(spec.hint, value)
    except _Bad:
        raise bad() from None
    if out is None:
        return None
    choices = spec.choice_list()
    if choices is not None and out not in choices:
        close = difflib.get_close_matches(str(out), [str(c) for c in choices], n=1)
        raise bad(f" (did you mean {close[0]!r}?)" if close else "")
    for v in _numbers(out):
        if spec.low is not None and (v < spec.low or (spec.low_open and v == spec.low)):
            raise bad()
        if spec.high is not None and (v > spec.high or (spec.high_open and v == spec.high)):
            raise bad()
    if spec.length is not None and isinstance(out, list) and len(out) != spec.length:
        raise bad()
    if spec.check is not None:
        problem = spec.check(out)
        if problem:
            raise ValueError(f"option {name!r}: got {value!r}; {problem}")
    return out


# ----- checks that ask the libraries --------------------------------------------------------------------------------

def _optimizers() -> List[str]:
    from timm.optim import list_optimizers
    return list(list_optimizers())


def _check_optimizer(name: str) -> Optional[str]:
    names = _optimizers()
    if name.lower() in names or name.lower().split("_")[-1] in names:  # timm accepts 'lookahead_adamw'
        return None
    close = difflib.get_close_matches(name.lower(), names, n=3)
    return (f"allowed: an optimizer timm.optim knows ({len(names)}, e.g. adamw, sgd, lamb"
            + (f"; did you mean {', '.join(close)}?" if close else "") + ")")


def _check_auto_augment(text: str) -> Optional[str]:
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform
    make = (rand_augment_transform if text.startswith("rand") else
            augment_and_mix_transform if text.startswith("augmix") else auto_augment_transform)
    try:
        make(text, {"translate_const": 100, "img_mean": (124, 116, 104)})
    except (AssertionError, ValueError, KeyError, IndexError, TypeError) as e:
        reason = str(e).strip() or "not understood"
        return (f"{reason}; allowed: a timm auto-augment string such as rand-m9-mstd0.5-inc1, augmix-m5-w4-d2, "
                "original, v0, 3a")
    return None


def _check_device(text: str) -> Optional[str]:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return None
    return "allowed: cpu, cuda, cuda:N, or null (CUDA when available)"


INTERPOLATIONS = ["bicubic", "bilinear", "nearest", "box", "hamming", "lanczos", "random"]
SCHEDULES = ["cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "plateau", "none"]
PROB = dict(low=0.0, high=1.0)


# ----- simattn train ------------------------------------------------------------------------------------------------

def _opt(default: Any = None, help: str = "", factory=None, **spec: Any):
    """A :class:`TrainConfig` field; its :class:`Opt` (help, range, choices) lives in the field's metadata."""
    opt = Opt(default=factory() if factory is not None else default, help=help, **spec)
    if factory is not None:
        return field(default_factory=factory, metadata={"opt": opt})
    return field(default=default, metadata={"opt": opt})


@dataclass
class TrainConfig:
    """Every option of ``simattn train`` (each is a recipe key and a ``--flag``)."""

    # --- model
    model: str = _opt("sima_deit_tiny_patch16_224", "registered model name (timm.create_model)")
    model_kwargs: Dict[str, Any] = _opt(factory=dict, help="extra create_model kwargs (img_size, attn_type, ...)")
    num_classes: Optional[int] = _opt(None, "classifier size; None = the dataset's class count (a mismatch is an "
                                            "error)", low=1)
    initial_checkpoint: Optional[str] = _opt(None, "weights to start from (a classification checkpoint or "
                                                   "safetensors of any layout the model family reads); the "
                                                   "classifier is re-initialized when its size differs")
    drop_path: float = _opt(0.0, "stochastic depth rate", low=0.0, high=1.0, high_open=True)
    drop: float = _opt(0.0, "dropout rate", low=0.0, high=1.0, high_open=True)

    # --- data
    dataset: str = _opt("digits", "digits (embedded) | folder/imagenet (root/<split>/<class>/<img>) | cifar10 | "
                                  "cifar100 (checked by simattn.data.create_dataset)")
    data_dir: Optional[str] = _opt(None, "dataset root (not used by digits)")
    train_split: str = _opt("train", "split (sub-folder) to train on")
    val_split: str = _opt("val", "split to evaluate on")
    img_size: Optional[int] = _opt(None, "input resolution; None = model_kwargs.img_size or the model's default",
                                   low=1)
    workers: int = _opt(0, "data-loader worker processes per rank", low=0)
    pin_memory: bool = _opt(False, "pin host memory for faster GPU copies")

    # --- augmentation (timm.data.create_transform, timm.data.Mixup, timm.data.RepeatAugSampler)
    scale: List[float] = _opt(factory=lambda: [0.08, 1.0], help="RandomResizedCrop area range", low=0.0, high=1.0,
                              low_open=True, length=2)
    ratio: List[float] = _opt(factory=lambda: [3 / 4, 4 / 3], help="RandomResizedCrop aspect range", low=0.0,
                              low_open=True, length=2)
    hflip: float = _opt(0.5, "horizontal flip probability", **PROB)
    vflip: float = _opt(0.0, "vertical flip probability", **PROB)
    color_jitter: float = _opt(0.4, "color jitter strength (ignored when aa is set)", low=0.0)
    aa: Optional[str] = _opt(None, "timm auto-augment string, e.g. rand-m9-mstd0.5-inc1", check=_check_auto_augment)
    interpolation: Optional[str] = _opt(None, "bicubic | bilinear | ...; None = the model's default",
                                        choices=INTERPOLATIONS)
    mean: Optional[List[float]] = _opt(None, "None = the model's default", length=3)
    std: Optional[List[float]] = _opt(None, "None = the model's default", low=0.0, low_open=True, length=3)
    crop_pct: Optional[float] = _opt(None, "evaluation center-crop ratio; None = the model's default", low=0.0,
                                     high=1.0, low_open=True)
    reprob: float = _opt(0.0, "random erasing probability", **PROB)
    remode: str = _opt("pixel", "random erasing fill: pixel | rand | const", choices=["pixel", "rand", "const"])
    recount: int = _opt(1, "random erasing regions per image", low=1)
    aug_repeats: int = _opt(0, "repeated augmentation (RepeatAugSampler) copies per image; 0 = off", low=0)
    mixup: float = _opt(0.0, "mixup alpha (0 = off)", low=0.0)
    cutmix: float = _opt(0.0, "cutmix alpha (0 = off)", low=0.0)
    mixup_prob: float = _opt(1.0, "probability of mixing a batch", **PROB)
    mixup_switch_prob: float = _opt(0.5, "probability of cutmix instead of mixup when both are on", **PROB)
    mixup_mode: str = _opt("batch", "batch | pair | elem", choices=["batch", "pair", "elem"])
    smoothing: float = _opt(0.1, "label smoothing", low=0.0, high=1.0, high_open=True)

    # --- optimization (timm.optim.create_optimizer_v2, timm.scheduler.create_scheduler_v2)
    epochs: int = _opt(10, "training epochs", low=1)
    batch_size: int = _opt(64, "per process", low=1)
    grad_accum_steps: int = _opt(1, "micro-batches per optimizer update", low=1)
    steps_per_epoch: Optional[int] = _opt(None, "cap on optimizer updates per epoch (quick runs); None = full epochs",
                                          low=1)
    max_updates: Optional[int] = _opt(None, "stop after this many optimizer updates in all (smoke runs; the epoch "
                                            "where it stops is evaluated as the last); None = every epoch", low=1)
    opt: str = _opt("adamw", "optimizer name (timm.optim)", check=_check_optimizer)
    opt_eps: Optional[float] = _opt(None, "optimizer epsilon; None = the optimizer's default", low=0.0, low_open=True)
    opt_betas: Optional[List[float]] = _opt(None, "optimizer betas; None = the optimizer's default", low=0.0,
                                            high=1.0, high_open=True, length=2)
    momentum: float = _opt(0.9, "SGD-style momentum", low=0.0, high=1.0, high_open=True)
    weight_decay: float = _opt(0.05, "weight decay (not applied to norms, biases, tokens)", low=0.0)
    lr: Optional[float] = _opt(None, "absolute learning rate; None = lr_base scaled by the global batch", low=0.0,
                               low_open=True)
    lr_base: float = _opt(5e-4, "learning rate at a global batch of lr_base_size", low=0.0, low_open=True)
    lr_base_size: int = _opt(512, "global batch at which lr_base applies", low=1)
    lr_base_scale: str = _opt("linear", "linear | sqrt", choices=["linear", "sqrt"])
    sched: str = _opt("cosine", "schedule name (timm.scheduler): cosine | step | ... | none", choices=SCHEDULES)
    sched_on_updates: bool = _opt(False, "step the schedule every update instead of every epoch")
    warmup_epochs: float = _opt(5, "linear warmup length", low=0.0)
    warmup_lr: float = _opt(1e-6, "learning rate at the start of warmup", low=0.0)
    min_lr: float = _opt(1e-5, "floor of the decayed learning rate", low=0.0)
    cooldown_epochs: int = _opt(0, "epochs at min_lr after the schedule", low=0)
    clip_grad: Optional[float] = _opt(None, "gradient clipping threshold; None = off", low=0.0, low_open=True)
    clip_mode: str = _opt("norm", "norm | value | agc", choices=["norm", "value", "agc"])
    model_ema: bool = _opt(False, "keep an EMA of the weights (timm ModelEmaV3)")
    model_ema_decay: float = _opt(0.9998, "EMA decay per update", low=0.0, high=1.0, low_open=True, high_open=True)
    model_ema_warmup: bool = _opt(False, "ramp the EMA decay up over the first updates")
    max_nonfinite_steps: int = _opt(0, "updates with a non-finite loss to skip (counted in the log) before the run "
                                       "stops with an error", low=0)

    # --- precision and speed
    device: Optional[str] = _opt(None, "cpu | cuda; None = cuda when available", check=_check_device)
    amp: bool = _opt(False, "autocast mixed precision")
    amp_dtype: str = _opt("float16", "float16 (with loss scaling) | bfloat16", choices=["float16", "bfloat16"])
    grad_checkpointing: bool = _opt(False, "recompute activations in backward (model.set_grad_checkpointing)")
    channels_last: bool = _opt(False, "channels_last memory format for model and inputs")
    compile: bool = _opt(False, "torch.compile the model")
    sync_bn: bool = _opt(False, "SyncBatchNorm across ranks (CUDA only)")
    threads: Optional[int] = _opt(None, "CPU intra-op threads per process; None = torch's default", low=1)
    dist_timeout: float = _opt(10.0, "minutes a torchrun process waits at a collective before the job stops (a "
                                     "frozen or dead rank)", low=0.0, low_open=True)

    # --- run, checkpoints, output
    output: Optional[str] = _opt(None, "run folder (last.pth, best/final .safetensors, metrics.jsonl, summary.json, "
                                       "summary.csv); None = runs/<recipe>/<date-time>")
    resume: Optional[str] = _opt(None, "checkpoint to continue; 'auto' (or the bare flag) = <output>/last.pth",
                                 const="auto")
    overwrite: bool = _opt(False, "write into <output> even if it holds another run's files (they are replaced)")
    checkpoint_every_steps: int = _opt(0, "also write last.pth every K updates (0 = only at epoch ends)", low=0)
    eval_every_epochs: int = _opt(1, "evaluate every N epochs (and always after the last)", low=1)
    log_interval: int = _opt(50, "updates between progress lines / JSON step records", low=1)
    seed: int = _opt(0, "base seed (each rank adds its rank)", low=0)
    recipe: Optional[str] = _opt(None, "the recipe this config came from (informational)")

    def __post_init__(self) -> None:
        # every value is checked against its Opt, whichever way the config was made (recipe, flags, Python)
        for name, opt in _dataclass_specs(type(self)).items():
            setattr(self, name, check_value(name, opt, getattr(self, name)))

    def to_dict(self) -> Dict[str, Any]:
        """Plain types only (lists, dicts, str, numbers): safe for JSON, YAML and weights_only checkpoints."""
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        """Check every option and the ones that depend on each other (a one-line ValueError)."""
        self.__post_init__()
        for name in ("scale", "ratio"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"option {name!r}: got {getattr(self, name)!r}; allowed: [low, high] with "
                                 "low <= high")
        if self.resume == "auto" and not self.output:
            raise ValueError("option 'resume': 'auto' continues <output>/last.pth, so it needs an output folder "
                             "(--output); or give the checkpoint's path")
        return self


def scaled_lr(cfg: TrainConfig, world_size: int = 1) -> float:
    """``cfg.lr`` if set, else ``lr_base × (global batch / lr_base_size)`` (or its square root), global batch =
    batch_size × world_size × grad_accum_steps (the recipes' ``lr 5e-4 × total_batch/512``)."""
    if cfg.lr is not None:
        return cfg.lr
    ratio = cfg.batch_size * world_size * cfg.grad_accum_steps / cfg.lr_base_size
    return cfg.lr_base * (ratio ** 0.5 if cfg.lr_base_scale == "sqrt" else ratio)


# ----- simattn ssl --------------------------------------------------------------------------------------------------

def _maybe(hint: Any) -> Any:
    return Optional[hint]


#: every ``simattn ssl`` option with its default: the ImageNet recipe of the SimA paper's DINO experiment (Table 5)
SSL_SCHEMA: Dict[str, Any] = {
    "model": {
        "name": Opt("sima_small_12_p16", "any model timm.create_model knows (import simattn registers ours)"),
        "drop_path_rate": Opt(0.1, "student only; the teacher has none", low=0.0, high=1.0, high_open=True),
        "kwargs": Opt({}, "extra timm.create_model arguments (img_size, depth, attn_type, ...)"),
        "weights": Opt(None, "initial backbone weights: classification, official/timm or DINO weights "
                             "(.pth / .safetensors), read by simattn.models.factory.load_initial_weights",
                       type=_maybe(str)),
    },
    "head": {
        "hidden_dim": Opt(2048, low=1),
        "bottleneck_dim": Opt(256, low=1),
        "output_dim": Opt(65536, "prototypes K", low=1),
        "norm_last_layer": Opt(True, "weight-normalized last layer with fixed norm (stabler for ViTs)"),
        "batch_norm": Opt(False, "BatchNorm in the head's MLP (DINO's ResNet setting; guards tiny runs against "
                                 "collapse)"),
        "freeze_last_layer_epochs": Opt(1, low=0),
    },
    "data": {
        "name": Opt("folder", "'digits' (embedded) or 'folder' (root/train, root/val ImageFolder)",
                    choices=["digits", "folder"]),
        "root": Opt(None, type=_maybe(str)),
        "workers": Opt(8, low=0),
        "global_crop_size": Opt(224, low=1),
        "global_crop_scale": Opt([0.25, 1.0], type=List[float], low=0.0, high=1.0, low_open=True, length=2),
        "local_crop_size": Opt(96, low=1),
        "local_crop_scale": Opt([0.05, 0.25], type=List[float], low=0.0, high=1.0, low_open=True, length=2),
        "n_local_views": Opt(10, low=0),
        "augment": Opt({}, "extra lightly DINOTransform arguments (hf_prob, cj_prob, sigmas, solarization_prob, "
                           "...)"),
    },
    "train": {
        "epochs": Opt(100, low=1),
        "batch_size": Opt(256, "total over all processes", low=1),
        "lr": Opt(2.5e-4, "peak learning rate for this batch size", low=0.0, low_open=True),
        "min_lr": Opt(1e-6, low=0.0),
        "warmup_epochs": Opt(10, low=0),
        "optimizer": Opt("adamw", check=_check_optimizer),
        "weight_decay": Opt(0.04, low=0.0),
        "weight_decay_end": Opt(0.4, low=0.0),
        "momentum_teacher": Opt(0.996, "cosine schedule to 1.0", low=0.0, high=1.0, high_open=True),
        "teacher_temp": Opt(0.04, "sharpening", low=0.0, low_open=True),
        "warmup_teacher_temp": Opt(0.04, low=0.0, low_open=True),
        "warmup_teacher_temp_epochs": Opt(0, low=0),
        "student_temp": Opt(0.1, low=0.0, low_open=True),
        "center_momentum": Opt(0.9, "centering", low=0.0, high=1.0, high_open=True),
        "clip_grad": Opt(3.0, "max grad norm of each parameter tensor (as DINO clips); null disables",
                         type=_maybe(float), low=0.0, low_open=True),
        "amp": Opt(True, "fp16 autocast + loss scaling on CUDA (ignored on CPU)"),
        "seed": Opt(0, low=0),
        "save_every": Opt(1, "epochs between checkpoints (the last epoch is always saved)", low=1),
        "checkpoint_every_steps": Opt(0, "also write last.pth every K updates (0: at epoch ends only)", low=0),
        "max_nonfinite_steps": Opt(0, "steps with a non-finite loss to skip before stopping with an error", low=0),
        "device": Opt(None, "'cpu', 'cuda' or null (CUDA when available)", type=_maybe(str), check=_check_device),
        "threads": Opt(None, "CPU intra-op threads (null: torch's default)", type=_maybe(int), low=1),
        "dist_timeout": Opt(10.0, "minutes a torchrun process waits at a collective before the job stops",
                            low=0.0, low_open=True),
    },
    "eval": {
        "every": Opt(0, "evaluate every N epochs (0: only at the end)", low=0),
        "compare_random_init": Opt(False, "also evaluate the backbone before training"),
        "recalibrate_bn": Opt(False, "re-estimate BatchNorm statistics on the eval training images first"),
        "img_size": Opt(224, low=1),
        "crop_pct": Opt(0.875, low=0.0, high=1.0, low_open=True),
        "batch_size": Opt(256, low=1),
        "knn_k": Opt(20, low=1),
        "knn_temperature": Opt(0.07, low=0.0, low_open=True),
        "linear_epochs": Opt(100, "0 disables the linear probe", low=0),
        "linear_lr": Opt(1e-3, low=0.0, low_open=True),
        "linear_batch_size": Opt(256, low=1),
    },
    "output": Opt(None, "run folder; null = runs/<recipe>/<date-time>", type=_maybe(str)),
}


# ----- simattn detect -----------------------------------------------------------------------------------------------

#: every ``simattn detect`` option with its default: XCiT-S12/16 → SimA with Mask R-CNN on COCO (the paper's Table 4)
DETECT_SCHEMA: Dict[str, Any] = {
    "model": {
        "backbone": Opt("sima_small_12_p16"),
        "backbone_kwargs": Opt({}, "extra timm.create_model arguments"),
        "backbone_weights": Opt(None, "classification or DINO weights (.pth / .safetensors)", type=_maybe(str)),
        "drop_path_rate": Opt(0.05, low=0.0, high=1.0, high_open=True),
        "out_indices": Opt([3, 5, 7, 11], "blocks 4, 6, 8, 12 (1-based)", type=List[int], low=0, length=4),
        "strides": Opt([4, 8, 16, 32], type=List[int], low=1, length=4),
        "fpn_channels": Opt(256, low=1),
        "box_head_dim": Opt(1024, low=1),
        "mask_head_channels": Opt(256, low=1),
        "min_size": Opt(800, "a list gives multi-scale training", type=Union[int, List[int]], low=1),
        "max_size": Opt(1333, low=1),
        "maskrcnn": Opt({}, "extra torchvision MaskRCNN arguments (rpn_batch_size_per_image, ...)"),
    },
    "data": {
        "train_images": Opt(None, type=_maybe(str)),
        "train_annotations": Opt(None, type=_maybe(str)),
        "val_images": Opt(None, type=_maybe(str)),
        "val_annotations": Opt(None, type=_maybe(str)),
        "hflip_prob": Opt(0.5, **PROB),
        "workers": Opt(4, low=0),
    },
    "train": {
        "epochs": Opt(36, low=1),
        "batch_size": Opt(16, "total over all processes", low=1),
        "optimizer": Opt("adamw", check=_check_optimizer),
        "lr": Opt(1e-4, low=0.0, low_open=True),
        "weight_decay": Opt(0.05, low=0.0),
        "warmup_steps": Opt(500, low=0),
        "warmup_ratio": Opt(0.001, "warm-up starts at lr × this", low=0.0, high=1.0),
        "lr_decay_epochs": Opt([27, 33], "1-based epochs after which the lr is multiplied by lr_decay_rate",
                               type=List[int], low=0),
        "lr_decay_rate": Opt(0.1, low=0.0, high=1.0, low_open=True),
        "clip_grad": Opt(None, type=_maybe(float), low=0.0, low_open=True),
        "amp": Opt(True, "fp16 autocast + loss scaling on CUDA (ignored on CPU)"),
        "max_steps": Opt(None, "stop early after this many optimizer steps (smoke runs)", type=_maybe(int), low=1),
        "max_nonfinite_steps": Opt(0, "steps with a non-finite loss to skip before stopping with an error", low=0),
        "seed": Opt(0, low=0),
        "save_every": Opt(1, "epochs between checkpoints (the last epoch is always saved)", low=1),
        "checkpoint_every_steps": Opt(0, "also write last.pth every K updates (0: at epoch ends only)", low=0),
        "device": Opt(None, type=_maybe(str), check=_check_device),
        "threads": Opt(None, "CPU intra-op threads (null: torch's default)", type=_maybe(int), low=1),
        "dist_timeout": Opt(10.0, "minutes a torchrun process waits at a collective before the job stops",
                            low=0.0, low_open=True),
    },
    "eval": {
        "every": Opt(1, "epochs between evaluations (0: only at the end)", low=0),
        "batch_size": Opt(2, low=1),
    },
    "output": Opt(None, "run folder; null = runs/<recipe>/<date-time>", type=_maybe(str)),
}


#: the nested schemas (a recipe's sections tell which one it follows)
NESTED_SCHEMAS: List[Dict[str, Any]] = [SSL_SCHEMA, DETECT_SCHEMA]


# ----- schemas as nested specs --------------------------------------------------------------------------------------

Schema = Union[type, Mapping[str, Any]]


@functools.lru_cache(maxsize=None)
def _dataclass_specs(cls: type) -> Dict[str, Opt]:
    hints = typing.get_type_hints(cls)
    return {f.name: dataclasses.replace(f.metadata["opt"], type=hints[f.name])
            for f in dataclasses.fields(cls) if "opt" in f.metadata}


def specs_of(schema: Schema) -> Dict[str, Any]:
    """The nested ``{key: Opt | {…}}`` of a schema (a dataclass such as :class:`TrainConfig`, or a nested dict)."""
    if isinstance(schema, RecipeDefaults):
        return schema.specs
    if dataclasses.is_dataclass(schema):
        return dict(_dataclass_specs(schema if isinstance(schema, type) else type(schema)))
    return dict(schema)


class RecipeDefaults(dict):
    """A nested schema's defaults as a plain nested dict (``DEFAULTS['train']['epochs']``), which also carries the
    schema (``.specs``) so that :func:`load_recipe` and :func:`merge_recipe` check values against it."""

    def __init__(self, specs: Mapping[str, Any]) -> None:
        super().__init__(_defaults(specs))
        self.specs = dict(specs)


def _defaults(specs: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: copy.deepcopy(v.default) if isinstance(v, Opt) else _defaults(v) for k, v in specs.items()}


def defaults_of(schema: Schema) -> RecipeDefaults:
    """Every option of ``schema`` at its default."""
    return RecipeDefaults(specs_of(schema))


def _is_free(spec: Any) -> bool:
    return isinstance(spec, Opt) and isinstance(spec.default, dict)


def _unknown(name: str, specs: Mapping[str, Any]) -> ValueError:
    leaf = name.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, list(specs), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    known = (f"known keys here: {', '.join(sorted(specs))}" if len(specs) <= 25 else
             "--help lists every option")
    return ValueError(f"recipe: unknown key {name!r}{hint}; {known}")


def _merge(values: Dict[str, Any], update: Mapping[str, Any], specs: Mapping[str, Any], where: str = "",
           check: bool = True) -> Dict[str, Any]:
    out = copy.deepcopy(values)
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in specs:
            raise _unknown(name, specs)
        spec = specs[key]
        if isinstance(spec, Mapping):  # a checked section
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ValueError(f"recipe: {name!r} must be a mapping of options, got {value!r}")
            out[key] = _merge(out.get(key, {}), value, spec, f"{name}.", check)
        elif _is_free(spec):  # free-form kwargs: null empties them, a mapping merges key by key
            if value is None:
                out[key] = {}
            elif not isinstance(value, Mapping):
                raise ValueError(f"option {name!r}: got {value!r}; allowed: a mapping (KEY=VALUE items)")
            else:
                out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = check_value(name, spec, value) if check else value
    return out


def _check_all(values: Mapping[str, Any], specs: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    out = {}
    for key, spec in specs.items():
        name = f"{where}{key}"
        if isinstance(spec, Mapping):
            out[key] = _check_all(values.get(key, {}), spec, f"{name}.")
        else:
            out[key] = check_value(name, spec, values.get(key, spec.default))
    return out


def merge_recipe(base: Mapping[str, Any], update: Mapping[str, Any], schema: Optional[Schema] = None,
                 where: str = "") -> Dict[str, Any]:
    """``base`` deep-updated with ``update``, every value checked against ``schema`` (``base``'s when it is a
    :class:`RecipeDefaults`); unknown keys raise a ValueError naming them."""
    schema = schema if schema is not None else base
    if not isinstance(schema, RecipeDefaults) and not dataclasses.is_dataclass(schema):
        schema = _schema_of_values(schema)
    return _merge(dict(base), update, specs_of(schema), where)


def _schema_of_values(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The nested schema (:data:`NESTED_SCHEMAS`) whose sections are those of the recipe ``values``."""
    if any(isinstance(v, Opt) for v in values.values()):
        return values
    for schema in NESTED_SCHEMAS:
        if set(values) == set(schema):
            return schema
    raise ValueError(f"recipe sections {sorted(values)} are not those of any command's recipe")


def parse_overrides(items: Union[str, Iterable[str], None]) -> Dict[str, Any]:
    """``['train.epochs=3', 'model.kwargs.depth=4']`` → a nested dict
    (:func:`simattn.utils.options.parse_assignments`)."""
    from .options import parse_assignments
    return parse_assignments(items, what="--set item")


# ----- recipe files -------------------------------------------------------------------------------------------------

def _recipe_dir():
    # package data (pyproject: simattn = ["configs/*.yaml"]); repo-root configs/ links to the same files
    return resources.files("simattn") / "configs"


def _fits(data: Mapping[str, Any], specs: Mapping[str, Any]) -> bool:
    """Whether every key of ``data`` (and of its checked sections) is one of the schema's."""
    for key, value in data.items():
        if key == "base":
            continue
        if key not in specs:
            return False
        if isinstance(specs[key], Mapping) and isinstance(value, Mapping) and not _fits(value, specs[key]):
            return False
    return True


def list_recipes(schema: Optional[Schema] = None) -> List[str]:
    """Names of the recipes shipped in the package (``--config NAME``); with ``schema``, only those for that task
    (whose keys the schema knows)."""
    import yaml
    specs = specs_of(schema) if schema is not None else None
    names = []
    for entry in _recipe_dir().iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        try:
            data = yaml.safe_load(entry.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, Mapping) and (specs is None or _fits(data, specs)):
            names.append(entry.name[:-5])
    return sorted(names)


def find_recipe(recipe: str, schema: Optional[Schema] = None) -> Path:
    """A recipe file from a path or a shipped recipe name (with or without ``.yaml``, or as ``configs/NAME.yaml``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    shipped = _recipe_dir() / f"{name}.yaml"
    if str(path.parent) in ("", ".", "configs") and shipped.is_file():
        return Path(str(shipped))
    if path.exists():
        raise ValueError(f"recipe {recipe!r} is not a file")
    raise FileNotFoundError(f"recipe file not found: {recipe!r} is neither a file nor a shipped recipe "
                            f"({', '.join(list_recipes(schema))})")


def recipe_name(recipe: Optional[str]) -> Optional[str]:
    """The short name of a recipe path or name (``configs/digits_cpu.yaml`` → ``digits_cpu``)."""
    if not recipe:
        return None
    name = Path(str(recipe)).name
    return name[:-5] if name.endswith(".yaml") else name


def _read_recipe(recipe: str, specs: Mapping[str, Any], schema: Schema, chain: Tuple[Path, ...] = ()
                 ) -> Dict[str, Any]:
    """A recipe's values (unchecked), after those of its ``base:`` recipe (a shipped name or a path beside it)."""
    from .io import read_yaml_mapping
    path = find_recipe(recipe, schema)
    if path.resolve() in chain:
        raise ValueError(f"recipe {path} inherits from itself (base: chain {' -> '.join(map(str, chain))})")
    loaded = read_yaml_mapping(path)
    base = loaded.pop("base", None)
    values: Dict[str, Any] = {}
    if base is not None:
        name = str(base) if str(base).endswith(".yaml") else f"{base}.yaml"
        sibling = path.parent / name
        values = _read_recipe(str(sibling) if sibling.is_file() else str(base), specs, schema,
                              chain + (path.resolve(),))
    try:
        return _merge(values, loaded, specs, check=False)
    except ValueError as e:
        raise ValueError(f"{e} (in recipe {path})") from None


def load_recipe(schema: Schema, recipe: Optional[str] = None,
                overrides: Union[Mapping[str, Any], Iterable[str], None] = None) -> Any:
    """Defaults < the recipe file ``recipe`` (a path or shipped name) < ``overrides`` (a nested mapping or
    ``key=value`` items), every value checked.

    ``schema`` is :class:`TrainConfig` (returns a TrainConfig with ``recipe`` set to the recipe given) or a nested
    schema / its :class:`RecipeDefaults` (returns the nested dict).
    """
    specs = specs_of(schema)
    values: Dict[str, Any] = _defaults(specs)
    if recipe is not None:
        values = _merge(values, _read_recipe(str(recipe), specs, schema), specs, check=False)
    if overrides:
        update = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
        values = _merge(values, update, specs, check=False)
    if dataclasses.is_dataclass(schema):
        if recipe is not None and "recipe" in specs:
            values["recipe"] = str(recipe)
        return schema(**values).validate()
    return _check_all(values, specs)


def recipe_to_save(values: Union[Mapping[str, Any], Any]) -> Dict[str, Any]:
    """A run's recipe as it is saved to ``config.yaml``: every option except :data:`RUN_KEYS`, so the file is a
    recipe for a new run (``--config run/config.yaml``) that writes to its own folder."""
    data = values.to_dict() if hasattr(values, "to_dict") else copy.deepcopy(dict(values))
    return {k: v for k, v in data.items() if k not in RUN_KEYS and k != "recipe"}


# ----- the command line of nested recipes (ssl, detect) --------------------------------------------------------------

def add_recipe_arguments(parser: Any, schema: Schema, example: str, run: bool = False) -> None:
    """``--config``, ``--set`` and ``--output`` (and with ``run``, ``--resume`` and ``--overwrite``) for a command
    driven by a nested recipe; :func:`recipe_from_args` reads them back."""
    from .options import OPTIONS_HELP
    parser.add_argument("-c", "--config", metavar="RECIPE",
                        help=f"a YAML file or a shipped recipe name ({', '.join(list_recipes(schema))}); default: "
                             "the built-in defaults")
    parser.add_argument("--set", dest="set_items", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help=f"recipe options to override ({OPTIONS_HELP}), e.g. --set {example} (repeatable)")
    parser.add_argument("--output", help="output folder (default: runs/<recipe>/<date-time>)")
    if run:
        parser.add_argument("--resume", action="store_true",
                            help="continue the run in --output from its last.pth")
        parser.add_argument("--overwrite", action="store_true",
                            help="write into --output even if it holds another run's files (they are replaced)")


def recipe_from_args(schema: Schema, args: Any) -> Dict[str, Any]:
    """The checked recipe of :func:`add_recipe_arguments`' options."""
    from .options import deep_merge, parse_assignments
    overrides = parse_assignments(args.set_items, what="--set item")
    if args.output:
        overrides = deep_merge(overrides, {"output": args.output})
    return load_recipe(schema, args.config, overrides)
