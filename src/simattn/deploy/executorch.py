"""ExecuTorch (``.pte``, the XNNPACK delegate): capture at one input size, PT2E int8, lowering, metadata, running.

``executorch`` and ``torchao`` (the ``edge`` extra) are imported inside the functions that need them.

Metadata: the weights' record (:mod:`simattn.models.weights`) as JSON text in a constant method,
:data:`PTE_METADATA_METHOD` (constant methods hold ints, floats, bools or tensors, not strings, so the text is a
uint8 tensor).

Quantization: the matmul-type layers only (linear, conv: int8 inputs, weights and outputs). Residual adds, norms and
SimA's normalization compute in float, and the residual stream is never rounded to int8: quantizing them breaks
the model (SimA's ``s_q·s_k`` product and the residual stream span ranges that one int8 scale cannot hold).

Delegation: XNNPACK has no LayerNorm, no sum, no squeeze, select or repeat, and its mean only pools a 4D map over
both spatial axes. Left as they are, each of those ops runs in ExecuTorch's portable kernels and splits the graph
into separate delegate calls. Before lowering, :data:`XNNPACK_DECOMPOSITIONS` rewrites them in ops XNNPACK runs (the
same math): sums and means become products with a constant column or row of ones (an fp32 GEMM, exact up to
summation order), LayerNorm becomes those means plus elementwise ops and ``rsqrt``, ``unbind`` and ``select`` become
slices and reshapes, ``repeat`` an expand. :func:`fold_input_free` then folds what does not depend on the input into
constants: those columns and rows of ones, XCiT's Fourier position encoding (fixed by the input size) and CvT's
q/k/v slices of its ``qkv`` weight (so XNNPACK takes those GEMMs with static weights). At lowering, ExecuTorch's own
transform passes drop the expands a batch of 1 makes no-ops (``RemoveNoopExpandCopyPass``, XNNPACK's
``get_transform_passes``) and turn (un)squeezes into reshapes (``ReplaceSqueezeAndUnsqueezeWithViewPass``). The
SimA DeiT, XCiT and CvT programs, fp32 and int8, then run in one XNNPACK call with nothing outside it;
:func:`delegation_summary` reports what is left outside, and :func:`outside_allowance` what of it is more than the
class token's select and expand.
"""
from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import torch
from torch import nn

from ..models.weights import WeightsRecord, read_deployed_record
from ..utils.io import atomic_path
from ..utils.values import first_line
from .base import (PROFILE_CALLS, Exported, Format, OnOps, Program, capture, capture_fixed, dims, quiet_loggers,
                   quiet_stderr)
from .ops import GraphAudit, aten_op_counts

__all__ = ["FORMAT", "ExecuTorchFormat", "PTE_METADATA_METHOD", "quantize_pt2e", "lower_executorch",
           "delegation_summary", "pte_input_shape", "set_executorch_threads", "XNNPACK_DECOMPOSITIONS",
           "for_xnnpack", "fold_input_free", "ALLOWED_OUTSIDE", "outside_allowance", "delegation_line",
           "summarize_delegation", "XNNPACK_LINEAR_PREFIXES", "executorch_profile"]

PTE_METADATA_METHOD = "simattn_metadata"


