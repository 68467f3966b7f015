"""What a forward costs besides time: exp-like evaluations, FLOPs and peak memory, counted from the dispatched ops.

* :class:`OpTrace` is a ``TorchDispatchMode`` that sees every aten op below autograd (so composite ops such as
  ``F.softmax`` or ``F.scaled_dot_product_attention`` arrive as the kernels that really run) and records each op's
  calls and, for exp-like ops, the number of exp evaluations. A fused SDPA kernel hides its softmax, so it counts
  as B·H·Nq·Nk evaluations. This regenerates the paper's "Softmax/#exp" column: H·N² per block for DeiT,
  H·d² for XCiT (d = head dim), 0 for SimA.
* :func:`count_flops` wraps ``torch.utils.flop_counter.FlopCounterMode`` and adds the CPU flash-attention kernel,
  which torch's table lacks (without it, softmax attention on CPU would count zero attention FLOPs).
* :class:`PeakMemory` measures the peak of tensor memory allocated inside a region. On CUDA it reads
  ``torch.cuda.max_memory_allocated``. On CPU there is no allocator statistic, so it accounts tensor storages the
  way tracemalloc accounts Python objects: every storage an op creates is added when it appears and removed when
  it is freed (a finalizer on the storage). That is deterministic (the same ops give the same bytes, whatever
  else the machine does) and counts what the model holds: activations, autograd's saved tensors, gradients,
  optimizer state. Kernel-internal scratch buffers are not seen.
"""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..deploy.ops import FUSED_ATTENTION, exp_like

__all__ = [
    "OpTrace", "trace_ops", "count_flops", "FlopReport", "attention_module_names",
    "PeakMemory", "peak_memory",
]

#: q and k of the fused attention kernels (:data:`~simattn.deploy.ops.FUSED_ATTENTION`) are (B, H, N, d), except for
#: the low-level flash/efficient kernels (B, N, H, d).
_TOKENS_SECOND = frozenset(("_flash_attention_forward", "_efficient_attention_forward", "_flash_attention_backward",
                            "_efficient_attention_backward"))


def _op_name(func) -> str:
    name = func.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _exp_evals(name: str, args: Tuple[Any, ...], out: Any) -> Tuple[Optional[str], int]:
    """(category, exp evaluations) of one dispatched op; (None, 0) for ops without exp-like work."""
    if name in FUSED_ATTENTION:
        # Forward: (q, k, v, ...); backward: (grad_out, q, k, v, ...).
        q, k = (args[1], args[2]) if name.endswith("_backward") else (args[0], args[1])
        key_tokens = k.shape[1] if name in _TOKENS_SECOND else k.shape[-2]
        return "softmax", q.shape[:-1].numel() * key_tokens  # (B·H·Nq in either layout) × Nk
    category = exp_like(name)
    if category is None:
        return None, 0
    if category == "softmax":
        return category, args[0].numel()  # one exp per input element, logsumexp included
    first = tree_flatten(out)[0][0]
    return category, first.numel() if isinstance(first, torch.Tensor) else 0


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


class _KernelMode(TorchDispatchMode):
    """A dispatch mode that sees the kernels that run: composite ops that arrive whole (under
    ``torch.inference_mode`` there is no autograd key to decompose them) are decomposed first, as autograd would:
    by their C++ composite kernel, which eager calls, rather than the Python decomposition registered for tracing
    (``upsample_bilinear2d.vec``'s would show index/sub/mul ops and their full-size temporaries where eager runs
    one upsampling kernel). Subclasses implement :meth:`record`."""

    def record(self, func, args, kwargs, out) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self:
            if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE):
                out = func._op_dk(_COMPOSITE, *args, **kwargs)
            else:
                out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        out = func(*args, **kwargs)
        self.record(func, args, kwargs, out)
        return out


