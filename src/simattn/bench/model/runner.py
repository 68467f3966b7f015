"""One configuration's model built (or its attention-free floor), deployed when its runtime is not torch, and its timed
calls: inference and one training step."""
from __future__ import annotations

import gc
import json
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...engine.losses import pixel_cross_entropy
from ...models.factory import create_model, with_attention
from ...utils.timing import time_fn
from .spec import CALIBRATION_IMAGES, DEFAULT_ATTN, HEADS, PRECISIONS, SEG_CLASSES, BenchSpec, size_hw, size_text



def check_builds(specs: Sequence[BenchSpec]) -> None:
    """Build each distinct model of ``specs`` on the meta device (no memory, no weights initialized): kwargs or
    attention options the model refuses are a one-line ValueError before any worker starts, not an error row per
    configuration after the sweep."""
    seen = set()
    for spec in specs:
        key = json.dumps([spec.model, spec.head, spec.attn, spec.attn_kwargs, spec.sima_order, spec.model_kwargs,
                          spec.img_size, spec.attention_free], sort_keys=True, default=str)
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
    from ...models.segmentation import Segmenter

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
    from ...attention import SimAAttention

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
    return without_attention(model) if spec.attention_free else model


def _values_through(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None,
                    **options: Any) -> torch.Tensor:
    """The attention-free floor's attention core: the values as they are (the queries where keys and values have
    another length), no work; projections, norms and the rest of the module run as in the model."""
    return v if v.shape[-2] == q.shape[-2] else q


_ATTENTION_FREE: Dict[type, type] = {}


def without_attention(model: nn.Module) -> nn.Module:
    """``model`` with every attention module's core replaced by :func:`_values_through` (in place): the same
    network at zero attention cost, the floor every attention kind is measured against. A one-line ValueError
    when the model has no attention module, or one that is not one of simattn's kinds."""
    from ...attention import TokenAttention
    from ..counters import attention_module_names

    modules = dict(model.named_modules())
    found = [modules[name] for name in attention_module_names(model)]
    if not found:
        raise ValueError("the model has no attention module to take out (no attention-free floor)")
    other = sorted({type(m).__name__ for m in found if not isinstance(m, TokenAttention)})
    if other:
        raise ValueError(f"the attention-free floor replaces simattn's attention kinds, not {', '.join(other)}: "
                         "name one with --attn (e.g. --attn softmax)")
    for module in found:
        cls = type(module)
        if cls not in _ATTENTION_FREE:  # one class per kind, so compiled graphs guard on a stable type
            _ATTENTION_FREE[cls] = type(f"AttentionFree{cls.__name__}", (cls,), {
                "attend": _values_through, "fuses_projection": False, "__module__": __name__})
        module.__class__ = _ATTENTION_FREE[cls]
    return model


def token_count(model: nn.Module, img_size: Union[int, Sequence[int]]) -> Optional[int]:
    """Tokens per image for patch models (grid + prefix tokens; a segmenter's: its backbone's), None when the model
    does not say."""
    from ...models.segmentation import Segmenter

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


