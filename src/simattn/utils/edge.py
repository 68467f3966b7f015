"""ExecuTorch and Core ML: lower a captured model, store simattn's metadata in the file, and run a ``.pte``.

The edge counterpart of :mod:`simattn.utils.onnx`, shared by ``simattn export``, ``simattn validate`` and
``simattn bench model``. ``executorch`` and ``coremltools`` (the ``edge`` extra) are imported inside the functions
that need them.

Metadata: the same :data:`~simattn.utils.onnx.METADATA_KEYS` as ONNX files carry. A ``.pte`` stores them as JSON
text in a constant method, :data:`PTE_METADATA_METHOD` (constant methods hold ints, floats, bools or tensors, not
strings, so the text is a uint8 tensor); an ``.mlpackage`` stores each key as JSON text under ``simattn.<key>`` in
``user_defined_metadata``.

Quantization: the matmul-type layers only (linear, conv: int8 inputs, weights and outputs). Residual adds, norms and
SimA's normalization compute in float, and the residual stream is never rounded to int8: quantizing them breaks
the model (SimA's ``s_q·s_k`` product and the residual stream span ranges that one int8 scale cannot hold).
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .onnx import METADATA_KEYS, check_metadata_values

__all__ = ["PTE_METADATA_METHOD", "COREML_KEY_PREFIX", "EXP_LIKE_ATEN", "capture", "aten_op_counts",
           "exp_like_ops", "quantize_pt2e", "lower_executorch", "delegation_summary", "read_pte_metadata",
           "pte_input_shape", "set_executorch_threads", "executorch_method", "run_executorch", "coreml_ready",
           "convert_coreml", "save_coreml", "kept_interrupts", "read_coreml_metadata"]

PTE_METADATA_METHOD = "simattn_metadata"
COREML_KEY_PREFIX = "simattn."
#: ATen ops whose kernels evaluate exp: these names, and any name holding one of :data:`EXP_LIKE_ATEN_PARTS`
EXP_LIKE_ATEN = ("exp", "exp2", "expm1", "elu", "selu", "celu", "sinh", "cosh")
EXP_LIKE_ATEN_PARTS = ("softmax", "gelu", "erf", "tanh", "sigmoid", "silu", "mish", "softplus", "logsumexp")


def _load_edge_packages() -> None:
    """Import executorch and torchao once with torch's pytree deprecation notice (a torchao registration, logged
    as a warning on every first import) held back."""
    from .onnx import quiet_loggers

    with quiet_loggers("torch.utils._pytree"), _quiet_runtime():
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
        import torchao.quantization.pt2e  # noqa: F401


def capture(model: nn.Module, input_size: Iterable[int], batch: int = 1):
    """``torch.export.export`` of ``model`` (in eval mode already: a PT2E-converted graph refuses ``.eval()``;
    no grad) at a fixed ``(batch, *input_size)``."""
    example = torch.randn(batch, *[int(v) for v in input_size])
    with torch.no_grad():
        return torch.export.export(model, (example,))


def aten_op_counts(program) -> Dict[str, int]:
    """Calls per op (``aten.linear``, ...) in an exported program's graph, overloads merged."""
    counts: Counter = Counter()
    for node in program.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name.split(".")[0]] += 1
    return dict(sorted(counts.items()))


def exp_like_ops(counts: Mapping[str, int]) -> Dict[str, int]:
    """The exp-evaluating entries of :func:`aten_op_counts` (matched on names; relu and the piecewise-linear
    ``hard*`` ops are not)."""
    def exp_like(name: str) -> bool:
        n = name.lower().lstrip("_")
        return n in EXP_LIKE_ATEN or (not n.startswith("hard") and any(s in n for s in EXP_LIKE_ATEN_PARTS))

    return {op: n for op, n in counts.items() if exp_like(op)}


def _quantizer(dynamic: bool):
    _load_edge_packages()
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    # Module types, not the global config: only these layers get int8; everything between them stays float.
    quantizer = XNNPACKQuantizer()
    for layer in (nn.Linear, nn.Conv1d, nn.Conv2d):
        quantizer.set_module_type(layer, config)
    return quantizer


def quantize_pt2e(model: nn.Module, input_size: Iterable[int], mode: str,
                  calibration: Optional[Iterable[torch.Tensor]] = None) -> nn.Module:
    """int8 linear and conv layers through PT2E with the XNNPACK quantizer (per-channel symmetric weights).

    ``mode='static'`` calibrates activation scales on ``calibration`` (batches of 1 image, preprocessed as the model
    expects); ``'dynamic'`` quantizes activations at run time. Returns the converted module, ready to
    :func:`capture`."""
    _load_edge_packages()
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if mode not in ("static", "dynamic"):
        raise ValueError(f"quantization mode {mode!r}: expected static or dynamic")
    graph = capture(model.eval(), input_size).module()
    prepared = prepare_pt2e(graph, _quantizer(mode == "dynamic"))
    with torch.no_grad():
        if mode == "static":
            seen = 0
            for x in calibration or ():
                prepared(x)
                seen += 1
            if not seen:
                raise ValueError("static quantization needs calibration images; got none")
        else:
            prepared(torch.randn(1, *input_size))
    from torchao.quantization.pt2e import move_exported_model_to_eval

    return move_exported_model_to_eval(convert_pt2e(prepared))


