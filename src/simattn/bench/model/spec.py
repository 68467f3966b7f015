"""What ``simattn bench model`` measures, one configuration at a time: :class:`BenchSpec`, its checks, and the
names of input sizes and runtimes that rows show."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...utils.values import quoted

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


@dataclass
class BenchSpec:
    """One model configuration, measured by one worker.

    ``attn``: attention kind passed as ``attn_type`` (``'default'`` keeps the model's own), ``attn_kwargs`` its
    options (e.g. ``{'fused': False}`` for explicit softmax). ``sima_order`` forces every SimA module's matmul
    order. ``model_kwargs`` go to :func:`~simattn.models.factory.create_model` (e.g. ``depth``, ``act_layer``,
    ``attn_kwargs``). ``latency_batch`` is the batch of the latency timings (1 unless a caller needs otherwise).
    ``runtime``: ``'torch'`` (eager, or ``compile`` for ``torch.compile``) or ``'onnxruntime'`` (the model exported
    with ``onnx_exporter``); ``channels_last`` runs the model and its inputs in channels-last memory format.
    ``img_size``: N (N×N) or [H, W]; ``head`` (a key of :data:`HEADS`) wraps ``model`` as the backbone of that
    segmenter (:data:`SEG_CLASSES` classes; logits at the input size). ``floor``: with latency, also time the
    model's linear layers alone (:func:`linear_floor`) through the same runtime and precision; ``profile``: with
    latency on an exported runtime, the shares of :func:`runtime_profile` (where the runtime can say).
    """

    model: str
    attn: str = DEFAULT_ATTN
    attn_kwargs: Dict[str, Any] = field(default_factory=dict)
    img_size: Union[int, List[int]] = 224
    precision: str = "fp32"
    device: str = "cpu"
    threads: int = 1
    batch_size: int = 8
    latency_batch: int = 1
    sima_order: Optional[str] = None
    model_kwargs: Dict[str, Any] = field(default_factory=dict)
    measures: Tuple[str, ...] = MEASURES
    warmup: int = 2
    repeats: int = 10
    max_time: float = 30.0
    label: str = ""
    runtime: str = "torch"
    compile: bool = False
    compile_backend: str = "inductor"
    channels_last: bool = False
    onnx_exporter: str = "auto"
    quantize: Optional[str] = None  # 'static': int8 row of an exported runtime
    head: Optional[str] = None
    floor: bool = False  # with latency: time the model's linear layers alone (:class:`LinearFloor`) too
    profile: bool = False  # with latency on onnxruntime/executorch: the profiled shares of the runtime's time

    def __post_init__(self) -> None:
        self.measures = tuple(self.measures)
        if isinstance(self.img_size, (list, tuple)):  # a square H×W is N
            h, w = self.img_size
            self.img_size = h if h == w else [h, w]
        self.label = self.label or _default_label(self)

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


def runtimes() -> List[str]:
    """``torch`` and the runtime of every registered deployment format that runs on this machine."""
    from ... import deploy
    return ["torch", *deploy.runtimes()]


def int8_runtimes() -> List[str]:
    """Runtimes with an int8 row (--int8): their format has static int8 of the matmul-type layers."""
    from ... import deploy
    return [f.runtime for f in deploy.formats().values() if f.runs_here and "static" in f.quantize_modes]


def runtime_name(spec: BenchSpec) -> str:
    """What ran the timed calls: 'eager', 'compiled', or the runtime ('executorch int8' for an int8 row), with
    ', channels-last' when set."""
    if spec.runtime == "torch":
        name = "compiled" if spec.compile else "eager"
    else:
        name = spec.runtime + (" int8" if spec.quantize else "")
    return name + (", channels-last" if spec.channels_last else "")


def validate_spec(spec: BenchSpec) -> None:
    """One-line ValueErrors for what would otherwise fail deep inside a worker."""
    import timm

    from ...attention import list_attentions
    from ...models import list_models

    if not timm.is_model(spec.model):
        raise ValueError(f"unknown model {spec.model!r} (not registered with timm; simattn models: "
                         f"{', '.join(list_models())})")
    if spec.attn != DEFAULT_ATTN and spec.attn not in list_attentions():
        raise ValueError(f"unknown attention {spec.attn!r}; known: {DEFAULT_ATTN}, {', '.join(list_attentions())}")
    if spec.attn == DEFAULT_ATTN and spec.attn_kwargs:
        raise ValueError("attention options need an attention kind, e.g. --attn softmax --attn-kwargs "
                         "softmax.fused=false")
    if spec.precision not in PRECISIONS:
        raise ValueError(f"unknown precision {spec.precision!r}; expected one of {', '.join(PRECISIONS)}")
    if spec.sima_order is not None and spec.sima_order not in SIMA_ORDERS:
        raise ValueError(f"unknown SimA order {spec.sima_order!r}; expected one of {', '.join(SIMA_ORDERS)}")
    bad = set(spec.measures) - set(MEASURES)
    if bad:
        raise ValueError(f"unknown measure(s) {', '.join(sorted(bad))}; expected some of {', '.join(MEASURES)}")
    if spec.head is not None and spec.head not in HEADS:
        raise ValueError(f"unknown segmentation head {spec.head!r}; expected one of {', '.join(HEADS)}")
    if min(size_hw(spec.img_size)) <= 0 or spec.batch_size <= 0 or spec.latency_batch <= 0 or spec.repeats <= 0:
        raise ValueError(f"image size, batch sizes and repeats must be positive, got img_size={spec.img_size}, "
                         f"batch_size={spec.batch_size}, latency_batch={spec.latency_batch}, repeats={spec.repeats}")
    if spec.warmup < 0 or not spec.max_time > 0 or spec.threads < 1:
        raise ValueError(f"warmup must be >= 0, max_time > 0 and threads >= 1, got warmup={spec.warmup}, "
                         f"max_time={spec.max_time}, threads={spec.threads}")
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec.device!r} requested but CUDA is not available")
    if spec.compile:
        from torch._dynamo import list_backends

        if spec.compile_backend not in list_backends(exclude_tags=()):
            raise ValueError(f"--compile-backend {spec.compile_backend!r} is not one of "
                             f"{', '.join(list_backends(exclude_tags=()))}")
    if spec.runtime not in runtimes():
        raise ValueError(f"--runtime {spec.runtime!r} is not one of {', '.join(runtimes())}")
    if spec.quantize is not None and (spec.quantize != "static" or spec.runtime not in int8_runtimes()):
        raise ValueError(f"int8 ({spec.quantize!r}) is measured for --runtime {' and '.join(int8_runtimes())} "
                         f"(static), not {spec.runtime}")
    if spec.runtime != "torch":
        if spec.compile or spec.channels_last:
            raise ValueError(f"--compile and --channels-last apply to --runtime torch, not {spec.runtime}")
        if spec.precision != "fp32" or device.type != "cpu":
            raise ValueError(f"--runtime {spec.runtime} runs fp32 on cpu, got precision {spec.precision!r} on "
                             f"{spec.device!r}")
        other = set(spec.measures) - set(DEPLOYED_MEASURES)
        if other:
            raise ValueError(f"--runtime {spec.runtime} measures {', '.join(DEPLOYED_MEASURES)} only, not "
                             f"{', '.join(sorted(other))}")
