"""The host side every Triton kernel family shares: how a call's kernels run and what it costs the host.

A family (:mod:`simattn.kernels.linear`, :mod:`simattn.kernels.pointwise`, :mod:`simattn.kernels.agent`) plans each
call signature once (shapes, strides, dtypes, masks present, flags, device) into launches and keeps the plan here
(:func:`planned`, :data:`PLANS`); a repeat call looks it up, allocates its outputs and launches, checking nothing.
What is here:

* the launch modes (:class:`Mode`): compiled on CUDA (autotuned on a GPU once per tune key unless
  ``SIMATTN_TRITON_AUTOTUNE=0``, :func:`tuning`), in Triton's interpreter on CPU tensors (:data:`INTERPRETER`, fixed
  when this module is first imported: the test suite sets ``TRITON_INTERPRET=1`` before that on machines without
  CUDA), or dry (:func:`dry_run`);
* one kernel launch (:class:`Launch`): after a signature's first launch, the compiled kernel Triton returned is
  launched directly, skipping Triton's per-call binding;
* :func:`tuned`, the one decorator of the kernels: autotuned over their configurations when compiled, as written in
  the interpreter;
* :func:`op`, which makes a family's call from one declaration (a forward, a backward, a fake): its eager
  ``torch.autograd.Function``, its custom ops with their fakes and registered autograd, and the one branch between
  them: the custom ops while compiling, exporting or tracing, on tensor subclasses and under dispatch modes
  (:func:`as_op`), else the Function where a gradient is wanted, else the forward itself;
* :func:`dry_run` and :func:`hopper_stand_in`: the whole host path without a GPU (launches skipped; or compiled for
  an H100/H200 with Triton's launcher stubbed), for measuring host cost;
* the helpers every plan uses: tile sizes (:func:`block`), TF32 and native-product choices, masks as bytes and
  their strides, the signature of q, k, v and masks.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import torch
import triton
from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.runtime import driver

__all__ = ["INTERPRETER", "INTERPRETER_BLOCK", "SPLIT_MIN_TOKENS", "PLANS", "Launch", "Mode", "as_op", "block",
           "dry_multiprocessors", "dry_run", "grad_like", "hopper_stand_in", "interpreting", "mask_bytes",
           "mask_strides", "native", "op", "plan", "planned", "precision", "tf32", "tuned", "tuning"]

#: whether the kernels run in Triton's interpreter (``TRITON_INTERPRET`` when this module was first imported; every
#: family's kernels are decorated in that mode, as they import it)
INTERPRETER = bool(triton.knobs.runtime.interpret)

#: fewest tokens per program when the token axis is split over programs (GPU; the interpreter uses 32)
SPLIT_MIN_TOKENS = 512
INTERPRETER_BLOCK = 32  # tokens per tile in the interpreter: small, so short test inputs span several tiles
#: calls remembered; past this many signatures the memory starts over (shapes that never repeat)
_MAX_PLANS = 1024
#: the plans made, by call signature (each family's key)
PLANS: dict = {}
_dry_sms: Optional[int] = None  # the multiprocessors dry_run() plans for; None: launches run
#: hopper_stand_in(): (multiprocessors, whether to autotune) of the GPU CPU tensors stand in for; None outside it
_hopper: Optional[Tuple[int, bool]] = None
_hopper_launch: Callable[..., None] = lambda *args: None  # what a launch ends in within hopper_stand_in()


def interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when they were first imported)."""
    return INTERPRETER


@contextlib.contextmanager
def dry_run(multiprocessors: int = 132) -> Iterator[None]:
    """Within it, calls run their whole host path but launch nothing: outputs are allocated and never written, CPU
    tensors are taken as CUDA ones would be, and launches are planned as for a GPU with ``multiprocessors``
    multiprocessors (132: an H100/H200), compiled, not interpreted. For measuring host cost without a GPU."""
    global _dry_sms
    before, _dry_sms = _dry_sms, multiprocessors
    try:
        yield
    finally:
        _dry_sms = before