class Runner:
    """The model, its inputs and the two callables that are timed: inference and one training step."""

    def __init__(self, spec: BenchSpec, work_dir: Optional[str] = None, model: Optional[nn.Module] = None,
                 like: Optional["Runner"] = None, stem: str = "model") -> None:
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
        mode = None if spec.compile_mode == "default" else spec.compile_mode
        self.timed = (torch.compile(self.model, backend=spec.compile_backend, mode=mode, dynamic=False)
                      if spec.compile else self.model)
        # the modes with CUDA graphs reuse their output buffers: each call starts a new step
        self.graphed = spec.compile and spec.compile_mode in ("reduce-overhead", "max-autotune")
        self.deployed = None  # the exported file's program (batch -> first output) for the other runtimes
        self.deployed_path: Optional[Path] = None  # the file it runs
        self.runtime_max_abs_diff: Optional[float] = None
        self.runtime_threads: Optional[int] = None
        if spec.runtime != "torch":
            self._deploy(work_dir)
        self.optimizer = None
        self.scaler = None

    def _deploy(self, work_dir: str) -> None:
        """The model as its runtime runs it, through :func:`simattn.deploy.pipeline.deploy_model` (export, int8,
        opening and the parity measurement of ``simattn export``), with the record ``simattn export`` writes and,
        for an int8 row, digits to calibrate on."""
        from ... import deploy
        from ...deploy.pipeline import deploy_model
        from ...data.images import resolve_data_config
        from ...models.weights import export_record

        data_config = {**resolve_data_config(self.source), "input_size": self.shape}
        name, kwargs = model_args(self.spec)
        record = export_record(name, kwargs, data_config,
                               attention=getattr(self.source, "attn_type", self.spec.attn),
                               producer="simattn bench model" + (f" ({self.stem})" if self.stem != "model" else ""))
        fmt = deploy.get(self.spec.runtime)
        done = deploy_model(fmt, self.model.eval(), record, Path(work_dir) / f"{self.stem}{fmt.suffixes[0]}",
                            quantize=self.spec.quantize,
                            calibration=self._calibration(data_config) if self.spec.quantize else None,
                            options=fmt.bench_values(self.spec.format_options), fixed_size=True, verify=False,
                            parity_inputs={"random": self.inputs(1)}, atol=None, threads=self.spec.threads,
                            open_program=True)
        self.deployed, self.deployed_path = done.program, done.path
        self.runtime_max_abs_diff = done.max_abs_diff
        self.runtime_threads = self.deployed.threads

    def _calibration(self, data_config) -> torch.Tensor:
        """Digits (train split) at the model's input size and normalization: int8 rows are calibrated on real
        images, as ``simattn export --quantize static`` does by default."""
        from ...data.calibration import calibration_images, open_calibration_dataset

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
            self._step_begins()
            with torch.inference_mode(), self.autocast():
                return model(x)

        return infer

    def train_fn(self, batch: int):
        from timm.optim import create_optimizer_v2

        self.model.train()
        if self.optimizer is None:
            self.optimizer = create_optimizer_v2(self.model, "adamw", lr=1e-4, weight_decay=0.05)
            # fp16 training needs loss scaling; the scaler's checks are part of the real step's cost.
            from ...engine.amp import grad_scaler

            self.scaler = grad_scaler(self.device, self.dtype == torch.float16)
        x = self.inputs(batch)
        if self.spec.head:  # a class per pixel
            target = torch.randint(SEG_CLASSES, (batch, *self.shape[1:]), device=self.device)
        else:
            with torch.no_grad(), self.autocast():
                num_classes = _first_tensor(self.model(x[:1])).shape[-1]
            target = torch.randint(num_classes, (batch,), device=self.device)

        # per pixel: in chunks where the logits are more than one CUDA loss call takes
        criterion = pixel_cross_entropy if self.spec.head else lambda out, t: F.cross_entropy(out.float(), t)

        def loss_of(out):
            if isinstance(out, torch.Tensor):
                return criterion(out, target)
            # UperNet's auxiliary head in training, weighted as mmseg's configs weight it
            return criterion(out[0], target) + 0.4 * criterion(out[1], target)

        def step():
            self._step_begins()
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

    def _step_begins(self) -> None:
        if self.graphed:
            torch.compiler.cudagraph_mark_step_begin()

    def time(self, fn) -> Dict[str, float]:
        s = self.spec
        return time_fn(fn, warmup=s.warmup, repeats=s.repeats, device=self.device, max_time=s.max_time)


def largest_fitting_batch(run_batch: Callable[[int], Any], batch: int) -> int:
    """The first of ``batch``, ``batch // 2``, ..., 1 at which ``run_batch(b)`` (one call, e.g. a training step)
    runs without CUDA running out of memory; batch 1's out-of-memory error is raised."""
    while True:
        try:
            run_batch(batch)
            return batch
        except torch.cuda.OutOfMemoryError:
            if batch == 1:
                raise
        # out of the except block, so the failed call's frames (and the tensors they hold) are gone
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        batch //= 2