def _sum_last(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale`` × the sum over the last axis (kept, length 1), as a GEMM with a constant column."""
    r = x.shape[-1]
    column = torch.full((r, 1), scale, dtype=x.dtype)
    return torch.mm(x.reshape(-1, r), column).reshape(*x.shape[:-1], 1)


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    r = math.prod(normalized_shape)
    lead = x.shape[:x.dim() - len(normalized_shape)]
    flat = x.reshape(*lead, r)
    centered = flat - _sum_last(flat, 1.0 / r)
    var = _sum_last(centered * centered, 1.0 / r)  # biased, as LayerNorm's
    out = (centered * torch.rsqrt(var + eps)).reshape(x.shape)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _sum(x, dims=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.to(dtype)
    dims = sorted({d % x.dim() for d in dims} if dims else range(x.dim()))
    kept = [d for d in range(x.dim()) if d not in dims]
    r = math.prod(x.shape[d] for d in dims)
    if dims == [x.dim() - 2]:  # over the tokens of (..., N, d): rows of ones from the left, no transposed copy
        m = math.prod(x.shape[:-2])
        out = torch.bmm(torch.ones(m, 1, r, dtype=x.dtype), x.reshape(m, r, x.shape[-1]))
    else:
        out = _sum_last(x.permute(*kept, *dims).reshape(-1, r))
    shape = [1 if d in dims else x.shape[d] for d in range(x.dim())] if keepdim else [x.shape[d] for d in kept]
    return out.reshape(shape)


def _unbind(x, dim=0):
    dim = dim % x.dim()
    shape = [s for i, s in enumerate(x.shape) if i != dim]
    return [x.narrow(dim, i, 1).reshape(shape) for i in range(x.shape[dim])]


def _select(x, dim, index):
    dim = dim % x.dim()
    return x.narrow(dim, index % x.shape[dim], 1).reshape([s for i, s in enumerate(x.shape) if i != dim])


def _repeat(x, repeats):
    x = x.reshape([1] * (len(repeats) - x.dim()) + list(x.shape))
    if all(r == 1 for r in repeats):  # XCiT's position encoding repeated over a batch of 1: a no-op expand
        return x.expand(x.shape)
    pairs = [v for r, s in zip(repeats, x.shape) for v in (r, s)]
    ones = [v for s in x.shape for v in (1, s)]
    return x.reshape(ones).expand(pairs).reshape([r * s for r, s in zip(repeats, x.shape)])


#: ATen ops of a captured program → the same math in ops the XNNPACK delegate takes (see the module docstring)
XNNPACK_DECOMPOSITIONS = {
    torch.ops.aten.layer_norm.default: _layer_norm,
    torch.ops.aten.sum.dim_IntList: _sum,
    torch.ops.aten.unbind.int: _unbind,
    torch.ops.aten.select.int: _select,
    torch.ops.aten.repeat.default: _repeat,
}

#: ops that cut a parameter into pieces (CvT's q/k/v chunks of one ``qkv`` weight); folded into separate constants
_PARAMETER_SLICES = frozenset({"split.Tensor", "split_with_sizes.default", "chunk.default", "getitem", "slice.Tensor",
                               "select.int", "narrow.default", "unbind.int"})


def _op_name(target) -> str:
    return getattr(target, "__name__", str(target))  # an ATen overload's is 'split_with_sizes.default'


def fold_input_free(program):
    """Fold into constants, node by node, what does not depend on the program's input and is either made from
    generated values (``arange``, ``full``, lifted constants: XCiT's Fourier position encoding, which depends on the
    input size only, through its projection; the columns of ones of :data:`XNNPACK_DECOMPOSITIONS`) or a slice of
    a parameter (CvT's chunks of ``qkv``). Quantize/dequantize ops are never folded (int8 weights stay int8), nor
    is any other computation on parameters alone: folding all of them (``constant_prop_pass`` on the whole graph)
    made XNNPACK compute wrong CvT outputs. Folded tensors are stored contiguous (a slice is a view of its whole
    parameter)."""
    _load_edge_packages()
    from executorch.exir.passes import constant_prop_pass as cp
    from torch.export.exported_program import InputKind

    graph = program.graph
    constants = cp.get_constant_placeholder_dict(program)
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    generated = {n for n in constants if specs[n.name].kind == InputKind.CONSTANT_TENSOR}
    folded = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.is_impure():
            continue
        namespace = getattr(node.target, "namespace", "")
        if namespace in ("quantized_decomposed", "torchao"):
            continue
        inputs = node.all_input_nodes
        if not all(n in constants for n in inputs):
            continue
        made = not inputs or any(n in generated for n in inputs)
        if not made and _op_name(node.target) not in _PARAMETER_SLICES:
            continue
        args, kwargs = torch.utils._pytree.tree_map(
            lambda a: constants[a] if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        if isinstance(value, torch.Tensor):
            value = value.detach().contiguous().clone()
        elif isinstance(value, (list, tuple)):
            value = type(value)(v.detach().contiguous().clone() for v in value)
        constants[node] = value
        generated.add(node)
        folded[node] = value
    if not folded:
        return program
    # placeholders stay where they are; each folded node with a reader that is not folded becomes a constant
    kept = {n: t for n, t in constants.items() if n.op == "placeholder" or n in folded}
    # ExecuTorch's own placement of the new constants (it also drops the placeholders nothing reads any more)
    specs.update(cp.create_constant_nodes_and_return_specs(kept, program))
    program.graph_signature.input_specs = [specs[n.name] for n in graph.find_nodes(op="placeholder")]
    cp._update_output_node_and_specs(program, _skip_dim_order=True)
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    return program


def for_xnnpack(program):
    """``program`` with :data:`XNNPACK_DECOMPOSITIONS` applied and its input-free parts folded
    (:func:`fold_input_free`)."""
    _load_edge_packages()
    program = program.run_decompositions(dict(XNNPACK_DECOMPOSITIONS))
    # x[:, 0:] (a grid with no class token in front) is an alias, which XNNPACK does not take: the tensor itself
    for node in program.graph.find_nodes(op="call_function", target=torch.ops.aten.alias.default):
        if node.args[0].op != "placeholder":
            node.replace_all_uses_with(node.args[0])
            program.graph.erase_node(node)
    return fold_input_free(program)


def _load_edge_packages() -> None:
    """Import executorch and torchao once with torch's pytree deprecation notice (a torchao registration, logged
    as a warning on every first import) held back."""
    with quiet_loggers("torch.utils._pytree"), quiet_stderr():
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
        import torchao.quantization.pt2e  # noqa: F401


#: the layers that get int8 weights and inputs; everything between them stays float
INT8_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)
_INT8_LAYER_NAMES = {f"{t.__module__}.{t.__qualname__}" for t in INT8_LAYERS}


def _in_int8_layer(node) -> bool:
    """Whether an exported node runs inside one of :data:`INT8_LAYERS` (its ``nn_module_stack``)."""
    for _, module_type in node.meta.get("nn_module_stack", {}).values():
        if isinstance(module_type, type):
            module_type = f"{module_type.__module__}.{module_type.__qualname__}"
        if module_type in _INT8_LAYER_NAMES:
            return True
    return False


def _quantizer(dynamic: bool):
    _load_edge_packages()
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    # One global config behind a filter rather than one config per module type: the quantizer traces every pattern
    # it knows once per config, which is most of a small model's quantization time.
    return XNNPACKQuantizer().set_global(config).set_filter_function(_in_int8_layer)


def quantize_pt2e(model: nn.Module, input_size: Iterable[int], mode: str,
                  calibration: Optional[Iterable[torch.Tensor]] = None, program=None) -> nn.Module:
    """int8 linear and conv layers through PT2E with the XNNPACK quantizer (per-channel symmetric weights).

    ``mode='static'`` calibrates activation scales on ``calibration`` (batches of 1 image, preprocessed as the model
    expects); ``'dynamic'`` quantizes activations at run time. ``program``: the model already captured at batch 1
    and ``input_size`` (:func:`~simattn.deploy.base.capture`), which is then not captured again. Returns the
    converted module, ready to capture."""
    _load_edge_packages()
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if mode not in ("static", "dynamic"):
        raise ValueError(f"quantization mode {mode!r}: expected static or dynamic")
    input_size = tuple(input_size)
    graph = (program if program is not None else capture(model.eval(), input_size)).module()
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


def lower_executorch(program, record: WeightsRecord):
    """Lower an exported program to ExecuTorch with the XNNPACK partitioner, with ``record`` in the
    :data:`PTE_METADATA_METHOD` constant method. Returns the edge program manager (``.to_executorch().buffer``
    is the ``.pte``; :func:`delegation_summary` reads what XNNPACK took)."""
    _load_edge_packages()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.transforms.replace_squeeze_unsqueeze_with_view import \
        ReplaceSqueezeAndUnsqueezeWithViewPass
    from executorch.backends.xnnpack.utils.configs import get_transform_passes, get_xnnpack_edge_compile_config
    from executorch.exir import to_edge_transform_and_lower

    text = json.dumps(record.to_metadata()).encode("utf-8")
    # before the partitioner sees them: XNNPACK's transform passes drop the expands that a fixed batch of 1 makes
    # no-ops (the class token's, matmul's broadcasts), and (un)squeezes, which XNNPACK does not take, become reshapes
    passes = get_transform_passes([ReplaceSqueezeAndUnsqueezeWithViewPass()])
    return to_edge_transform_and_lower(
        for_xnnpack(program), partitioner=[XnnpackPartitioner()], transform_passes=passes,
        compile_config=get_xnnpack_edge_compile_config(),
        constant_methods={PTE_METADATA_METHOD: torch.tensor(list(text), dtype=torch.uint8)})


def delegation_summary(edge) -> Dict[str, Any]:
    """What the XNNPACK delegate took in the lowered program ``edge``: :func:`summarize_delegation` of
    ExecuTorch's delegation table."""
    _load_edge_packages()
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge.exported_program().graph_module)
    table = info.get_operator_delegation_dataframe()
    outside = {str(r.op_type): int(r.occurrences_in_non_delegated_graphs) for r in table.itertuples()}
    return summarize_delegation(int(info.num_delegated_nodes), int(info.num_delegated_subgraphs), outside)