class _HopperDriver:
    """Stands in for Triton's CUDA driver: an sm_90 target (H100/H200) to compile for, device 0, stream 0."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def _launch_stand_in(*args) -> None:
    _hopper_launch(*args)


@contextlib.contextmanager
def hopper_stand_in(launch: Optional[Callable[..., None]] = None, multiprocessors: int = 132,
                    tune: bool = False) -> Iterator[None]:
    """Within it, calls on CPU tensors take the compiled path of an H100/H200 with ``multiprocessors``
    multiprocessors: the kernels compile for sm_90 with Triton's own compiler (its bundled ptxas), and every
    launch, through all of Triton's launch path, ends in ``launch(*arguments)`` (what Triton's CUDA launcher would
    get: the grid, stream, function, metadata and hooks, then the kernel's arguments; by default nothing) instead
    of a GPU. ``tune``: launch through Triton's autotuners (which time on a GPU: patch them) rather than in each
    kernel's first configuration. For compiling the kernels and measuring the host path, Triton's included,
    without a GPU; not with the interpreter, which compiles nothing. Plans made within it are dropped at its end."""
    global _hopper, _hopper_launch
    if INTERPRETER:
        raise RuntimeError("hopper_stand_in: the kernels were imported for Triton's interpreter (TRITON_INTERPRET=1), "
                           "which compiles nothing; run without it")

    original = CompiledKernel._init_handles
    # the driver in use before (None: not made yet; on a machine without a GPU making one fails, so it is not made)
    active = getattr(driver, "_active", None)

    def no_gpu(kernel) -> None:  # the launcher without loading the binary onto a GPU
        if kernel._run is None:
            kernel._run = _launch_stand_in

    driver.set_active(_HopperDriver())
    CompiledKernel._init_handles = no_gpu
    _hopper, _hopper_launch = (multiprocessors, tune), launch or (lambda *args: None)
    PLANS.clear()
    try:
        yield
    finally:
        _hopper, _hopper_launch = None, lambda *args: None
        PLANS.clear()
        CompiledKernel._init_handles = original
        driver.set_active(active)


def tuning() -> bool:
    """Whether launch configurations are autotuned on a GPU: yes unless ``SIMATTN_TRITON_AUTOTUNE=0``, which runs
    each kernel in its first configuration without timing any (quick checks and tests, which compile each shape
    once instead of once per configuration). Read when a call signature is first planned."""
    return os.environ.get("SIMATTN_TRITON_AUTOTUNE", "1") != "0"


# ------------------------------------------------------------------------------------------------ launch plans


def block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot needs every dimension >= 16


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _runnable(device: torch.device) -> bool:
    """Whether compiled kernels can launch on ``device`` (CPU tensors within :func:`hopper_stand_in`)."""
    return device.type == "cuda" or (_hopper is not None and device.type == "cpu")


class Mode:
    """How a call's kernels run: dry (planned for ``sms`` multiprocessors, not launched), interpreted, or compiled
    on ``device`` (tuned or in the first configuration)."""

    def __init__(self, name: str, device: torch.device, dry_sms: Optional[int], tune: bool):
        self.dry = dry_sms is not None
        self.interpret = INTERPRETER and not self.dry
        if not (_runnable(device) or self.interpret or self.dry):
            raise ValueError(f"{name}: backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 when the kernels "
                             f"are first imported, to run them in Triton's interpreter on CPU), got {device.type} "
                             f"tensors")
        self.tune = tune
        if self.dry:
            self.sms, self.least = dry_sms, SPLIT_MIN_TOKENS
        elif self.interpret:
            self.sms, self.least = 2, INTERPRETER_BLOCK
        elif device.type != "cuda":  # a GPU stood in for (hopper_stand_in)
            (self.sms, self.tune), self.least = _hopper, SPLIT_MIN_TOKENS
        else:
            self.sms, self.least = _multiprocessors(device), SPLIT_MIN_TOKENS
        # launches go to the current CUDA device: the tensors' one (set around the launches when it is another)
        self.device_index = device.index if device.type == "cuda" and not self.dry else None

    def device(self):
        if self.device_index is None or self.device_index == torch.cuda.current_device():
            return contextlib.nullcontext()
        return torch.cuda.device(self.device_index)


class Launch:
    """One kernel launch of a call: grid and constexprs fixed; the configuration (tile, warps, stages) the first
    configuration, or on a tuned GPU the one Triton's autotuner picks at the first launch, after which the kernel is
    launched in it directly. Dry: nothing.

    Compiled launches after the first skip Triton's per-call work (binding and specializing every argument, the cache
    lookup: tens of microseconds for these kernels' 30-odd arguments) and launch the compiled kernel Triton returned
    (``compiled[grid](*args)``, with the launch hooks profilers set), checking nothing: what Triton specializes a
    kernel on is fixed by the plan (:func:`plan`). Its signature fixes every integer argument (the other scalars
    are floats, which Triton does not specialize) and the dtype and 16-byte alignment of each tensor the call is
    given; every other tensor argument is one the call allocated (its outputs and scratch) or a forward's output
    handed to its backward, which torch's allocators align to 64 bytes or more, in dtypes the plan sets."""

    __slots__ = ("kernel", "grid", "kwargs", "tuning", "compiled", "constants")

    def __init__(self, kernel, grid: Tuple[int, ...], consts: dict, mode: Mode):
        self.grid, self.tuning, self.compiled, self.constants = grid, False, None, ()
        if mode.dry:
            self.kernel, self.kwargs = None, {}
        elif mode.interpret:  # the kernel as written; the host picks the tile
            self.kernel, self.kwargs = kernel, dict({"BLOCK": INTERPRETER_BLOCK}, **consts)
        elif mode.tune:
            self.kernel, self.kwargs, self.tuning = kernel, consts, True
        else:
            self.kernel, self.kwargs = kernel.fn, dict(consts, **kernel.configs[0].all_kwargs())

    def __call__(self, *args) -> None:
        if self.kernel is None:
            return
        if self.compiled is not None:
            _launch(self.compiled, self.grid, *args, *self.constants)
            return
        compiled = self.kernel.run(*args, grid=self.grid, warmup=False, **self.kwargs)
        if self.tuning:  # from now on the tuned configuration, without the autotuner
            self.kernel, self.kwargs = self.kernel.fn, dict(self.kwargs, **self.kernel.best_config.all_kwargs())
            self.tuning = False
        elif isinstance(compiled, CompiledKernel) and not INTERPRETER:
            self._keep(compiled, args)

    def _keep(self, compiled, args) -> None:
        """Launch ``compiled`` directly from now on for arguments like ``args``: the constexprs follow the runtime
        arguments in each kernel's signature, in its order."""
        names = self.kernel.arg_names[len(args):]
        if all(name in self.kwargs for name in names):
            self.compiled = compiled
            self.constants = tuple(self.kwargs[name] for name in names)
            self.grid = tuple(self.grid) + (1,) * (3 - len(self.grid))  # a compiled kernel's launch takes three