def lower_executorch(program, metadata: Mapping[str, Any]):
    """Lower an exported program to ExecuTorch with the XNNPACK partitioner, with ``metadata`` in the
    :data:`PTE_METADATA_METHOD` constant method. Returns the edge program manager (``.to_executorch().buffer``
    is the ``.pte``; :func:`delegation_summary` reads what XNNPACK took)."""
    _load_edge_packages()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    check_metadata_values(metadata)
    text = json.dumps(dict(metadata), default=str).encode("utf-8")
    return to_edge_transform_and_lower(
        program, partitioner=[XnnpackPartitioner()],
        constant_methods={PTE_METADATA_METHOD: torch.tensor(list(text), dtype=torch.uint8)})


def delegation_summary(edge) -> Dict[str, Any]:
    """What the XNNPACK delegate took: ``{'delegated_nodes', 'portable_nodes', 'subgraphs', 'not_delegated':
    {op: count}}`` (ops left to ExecuTorch's portable kernels, getitem bookkeeping left out)."""
    _load_edge_packages()
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge.exported_program().graph_module)
    table = info.get_operator_delegation_dataframe()
    rest = {str(r.op_type).removeprefix("aten_"): int(r.occurrences_in_non_delegated_graphs)
            for r in table.itertuples() if r.op_type not in ("Total", "getitem")
            and r.occurrences_in_non_delegated_graphs}
    return {"delegated_nodes": int(info.num_delegated_nodes), "portable_nodes": int(info.num_non_delegated_nodes),
            "subgraphs": int(info.num_delegated_subgraphs), "not_delegated": dict(sorted(rest.items()))}


@contextmanager
def _quiet_runtime():
    """ExecuTorch's C++ runtime logs cpuinfo probing to stderr (fd 2) on first use; keep it off the terminal."""
    try:
        fd = os.dup(2)
    except OSError:  # no stderr to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        os.close(devnull)


def _program(path: Union[str, Path]):
    _load_edge_packages()
    from executorch.runtime import Runtime

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ExecuTorch file not found: {path}")
    with _quiet_runtime():
        try:
            return Runtime.get().load_program(path)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{path} is not an ExecuTorch program ({str(e).splitlines()[0] if str(e) else e})") \
                from None


def read_pte_metadata(path: Union[str, Path]) -> Dict[str, Any]:
    """The simattn metadata of a ``.pte`` (checked like ONNX's: a ValueError names what is missing)."""
    program = _program(path)
    if PTE_METADATA_METHOD not in program.method_names:
        raise ValueError(f"{path} lacks simattn metadata (no {PTE_METADATA_METHOD} method); export it with "
                         "`simattn export --format executorch`")
    with _quiet_runtime():
        values = program.load_method(PTE_METADATA_METHOD).execute([])
    try:
        meta = json.loads(bytes(values[0].tolist()).decode("utf-8"))
    except (ValueError, IndexError, AttributeError) as e:
        raise ValueError(f"{path}: malformed simattn metadata ({e})") from None
    return check_metadata_values(meta, what=str(path))


def pte_input_shape(path: Union[str, Path]) -> Tuple[int, ...]:
    """The shape of the first input of a ``.pte``'s ``forward`` (batch included): what the program takes."""
    program = _program(path)
    if "forward" not in program.method_names:
        raise ValueError(f"{path} has no forward method; export it with `simattn export --format executorch`")
    with _quiet_runtime():
        meta = program.metadata("forward")
    if meta.num_inputs() < 1:
        raise ValueError(f"{path}: its forward method takes no input")
    return tuple(int(v) for v in meta.input_tensor_meta(0).sizes())


def set_executorch_threads(threads: Optional[int]) -> Optional[int]:
    """Size ExecuTorch's shared thread pool (XNNPACK's workers), which otherwise takes one thread per core
    whatever torch's thread count; returns the pool's size. ``None`` leaves the pool as it is."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"ExecuTorch threads {threads!r}: expected an integer >= 1 (or None for the pool as it is)")
    _load_edge_packages()
    from executorch.extension.pybindings import portable_lib

    with _quiet_runtime():
        portable_lib._unsafe_reset_threadpool(int(threads))
        return int(portable_lib._threadpool_get_thread_count())


def executorch_method(path: Union[str, Path], threads: Optional[int] = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable running ``forward`` of a ``.pte`` on a tensor of the exported shape (first output)."""
    set_executorch_threads(threads)
    program = _program(path)
    with _quiet_runtime():
        method = program.load_method("forward")

    def run(x: torch.Tensor) -> torch.Tensor:
        return method.execute([x.contiguous()])[0]

    return run