def summarize_delegation(delegated_nodes: int, subgraphs: int, outside: Dict[str, int]) -> Dict[str, Any]:
    """The delegation report: ``{'delegated_nodes', 'subgraphs', 'portable_ops', 'not_delegated': {op: count},
    'beyond_allowance': {op: count}, 'line'}`` from the delegate's node and segment counts and ``outside`` (op →
    calls outside the delegate, as ExecuTorch's table names them). ``getitem`` only picks a delegate's outputs and
    runs no kernel: it is no op left to the portable kernels, and ``portable_ops`` and the line count the same ops
    (``beyond_allowance``: those beyond :data:`ALLOWED_OUTSIDE`; ``line``: :func:`delegation_line`)."""
    rest = {op.removeprefix("aten_"): int(n) for op, n in outside.items() if op not in ("Total", "getitem") and n}
    summary = {"delegates_to": "XNNPACK", "delegated_nodes": int(delegated_nodes), "subgraphs": int(subgraphs),
               "portable_ops": sum(rest.values()), "not_delegated": dict(sorted(rest.items()))}
    summary["beyond_allowance"] = outside_allowance(summary["not_delegated"])
    summary["line"] = delegation_line(summary)
    return summary


#: what may stay outside XNNPACK: the class token's select (``x[:, 0]``) and its expand over the batch, once each
ALLOWED_OUTSIDE = {"select_copy_int": 1, "expand_copy_default": 1}