def _launch(compiled: CompiledKernel, grid: Tuple[int, int, int], *args) -> None:
    """``compiled[grid](*args)``: what Triton's runner hands the launcher, without building the launch metadata
    (a dict per launch that only launch hooks read) while no hook is set, nor the runner itself."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _hooked(enter) or _hooked(leave):
        compiled[grid](*args)
        return
    device = driver.active.get_current_device()
    compiled.run(*grid, driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata, None,
                 enter, leave, *args)


def _hooked(hook) -> bool:
    """Whether a launch hook is set: a chain of hooks that is not empty (Triton 3.5 on), or one that is not None."""
    return bool(getattr(hook, "calls", hook is not None))


def grad_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialized gradient for ``t``: its shape and dtype, contiguous (what the backward kernels write)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def precision(t: torch.Tensor) -> str:
    """Products with an fp32 operand: TF32 for half inputs (exact in TF32), else as torch's flag says."""
    tf32 = t.dtype != torch.float32 or (t.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)
    return "tf32" if tf32 else "ieee"


def native(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a product of a and b runs in their own dtype: equal half dtypes, whose products are exact in fp32."""
    return a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16)


def mask_bytes(mask: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """A bool keep-mask as bytes (a view, no copy); a placeholder pointer for none."""
    return like if mask is None else mask.view(torch.uint8)


def mask_strides(mask: Optional[torch.Tensor]) -> Tuple[int, int]:
    return (0, 0) if mask is None else mask.stride()


def plan(name: str, what: tuple, tensors: Sequence[Optional[torch.Tensor]], build: Callable[[Mode], Any]):
    """A family's call planned for ``tensors`` (every tensor the call is given) and ``what`` (the call and the
    options its plan depends on): one plan per signature, each tensor's shape, strides, dtype and 16-byte alignment
    (None for none) with the device, the dry run's multiprocessors and TF32; made by ``build(mode)`` the first time
    (``name`` heads a refusal of the device)."""
    first = tensors[0]
    dry = _dry_sms
    key = (what, tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0)
                        for t in tensors]), first.device, dry, first.dtype == torch.float32 and tf32())
    return planned(key, lambda: build(Mode(name, first.device, dry, tuning())))


def planned(key: tuple, build):
    """The plan at ``key`` (a family's call signature), made by ``build()`` the first time; past
    :data:`_MAX_PLANS` signatures the memory starts over."""
    call = PLANS.get(key)
    if call is None:
        if len(PLANS) >= _MAX_PLANS:
            PLANS.clear()
        call = PLANS[key] = build()
    return call


#: ``torch.backends.cuda.matmul.allow_tf32``'s getter, without the Python attribute lookup in front of it (a few
#: microseconds: every call's plan reads it)
_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None)


def tf32() -> bool:
    """``torch.backends.cuda.matmul.allow_tf32`` now."""
    return _allow_tf32() if _allow_tf32 is not None else torch.backends.cuda.matmul.allow_tf32


def as_op(q: torch.Tensor) -> bool:
    """Whether a call goes through the registered ops: while compiling, exporting or tracing (the graph records one
    op), on tensor subclasses (fake and functional tensors) and under dispatch modes, which see torch ops only."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing() or type(q) is not torch.Tensor
            or torch._C._len_torch_dispatch_stack() > 0)



