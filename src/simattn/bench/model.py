"""``simattn bench model``: what SimA saves in whole models.

For every combination of registered model × attention kind × input size × precision it measures, in a fresh
subprocess per combination (``python -m simattn.bench.model --worker SPEC``, one JSON line back on stdout) so that
one model's allocations, caches and thread pools do not disturb the next (freed memory is kept by the allocator,
see :func:`simattn.utils.timing.keep_freed_memory`, so calls do not page-fault their buffers in):

* inference: batch-1 latency (p50, p90) and batched throughput;
* training step (forward + backward + AdamW step): batch-1 latency and batched throughput;
* exp-like evaluations and op calls per forward, FLOPs (total and attention core) — :mod:`simattn.bench.counters`;
* peak memory of a forward and of a training step (CUDA: allocator peak; CPU: deterministic storage accounting);
* with latency, on the eager model: the attention share, the measured fraction of the forward's time spent inside
  the attention modules (:func:`attention_share`: forward hooks time each attention module, with and without its
  qkv/output projections, within the same calls; not an estimate from FLOPs).

``--img-size`` takes N (N×N) or HxW (``1024x2048``; ViT-style models are built for that size). ``--head fpn`` or
``--head upernet`` wraps each ``--models`` backbone in that segmenter (:mod:`simattn.models.segmentation`,
registered as ``semantic_fpn``/``upernet``, 150 classes as ADE20K; ``--attn`` reaches the backbone), whose logits
are per pixel at the input size; its training step takes a per-pixel cross-entropy. Sizes must be multiples of the
patch size (and of 32 for a segmenter), checked before any work.

Every timing comes with its p10 and p90 (throughput: batch / p90 and batch / p10), and a one-line warning names
the timings whose p10-p90 range is wider than :data:`simattn.bench.report.WIDE_SPREAD` of the median.

What runs the model (the ``runtime`` column): ``eager`` PyTorch, ``compiled`` (``--compile``, ``torch.compile``;
the first, compiling call is part of the warm-up), or the runtime of a deployment format (:mod:`simattn.deploy`:
the model exported, and opened, by the same registry entry ``simattn export`` uses): ``onnxruntime``,
``executorch`` (XNNPACK), ``openvino`` (CPU plugin, fp32), ``litert`` (TFLite), with ``channels-last`` added under
``--channels-last``. ``--runtime`` takes several; ``--int8`` adds an int8 row for each runtime whose format has
static int8 (onnxruntime: QDQ; ExecuTorch: PT2E), calibrated on digits. Every exported graph is checked against
PyTorch (``runtime_max_abs_diff``) and is inference only. Every runtime is held to ``--threads`` (torch's intra-op
pool, onnxruntime's intra-op threads, ExecuTorch's XNNPACK pool, OpenVINO's inference threads), and the CPU's vector
features (AVX2, AVX-512, VNNI, AMX) are recorded, since int8 speed depends on them. Exp/FLOP counts and memory are
always those of the eager model.

The floor (with latency; on by default when ``--runtime`` names a runtime besides torch, ``--floor``/``--no-floor``
to choose): each row's model reduced to its ``nn.Linear`` layers, each applied to an input of the shape it sees in
the model (:func:`linear_floor`; a convolution patch embedding is not a linear and is left out), run through the
same runtime, precision and threads and timed in the same worker (``floor_ms``; ``of_floor`` = the model's p50 /
the floor's). On onnxruntime and ExecuTorch a separate profiled run (:func:`runtime_profile`) gives the shares of
the runtime's time outside matmul-type kernels (``non_linear_share``) and, on ExecuTorch, outside XNNPACK's
delegate calls (``non_delegated_share``).

Results go to ``bench_model.{json,csv,md,png}`` (the figure: bars per runtime and precision for one input size,
lines against size for several). ``--fixed-order`` runs SimA as (q̂k̂ᵀ)v, the paper's way of
isolating the cost of exp. ``--attn`` lists the kinds (``LABEL=KIND`` runs a kind twice under another name),
``--attn-kwargs`` gives each its options (``softmax.fused=false`` is the explicit N×N softmax, whose memory grows
quadratically; fused SDPA's does not). Examples::

    simattn bench model --models sima_deit_small_patch16_224 --attn sima softmax --img-size 224 512 1024
    simattn bench model --attn sima softmax explicit=softmax --attn-kwargs explicit.fused=false \\
        --measure memory counts --img-size 224 384 512
    simattn bench model --attn sima softmax --compile --measure latency throughput
    simattn bench model --attn sima softmax --head fpn --img-size 512 1024 1024x2048 --measure latency memory

On a GPU (``--device cuda``; bf16 autocast unless ``--precision`` says otherwise; peak memory from
``torch.cuda.max_memory_allocated``), SimA against its softmax twin, with SimA's Triton kernels as a third entry::

    simattn bench model --device cuda --attn sima triton=sima softmax --attn-kwargs triton.backend=triton \
        --img-size 224 512 1024 --measure throughput train-throughput memory

Without a CUDA device, ``--device cuda`` stops at once with a one-line error (exit code 2).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..models.factory import create_model, parse_model_kwargs, with_attention
from ..utils.values import OPTIONS_HELP, parse_assignments, quoted
from ..utils.timing import keep_freed_memory, set_threads, sync, time_fn
from .cli import check_bench_flags, check_out, refuse_unused, require_cuda
from .report import machine_info, markdown_table, new_figure, progress, relative_spread, save_figure, \
    spread_warning, write_csv, write_json, write_text

__all__ = ["BenchSpec", "PRECISIONS", "MEASURES", "HEADS", "runtimes", "int8_runtimes", "measure", "run_specs",
           "speedups", "runtime_speedups", "plot_results", "plot_bars", "plot_lines", "linear_calls", "linear_floor",
           "LinearFloor", "runtime_profile", "parse_attn", "parse_size", "size_text", "runtime_name",
           "attention_share", "main"]

#: precision name → autocast dtype (None = plain fp32, no autocast)
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
_RESULT_TAG = "SIMATTN_BENCH_RESULT "
MB = 2 ** 20


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


def _check_sizes(values: Sequence[Any]) -> Optional[str]:
    """The ``--img-size`` check: every item N or HxW."""
    for value in values:
        try:
            parse_size(value)
        except ValueError as e:
            return str(e)
    return None


def runtimes() -> List[str]:
    """``torch`` and the runtime of every registered deployment format that runs on this machine."""
    from .. import deploy
    return ["torch", *deploy.runtimes()]


def int8_runtimes() -> List[str]:
    """Runtimes with an int8 row (--int8): their format has static int8 of the matmul-type layers."""
    from .. import deploy
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

    from ..attention import list_attentions
    from ..models import list_models

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


def check_builds(specs: Sequence[BenchSpec]) -> None:
    """Build each distinct model of ``specs`` on the meta device (no memory, no weights initialized): kwargs or
    attention options the model refuses are a one-line ValueError before any worker starts, not an error row per
    configuration after the sweep."""
    seen = set()
    for spec in specs:
        key = json.dumps([spec.model, spec.head, spec.attn, spec.attn_kwargs, spec.sima_order, spec.model_kwargs,
                          spec.img_size], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            with torch.device("meta"):
                model = build_model(spec)
        except ValueError as e:
            message = str(e).strip().splitlines()[0]
            what = [spec.model] if spec.model not in message else []
            what += [f"{spec.head} head"] if spec.head else []
            what += [f"attention {spec.label!r}"] if spec.attn != DEFAULT_ATTN else []
            raise ValueError(f"{', '.join(what + [f'{size_text(spec.img_size)} px'])}: {message}") from None
        except Exception:  # noqa: BLE001 - an op the meta device lacks: the worker's real build will tell
            continue
        multiple, why = input_multiple(model)
        if any(v % multiple for v in size_hw(spec.img_size)):
            name = f"{HEADS[spec.head]} on {spec.model}" if spec.head else spec.model
            raise ValueError(f"--img-size {size_text(spec.img_size)}: {name} takes heights and widths that are "
                             f"multiples of {multiple} ({why})")


def input_multiple(model: nn.Module) -> Tuple[int, str]:
    """(m, why): input heights and widths ``model`` runs at are multiples of m — the patch size of a patch model
    (timm's patch embedding refuses others), and for a segmenter also the coarsest feature stride (its decoder adds
    each level to the 2× upsampled coarser one)."""
    from ..models.segmentation import Segmenter

    body = model.backbone if isinstance(model, Segmenter) else model
    patch = getattr(getattr(body, "patch_embed", None), "patch_size", None)
    multiple, why = 1, []
    if patch is not None:
        ph, pw = (patch, patch) if isinstance(patch, int) else patch
        multiple = math.lcm(int(ph), int(pw))
        why.append(f"patch {ph}" if ph == pw else f"patch {ph}x{pw}")
    if isinstance(model, Segmenter):
        stride = max(model.neck.strides)
        multiple = math.lcm(multiple, stride)
        why.append(f"feature levels down to stride {stride}")
    return multiple, ", ".join(why) or "any size"


# ------------------------------------------------------------------------------------------------ the worker


def model_args(spec: BenchSpec) -> Tuple[str, Dict[str, Any]]:
    """The registered name and ``create_model`` kwargs of ``spec``'s model, without the attention and size: the
    model itself, or with ``head`` the segmenter with ``backbone=spec.model`` (the record of an exported file)."""
    if spec.head:
        return HEADS[spec.head], {"backbone": spec.model, "num_classes": SEG_CLASSES, **spec.model_kwargs}
    return spec.model, dict(spec.model_kwargs)


def build_model(spec: BenchSpec) -> nn.Module:
    """The model of ``spec`` from the model factory (built for ``img_size`` when the model takes it, so position
    embeddings are not resampled on every forward), with the SimA order forced when asked. A segmenter passes the
    kwargs it does not take (``attn_type``, ``img_size``, ...) to its backbone."""
    from ..attention import SimAAttention

    name, kwargs = model_args(spec)
    if spec.attn != DEFAULT_ATTN:
        attn_kwargs = {**kwargs.get("attn_kwargs", {}), **spec.attn_kwargs}
        if spec.attn == "sima" and spec.sima_order:
            attn_kwargs["order"] = spec.sima_order
        kwargs = with_attention(kwargs, spec.attn, attn_kwargs)
    h, w = size_hw(spec.img_size)
    # every family takes img_size; one it cannot be built for is a one-line error naming the size
    model = create_model(name, **{"img_size": h if h == w else (h, w), **kwargs})
    if spec.sima_order:
        # Models whose default attention is SimA (or that mix kinds) get the order on every SimA module too.
        for module in model.modules():
            if isinstance(module, SimAAttention):
                module.order = spec.sima_order
    return model


def _token_count(model: nn.Module, img_size: Union[int, Sequence[int]]) -> Optional[int]:
    """Tokens per image for patch models (grid + prefix tokens; a segmenter's: its backbone's), None when the model
    does not say."""
    from ..models.segmentation import Segmenter

    model = model.backbone if isinstance(model, Segmenter) else model
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is None:
        return None
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    h, w = size_hw(img_size)
    return (h // ph) * (w // pw) + int(getattr(model, "num_prefix_tokens", 0) or 0)


def _first_tensor(out: Any) -> torch.Tensor:
    while not isinstance(out, torch.Tensor):
        out = out[0]
    return out


class _Runner:
    """The model, its inputs and the two callables that are timed: inference and one training step."""

    def __init__(self, spec: BenchSpec, work_dir: Optional[str] = None, model: Optional[nn.Module] = None,
                 like: Optional["_Runner"] = None, stem: str = "model") -> None:
        """``model``: run this module instead of ``spec``'s (the linear floor), taking the inputs of ``like``'s
        model and exported with its record and calibration images; ``stem`` names its exported files."""
        self.spec = spec
        self.device = torch.device(spec.device)
        self.dtype = PRECISIONS[spec.precision]
        self.memory_format = torch.channels_last if spec.channels_last else torch.contiguous_format
        self.model = (model if model is not None else build_model(spec)).to(self.device,
                                                                             memory_format=self.memory_format)
        self.source = like.model if like is not None else self.model  # the model whose inputs and record these are
        self.stem = stem
        in_chans = (getattr(self.source, "pretrained_cfg", None) or {}).get("input_size", (3,))[0]
        self.shape = (in_chans, *size_hw(spec.img_size))
        # the module the timed calls run (counts and memory use the eager self.model)
        # static shapes: the latency and throughput batches each get their own specialized graph
        self.timed = (torch.compile(self.model, backend=spec.compile_backend, dynamic=False) if spec.compile
                      else self.model)
        self.deployed = None  # the exported file's program (batch -> first output) for the other runtimes
        self.deployed_path: Optional[Path] = None  # the file it runs
        self.onnx_max_abs_diff: Optional[float] = None
        self.runtime_max_abs_diff: Optional[float] = None
        self.runtime_threads: Optional[int] = None
        if spec.runtime != "torch":
            self._deploy(work_dir)
        self.optimizer = None
        self.scaler = None

    def _deploy(self, work_dir: str) -> None:
        """The model exported through its format's registry entry (:mod:`simattn.deploy`; int8: static, calibrated
        on digits), opened at --threads, and checked against PyTorch on one input."""
        from .. import deploy
        from ..data.images import resolve_data_config
        from ..models.weights import export_record

        fmt = deploy.get(self.spec.runtime)
        model = self.model.eval()
        data_config = {**resolve_data_config(self.source), "input_size": self.shape}
        name, kwargs = model_args(self.spec)
        record = export_record(name, kwargs, data_config,
                               attention=getattr(self.source, "attn_type", self.spec.attn),
                               producer="simattn bench model" + (f" ({self.stem})" if self.stem != "model" else ""))
        calibration = self._calibration(data_config) if self.spec.quantize else None
        options = {"exporter": self.spec.onnx_exporter} if "exporter" in fmt.options else {}
        path = Path(work_dir) / f"{self.stem}{fmt.suffixes[0]}"
        from_file = bool(self.spec.quantize) and fmt.quantizes == "file"
        fmt.export(model, path, record, quantize=None if from_file else self.spec.quantize, calibration=calibration,
                   fixed_size=True, verify=False, **options)
        if from_file:
            path = fmt.quantize(path, calibration, self.spec.quantize,
                                dst=Path(work_dir) / f"{self.stem}_int8{path.suffix}")
        self.deployed_path = Path(path)
        self.deployed = fmt.open(path, self.spec.threads)
        self.runtime_threads = self.deployed.threads
        x = self.inputs(1)
        with torch.no_grad():
            ref = _first_tensor(self.model(x))
            self.runtime_max_abs_diff = float((self.deployed(x) - ref).abs().max())
        if fmt.name == "onnx":  # the column the first onnxruntime rows had
            self.onnx_max_abs_diff = self.runtime_max_abs_diff

    def _calibration(self, data_config) -> torch.Tensor:
        """Digits (train split) at the model's input size and normalization: int8 rows are calibrated on real
        images, as ``simattn export --quantize static`` does by default."""
        from ..data.calibration import calibration_images, open_calibration_dataset

        config = {"crop_pct": 1.0, "interpolation": "bilinear", **data_config, "input_size": self.shape}
        return calibration_images(open_calibration_dataset("digits"), config, CALIBRATION_IMAGES)

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def inputs(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, *self.shape, device=self.device).contiguous(memory_format=self.memory_format)

    def infer_fn(self, batch: int, timed: bool = True):
        """One inference call; ``timed`` runs what is timed (compiled module, exported program), else the eager
        model (for counts and memory)."""
        self.model.eval()
        x = self.inputs(batch)
        if timed and self.deployed is not None:
            return self.deployed.bind(x)
        model = self.timed if timed else self.model

        def infer():
            with torch.inference_mode(), self.autocast():
                return model(x)

        return infer

    def train_fn(self, batch: int):
        from timm.optim import create_optimizer_v2

        self.model.train()
        if self.optimizer is None:
            self.optimizer = create_optimizer_v2(self.model, "adamw", lr=1e-4, weight_decay=0.05)
            # fp16 training needs loss scaling; the scaler's checks are part of the real step's cost.
            from ..engine.core import grad_scaler

            self.scaler = grad_scaler(self.device, self.dtype == torch.float16)
        x = self.inputs(batch)
        if self.spec.head:  # a class per pixel
            target = torch.randint(SEG_CLASSES, (batch, *self.shape[1:]), device=self.device)
        else:
            with torch.no_grad(), self.autocast():
                num_classes = _first_tensor(self.model(x[:1])).shape[-1]
            target = torch.randint(num_classes, (batch,), device=self.device)

        def loss_of(out):
            if isinstance(out, torch.Tensor):
                return F.cross_entropy(out.float(), target)
            # UperNet's auxiliary head in training, weighted as mmseg's configs weight it
            return F.cross_entropy(out[0].float(), target) + 0.4 * F.cross_entropy(out[1].float(), target)

        def step():
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast():
                loss = loss_of(self.timed(x))
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()

        return step

    def time(self, fn) -> Dict[str, float]:
        s = self.spec
        return time_fn(fn, warmup=s.warmup, repeats=s.repeats, device=self.device, max_time=s.max_time)


def attention_share(model: nn.Module, fn, device: torch.device, repeats: int,
                    max_time: float = float("inf")) -> Dict[str, Any]:
    """The share of ``fn()``'s (a forward of ``model``) wall time spent inside its attention modules, measured.

    Forward pre/post hooks on every outermost attention module
    (:func:`simattn.bench.counters.attention_module_names`: simattn's ``TokenAttention`` kinds, timm's attention
    classes) and on their Linear/Conv layers add up the time spent in them during each call (CUDA: the device is
    synchronized at every hook, so each span is the work done, not the launch); the share is that time over the
    call's own, in the same call. ``attn_share``: the whole module (qkv and output projections included);
    ``attn_core_share``: without the projections, i.e. what the attention kind changes (q kᵀ, softmax or SimA's
    normalization, the weighted sum). Medians over ``repeats`` calls (at least one; fewer once ``max_time`` s are
    spent). The hooks cost a few µs per module call, which this timing includes and the latency rows do not.
    Empty when the model has no attention module."""
    from .counters import attention_module_names

    modules = dict(model.named_modules())
    outer = [modules[name] for name in attention_module_names(model)]
    if not outer:
        return {}
    projections = [sub for m in outer for sub in m.modules() if isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd))]
    spent = {"attn": 0.0, "proj": 0.0}
    started: Dict[int, float] = {}

    def enter(module, args):
        sync(device)
        started[id(module)] = time.perf_counter()

    def leave(kind):
        def hook(module, args, out):
            sync(device)
            spent[kind] += time.perf_counter() - started.pop(id(module))
        return hook

    handles = [m.register_forward_pre_hook(enter) for m in outer + projections]
    handles += [m.register_forward_hook(leave("attn")) for m in outer]
    handles += [m.register_forward_hook(leave("proj")) for m in projections]
    shares, cores = [], []
    try:
        start = time.perf_counter()
        while len(shares) < max(1, repeats) and (not shares or time.perf_counter() - start < max_time):
            spent.update(attn=0.0, proj=0.0)
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            total = time.perf_counter() - t0
            shares.append(spent["attn"] / total)
            cores.append((spent["attn"] - spent["proj"]) / total)
    finally:
        for handle in handles:
            handle.remove()
    return {"attn_share": statistics.median(shares), "attn_core_share": statistics.median(cores),
            "attn_share_runs": len(shares)}


# ------------------------------------------------------------------------------------------------ the linear floor


def linear_calls(model: nn.Module, x: torch.Tensor) -> List[Dict[str, Any]]:
    """Every ``nn.Linear`` call of one eager forward of ``model`` on ``x``, in call order (forward hooks): ``name``,
    ``input_shape`` (batch first, as the layer saw it), ``in_features``, ``out_features``, ``bias``. A layer called
    twice is listed twice; linears applied as ``F.linear`` outside an ``nn.Linear`` call are not seen."""
    calls: List[Dict[str, Any]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, args, out):
        calls.append({"name": names[module], "input_shape": tuple(args[0].shape), "in_features": module.in_features,
                      "out_features": module.out_features, "bias": module.bias is not None})

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        with torch.inference_mode():
            model.eval()(x)
    finally:
        for handle in handles:
            handle.remove()
    return calls


class LinearFloor(nn.Module):
    """The linear layers of a model alone: one ``nn.Linear`` per call :func:`linear_calls` saw (same in/out
    features and bias), each applied to an input of the shape that call saw, batch as given.

    It takes the model's input (a batch of images), so that a runtime exports, calibrates and runs it exactly as
    it does the model. The layers run in the model's order, each on the previous one's output where the shapes
    agree (DeiT: proj → fc1 → fc2 → the next block's qkv), else on it flattened and cut (repeated if short) to the
    shape the layer saw (image → first layer, qkv → proj, last layer → head): a chain, so no layer is dead code a
    runtime could drop, and no sums or concatenations are added. Weights are fresh with std 1/√in_features and
    zero bias, so that activations keep their scale along the chain (no vanishing values, no denormals; timing
    does not depend on the weights' values)."""

    def __init__(self, calls: Sequence[Dict[str, Any]]) -> None:
        super().__init__()
        if not calls:
            raise ValueError("the model runs no nn.Linear layer: it has no linear floor")
        self.shapes = [tuple(int(v) for v in c["input_shape"][1:]) for c in calls]
        self.layers = nn.ModuleList(nn.Linear(c["in_features"], c["out_features"], bias=c["bias"]) for c in calls)
        with torch.no_grad():
            for layer in self.layers:
                nn.init.normal_(layer.weight, std=layer.in_features ** -0.5)
                if layer.bias is not None:
                    layer.bias.zero_()

    @staticmethod
    def _fit(h: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
        if tuple(h.shape[1:]) == shape:
            return h
        need = math.prod(shape)
        flat = h.reshape(h.shape[0], -1)
        have = math.prod(h.shape[1:])
        if have < need:
            flat = flat.repeat(1, -(-need // have))
        return flat[:, :need].reshape(-1, *shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for shape, layer in zip(self.shapes, self.layers):
            h = layer(self._fit(h, shape))
        return h


def linear_floor(model: nn.Module, x: torch.Tensor) -> LinearFloor:
    """:class:`LinearFloor` of ``model``'s linear layers as one forward on ``x`` (its batch) calls them."""
    return LinearFloor(linear_calls(model, x))


# ------------------------------------------------------------------------------------------------ runtime profiles

def runtime_profile(runtime: str, path: Union[str, Path], x: torch.Tensor, threads: int,
                    work_dir: Optional[str] = None) -> Dict[str, Any]:
    """The profiled shares of an exported file's time in its runtime (the format's
    :meth:`~simattn.deploy.base.Format.profile`), from runs of their own (profiling slows the calls it records), or
    a ``profile_note`` saying why there are none; empty for runtimes that cannot say."""
    from .. import deploy

    return deploy.get(runtime).profile(path, x, threads, work_dir=work_dir)


def measure(spec: BenchSpec) -> Dict[str, Any]:
    """Measure one configuration in this process and return its result row (what a worker sends back)."""
    validate_spec(spec)
    with tempfile.TemporaryDirectory(prefix="simattn_bench_") as work_dir:
        return _measure(spec, work_dir)


def _measure(spec: BenchSpec, work_dir: str) -> Dict[str, Any]:
    from .counters import count_flops, peak_memory, trace_ops

    threads = set_threads(spec.threads)
    allocator = keep_freed_memory()
    torch.manual_seed(0)
    run = _Runner(spec, work_dir)
    model = run.model
    row: Dict[str, Any] = {
        "model": spec.model, "label": spec.label, "attn": spec.attn, "runtime": runtime_name(spec),
        "attn_kwargs": json.dumps(spec.attn_kwargs) if spec.attn_kwargs else "",
        "attn_type": getattr(model, "attn_type", spec.attn), "sima_order": spec.sima_order or "",
        "head": spec.head or "", "img_size": size_text(spec.img_size), "tokens": _token_count(model, spec.img_size),
        "precision": spec.precision,
        "device": spec.device, "threads": threads, "allocator": allocator, "batch_size": spec.batch_size,
        "latency_batch": spec.latency_batch, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }
    if run.onnx_max_abs_diff is not None:
        row["onnx_max_abs_diff"] = run.onnx_max_abs_diff
    if run.runtime_max_abs_diff is not None:
        row["runtime_max_abs_diff"] = run.runtime_max_abs_diff
        row["runtime_threads"] = run.runtime_threads
    b1 = spec.latency_batch
    if "counts" in spec.measures:
        infer = run.infer_fn(b1, timed=False)
        trace = trace_ops(infer)
        row.update({k: v for k, v in trace.summary().items()})
        flops = count_flops(infer, model)
        row["gflops"] = flops.total / 1e9 / b1
        row["attn_gflops"] = flops.attention / 1e9 / b1
    if "memory" in spec.measures:
        row["peak_fwd_mb"] = peak_memory(run.infer_fn(b1, timed=False), run.device) / MB
        timed, run.timed = run.timed, run.model  # memory of the eager step
        step = run.train_fn(b1)
        step()  # optimizer state exists from here on: measure a steady-state step
        row["peak_train_mb"] = peak_memory(step, run.device) / MB
        run.timed = timed
    for prefix, measure, make_fn in (("infer", "", run.infer_fn), ("train", "train-", run.train_fn)):
        if measure + "latency" in spec.measures:
            t = run.time(make_fn(b1))
            row.update({f"{prefix}_p50_ms": t["median_ms"], f"{prefix}_p10_ms": t["p10_ms"],
                        f"{prefix}_p90_ms": t["p90_ms"], f"{prefix}_min_ms": t["min_ms"],
                        f"{prefix}_runs": t["runs"]})
            if prefix == "infer" and spec.runtime == "torch" and not spec.compile:
                # the eager forward just timed, again with the attention modules timed inside it
                row.update(attention_share(model, run.infer_fn(b1), run.device, spec.repeats, spec.max_time))
            if prefix == "infer" and spec.floor:
                row.update(_time_floor(run, work_dir))
                row["of_floor"] = row["infer_p50_ms"] / row["floor_ms"]
            if prefix == "infer" and spec.profile and run.deployed_path is not None:
                row.update(runtime_profile(spec.runtime, run.deployed_path, run.inputs(b1), spec.threads, work_dir))
        if measure + "throughput" in spec.measures:
            t = run.time(make_fn(spec.batch_size))
            ips = spec.batch_size * 1e3
            row.update({f"{prefix}_ips": ips / t["median_ms"], f"{prefix}_ips_p10": ips / t["p90_ms"],
                        f"{prefix}_ips_p90": ips / t["p10_ms"]})
    sync(run.device)
    return row


def _time_floor(run: _Runner, work_dir: str) -> Dict[str, Any]:
    """The linear floor of ``run``'s model (:func:`linear_floor` at the latency batch), run as ``run`` runs the
    model (eager, compiled, or exported, quantized and opened by the same registry entry at the same threads),
    timed the same way: ``floor_ms`` (p50), ``floor_p10_ms``, ``floor_p90_ms`` and ``floor_linears``."""
    spec = run.spec
    b1 = spec.latency_batch
    with torch.random.fork_rng(devices=[]), torch.no_grad(), run.autocast():  # the same fresh weights every run
        torch.manual_seed(0)
        floor = linear_floor(run.model, run.inputs(b1))
    floor_run = _Runner(spec, work_dir, model=floor, like=run, stem="floor")
    t = floor_run.time(floor_run.infer_fn(b1))
    return {"floor_ms": t["median_ms"], "floor_p10_ms": t["p10_ms"], "floor_p90_ms": t["p90_ms"],
            "floor_linears": len(floor.layers)}


def _worker_main(spec_json: str) -> int:
    row = measure(BenchSpec.from_json(spec_json))
    print(_RESULT_TAG + json.dumps(row), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ the parent


def _run_worker(spec: BenchSpec, timeout: Optional[float]) -> Dict[str, Any]:
    """Measure ``spec`` in a fresh interpreter; a failed worker gives a row with ``error`` set."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.threads), MKL_NUM_THREADS=str(spec.threads))
    cmd = [sys.executable, "-m", "simattn.bench.model", "--worker", spec.to_json()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _error_row(spec, f"worker timed out after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_TAG):
            return json.loads(line[len(_RESULT_TAG):])
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return _error_row(spec, tail[-1] if tail else f"worker exited with code {proc.returncode} and no result")


def _error_row(spec: BenchSpec, message: str) -> Dict[str, Any]:
    return {"model": spec.model, "label": spec.label, "attn": spec.attn, "runtime": runtime_name(spec),
            "sima_order": spec.sima_order or "", "head": spec.head or "",
            "img_size": size_text(spec.img_size), "precision": spec.precision, "device": spec.device,
            "threads": spec.threads, "error": message}


_TIMING_KEYS = tuple(f"{prefix}_{key}" for prefix in ("infer", "train")
                     for key in ("p50_ms", "p10_ms", "p90_ms", "min_ms", "ips", "ips_p10", "ips_p90")) + \
    ("attn_share", "attn_core_share", "floor_ms", "floor_p10_ms", "floor_p90_ms")


def run_specs(specs: Sequence[BenchSpec], *, rounds: int = 1, in_process: bool = False,
              timeout: Optional[float] = None, desc: str = "bench model") -> List[Dict[str, Any]]:
    """Measure every spec (each in its own subprocess unless ``in_process``) and return one row per spec.

    With ``rounds`` > 1 the whole list is timed again (interleaved, so slow phases of a shared machine hit all
    configurations alike) and each timing is the median over rounds (``<key>_rounds`` keeps every round's value;
    ``*_min_ms`` is the minimum over rounds); counts and memory are measured once.
    """
    for spec in specs:
        validate_spec(spec)
    jobs = [(r, i) for r in range(rounds) for i in range(len(specs))]
    results: List[List[Dict[str, Any]]] = [[] for _ in specs]

    def describe(job):
        s = specs[job[1]]
        head = f" {s.head}" if s.head else ""
        return f"{s.model}{head} {s.label} {size_text(s.img_size)}px {s.precision}" + \
            (f" (round {job[0] + 1})" if rounds > 1 else "")

    for r, i in progress(jobs, desc, describe):
        spec = specs[i]
        if r > 0:  # timings again; counts, memory and profiles once
            timed = tuple(m for m in spec.measures if m not in ("counts", "memory"))
            spec = BenchSpec(**{**asdict(spec), "measures": timed, "profile": False})
        row = measure(spec) if in_process else _run_worker(spec, timeout)
        if "error" in row:
            print(f"  failed: {describe((r, i))}: {row['error']}", file=sys.stderr, flush=True)
        results[i].append(row)
    rows = []
    for per_round in results:
        row = dict(per_round[0])
        for key in _TIMING_KEYS:
            values = [r[key] for r in per_round if r.get(key) is not None]
            if values:
                row[key] = min(values) if key.endswith("_min_ms") else statistics.median(values)
                if len(values) > 1:
                    row[f"{key}_rounds"] = values
        if row.get("floor_ms") and row.get("infer_p50_ms"):  # of the medians over rounds
            row["of_floor"] = row["infer_p50_ms"] / row["floor_ms"]
        row["rounds"] = len(per_round)
        rows.append(row)
    return rows


def speedups(rows: Sequence[Dict[str, Any]], baseline: str = "softmax") -> List[Dict[str, Any]]:
    """Baseline time / row time for every row that has a baseline row (the one labelled ``baseline``, e.g.
    ``softmax`` or ``softmax:fused=False``) with the same model, size, precision
    device and runtime (inference and training, p50 and min — the min is the steadier on a busy machine; >1 means
    faster than the baseline)."""
    def key(r):
        return r["model"], r.get("head", ""), r["img_size"], r["precision"], r["device"], r.get("runtime")

    base = {key(r): r for r in rows if r.get("label") == baseline and "error" not in r}
    out = []
    for r in rows:
        b = base.get(key(r))
        if b is None or r is b or "error" in r:
            continue
        entry = {"model": r["model"], "head": r.get("head", ""), "label": r["label"], "baseline": b["label"],
                 "img_size": r["img_size"], "precision": r["precision"], "device": r["device"],
                 "runtime": r.get("runtime")}
        for metric, name in (("infer_p50_ms", "infer_speedup"), ("infer_min_ms", "infer_speedup_min"),
                             ("train_p50_ms", "train_speedup"), ("train_min_ms", "train_speedup_min")):
            if r.get(metric) and b.get(metric):
                entry[name] = b[metric] / r[metric]
        for metric, name in (("infer_ips", "infer_ips_ratio"), ("train_ips", "train_ips_ratio")):
            if r.get(metric) and b.get(metric):
                entry[name] = r[metric] / b[metric]
        entry.update(_ratio_spread(b, r, "infer"))
        if len(entry) > 8:  # some timing was measured on both
            out.append(entry)
    return out


def _ratio_spread(slow: Dict[str, Any], fast: Dict[str, Any], prefix: str) -> Dict[str, float]:
    """The range of ``slow / fast`` that the two p10-p90 ranges allow (p10/p90 to p90/p10)."""
    keys = [f"{prefix}_p10_ms", f"{prefix}_p90_ms"]
    if not all(slow.get(k) and fast.get(k) for k in keys):
        return {}
    return {f"{prefix}_speedup_lo": slow[keys[0]] / fast[keys[1]],
            f"{prefix}_speedup_hi": slow[keys[1]] / fast[keys[0]]}


def runtime_speedups(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Eager PyTorch time / each other runtime's time, for the same model, label, size, precision and device, with
    the range the p10-p90 spreads allow (> 1: the runtime is faster than eager)."""
    def key(r):
        return r["model"], r.get("head", ""), r["label"], r["img_size"], r["precision"], r["device"]

    eager = {key(r): r for r in rows if r.get("runtime") == "eager" and "error" not in r}
    out = []
    for r in rows:
        e = eager.get(key(r))
        if e is None or r is e or "error" in r or not (r.get("infer_p50_ms") and e.get("infer_p50_ms")):
            continue
        out.append({"model": r["model"], "head": r.get("head", ""), "label": r["label"], "img_size": r["img_size"],
                    "runtime": r["runtime"],
                    "threads": r.get("threads"), "eager_ms": e["infer_p50_ms"], "runtime_ms": r["infer_p50_ms"],
                    "over_eager": e["infer_p50_ms"] / r["infer_p50_ms"], **_ratio_spread(e, r, "infer"),
                    **{k: r[k] for k in ("floor_ms", "of_floor") if r.get(k) is not None}})
    return out


def _series(rows: Sequence[Dict[str, Any]], by_runtime: bool = True) -> Dict[str, List[Dict[str, Any]]]:
    """Rows by the name of their series in the plots (label; model, head and precision when several), and with
    ``by_runtime`` the runtime when several ran."""
    series: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if "error" in r:
            continue
        name = r["label"] if r["attn"] != DEFAULT_ATTN else r["model"]
        if len({x["model"] for x in rows}) > 1 and r["attn"] != DEFAULT_ATTN:
            name = f"{r['model']} {name}"
        if len({x.get("head", "") for x in rows}) > 1:
            name += f" {r.get('head') or 'classifier'}"
        if len({x["precision"] for x in rows}) > 1:
            name += f" {r['precision']}"
        if by_runtime and len({x.get("runtime") for x in rows}) > 1:
            name += f" ({r.get('runtime')})"
        series.setdefault(name, []).append(r)
    return {k: sorted(v, key=lambda r: size_side(r["img_size"])) for k, v in series.items()}


#: the panels of the figure: (key, second key, y label of the line plot, y label of the bar plot, y scale)
_PANELS = [
    ("infer_p50_ms", "infer_p90_ms", "inference latency (ms): p50 solid, p90 dashed",
     "batch-1 inference latency (ms): p50 bars, p10-p90 whiskers", "log"),
    ("train_p50_ms", "train_p90_ms", "training step (ms): p50 solid, p90 dashed",
     "training step (ms): p50 bars, p10-p90 whiskers", "log"),
    ("peak_fwd_mb", "peak_train_mb", "peak memory (MB): forward solid, train step dashed",
     "peak memory (MB): forward filled, train step outlined", "log"),
    ("exp_softmax", "exp_total", "exp evaluations / forward: softmax solid, all dashed",
     "exp evaluations / forward: softmax filled, all outlined", "symlog"),
]


def plot_results(rows: Sequence[Dict[str, Any]], path: Path, title: str = "", baseline: str = "softmax") -> None:
    """The figure of a sweep: with one input size, grouped bars (:func:`plot_bars`); with several, one line per
    series against input size (:func:`plot_lines`)."""
    measured = [r for r in rows if "error" not in r]
    if len({size_side(r["img_size"]) for r in measured}) == 1:
        plot_bars(rows, path, title, baseline)
    else:
        plot_lines(rows, path, title)


def plot_lines(rows: Sequence[Dict[str, Any]], path: Path, title: str = "") -> None:
    """Against input size, one line per series: inference latency, training step, peak memory and exp-like
    evaluations per forward (solid: softmax-family, the paper's column; dashed: all, activations included).
    Panels with nothing measured are left out."""
    series = _series(rows)
    panels = [p for p in _PANELS if any(r.get(p[0]) is not None or r.get(p[1]) is not None
                                        for rs in series.values() for r in rs)]
    fig, axes = new_figure(min(2, max(1, len(panels))), (len(panels) + 1) // 2 or 1, size=5.2)
    for ax, (solid, dashed, ylabel, _, scale) in zip(axes, panels):
        for name, rs in series.items():
            color = None
            for key, style in ((solid, "-"), (dashed, "--")):
                pts = [(size_side(r["img_size"]), r[key]) for r in rs if r.get(key) is not None]
                if pts:
                    line, = ax.plot(*zip(*pts), marker="o", linestyle=style, color=color,
                                    label=name if style == "-" else None)
                    color = line.get_color()
        ax.set_xlabel("input size (px; √(H·W) for H×W)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_yscale(scale, **({"linthresh": 1.0} if scale == "symlog" else {}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def _group_name(row: Dict[str, Any]) -> str:
    """The x group of a row in the bar plot: what ran it and at which precision ('torch fp32', 'onnxruntime
    int8', 'torch.compile bf16', ...)."""
    runtime = str(row.get("runtime", "eager"))
    extra = ", channels-last" if runtime.endswith(", channels-last") else ""
    runtime = runtime.removesuffix(", channels-last")
    if runtime.endswith(" int8"):
        runtime, precision = runtime.removesuffix(" int8"), "int8"
    else:
        precision = row.get("precision", "fp32")
    runtime = {"eager": "torch", "compiled": "torch.compile"}.get(runtime, runtime)
    return f"{runtime}\n{precision}{extra}"


def plot_bars(rows: Sequence[Dict[str, Any]], path: Path, title: str = "", baseline: str = "softmax") -> None:
    """One input size: per panel, a group of bars per runtime and precision (x), one bar per series (attention
    kind; model and head when several), side by side. Inference latency: p50 bars with p10-p90 error bars; the
    linear floor (``floor_ms``) as a black line across its bar; above each bar its speed-up over eager PyTorch
    (same series) and, for the other series, over the ``baseline`` series (e.g. softmax) in the same group.
    Training step: the same bars without the annotations; memory and exp counts: the first key filled, the
    second outlined. Panels with nothing measured are left out."""
    measured = [r for r in rows if "error" not in r]
    series_of = {id(r): name for name, rs in _series(measured, by_runtime=False).items() for r in rs}
    series = list(dict.fromkeys(series_of.values()))
    groups = list(dict.fromkeys(_group_name(r) for r in measured))
    at = {(_group_name(r), series_of[id(r)]): r for r in measured}
    base_series = next((n for n in series if any(r.get("label") == baseline and series_of[id(r)] == n
                                                 for r in measured)), None)
    panels = [p for p in _PANELS if any(r.get(p[0]) is not None or r.get(p[1]) is not None for r in measured)]
    width = 0.8 / max(1, len(series))
    panel_width = max(5.2, 1.0 + 0.75 * len(groups) * max(1, len(series)))
    ncols = 2 if len(panels) > 1 and panel_width <= 7 else 1  # narrow panels side by side, wide ones stacked
    nrows = -(-max(1, len(panels)) // ncols)
    fig, axes = new_figure(ncols, nrows, size=panel_width)
    fig.set_size_inches(panel_width * ncols, 4.8 * nrows)
    colors = [f"C{i % 10}" for i in range(len(series))]
    sizes = ", ".join(dict.fromkeys(f"{size_text(r['img_size'])} px" for r in measured))
    models = list(dict.fromkeys(r["model"] + (f" + {r['head']}" if r.get("head") else "") for r in measured))
    what = f"{models[0]} at {sizes}" if len(models) == 1 else sizes
    for ax, (key, second, _, ylabel, scale) in zip(axes, panels):
        used = [g for g in groups if any(at.get((g, n), {}).get(key) is not None for n in series)]
        top = 0.0
        floor_drawn = False
        for i, name in enumerate(series):
            xs, values, lo, hi, rs = [], [], [], [], []
            for gi, g in enumerate(used):
                r = at.get((g, name))
                if r is None or r.get(key) is None:
                    continue
                xs.append(gi - 0.4 + width * (i + 0.5))
                values.append(r[key])
                rs.append(r)
                prefix = key.split("_")[0]
                p10, p90 = r.get(f"{prefix}_p10_ms"), r.get(f"{prefix}_p90_ms")
                timed = key.endswith("_ms") and p10 is not None and p90 is not None
                lo.append(max(0.0, r[key] - p10) if timed else 0.0)
                hi.append(max(0.0, p90 - r[key]) if timed else 0.0)
            if not xs:
                continue
            if not key.endswith("_ms"):  # the second key (train-step memory, all exp) outlined behind
                outline = [(x, r[second]) for x, r in zip(xs, rs) if r.get(second) is not None]
                if outline:
                    ax.bar(*zip(*outline), width * 0.92, fill=False, edgecolor=colors[i], hatch="//", linewidth=1)
                    top = max(top, max(v for _, v in outline))
            ax.bar(xs, values, width * 0.92, color=colors[i], label=name,
                   yerr=[lo, hi] if any(lo) or any(hi) else None, error_kw={"elinewidth": 0.8, "capsize": 2})
            top = max(top, max(v + h for v, h in zip(values, hi)))
            if key != "infer_p50_ms":
                continue
            for x, v, h, r in zip(xs, values, hi, rs):
                if r.get("floor_ms") is not None:
                    ax.hlines(r["floor_ms"], x - width * 0.46, x + width * 0.46, colors="black", linewidth=2.2,
                              label=None if floor_drawn else "linear floor (floor_ms)")
                    floor_drawn = True
                lines = []
                eager = at.get((_group_name({**r, "runtime": "eager"}), name))
                if eager is not None and eager is not r and eager.get(key):
                    lines.append(f"{eager[key] / v:.2f}× eager")
                base = at.get((_group_name(r), base_series)) if base_series not in (None, name) else None
                if base is not None and base.get(key):
                    lines.append(f"{base[key] / v:.2f}× {baseline}")
                if lines:
                    ax.annotate("\n".join(lines), (x, v + h), xytext=(0, 3), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks(range(len(used)))
        ax.set_xticklabels(used, fontsize=8)
        ax.set_xlim(-0.6, len(used) - 0.4)
        ax.set_ylabel(ylabel, fontsize=8)
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=1.0)
        else:
            ax.set_ylim(0, top * (1.45 if key == "infer_p50_ms" else 1.1) or 1.0)
        ax.set_title(what + ("\nabove each bar: its speed-up over eager PyTorch and over the same runtime's "
                             f"{baseline}" if key == "infer_p50_ms" else ""), fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        # below the group names, where no bar or annotation can be
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(series) + 1, frameon=False)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


RESULT_COLUMNS = ["model", "head", "label", "attn", "attn_kwargs", "runtime", "sima_order", "img_size", "tokens",
                  "precision", "device", "threads", "params_m", "infer_p50_ms", "infer_p10_ms", "infer_p90_ms",
                  "infer_min_ms", "floor_ms", "floor_p10_ms", "floor_p90_ms", "floor_linears", "of_floor",
                  "non_linear_share", "non_delegated_share", "profile_ops", "profile_note", "attn_share",
                  "attn_core_share", "attn_share_runs",
                  "infer_ips", "infer_ips_p10", "infer_ips_p90", "train_p50_ms", "train_p10_ms", "train_p90_ms",
                  "train_min_ms", "train_ips", "train_ips_p10", "train_ips_p90", "batch_size", "gflops",
                  "attn_gflops", "exp_total", "exp_softmax", "exp_activation", "exp_calls", "op_calls",
                  "peak_fwd_mb", "peak_train_mb", "onnx_max_abs_diff", "runtime_max_abs_diff", "runtime_threads",
                  "rounds", "error"]


def write_results(rows: Sequence[Dict[str, Any]], out_dir: Path, meta: Dict[str, Any],
                  baseline: str = "softmax", stem: str = "bench_model") -> Dict[str, Path]:
    """``<stem>.json`` (meta, rows, speedups), ``.csv``, ``.md`` and ``.png`` in ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    ups = speedups(rows, baseline)
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "md", "png")}
    write_json({"meta": meta, "rows": list(rows), "speedups": ups, "runtime_speedups": runtime_speedups(rows)},
               paths["json"])
    extra = dict.fromkeys(c for r in rows for c in r if c not in RESULT_COLUMNS)  # first-seen order, once each
    write_csv(rows, paths["csv"], RESULT_COLUMNS + list(extra))
    write_text(summary_markdown(rows, ups, meta, runtime_speedups(rows)) + "\n", paths["md"])
    plot_results(rows, paths["png"], title=f"{meta.get('device')} · {meta.get('threads')} threads · "
                                          f"torch {meta.get('torch')}", baseline=baseline)
    return paths


def summary_markdown(rows: Sequence[Dict[str, Any]], ups: Sequence[Dict[str, Any]], meta: Dict[str, Any],
                     runtime_ups: Sequence[Dict[str, Any]] = ()) -> str:
    """Results and speedups as markdown tables, and a warning line when some timing's spread is wide."""
    cols = ["model", "head", "label", "runtime", "img_size", "tokens", "precision", "infer_p50_ms", "infer_p10_ms",
            "infer_p90_ms", "floor_ms", "floor_p10_ms", "floor_p90_ms", "of_floor", "non_linear_share",
            "non_delegated_share", "attn_share", "attn_core_share", "infer_ips", "infer_ips_p10", "infer_ips_p90",
            "train_p50_ms", "train_p10_ms", "train_p90_ms", "train_ips", "train_ips_p10", "train_ips_p90", "gflops",
            "attn_gflops", "exp_softmax", "exp_total", "peak_fwd_mb", "peak_train_mb", "runtime_max_abs_diff",
            "runtime_threads", "error"]
    present = [c for c in cols if any(r.get(c) not in (None, "") for r in rows)]
    features = f" (CPU {meta.get('cpu_name')}; {', '.join(meta['cpu_features'])})" if meta.get("cpu_features") \
        else ""
    parts = [f"Device {meta.get('device')}{features}, {meta.get('threads')} threads, torch {meta.get('torch')}. Times "
             f"in ms (p50 = median; p10/p90 beside it), throughput in images/s."
             + (" attn_share: measured share of the eager forward's time inside the attention modules (forward "
                "hooks; attn_core_share: without their qkv/output projections)." if "attn_share" in present else "")
             + (f" Segmentation heads have {SEG_CLASSES} classes." if "head" in present else "")
             + (" floor_ms: the same model's nn.Linear layers alone (each applied to an input of the shape it sees "
                "in the model, same batch; a convolution patch embedding is not a linear and is left out; with a "
                "segmentation head, still the linears only), run through the same runtime, precision, threads and "
                "timing as the row (p10/p90 beside it); of_floor: the row's p50 / floor_ms."
                if "floor_ms" in present else "")
             + (" non_linear_share: from a separate profiled run, the share of the runtime's time outside matmul/"
                "GEMM/convolution kernels (onnxruntime: of the summed node kernel time, ops other than MatMul, Gemm, "
                "QLinearMatMul, MatMulInteger(ToFloat), QGemm, Conv and their fused forms, so (de)quantize steps "
                "count as non-linear and attention's own matmuls as linear; ExecuTorch: of Method::execute, "
                "outside XNNPACK's Fully Connected/Batch Matrix Multiply/Convolution operators, where LayerNorm's "
                "and SimA's sums, rewritten as GEMMs with columns of ones for XNNPACK, count as linear)."
                if "non_linear_share" in present else "")
             + (" non_delegated_share: ExecuTorch, from an ETDump of a separate run: the share of Method::execute "
                "outside XNNPACK delegate calls (portable kernels and the runtime's dispatch)."
                if "non_delegated_share" in present else ""), "",
             markdown_table(rows, present)]
    notes = dict.fromkeys(f"{r['runtime']}: {r['profile_note']}" for r in rows if r.get("profile_note"))
    parts += [f"no profile shares for {note}" for note in notes]
    timings = {"infer": ("infer_p10_ms", "infer_p90_ms", "infer_p50_ms"),
               "train": ("train_p10_ms", "train_p90_ms", "train_p50_ms"),
               "floor": ("floor_p10_ms", "floor_p90_ms", "floor_ms")}
    spreads = {f"{r['label']} {r['img_size']}px {r.get('runtime', '')} {what}": relative_spread(*map(r.get, keys))
               for r in rows for what, keys in timings.items() if r.get(keys[2])}
    warning = spread_warning(spreads)
    if warning:
        parts += ["", warning]
    if ups:
        ucols = [c for c in ("model", "head", "label", "baseline", "runtime", "img_size", "precision",
                             "infer_speedup", "infer_speedup_lo", "infer_speedup_hi", "infer_speedup_min",
                             "train_speedup", "train_speedup_min", "infer_ips_ratio", "train_ips_ratio")
                 if any(u.get(c) for u in ups)]
        parts += ["", "Speed-up over the baseline (baseline time / time; > 1 is faster; lo-hi: the range the p10-p90 "
                      "spreads allow):", "", markdown_table(ups, ucols)]
    if runtime_ups:
        parts += ["", "Speed-up of each runtime over eager PyTorch (batch-1 latency, same threads):", "",
                  markdown_table(runtime_ups, ["model", *(["head"] if "head" in present else []), "label",
                                               "img_size", "runtime", "threads", "eager_ms",
                                               "runtime_ms", "over_eager", "infer_speedup_lo", "infer_speedup_hi",
                                               *(["floor_ms", "of_floor"] if "floor_ms" in present else [])])]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------ CLI


def parse_attn(entries: Sequence[str], kwargs_items: Sequence[str] = ()) -> List[Tuple[str, str, Dict[str, Any]]]:
    """``--attn`` entries and ``--attn-kwargs`` items → ``(label, kind, options)`` per entry.

    An entry is a kind (``sima``) or ``LABEL=KIND`` (``explicit=softmax``: the kind again under another label);
    ``--attn-kwargs`` items are ``LABEL.OPTION=VALUE`` in the one option mini-language
    (:func:`simattn.utils.values.parse_assignments`), e.g. ``sima.order=qk_first softmax.fused=false``.
    """
    labels: Dict[str, str] = {}
    for entry in entries:
        label, sep, kind = entry.partition("=")
        label, kind = label.strip(), (kind if sep else label).strip()
        if not label or not kind or "." in label or ":" in entry:
            raise ValueError(f"--attn {entry!r} is not KIND or LABEL=KIND (e.g. sima, explicit=softmax); options "
                             f"go in --attn-kwargs KIND.OPTION=VALUE")
        if label in labels:
            raise ValueError(f"--attn lists {label!r} twice; give one a label, e.g. {label}2={kind}")
        labels[label] = kind
    options = parse_assignments(kwargs_items, what="--attn-kwargs item")
    for label, value in options.items():
        if label not in labels:
            raise ValueError(f"--attn-kwargs {label!r} is not one of --attn ({', '.join(labels)})")
        if not isinstance(value, dict):
            raise ValueError(f"--attn-kwargs {label}={value!r} gives no option name; write {label}.OPTION=VALUE "
                             f"(e.g. softmax.fused=false)")
    return [(label, kind, dict(options.get(label, {}))) for label, kind in labels.items()]


def _options():
    """Every option of ``bench model`` (the shared ones from :mod:`simattn.bench.cli`) with its allowed values."""
    from ..utils.recipe import Opt, check_path, maybe
    from .cli import shared, some_of
    return {
        "models": Opt(["sima_deit_small_patch16_224"], "registered model names", type=List[str]),
        "attn": Opt([DEFAULT_ATTN], f"attention kinds passed as attn_type ('{DEFAULT_ATTN}' = the model's own); "
                                    "LABEL=KIND runs a kind again under another label (e.g. explicit=softmax)",
                    type=List[str]),
        "img_size": Opt([224], "input sizes: N (N×N px) or HxW (e.g. 512 1024x2048); each a multiple of the "
                               "model's patch size (and, with --head, of 32)", type=List[Union[int, str]],
                        check=_check_sizes, allowed="sizes N or HxW with positive integers (e.g. 512, 1024x2048)"),
        "head": Opt(None, f"wrap each --models backbone in a segmentation head (fpn: semantic_fpn, upernet; "
                          f"{SEG_CLASSES} classes, logits at the input size); default: the model as it is",
                    type=maybe(str), choices=list(HEADS)),
        "precision": Opt(None, "fp32, or bf16/fp16 autocast (default: fp32 on CPU, bf16 on CUDA)",
                         type=maybe(List[str]), check=some_of(list(PRECISIONS))),
        "device": shared("device"),
        "threads": shared("threads", help="CPU threads in every worker (default: this process's "
                                          "torch.get_num_threads())"),
        "batch_size": Opt(8, "batch of the throughput measurements", low=1),
        "measure": Opt(list(MEASURES), f"what to measure: some of {', '.join(MEASURES)}", type=List[str],
                       check=some_of(list(MEASURES))),
        # one or the other (a mutually exclusive pair): --fixed-order is --sima-order qk_first
        "fixed_order": Opt(False, "force SimA to (q̂k̂ᵀ)v (order='qk_first'): the same N² matmuls as softmax, so the "
                                  "difference is the cost of exp alone (the paper's comparison)"),
        "sima_order": Opt(None, f"force this SimA order ({', '.join(SIMA_ORDERS)})", type=maybe(str),
                          choices=list(SIMA_ORDERS)),
        "runtime": Opt(["torch"], f"one or more of {', '.join(runtimes())}: PyTorch, or the model exported and run in "
                                  "that runtime (simattn.deploy; inference only), each at --threads", type=List[str]),
        "int8": Opt(False, f"add an int8 row for each of {', '.join(int8_runtimes())} in --runtime (static, linear/"
                           f"conv/matmul only, calibrated on {CALIBRATION_IMAGES} digits images)"),
        "floor": Opt(None, "with latency, also time each row's linear floor: the model's nn.Linear layers alone "
                           "(each on an input of the shape it sees in the model; no conv patch embedding) through "
                           "the same runtime, precision and threads (columns floor_ms, of_floor); default: on when "
                           "--runtime names a runtime besides torch (--no-floor skips it)", type=maybe(bool)),
        "compile": Opt(False, "time the torch.compile'd model (runtime torch)"),
        "compile_backend": Opt(None, "torch.compile backend with --compile (default inductor; see "
                                     "torch._dynamo.list_backends())", type=maybe(str)),
        "channels_last": Opt(False, "model and inputs in channels-last memory format (runtime torch)"),
        "onnx_exporter": Opt(None, "torch.onnx exporter for --runtime onnxruntime (default auto: dynamo, else "
                                   "TorchScript)", type=maybe(str), choices=["auto", "dynamo", "torchscript"]),
        "warmup": Opt(2, "untimed runs before each measurement", low=0),
        "repeats": shared("repeats", 10, "timed runs per measurement (at least)"),
        "max_time": shared("max_time", 30.0),
        "rounds": shared("rounds", 1, "time the whole sweep this often, interleaved; report the median (steadier on "
                                      "a shared machine)"),
        "baseline": Opt(None, "the --attn label the speed-ups are relative to (default: softmax, when listed)",
                        type=maybe(str)),
        "timeout": shared("timeout", help="seconds before a worker is abandoned (not with --in-process)"),
        "in_process": Opt(False, "measure in this process (debugging)"),
        "out": Opt("runs/bench_model", "output folder", check=check_path),
        "worker": Opt(None, argparse.SUPPRESS, type=maybe(str), check=check_path),  # a worker's spec (JSON)
    }


def build_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import add_option_flags, command_parser
    options = _options()
    order = {name: options.pop(name) for name in ("fixed_order", "sima_order")}
    floor = options.pop("floor")  # three states: --floor, --no-floor, or neither (the default of the runtimes)
    p = command_parser("simattn bench model",
                       "Latency, throughput, exp-like op and FLOP counts and peak memory of registered models, each "
                       "configuration in its own subprocess.", options)
    add_option_flags(p.add_mutually_exclusive_group(), order)
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=None, help=floor.help)
    # sizes are read as text (YAML would read 0x10 as the number 16); _check_sizes reads N and HxW
    next(a for a in p._actions if a.dest == "img_size").type = str
    # KEY=VALUE items stay text until parse_assignments reads them: an Opt list flag reads each item as YAML
    # (``attn_kwargs={order: kv_first}`` would become a mapping), and an Opt mapping flag is a recipe's (it extends
    # a mapping default, which argparse cannot)
    p.add_argument("--attn-kwargs", nargs="*", default=[], metavar="KIND.OPTION=VALUE",
                   help=f"options of each --attn entry, {OPTIONS_HELP}: e.g. sima.order=qk_first softmax.fused=false")
    p.add_argument("--model-kwargs", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"create_model kwargs of every model, {OPTIONS_HELP}: e.g. depth=6 act_layer=relu")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn bench model``."""
    args = build_parser().parse_args(argv)
    if args.worker:
        return _worker_main(args.worker)
    check_bench_flags(args, _options())
    args.out = Path(args.out)
    require_cuda(args.device)
    check_out(args.out, folder=True)
    if not args.compile:
        refuse_unused(args, ["compile_backend"], "to --compile")
    if "onnxruntime" not in args.runtime:
        refuse_unused(args, ["onnx_exporter"], "to --runtime onnxruntime")
    if args.in_process:
        refuse_unused(args, ["timeout"], "to workers, not --in-process")
    args.precision = args.precision or (["bf16"] if torch.device(args.device).type == "cuda" else ["fp32"])
    order = "qk_first" if args.fixed_order else args.sima_order
    kwargs = parse_model_kwargs(args.model_kwargs)
    attns = parse_attn(args.attn, args.attn_kwargs)
    chosen = list(dict.fromkeys(args.runtime))
    known, int8 = runtimes(), int8_runtimes()
    unknown = [r for r in chosen if r not in known]
    if unknown:
        raise ValueError(f"--runtime {unknown[0]!r}: expected some of {', '.join(known)}")
    from .. import deploy

    for runtime in chosen:
        if runtime != "torch":  # a missing package: one line naming its extra, before any worker starts
            deploy.get(runtime).require(f"simattn bench model --runtime {runtime}")
    if args.int8 and not set(chosen) & set(int8):
        raise ValueError(f"--int8 needs --runtime {' or '.join(int8)} (given: {', '.join(chosen)})")
    variants = [(r, None) for r in chosen] + [(r, "static") for r in chosen if args.int8 and r in int8]
    measures = tuple(args.measure)
    deployed_measures = tuple(m for m in measures if m in DEPLOYED_MEASURES)
    if any(r != "torch" for r in chosen):
        exported = ", ".join(r for r in chosen if r != "torch")
        skipped = [m for m in measures if m not in DEPLOYED_MEASURES]
        if skipped:
            print(f"--runtime {exported}: not measured: {', '.join(skipped)} (inference only)", flush=True)
        if not deployed_measures:
            raise ValueError(f"--runtime {exported} measures {', '.join(DEPLOYED_MEASURES)}; --measure gave none of "
                             "them")
    threads = set_threads(args.threads)
    floor = args.floor if args.floor is not None else any(r != "torch" for r in chosen)
    floor = floor and "latency" in measures
    specs = [BenchSpec(model=m, attn=kind, attn_kwargs=attn_kwargs, label=label if kind != DEFAULT_ATTN else "",
                       img_size=s, precision=p, device=args.device, threads=threads, batch_size=args.batch_size,
                       sima_order=order, model_kwargs=kwargs,
                       measures=measures if runtime == "torch" else deployed_measures, warmup=args.warmup,
                       repeats=args.repeats, max_time=args.max_time, runtime=runtime, compile=args.compile,
                       compile_backend=args.compile_backend or "inductor", quantize=quantize,
                       channels_last=args.channels_last, onnx_exporter=args.onnx_exporter or "auto", head=args.head,
                       floor=floor, profile="latency" in measures and runtime != "torch")
             for runtime, quantize in variants
             for m in args.models for label, kind, attn_kwargs in attns for s in map(parse_size, args.img_size)
             for p in args.precision]
    for spec in specs:
        validate_spec(spec)
    labels = list(dict.fromkeys(s.label for s in specs))
    if args.baseline is not None and args.baseline not in labels:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the runs' labels ({', '.join(labels)}): "
                         "name an --attn entry")
    baseline = args.baseline or "softmax"
    check_builds(specs)
    meta = {**machine_info(args.device, threads), "sima_order": order or "model default",
            "runtime": ", ".join(dict.fromkeys(runtime_name(s) for s in specs)),
            "model_kwargs": kwargs, "batch_size": args.batch_size, "rounds": args.rounds,
            "command": "simattn bench model " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(f"simattn bench model: {len(specs)} configuration(s) on {args.device}, {threads} CPU threads "
          f"(fixed in every worker and runtime), runtime {meta['runtime']}, SimA order: {meta['sima_order']}; "
          f"CPU {meta.get('cpu_name') or meta['cpu']}, features: {', '.join(meta.get('cpu_features') or ['unknown'])}",
          flush=True)
    rows = run_specs(specs, rounds=args.rounds, in_process=args.in_process, timeout=args.timeout)
    paths = write_results(rows, args.out, meta, baseline=baseline)
    print(summary_markdown(rows, speedups(rows, baseline), meta, runtime_speedups(rows)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