class OpTrace(_KernelMode):
    """Records every dispatched aten op: ``ops`` (name → calls) and, for exp-like ops, ``exp_calls`` and
    ``exp_evals`` (name → count) and ``by_category`` (``'softmax'``: softmax kernels and fused SDPA; ``'exp'``:
    explicit exp ops; ``'activation'``: GELU/erf/tanh/sigmoid/ELU-like activations).

    >>> with OpTrace() as trace:
    ...     model(x)
    >>> trace.exp_total, trace.summary()
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.exp_calls: Counter = Counter()
        self.exp_evals: Counter = Counter()
        self.by_category: Counter = Counter()

    def record(self, func, args, kwargs, out) -> None:
        if func.namespace != "aten":
            return
        name = _op_name(func)
        self.ops[name] += 1
        category, evals = _exp_evals(name, args, out)
        if category is not None:
            self.exp_calls[name] += 1
            self.exp_evals[name] += evals
            self.by_category[category] += evals

    @property
    def exp_total(self) -> int:
        """All exp-like evaluations."""
        return sum(self.exp_evals.values())

    @property
    def exp_softmax(self) -> int:
        """Evaluations in softmax kernels, fused attention and explicit exp: the paper's "Softmax/#exp" column."""
        return self.by_category["softmax"] + self.by_category["exp"]

    def exp_like_ops(self) -> List[str]:
        """Names of the exp-like ops that ran."""
        return sorted(self.exp_calls)

    def summary(self) -> Dict[str, Any]:
        """JSON-ready counts."""
        return {
            "exp_total": self.exp_total,
            "exp_softmax": self.exp_softmax,
            "exp_activation": self.by_category["activation"],
            "exp_calls": sum(self.exp_calls.values()),
            "exp_ops": {name: {"calls": self.exp_calls[name], "evals": self.exp_evals[name]}
                        for name in self.exp_like_ops()},
            "op_calls": sum(self.ops.values()),
        }


def trace_ops(fn: Callable[[], Any]) -> OpTrace:
    """Run ``fn()`` under an :class:`OpTrace` and return the trace."""
    with OpTrace() as trace:
        fn()
    return trace


# ---------------------------------------------------------------------------------------------------- FLOPs


def _cpu_flash_flops():
    """FLOP formulas for the CPU flash-attention kernels, built on torch's own SDPA counts."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(q_shape, k_shape, v_shape)

    def backward(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


_ATTENTION_CLASS_SUFFIXES = ("Attention", "Attn", "XCA")


def attention_module_names(model: nn.Module) -> List[str]:
    """Qualified names of the outermost attention modules of ``model``: simattn's ``TokenAttention`` kinds and any
    module whose class name ends with Attention / Attn / XCA (timm's own attention classes)."""
    from ..attention import TokenAttention

    names: List[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(n + ".") for n in names):
            continue
        if isinstance(module, TokenAttention) or type(module).__name__.endswith(_ATTENTION_CLASS_SUFFIXES):
            names.append(name)
    return names


@dataclass
class FlopReport:
    """FLOPs of one call (a multiply-add counts 2, torch's convention).

    ``attention`` is the work inside attention modules other than their linear/conv projections (q kᵀ, the
    softmax-weighted sum, SimA's d×d products): the part whose growth with N separates the kinds.
    """

    total: int
    attention: int
    by_module: Dict[str, int] = field(default_factory=dict)


def count_flops(fn: Callable[[], Any], model: Optional[nn.Module] = None) -> FlopReport:
    """FLOPs of ``fn()``; with ``model`` (the root module ``fn`` calls) also the attention-core FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..kernels.cpu import sima as sima_cpu

    sima_cpu.available()  # loads a built kernel now: its FLOP formula must be registered before the counter copies them
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_flops())
    with counter:
        fn()
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    attention = 0
    if model is not None:
        root = type(model).__name__
        modules = dict(model.named_modules())
        for name in attention_module_names(model):
            attention += by_module.get(f"{root}.{name}", 0)
            attention -= sum(by_module.get(f"{root}.{name}.{child}", 0)
                             for child, sub in modules[name].named_modules()
                             if child and isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd)))
    return FlopReport(total=counter.get_total_flops(), attention=attention, by_module=by_module)


# ---------------------------------------------------------------------------------------------------- memory


class _StorageAccountant(_KernelMode):
    """Live bytes of the tensor storages created by ops inside the mode, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: Dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _release(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is not None:
            self.current -= nbytes

    def record(self, func, args, kwargs, out) -> None:
        # Outputs that share an input's storage (views, in-place results, views of weights) are no new memory.
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.live or key in inputs:
                continue
            nbytes = storage.nbytes()
            self.live[key] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            # Storage Python objects are preserved while the C++ storage lives: the finalizer runs when it is freed.
            weakref.finalize(storage, self._release, key, nbytes)


class PeakMemory:
    """Context manager: ``peak_bytes`` = the most memory allocated inside the region and alive at one time,
    above what existed when it was entered.

    CUDA: from the caching allocator's statistics (``torch.cuda.max_memory_allocated``). CPU (and other devices):
    deterministic storage accounting through a dispatch mode (see the module docstring).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.peak_bytes = 0
        self._accountant: Optional[_StorageAccountant] = None
        self._baseline = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
        else:
            self._accountant = _StorageAccountant()
            self._accountant.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._baseline
        else:
            self._accountant.__exit__(*exc)
            self.peak_bytes = self._accountant.peak


def peak_memory(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated (and alive at once) while ``fn()`` runs, above the memory in use before it."""
    with PeakMemory(device) as meter:
        fn()
    return meter.peak_bytes