def dry_multiprocessors() -> Optional[int]:
    """The multiprocessors :func:`dry_run` plans for within it; None outside it (launches run)."""
    return _dry_sms


def tuned(configs: Sequence[triton.Config], key: Sequence[str]) -> Callable:
    """A kernel's decorator (above ``triton.jit``): compiled, autotuned over ``configs`` on ``key`` (the host
    launches the tuned configuration itself once it is known, :class:`Launch`); in the interpreter the kernel as
    written, with the host's small tiles."""
    if INTERPRETER:
        return lambda fn: fn
    return triton.autotune(list(configs), key=list(key))


def op(name: str, forward: Callable, backward: Callable, fake: Callable, *, tensors: int, grads: int,
       save_output: bool = False, flags: Tuple[int, ...] = ()) -> Callable:
    """A family's call, forward and backward, made from one declaration: its eager ``torch.autograd.Function``,
    its custom ops ``{name}_fwd`` and ``{name}_bwd`` (with fakes, ``setup_context`` and registered autograd), and
    the one branch between them. Returns ``call(like, grad, *args)``: the custom ops where :func:`as_op` holds for
    ``like`` (compiling, exporting, tracing, tensor subclasses, dispatch modes: the graph records one op each way),
    else the Function where ``grad`` (a gradient is wanted; its dispatch costs a fraction of a custom op's), else
    the forward alone; each gives the forward's first output.

    ``forward(*args)``: annotated (the op's schema is read from it); ``args[:tensors]`` are tensors (or None), the
    rest plain values. It returns the output, or a tuple (output, *state) whose state the backward reads (a state
    tensor that is an earlier output, a placeholder where nothing is kept, comes back from the op as an empty fp32
    tensor: a custom op's outputs may not alias). ``fake(*args)``: the forward's outputs' shapes and dtypes.
    ``backward(g, *args[:tensors], *kept, *args[tensors:], *wanted)``: annotated too; ``kept`` is the state (with
    the output first where ``save_output``) and ``wanted`` whether each input at ``flags`` is given and needs a
    gradient. It returns the gradients of ``args[:grads]``, each shaped and typed as its input (for an input at
    ``flags`` not wanted, an empty fp32 tensor, given back to autograd as None)."""
    multi = _returns_tuple(forward)
    kept = slice(0 if save_output else 1, None)
    tail = (None,) * (len(inspect.signature(forward).parameters) - grads)
    saving = _Saving(tensors, multi, kept, save_output, flags, tail)
    function = _function(name, forward, backward, saving)

    def op_forward(*args):
        outs = forward(*args)
        if not multi:
            return outs
        return tuple(o if all(o is not p for p in outs[:i]) else o.new_empty(0, dtype=torch.float32)
                     for i, o in enumerate(outs))

    _annotate(op_forward, forward)
    fwd_op = torch.library.custom_op(f"{name}_fwd", op_forward, mutates_args=(), device_types=("cuda", "cpu"))
    fwd_op.register_fake(fake)
    bwd_op = torch.library.custom_op(f"{name}_bwd", backward, mutates_args=(), device_types=("cuda", "cpu"))
    bwd_op.register_fake(_grads_fake(grads, flags))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:tensors], *(output[kept] if multi else (output,) if save_output else ()))
        ctx.params = tuple(inputs[tensors:])
        if multi:
            ctx.mark_non_differentiable(*output[1:])

    def op_backward(ctx, g, *_):
        saved = ctx.saved_tensors
        want = saving.wanted(ctx, saved)
        return saving.gradients(tuple(bwd_op(g, *saved, *ctx.params, *want)), want)

    fwd_op.register_autograd(op_backward, setup_context=setup_context)
    apply = function.apply
    if multi:
        def eager(*args):
            return forward(*args)[0]

        def graphed(*args):
            return fwd_op(*args)[0]
    else:
        eager, graphed = forward, fwd_op

    def call(like: torch.Tensor, grad: bool, *args):
        if as_op(like):
            return graphed(*args)
        if grad:
            return apply(*args)
        return eager(*args)

    call.function, call.forward_op, call.backward_op = function, fwd_op, bwd_op
    return call


