"""What ``simattn bench model`` measures, one configuration at a time: :class:`BenchSpec`, its checks, and the
names of input sizes and runtimes that rows show."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...utils.recipe import Opt, check_fields, option
from ...utils.values import quoted
from ..cli import shared, some_of

PRECISIONS: Dict[str, Optional[torch.dtype]] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MEASURES = ("latency", "throughput", "train-latency", "train-throughput", "counts", "memory")
SIMA_ORDERS = ("auto", "kv_first", "qk_first")
#: what an exported graph can measure: inference only (training steps and torch memory describe PyTorch)
DEPLOYED_MEASURES = ("latency", "throughput", "counts")
CALIBRATION_IMAGES = 32
DEFAULT_ATTN = "default"  # keep the model's own attention kind
#: --head → the registered segmenter each --models backbone is wrapped in
HEADS = {"fpn": "semantic_fpn", "upernet": "upernet"}
#: classes of the segmentation heads (ADE20K's)
SEG_CLASSES = 150
#: torch.compile's modes (``default``: no mode given)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: the label of the attention-free floor's rows
FLOOR_LABEL = "floor"


def runtimes() -> List[str]:
    """``torch`` and the runtime of every registered deployment format that runs on this machine."""
    from ... import deploy
    return ["torch", *deploy.runtimes()]


def int8_runtimes() -> List[str]:
    """Runtimes with an int8 row (--int8): their format has static int8 of the matmul-type layers."""
    from ... import deploy
    return [f.runtime for f in deploy.formats().values() if f.runs_here and "static" in f.quantize_modes]


def _check_model(name: str) -> Optional[str]:
    from ...models.factory import check_model_name
    try:
        check_model_name(name)
    except ValueError as e:
        return str(e)
    return None


def _check_attention(kind: str) -> Optional[str]:
    from ...attention import list_attentions
    if kind == DEFAULT_ATTN or kind in list_attentions():
        return None
    return f"unknown attention {kind!r}; known: {DEFAULT_ATTN}, {', '.join(list_attentions())}"


@dataclass
class BenchSpec:
    """One model configuration, measured by one worker. Each field is an option of the one option mechanism
    (:mod:`simattn.utils.recipe`: type, default, allowed values, help); ``simattn bench model``'s flags are made
    from them, and every spec is checked when made (:meth:`check`), so a bad one is a one-line ValueError before
    any worker starts."""

    model: str = field(metadata={"opt": Opt(help="registered model name", check=_check_model)})
    attn: str = option(DEFAULT_ATTN, f"attention kind passed as attn_type ('{DEFAULT_ATTN}' keeps the model's own)",
                       check=_check_attention)
    attn_kwargs: Dict[str, Any] = option(factory=dict, help="options of the attention kind (e.g. fused: false)")
    img_size: Union[int, List[int]] = option(224, "input size: N (N×N px) or [H, W]", low=1, length=2)
    precision: str = option("fp32", "fp32, or bf16/fp16 autocast", choices=list(PRECISIONS))
    device: str = field(default="cpu", metadata={"opt": shared("device")})
    threads: int = field(default=1, metadata={"opt": shared("threads", 1)})
    batch_size: int = option(8, "batch of the throughput measurements", low=1)
    fill_batch: bool = option(False, "halve the throughput batch on CUDA out-of-memory until a call fits (the "
                                     "batch used is in the row)")
    latency_batch: int = option(1, "batch of the latency measurements", low=1)
    sima_order: Optional[str] = option(None, f"force this SimA order ({', '.join(SIMA_ORDERS)}) on every SimA module",
                                       choices=list(SIMA_ORDERS))
    model_kwargs: Dict[str, Any] = option(factory=dict, help="create_model kwargs (depth, act_layer, ...)")
    measures: List[str] = option(factory=lambda: list(MEASURES), help=f"what to measure: some of "
                                 f"{', '.join(MEASURES)}", check=some_of(list(MEASURES)))
    warmup: int = option(2, "untimed runs before each measurement", low=0)
    repeats: int = field(default=10, metadata={"opt": shared("repeats", 10, "timed runs per measurement (at least)")})
    max_time: float = field(default=30.0, metadata={"opt": shared("max_time", 30.0)})
    label: str = option("", "the row's name (default: the attention kind, or the model for its own)")
    runtime: str = option("torch", "what runs the model: torch, or a deployment format's runtime (the model "
                                   "exported and run there; inference only)", choices=runtimes)
    compile: bool = option(False, "time the torch.compile'd model (runtime torch)")
    compile_backend: str = option("inductor", "torch.compile backend with --compile (see "
                                              "torch._dynamo.list_backends())")
    compile_mode: str = option("default", "torch.compile mode with --compile (reduce-overhead: CUDA graphs)",
                               choices=list(COMPILE_MODES))
    channels_last: bool = option(False, "model and inputs in channels-last memory format (runtime torch)")
    format_options: Dict[str, Any] = option(factory=dict, help="the deployment formats' own export options, by "
                                        "bench flag name (e.g. onnx_exporter; simattn.deploy.bench_options)")
    quantize: Optional[str] = option(None, "static: the int8 row of an exported runtime, calibrated on digits",
                                     choices=["static"])
    head: Optional[str] = option(None, f"wrap the model as the backbone of this segmentation head ({SEG_CLASSES} "
                                       "classes, logits at the input size)", choices=list(HEADS))
    floor: bool = option(False, "with latency: time the model's linear layers alone (the linear floor) too")
    attention_free: bool = option(False, "replace every attention core of the model with a zero-cost stand-in "
                                         "(the values pass through): the attention-free floor")
    profile: bool = option(False, "with latency on an exported runtime: the profiled shares of the runtime's time")

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.img_size, list):  # a square H×W is N
            h, w = self.img_size
            self.img_size = h if h == w else [h, w]
        self.label = self.label or _default_label(self)
        self.check()

    def check(self) -> None:
        """The rules between options (each option's own values are checked by its declaration); one-line
        ValueErrors for what would otherwise fail deep inside a worker."""
        if self.attn == DEFAULT_ATTN and self.attn_kwargs:
            raise ValueError("attention options need an attention kind, e.g. --attn softmax --attn-kwargs "
                             "softmax.fused=false")
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available")
        if self.compile:
            from torch._dynamo import list_backends

            if self.compile_backend not in list_backends(exclude_tags=()):
                raise ValueError(f"--compile-backend {self.compile_backend!r} is not one of "
                                 f"{', '.join(list_backends(exclude_tags=()))}")
            if self.compile_mode != "default" and self.compile_backend != "inductor":
                raise ValueError(f"--compile-mode {self.compile_mode} is inductor's; --compile-backend is "
                                 f"{self.compile_backend!r}")
        if self.head and any(m.startswith("train-") for m in self.measures):
            from ...engine.losses import check_loss_size

            check_loss_size(SEG_CLASSES, size_hw(self.img_size)[1])
        if self.quantize is not None and self.runtime not in int8_runtimes():
            raise ValueError(f"int8 ({self.quantize!r}) is measured for --runtime {' and '.join(int8_runtimes())}, "
                             f"not {self.runtime}")
        if self.runtime == "torch":
            return
        if self.compile or self.channels_last or self.attention_free:
            raise ValueError(f"--compile, --channels-last and the attention-free floor apply to --runtime torch, "
                             f"not {self.runtime}")
        if self.precision != "fp32" or torch.device(self.device).type != "cpu":
            raise ValueError(f"--runtime {self.runtime} runs fp32 on cpu, got precision {self.precision!r} on "
                             f"{self.device!r}")
        other = set(self.measures) - set(DEPLOYED_MEASURES)
        if other:
            raise ValueError(f"--runtime {self.runtime} measures {', '.join(DEPLOYED_MEASURES)} only, not "
                             f"{', '.join(sorted(other))}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchSpec":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"bench spec has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def _default_label(spec: BenchSpec) -> str:
    if spec.attention_free:
        return FLOOR_LABEL
    label = spec.attn if spec.attn != DEFAULT_ATTN else spec.model
    if spec.sima_order and spec.sima_order != "auto":
        label += f" ({spec.sima_order})"
    return label


def parse_size(value: Any) -> Union[int, List[int]]:
    """An ``--img-size`` item: N (an N×N input) or the text ``HxW`` (``1024x2048``) → N or [H, W] (a square HxW is
    N); a one-line ValueError for anything else (zero, ``12x``, ``axb``)."""
    text = str(value).strip().lower()
    parts = text.split("x")
    if isinstance(value, bool) or not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{quoted(value)} is not a size; allowed: N or HxW with positive integers "
                         "(e.g. 512, 1024x2048)")
    hw = [int(p) for p in parts]
    if min(hw) < 1:
        raise ValueError(f"{quoted(value)}: sizes must be positive (e.g. 512, 1024x2048)")
    return hw[0] if len(hw) == 1 or hw[0] == hw[1] else hw


def size_hw(size: Union[int, Sequence[int], str]) -> Tuple[int, int]:
    """(H, W) of a size as specs (N or [H, W]) and rows (N or ``'HxW'``) hold it."""
    if isinstance(size, str):
        size = parse_size(size)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[1])
    return int(size), int(size)


def size_text(size: Union[int, Sequence[int], str]) -> Union[int, str]:
    """A size as rows show it: N for N×N, ``'HxW'`` otherwise."""
    h, w = size_hw(size)
    return h if h == w else f"{h}x{w}"


def size_side(size: Union[int, Sequence[int], str]) -> float:
    """The side of the square with the same pixel count (the x axis of the plots): √(H·W)."""
    h, w = size_hw(size)
    return math.sqrt(h * w)


def check_sizes(values: Sequence[Any]) -> Optional[str]:
    """The ``--img-size`` check: every item N or HxW."""
    for value in values:
        try:
            parse_size(value)
        except ValueError as e:
            return str(e)
    return None


def runtime_name(spec: BenchSpec) -> str:
    """What ran the timed calls: 'eager', 'compiled', or the runtime ('executorch int8' for an int8 row), with
    ', channels-last' when set."""
    if spec.runtime == "torch":
        name = "eager" if not spec.compile else "compiled" + (
            f" ({spec.compile_mode})" if spec.compile_mode != "default" else "")
    else:
        name = spec.runtime + (" int8" if spec.quantize else "")
    return name + (", channels-last" if spec.channels_last else "")