def run_executorch(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Run a batch-1 program over a batch, one image at a time; logits stacked."""
    return torch.cat([run(x[i:i + 1]) for i in range(len(x))])


def _alias_as_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape)


def coreml_ready(program):
    """``program`` as coremltools' torch.export frontend takes it, computing the same values:

    - ``aten.alias`` (what an unbind/view whose result is used as is, or a model output that is an input's view,
      becomes after functionalization) is not a node kind that frontend knows: it is decomposed to a view of the
      same shape (a reshape to Core ML);
    - ``clamp_min``/``clamp_max`` of a float tensor by an int (``x.clamp_min(0)``) trip its equal-dtype check:
      the bound becomes the same value as a float.
    """
    aten = torch.ops.aten
    program = program.run_decompositions({aten.alias.default: _alias_as_view})
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in (aten.clamp_min.default, aten.clamp_max.default):
            x, bound = node.args[0], node.args[1]
            value = getattr(x, "meta", {}).get("val")
            if (isinstance(bound, int) and not isinstance(bound, bool) and isinstance(value, torch.Tensor)
                    and value.is_floating_point()):
                node.args = (x, float(bound), *node.args[2:])
    program.graph_module.recompile()
    return program


def convert_coreml(program, metadata: Mapping[str, Any], precision: str = "fp32"):
    """An mlprogram ``MLModel`` from an exported program, with ``metadata`` in ``user_defined_metadata``.

    ``precision``: compute precision, ``fp32`` or ``fp16`` (Core ML's own default)."""
    check_metadata_values(metadata)
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"Core ML precision {precision!r}: expected fp32 or fp16")
    # coremltools imports its optional dependencies under bare ``except:`` clauses, which would swallow a Ctrl-C;
    # one pressed during the (slow) first import stops the export as soon as it is done, before the conversion
    with kept_interrupts(), _quiet_coremltools():
        import coremltools as ct
    with kept_interrupts(), _quiet_coremltools():
        compute = ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16
        mlmodel = ct.convert(coreml_ready(program), convert_to="mlprogram", compute_precision=compute)
    for key, value in metadata.items():
        mlmodel.user_defined_metadata[COREML_KEY_PREFIX + key] = json.dumps(value, default=str)
    mlmodel.user_defined_metadata[COREML_KEY_PREFIX + "precision"] = json.dumps(precision)
    return mlmodel


def save_coreml(mlmodel, path: Union[str, Path]) -> Path:
    """``mlmodel.save(path)`` (an ``.mlpackage`` folder), with a failed file copy raised as the OSError it is:
    coremltools copies the package with ``shutil.copytree``, which gathers its OSErrors into one ``shutil.Error``
    as text, so a full disk would not read as one."""
    import re
    import shutil

    try:
        with kept_interrupts():
            mlmodel.save(str(path))
    except shutil.Error as e:
        entries = e.args[0] if e.args and isinstance(e.args[0], list) else []
        for entry in entries:
            if isinstance(entry, tuple) and len(entry) == 3:
                found = re.match(r"\[Errno (\d+)\] ([^:]+)", str(entry[2]))
                if found:
                    raise OSError(int(found.group(1)), found.group(2).strip(), str(entry[1])) from None
        raise
    return Path(path)


@contextmanager
def kept_interrupts(defer: bool = False):
    """Ctrl-C (SIGINT) inside the block is never lost. A KeyboardInterrupt raised inside library code that catches
    everything (bare ``except:``, as coremltools' optional imports do) would be swallowed and the work would go on;
    here each SIGINT is also recorded, and a recorded one is raised when the block ends, whatever the block did.
    ``defer=True`` only records it (for a few steps that must not be cut in two). Python's own handler is put back
    on leaving. Nothing changes off the main thread or when SIGINT has another handler (ignored, or the caller's)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    hits = []

    def handler(signum, frame):
        hits.append(signum)
        if not defer:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if hits:
            raise KeyboardInterrupt


@contextmanager
def _quiet_coremltools():
    """coremltools warns about untested torch/scikit-learn versions and its missing macOS runtime, and draws a
    progress bar for every pass; none of it concerns the conversion (errors still raise)."""
    import contextlib
    import io
    import warnings

    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def read_coreml_metadata(path: Union[str, Path]) -> Dict[str, Any]:
    """The simattn metadata of an ``.mlpackage`` (read without loading the model, which needs macOS)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Core ML package not found: {path}")
    with _quiet_coremltools():
        import coremltools as ct

        props = dict(ct.models.MLModel(str(path), skip_model_load=True).user_defined_metadata)
    meta = {k[len(COREML_KEY_PREFIX):]: v for k, v in props.items() if k.startswith(COREML_KEY_PREFIX)}
    missing = [k for k in METADATA_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path} lacks simattn metadata ({', '.join(missing)}); export it with `simattn export`")
    try:
        return check_metadata_values({k: json.loads(v) for k, v in meta.items()}, what=str(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed simattn metadata ({e})") from None