def outside_allowance(not_delegated: Dict[str, int]) -> Dict[str, int]:
    """The ops of ``not_delegated`` (op → calls outside XNNPACK) beyond :data:`ALLOWED_OUTSIDE`."""
    beyond = {op: n - ALLOWED_OUTSIDE.get(op, 0) for op, n in not_delegated.items()}
    return {op: n for op, n in beyond.items() if n > 0}


def delegation_line(summary: Dict[str, Any]) -> str:
    """One line: what runs outside XNNPACK, and how many nodes XNNPACK runs in how many delegate segments."""
    rest, segments = summary["not_delegated"], summary["subgraphs"]
    where = (f"{segments} XNNPACK delegate segment{'s' if segments != 1 else ''} "
             f"({summary['delegated_nodes']} nodes)")
    if not rest:
        return f"not delegated: nothing, every op runs in {where}"
    calls = sum(rest.values())
    return (f"not delegated: {calls} op{'s' if calls != 1 else ''} outside XNNPACK, in portable kernels ("
            + ", ".join(f"{op} ×{n}" for op, n in rest.items()) + f"); the rest runs in {where}")


def _program(path: Union[str, Path]):
    _load_edge_packages()
    from executorch.runtime import Runtime

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ExecuTorch file not found: {path}")
    with quiet_stderr():
        try:
            return Runtime.get().load_program(path)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{path} is not an ExecuTorch program ({str(e).splitlines()[0] if str(e) else e})") \
                from None


