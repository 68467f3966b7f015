"""Which implementation runs an attention call: torch, the fused Triton kernels, or SimA's compiled CPU kernel.

One table, :data:`POLICIES`, states for every kind with kernels which backends it has, each with its applicability
check (a ``verify``: None where the backend takes the call, else a one-line reason); each kind registers its own
policy beside its op (:func:`register_policy`), so importing :mod:`simattn.attention` fills it, and what only a kind
reads travels in :attr:`Call.params` and :attr:`Call.extra`. One function, :func:`choose`, decides, as a pure
function of what it is told about the call (a :class:`Call`: the tensors' shapes and dtypes, the
device, whether autograd records the call, the graph being captured), so every policy can be checked without a GPU;
what a :class:`Call` is not told it reads from the live state when it needs it. Kinds without kernels have no entry
and run torch.

The rule, the same for every kind:

* ``'torch'`` runs torch; an explicit kernel backend runs where its verify passes, else a one-line ValueError with
  the verify's reason;
* ``'auto'`` takes the first of the kind's kernel backends that runs on the call's device without being asked (the
  CPU kernel on CPU, the Triton kernels on CUDA, but not into graphs made for other runtimes, which could not run
  them, and where the kind's own ``auto`` condition holds: SimA's cheaper order is the kernels' one), whose verify
  passes, training included, and which the measured table, where it has a point near the call, found at least as
  fast as torch; else torch.

:func:`dispatch` is the one skeleton of the functional ops with kernels: the choice, then the kernel or the torch
path with autocast off, cast back.

A kind is kept off its kernels in training only where they have no backward: its verify refuses a call that needs
gradients and says so (XNorm's Triton kernel, SimA's CPU kernel).
"""
from __future__ import annotations

import functools
import importlib.util
import json
from importlib import resources
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from ._common import cast, fx_tracing, no_autocast

__all__ = ["LIVE", "Call", "Policy", "POLICIES", "register_policy", "choose", "choices", "dispatch", "check_backend",
           "graph_state", "TRITON_MAX_HEAD_DIM", "TRITON_DTYPES", "NO_BACKWARD", "triton_limits", "takes_triton",
           "gpu_table", "index_points", "backend_table", "gpu_points", "gpu_capability", "measured"]


#: a :class:`Call` field not given: read from the live state on first use
LIVE = object()


class Call:
    """What the chooser reads of one call on checked q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv).

    Of the tensors only shapes, dtypes and strides are read. The state around the call (``device``, ``grad``,
    ``graph``, ``autocast``, ``capability``) may be given: then the choice is a pure function of the fields, and a
    test can state a CUDA call in training with CPU tensors. A field not given is read from the live state when the
    choice first needs it, so a choice that depends only on the device costs no more than reading it.

    Fields: ``device`` the tensors' device type ('cpu', 'cuda', ...); ``grad`` whether autograd records the call
    (grad mode on and q, k, v or a tensor in ``params`` needs a gradient); ``graph`` None eagerly, 'compile' under
    torch.compile (which runs the kernels' custom ops), 'export' while making a graph for another runtime
    (torch.export, TorchScript, jit and fx tracing); ``autocast`` autocast's dtype where it is on, else None;
    ``capability`` the GPU's compute capability ('sm_90') where a measured table is read. ``params``: the call's
    other inputs (tensors among them count for ``grad``); ``extra``: what only the kind's own policy reads (SimA's
    orders and mask, the point-wise kinds' h), the chooser never."""

    __slots__ = ("q", "k", "v", "params", "extra", "_device", "_grad", "_graph", "_autocast", "_capability")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, device=LIVE, grad=LIVE, graph=LIVE,
                 autocast=LIVE, capability=LIVE, params: Tuple = (), extra: Any = None) -> None:
        self.q = q
        self.k = k
        self.v = v
        self.params = params
        self.extra = extra
        self._device = device
        self._grad = grad
        self._graph = graph
        self._autocast = autocast
        self._capability = capability

    @property
    def device(self) -> str:
        if self._device is LIVE:
            self._device = self.q.device.type
        return self._device

    @property
    def grad(self) -> bool:
        if self._grad is LIVE:
            q, k, v = self.q, self.k, self.v
            self._grad = torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad
                or any(torch.is_tensor(t) and t.requires_grad for t in self.params))
        return self._grad

    @property
    def graph(self) -> Optional[str]:
        if self._graph is LIVE:
            self._graph = graph_state()
        return self._graph

    @property
    def autocast(self) -> Optional[torch.dtype]:
        if self._autocast is LIVE:
            device = self.device
            self._autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        return self._autocast

    @property
    def capability(self) -> Optional[str]:
        if self._capability is LIVE:
            self._capability = gpu_capability(self.q.device) if self.device == "cuda" else None
        return self._capability

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(t.shape)) for t in (self.q, self.k, self.v))
        return (f"Call({shapes}, device={self.device!r}, grad={self.grad}, graph={self.graph!r}, "
                f"autocast={self.autocast}, extra={self.extra!r})")