class _Saving:
    """How an op's autograd keeps what its backward reads (see :func:`op`)."""

    def __init__(self, tensors: int, multi: bool, kept: slice, save_output: bool, flags: Tuple[int, ...],
                 tail: tuple):
        self.tensors, self.multi, self.kept, self.save_output, self.flags, self.tail = (
            tensors, multi, kept, save_output, flags, tail)

    def wanted(self, ctx, saved) -> tuple:
        """Whether each input at ``flags`` is given and needs a gradient."""
        return tuple([saved[i] is not None and ctx.needs_input_grad[i] for i in self.flags])

    def gradients(self, grads_in: tuple, wanted: tuple) -> tuple:
        """The backward's gradients, None where not wanted, then None for each plain argument."""
        if not self.flags:
            return (*grads_in, *self.tail)
        grads_in = list(grads_in)
        for i, want in zip(self.flags, wanted):
            if not want:
                grads_in[i] = None
        return (*grads_in, *self.tail)


def _function(name: str, forward: Callable, backward: Callable, saving: _Saving):
    """The eager ``torch.autograd.Function`` of an op: the cheapest way through autograd."""
    tensors, multi, kept, save_output, flags, tail = (saving.tensors, saving.multi, saving.kept,
                                                      saving.save_output, saving.flags, saving.tail)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            outs = forward(*args)
            if multi:
                ctx.save_for_backward(*args[:tensors], *outs[kept])
                ctx.params = args[tensors:]
                return outs[0]
            ctx.save_for_backward(*args[:tensors], *((outs,) if save_output else ()))
            ctx.params = args[tensors:]
            return outs

        @staticmethod
        def backward(ctx, g):
            saved = ctx.saved_tensors
            if not flags:
                return (*backward(g, *saved, *ctx.params), *tail)
            needs = ctx.needs_input_grad  # (written out: this runs on every eager backward)
            want = [saved[i] is not None and needs[i] for i in flags]
            grads_in = list(backward(g, *saved, *ctx.params, *want))
            for i, wanted in zip(flags, want):
                if not wanted:
                    grads_in[i] = None
            return (*grads_in, *tail)

    Function.__name__ = Function.__qualname__ = name.split("::")[-1]
    return Function


def _returns_tuple(fn: Callable) -> bool:
    """Whether ``fn``'s return annotation is a tuple (of tensors)."""
    ret = inspect.signature(fn, eval_str=True).return_annotation
    return getattr(ret, "__origin__", None) is tuple


def _annotate(wrapper: Callable, fn: Callable) -> None:
    """``wrapper`` (taking ``*args``) given ``fn``'s signature, annotations resolved, for the op's schema."""
    wrapper.__signature__ = inspect.signature(fn, eval_str=True)
    wrapper.__name__, wrapper.__qualname__, wrapper.__module__ = fn.__name__, fn.__qualname__, fn.__module__


def _grads_fake(grads: int, flags: Tuple[int, ...]) -> Callable:
    """A backward op's fake: each gradient shaped and typed as its input (after the output gradient), an input at
    ``flags`` not wanted an empty fp32 tensor."""

    def fake(g, *args):
        wanted = dict(zip(flags, args[len(args) - len(flags):])) if flags else {}
        return tuple(args[i].new_empty(args[i].shape) if wanted.get(i, True) else g.new_empty(0, dtype=torch.float32)
                     for i in range(grads))

    return fake