def _read_record(path: Union[str, Path]) -> WeightsRecord:
    program = _program(path)
    if PTE_METADATA_METHOD not in program.method_names:
        raise ValueError(f"{path} lacks simattn metadata (no {PTE_METADATA_METHOD} method); export it with "
                         "`simattn export --format executorch`")
    with quiet_stderr():
        values = program.load_method(PTE_METADATA_METHOD).execute([])
    try:
        meta = json.loads(bytes(values[0].tolist()).decode("utf-8"))
    except (ValueError, IndexError, AttributeError) as e:
        raise ValueError(f"{path}: malformed simattn metadata ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: malformed simattn metadata (not a mapping)")
    return read_deployed_record(meta, str(path))


def pte_input_shape(path: Union[str, Path]) -> Tuple[int, ...]:
    """The shape of the first input of a ``.pte``'s ``forward`` (batch included): what the program takes."""
    program = _program(path)
    if "forward" not in program.method_names:
        raise ValueError(f"{path} has no forward method; export it with `simattn export --format executorch`")
    with quiet_stderr():
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

    with quiet_stderr():
        portable_lib._unsafe_reset_threadpool(int(threads))
        return int(portable_lib._threadpool_get_thread_count())


def one_at_a_time(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A batch-1 program run over a batch one image at a time, outputs stacked (as a device runs it)."""
    return lambda x: torch.cat([torch.as_tensor(run(x[i:i + 1])) for i in range(len(x))])


#: XNNPACK operator names (ETDump events inside a delegate call) that compute a matmul, GEMM or convolution
XNNPACK_LINEAR_PREFIXES = ("Fully Connected", "Batch Matrix Multiply", "Convolution", "Deconvolution")


def executorch_profile(path: Union[str, Path], x: torch.Tensor, calls: int = PROFILE_CALLS,
                       work_dir: Optional[str] = None) -> Dict[str, Any]:
    """Shares of a ``.pte``'s time from an ETDump (the pybindings' ``enable_etdump``, read with
    ``executorch.devtools.Inspector``) over ``calls`` runs on ``x`` after one warm-up (the thread pool as the
    timed program left it): ``non_delegated_share`` = 1 − (time in ``DELEGATE_CALL`` events) / (time in
    ``Method::execute``), i.e. portable kernels plus the runtime's own dispatch between calls; ``non_linear_share``
    = 1 − (time of XNNPACK's matmul/GEMM/convolution operators, :data:`XNNPACK_LINEAR_PREFIXES`) / execute time,
    when the delegate reports its operators (the sums that :mod:`simattn.deploy.executorch` rewrites as GEMMs with
    columns of ones, LayerNorm's among them, are such operators). Empty with a ``profile_note`` when this build
    cannot trace."""
    try:
        from executorch.devtools import Inspector
        from executorch.extension.pybindings import portable_lib
    except ImportError as e:
        return {"profile_note": f"executorch.devtools is not importable here ({e})"}
    etdump = Path(work_dir or tempfile.gettempdir()) / "profile.etdp"
    try:
        with quiet_stderr():
            module = portable_lib._load_for_executorch(str(path), enable_etdump=True)
            args = [x.contiguous()]
            module.forward(args)
            if hasattr(module, "has_etdump") and not module.has_etdump():
                return {"profile_note": "this ExecuTorch build records no ETDump (no event tracer in the pybindings)"}
            for _ in range(calls):
                module.forward(args)
            module.write_etdump_result_to_file(str(etdump))
            with warnings.catch_warnings():  # no debug buffer was asked for; the Inspector warns that it is absent
                warnings.simplefilter("ignore")
                inspector = Inspector(etdump_path=str(etdump))
    except Exception as e:  # noqa: BLE001 - a build without event tracing fails in several ways
        return {"profile_note": f"ExecuTorch could not write or read an ETDump here ({first_line(e, limit=200)})"}
    finally:
        etdump.unlink(missing_ok=True)
    total = delegate = linear = 0.0
    delegate_ops = False
    for block in inspector.event_blocks:
        for event in block.events:
            raw = sum(event.perf_data.raw) if event.perf_data is not None else 0.0
            if event.name == "Method::execute":
                total += raw
            elif event.name == "DELEGATE_CALL":
                delegate += raw
            elif event.is_delegated_op:
                delegate_ops = True
                linear += raw if str(event.name).startswith(XNNPACK_LINEAR_PREFIXES) else 0.0
    if not total:
        return {"profile_note": "ExecuTorch's ETDump holds no Method::execute events"}
    out = {"non_delegated_share": min(1.0, max(0.0, 1 - delegate / total))}
    if delegate_ops:
        out["non_linear_share"] = min(1.0, max(0.0, 1 - linear / total))
    return out


class ExecuTorchFormat(Format):
    name, runtime, suffixes, extra = "executorch", "executorch", (".pte",), "edge"
    packages = ("executorch", "torchao")
    quantize_modes, quantizes = ("dynamic", "static"), "model"
    relative_atol = True  # XNNPACK sums in another order than torch: parity is judged against the logits' scale
    description = "XNNPACK delegate"
    delegates_to = "XNNPACK"

    def export(self, model: nn.Module, path, record: WeightsRecord, *, on_ops: OnOps = None, quantize=None,
               calibration=None, fixed_size: bool = True, **unused: Any) -> Exported:
        """Capture at ``record.input_size`` (batch 1; the model is laid out for that size first, in place), audit,
        quantize (PT2E) when asked, lower with the XNNPACK partitioner, write ``path`` atomically."""
        input_size = record.input_size
        model, program = capture_fixed(model, input_size)
        audit = self.ops(program)
        if on_ops is not None:
            on_ops(audit)
        if quantize:
            images = list(calibration.split(1)) if calibration is not None else None
            program = capture(self.quantize(model, images, quantize, input_size=input_size, program=program),
                              input_size)
        edge = lower_executorch(program, record)
        summary = delegation_summary(edge)  # export prints its line once the file passed its checks
        buffer = edge.to_executorch().buffer
        with atomic_path(path) as tmp:
            Path(tmp).write_bytes(buffer)
        return Exported(Path(path), audit, None, [], info={"delegation": summary})

    def profile(self, path, x: torch.Tensor, threads: Optional[int] = None, calls: int = PROFILE_CALLS,
                work_dir: Optional[str] = None) -> Dict[str, Any]:
        """:func:`executorch_profile` (on the thread pool the last opened program set)."""
        return executorch_profile(path, x, calls, work_dir)

    def delegation(self, path, exported: Optional[Exported] = None) -> Optional[Dict[str, Any]]:
        """:func:`delegation_summary` of the lowering that wrote ``path`` (a ``.pte`` keeps no trace of what was
        lowered where, so only the export that wrote it can tell)."""
        return exported.info.get("delegation") if exported is not None else None

    def quantize(self, source: nn.Module, calibration, mode: str, *, input_size=None, program=None,
                 **unused: Any) -> nn.Module:
        """PT2E int8 of the model ``source`` (:func:`quantize_pt2e`, from its capture ``program`` where given);
        ``calibration``: batches of one image."""
        return quantize_pt2e(source, input_size, mode, calibration, program)

    def open(self, path, threads: Optional[int] = None) -> Program:
        shape = pte_input_shape(path)
        if len(shape) != 4 or shape[0] != 1:
            raise ValueError(f"{path}: its program takes {dims(shape)} inputs; simattn runs programs of one "
                             "image (batch 1), as `simattn export --format executorch` writes them")
        pool = set_executorch_threads(threads)
        program = _program(path)
        with quiet_stderr():
            method = program.load_method("forward")

        def run(x: torch.Tensor, program=program):  # the program is held: its method runs on the program's memory
            return method.execute([x.contiguous()])[0]

        return Program(one_at_a_time(run), shape[1:], pool)

    def read_metadata(self, path) -> WeightsRecord:
        return _read_record(path)

    def ops(self, source) -> GraphAudit:
        """ATen ops of a captured program (a ``.pte`` keeps what XNNPACK took in opaque delegate blobs)."""
        if isinstance(source, (str, Path)):
            raise ValueError(f"{source}: a .pte holds its delegated ops in opaque blobs; audit the captured "
                             "program (simattn export prints it)")
        return GraphAudit(aten_op_counts(source), kind="ATen")


FORMAT = ExecuTorchFormat()