#: the largest head dim (of q/k and of v) the fused linear and point-wise kernels take: their d×dv fp32 state lives
#: in registers
TRITON_MAX_HEAD_DIM = 128
#: the dtypes of q, k and v the Triton kernels take
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # asked once: auto asks on every call
#: a verify's reason for a kernel without a backward
NO_BACKWARD = "has no backward kernel (run it under torch.no_grad() or torch.inference_mode())"


# ------------------------------------------------------------------------------------------------ verify


def triton_limits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """What every Triton family takes: :data:`TRITON_DTYPES`, head dims up to :data:`TRITON_MAX_HEAD_DIM`, the
    triton package; None where q, k, v meet it, else the reason."""
    if not (q.dtype in TRITON_DTYPES and k.dtype in TRITON_DTYPES and v.dtype in TRITON_DTYPES):
        return f"takes float32, float16 or bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}"
    d, dv = q.shape[-1], v.shape[-1]
    if d > TRITON_MAX_HEAD_DIM or dv > TRITON_MAX_HEAD_DIM:
        return f"takes head dims up to {TRITON_MAX_HEAD_DIM}, got d={d}, dv={dv}"
    if not _TRITON_INSTALLED:
        return "needs the triton package"
    return None


def takes_triton(call: "Call") -> Optional[str]:
    """The verify of a Triton backend that takes whatever :func:`triton_limits` allows (the linear kernels with a
    backward: ELU, SLAB, FLatten's and InLine's products; sigmoid's)."""
    return triton_limits(call.q, call.k, call.v)


# ------------------------------------------------------------------------------------------------ the table


class Policy(NamedTuple):
    """A kind's kernel backends, each with its verify, in the order ``'auto'`` tries them; ``table``: the measured
    table ``'auto'`` consults on a GPU (None: none); ``why``: the policy in words, for readers and reports;
    ``auto``: where ``'auto'`` may take the Triton kernels at all, beyond their verify (None: wherever it passes;
    SimA: where its cheaper order is q̂(k̂ᵀv), the kernels' one)."""

    backends: Dict[str, Callable[[Call], Optional[str]]]
    table: Optional[str] = None
    why: str = ""
    auto: Optional[Callable[[Call], bool]] = None


#: the words of the usual policy
EVERYWHERE = "auto: the Triton kernels on CUDA where they take the call, training included"
#: every kind with kernels, each registered beside its op (:func:`register_policy`); the others (softmax, XCA,
#: SOFT, Linformer, ...) run torch only
POLICIES: Dict[str, Policy] = {}
#: where ``'auto'`` takes a backend without being asked
_AUTO_DEVICE = {"triton": "cuda", "cpp": "cpu"}


def register_policy(kind: str, policy: Policy) -> Policy:
    """Make ``policy`` ``kind``'s (its kernel backends and their verifies: ``'triton'``, run on CUDA by ``'auto'``,
    or ``'cpp'``, run on CPU); a kind calls this beside its op. Returns it."""
    unknown = set(policy.backends) - set(_AUTO_DEVICE)
    if unknown:
        raise ValueError(f"register_policy: {kind!r} names backends {sorted(unknown)}; allowed: "
                         f"{', '.join(_AUTO_DEVICE)}")
    POLICIES[kind] = policy
    return policy


# ------------------------------------------------------------------------------------------------ the chooser


def choices(kind: str) -> Tuple[str, ...]:
    """The ``backend`` values ``kind`` takes."""
    return ("auto", "torch") + tuple(POLICIES[kind].backends)


def check_backend(owner: str, kind: str, backend: str) -> str:
    """``backend`` if ``kind`` takes it, else a one-line ValueError naming ``owner`` and the choices."""
    if backend not in choices(kind):
        raise ValueError(f"{owner}: unknown backend {backend!r}; expected one of {', '.join(choices(kind))}")
    return backend


def choose(kind: str, backend: str, call: Call, owner: Optional[str] = None) -> str:
    """The implementation that runs ``call`` of ``kind``: ``'torch'``, ``'triton'`` or ``'cpp'`` (see the module
    docstring for the rule). A one-line ValueError, naming ``owner`` (default ``kind``), for an unknown backend or
    an explicit one that cannot take the call."""
    if backend == "torch":
        return "torch"
    policy = POLICIES[kind]
    if backend != "auto":
        if backend not in policy.backends:
            check_backend(owner or kind, kind, backend)
        if backend == "triton" and call.q.shape[0] * call.q.shape[1] == 0:  # (empty batches: nothing to launch)
            return "torch"
        why = policy.backends[backend](call)
        if why is not None:
            raise ValueError(f"{owner or kind}: backend {backend!r} {why}; backend 'auto' runs torch there")
        return backend
    device = call.device
    for name, verify in policy.backends.items():
        if device != _AUTO_DEVICE[name]:
            continue
        if name == "triton":
            # graphs for other runtimes could not run the kernels
            if call.q.shape[0] * call.q.shape[1] == 0 or (policy.auto is not None and not policy.auto(call)) \
                    or call.graph == "export":
                continue
            if verify(call) is None and (policy.table is None or measured(call, policy.table) is not False):
                return name
        elif verify(call) is None:
            return name
    return "torch"


def dispatch(kind: str, backend: str, call: Call, dtype: torch.dtype, kernel: Callable[..., torch.Tensor],
             fallback: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """The one skeleton of the functional ops with kernels, past their checks and their output ``dtype``: where
    :func:`choose` takes the Triton kernels for ``call``, ``kernel(dtype, *args)`` (the output in ``dtype``; a
    kernel that does torch work first turns autocast off itself); else ``fallback(*args)``, the torch path, with
    autocast off (it picks its dtypes: norms and sums in fp32), cast to ``dtype``."""
    if choose(kind, backend, call) == "triton":
        return kernel(dtype, *args)
    with no_autocast(call.q):
        out = fallback(*args)
    return cast(out, dtype)


def graph_state() -> Optional[str]:
    """:attr:`Call.graph` now."""
    if torch.jit.is_scripting() or torch.jit.is_tracing() or fx_tracing() or torch.compiler.is_exporting():
        return "export"
    return "compile" if torch.compiler.is_compiling() else None


# ------------------------------------------------------------------------------------------------ measured table
#: a table's measured points per compute capability, then per (dtype, head dim, pass): ((B·H, ((N, whether
#: Triton was at least as fast as torch), ...)), ...), both levels sorted
Grid = Tuple[Tuple[int, Tuple[Tuple[int, bool], ...]], ...]
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@functools.lru_cache(maxsize=None)
def gpu_table(name: str = "sima_gpu_table.json") -> dict:
    """A checked-in table (package data): ``{"points": [{"capability": "sm_90", "dtype": "bfloat16", "head_dim":
    64, "pass": "fwd" or "fwd+bwd", "bh": B·H, "tokens": N, "triton_ms": ..., "torch_ms": ..., ...}, ...]}``, GPU
    times measured by ``simattn bench attention --device cuda --write-table PATH``."""
    return json.loads(resources.files(__package__).joinpath(name).read_text())


def index_points(points: Sequence[dict]) -> Dict[str, Dict[Tuple[str, int, str], Grid]]:
    """Measured points → per capability and (dtype, head dim, pass), the grid :func:`measured` searches. A point
    measured twice keeps its last measurement; points are never merged into thresholds."""
    cells: Dict[str, Dict[tuple, Dict[int, Dict[int, bool]]]] = {}
    for p in points:
        key = (p["dtype"], int(p["head_dim"]), p["pass"])
        row = cells.setdefault(p["capability"], {}).setdefault(key, {}).setdefault(int(p["bh"]), {})
        row[int(p["tokens"])] = p["triton_ms"] <= p["torch_ms"]
    return {cap: {key: tuple((bh, tuple(sorted(row[bh].items()))) for bh in sorted(row))
                  for key, row in keys.items()} for cap, keys in cells.items()}


@functools.lru_cache(maxsize=None)
def backend_table(name: str = "sima_gpu_table.json") -> Dict[str, Dict[Tuple[str, int, str], Grid]]:
    """A table, indexed (:func:`index_points`)."""
    return index_points(gpu_table(name)["points"])


@torch.compiler.assume_constant_result
def gpu_points(capability: str, name: str) -> Optional[Dict[Tuple[str, int, str], Grid]]:
    """The measured grids of one compute capability in table ``name`` (None: not measured), a constant under
    ``torch.compile``."""
    return backend_table(name).get(capability)


@torch.compiler.assume_constant_result
def gpu_capability(device: torch.device) -> str:
    """``'sm_90'`` for a compute capability 9.0 device."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _nearest(entries: Sequence[tuple], x) -> tuple:
    """The entry whose first value is nearest ``x`` on a log scale (entries sorted by it): past the geometric mean
    of two neighbours, the larger. Integer comparisons only, so symbolic sizes under ``torch.compile`` give guards."""
    i = 0
    while i + 1 < len(entries) and x * x >= entries[i][0] * entries[i + 1][0]:
        i += 1
    return entries[i]


def measured(call: Call, name: str = "sima_gpu_table.json") -> Optional[bool]:
    """Whether the Triton kernels were at least as fast as torch at the measured point nearest ``call`` (on a log
    scale in B·H, then in N = the longer token axis) among those of its GPU's compute capability, dtype (autocast's
    where it is on), head dim and pass (``fwd+bwd`` where autograd records the call); None where the table has no
    such point."""
    capability = call.capability
    grids = gpu_points(capability, name) if capability is not None else None
    if grids is None:
        return None
    q, autocast = call.q, call.autocast
    dtype = autocast if autocast is not None else q.dtype
    grid = grids.get((_DTYPE_NAMES.get(dtype, ""), q.shape[-1], "fwd+bwd" if call.grad else "fwd"))
    if grid is None:
        return None
    _, row = _nearest(grid, q.shape[0] * q.shape[1])
    _, faster = _nearest(row, max(q.shape[-2], call.k.shape[-2]))
    return faster
