"""ONNX (run in onnxruntime): export with the file checked against the model, static and dynamic int8, the ops of
a file for the exp-free audit.

Exporter choice: ``torch.onnx.export(dynamo=True)`` (torch.export) is the default because it records shape
arithmetic symbolically, so a ViT whose position embedding is resampled for the input size stays correct at
every input size. The legacy TorchScript tracer replays Python control flow with the example's sizes frozen in
(timm's position-embedding resampling becomes a fixed-size add, which fails at any other resolution), but it is
~10× faster and handles some code torch.export rejects; ``exporter='auto'`` falls back to it when the dynamo
export fails. Whatever exporter runs, the file is verified with onnxruntime at a second batch size and, when the
graph claims dynamic height/width, at a second resolution; a graph that fails there is re-exported with a fixed
resolution (recorded in the notes) rather than shipped broken.

Metadata: the weights' record (:mod:`simattn.models.weights`), one ``metadata_props`` entry per key.
"""
from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from ..models.weights import WeightsRecord, read_deployed_record
from ..utils.io import atomic_path
from ..utils.recipe import Opt
from .base import PROFILE_CALLS, ExportError, Exported, Format, OnOps, Program, first_line, quiet_loggers
from .onnx_passes import run_passes
from .ops import GraphAudit

__all__ = ["FORMAT", "OnnxFormat", "EXPORTERS", "check_opset", "ExportResult", "load_onnx", "export_onnx",
           "ort_session", "run_onnx", "check_parity", "export_and_verify", "audit_onnx", "QDQ_OP_TYPES",
           "FLOAT_OUTPUT_OP_TYPES", "INT8_KERNELS", "ort_delegation", "ORT_LINEAR_OPS", "ort_profile",
           "quantize_static_int8", "quantize_dynamic_int8"]

EXPORTERS = ("auto", "dynamo", "torchscript")
INPUT_NAME = "input"
#: the matmul-type ONNX ops int8 quantizes; adds, norms and SimA's normalization between them stay float
QDQ_OP_TYPES = ("MatMul", "Gemm", "Conv")
#: those of :data:`QDQ_OP_TYPES` whose outputs stay float (onnxruntime has int8 kernels with float outputs for them)
FLOAT_OUTPUT_OP_TYPES = ("MatMul", "Gemm")


@dataclass
class ExportResult:
    """What was written and how: exporter used, opset, which input dims are dynamic, notes on fallbacks."""

    path: str
    exporter: str
    opset: int
    input_shape: List[object]
    output_names: List[str]
    dynamic_batch: bool
    dynamic_spatial: bool
    seconds: float
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)


def check_opset(opset: int) -> Optional[str]:
    """None when the installed onnx knows ``opset`` (or onnx is not installed: the option is checked for every
    format, and ONNX's own export names the missing package), else what is allowed (an option check)."""
    try:
        from onnx.defs import onnx_opset_version
    except ImportError:
        return None
    if opset > onnx_opset_version():
        return f"allowed: 18 to {onnx_opset_version()} (the newest opset the installed onnx knows)"
    return None


def _write_metadata(proto, record: WeightsRecord) -> None:
    meta = record.to_metadata()
    kept = [p for p in proto.metadata_props if p.key not in meta]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def load_onnx(path: Union[str, Path]):
    """The ``onnx.ModelProto`` of the file ``path`` (external data not loaded); a one-line FileNotFoundError or
    ValueError names the file and why it cannot be read (missing, truncated, another format)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:6] == b"ET":  # the flatbuffer identifier of an ExecuTorch program ("ET12")
        raise ValueError(f"{path} is an ExecuTorch program, not an ONNX model (its name should end with .pte)")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError, onnx's own errors: the bytes are not a whole ModelProto
        raise ValueError(f"{path} is not a readable ONNX model (truncated, or another format: "
                         f"{first_line(e)})") from None


def _read_record(model: Union[str, Path, Any]) -> WeightsRecord:
    proto = load_onnx(model) if isinstance(model, (str, Path)) else model
    what = str(model) if isinstance(model, (str, Path)) else "ONNX model"
    return read_deployed_record({p.key: p.value for p in proto.metadata_props}, what)


def _output_names(model: nn.Module, example: torch.Tensor) -> List[str]:
    with torch.no_grad():
        out = model(example)
    return ["logits"] if isinstance(out, torch.Tensor) else [f"output{i}" for i in range(len(out))]


def _spatial_dims(example: torch.Tensor, multiple: Optional[int]):
    """Height and width as torch.export dims: AUTO (symbolic where the model allows, else specialized), or, with
    ``multiple``, symbolic multiples of it (a network whose levels are halved and added back, such as a
    segmentation decoder, needs sizes that divide evenly, which torch.export cannot prove for AUTO sizes)."""
    dim = torch.export.Dim
    # an example of one multiple (a 32x32 crop) would be specialized: torch.export treats sizes 0 and 1 as constants
    if not multiple or any(int(v) % multiple or int(v) < 2 * multiple for v in example.shape[2:]):
        return dim.AUTO, dim.AUTO
    return tuple(multiple * dim(f"{name}_{multiple}", min=1, max=max(2, 8192 // multiple))
                 for name in ("height", "width"))


def _export_dynamo(model, example, path, opset, output_names, dynamic_spatial, multiple=None):
    dim = torch.export.Dim
    # Batch must stay symbolic (an error otherwise); height/width stay symbolic where the model allows (AUTO lets
    # torch.export specialize them instead of failing; the written input shape tells which happened).
    dynamic = {0: dim.DYNAMIC, **dict(zip((2, 3), _spatial_dims(example, multiple)))} if dynamic_spatial \
        else {0: dim.DYNAMIC}
    program = torch.onnx.export(model, (example,), dynamo=True, dynamic_shapes=(dynamic,), opset_version=opset,
                                input_names=[INPUT_NAME], output_names=output_names, external_data=False,
                                verbose=False)
    program.save(str(path), external_data=False)


def _export_torchscript(model, example, path, opset, output_names, dynamic_spatial, multiple=None):
    axes = {0: "batch", 2: "height", 3: "width"} if dynamic_spatial else {0: "batch"}
    dynamic_axes = {INPUT_NAME: axes, **{name: {0: "batch"} for name in output_names}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side shape checks are expected
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=True)


_EXPORT_FNS = {"dynamo": _export_dynamo, "torchscript": _export_torchscript}


def export_onnx(model: nn.Module, path: str | Path, record: WeightsRecord, *, batch: int = 2, opset: int = 18,
                exporter: str = "auto", dynamic_spatial: bool = True,
                spatial_multiple: Optional[int] = None) -> ExportResult:
    """Write ``model`` (eval mode) to ``path`` as ONNX with a dynamic batch axis (and dynamic H/W if asked and the
    model allows; ``spatial_multiple``: sizes that are multiples of it, for the dynamo exporter), exported at
    ``record.input_size`` and carrying ``record`` in its ``metadata_props``. The file is written atomically.
    Raises :class:`ExportError` naming the failing exporter(s)."""
    import onnx

    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    if opset < 18:
        raise ValueError(f"opset must be >= 18, got {opset}")
    if batch < 2:
        raise ValueError(f"example batch must be >= 2 (a batch of 1 would be specialized), got {batch}")
    path = Path(path)
    model = model.eval()
    example = torch.randn(batch, *record.input_size)
    output_names = _output_names(model, example)
    notes: List[str] = []
    for name in (("dynamo", "torchscript") if exporter == "auto" else (exporter,)):
        start = time.perf_counter()
        try:
            with atomic_path(path) as tmp:
                with torch.no_grad(), quiet_loggers("onnxscript"):
                    _EXPORT_FNS[name](model, example, tmp, opset, output_names, dynamic_spatial, spatial_multiple)
                proto = onnx.load(str(tmp), load_external_data=False)
                run_passes(proto)  # onnxruntime's faster forms of GELU, linear layers and q/k/v projections
                _write_metadata(proto, record)
                onnx.save(proto, str(tmp))
        except Exception as e:  # exporters raise many types; keep the first line for the report
            notes.append(f"{name} exporter failed: {first_line(e)}")
            continue
        shape = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
        result = ExportResult(
            path=str(path), exporter=name, opset=opset, input_shape=shape,
            output_names=[o.name for o in proto.graph.output],
            dynamic_batch=isinstance(shape[0], str), dynamic_spatial=all(isinstance(d, str) for d in shape[2:]),
            seconds=round(time.perf_counter() - start, 2), notes=notes)
        if not result.dynamic_batch:
            raise ExportError(f"{name} exporter produced a fixed batch size ({shape}) for {path}")
        return result
    raise ExportError(f"could not export {type(model).__name__} to ONNX: " + "; ".join(notes))


def _session_options(threads: Optional[int], quiet: bool):
    """onnxruntime SessionOptions with ``threads`` intra-op threads (None = onnxruntime's default) and, ``quiet``,
    only fatal errors logged."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if quiet:
        opts.log_severity_level = 4  # fatal only
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return opts


def ort_session(path: str | Path, threads: Optional[int] = None, quiet: bool = False):
    """An onnxruntime CPU session; ``threads`` fixes intra-op threads (None = onnxruntime's default); ``quiet``
    silences onnxruntime's own error log (for probing runs whose errors the caller reports itself)."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), sess_options=_session_options(threads, quiet),
                                providers=["CPUExecutionProvider"])


def run_onnx(session, x: torch.Tensor) -> np.ndarray:
    """The first output of ``session`` on ``x``."""
    return session.run(None, {session.get_inputs()[0].name: x.detach().cpu().numpy()})[0]


def check_parity(model: nn.Module, session, inputs: Mapping[str, torch.Tensor],
                 atol: float = 1e-4) -> Dict[str, Dict[str, object]]:
    """Max |onnxruntime − PyTorch| of the first output for each named input; ``ok`` when within ``atol``.

    An input the graph cannot run (e.g. a resolution it was not exported for) is reported with its error."""
    results: Dict[str, Dict[str, object]] = {}
    for name, x in inputs.items():
        entry: Dict[str, object] = {"shape": list(x.shape)}
        with torch.no_grad():
            ref = model(x)
        ref = (ref if isinstance(ref, torch.Tensor) else ref[0]).numpy()
        try:
            out = run_onnx(session, x)
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            entry.update(ok=False, error=first_line(e))
        else:
            diff = float(np.abs(out - ref).max()) if out.shape == ref.shape else float("inf")
            entry.update(ok=bool(diff <= atol), max_abs_diff=diff)
        results[name] = entry
    return results


RealInputs = Callable[[Mapping[str, Any]], Mapping[str, torch.Tensor]]


def export_and_verify(model: nn.Module, path: str | Path, record: WeightsRecord, *,
                      real_inputs: Optional[RealInputs] = None, batch: int = 2, opset: int = 18,
                      exporter: str = "auto", dynamic_spatial: bool = True, stride: int = 32,
                      atol: float = 1e-4, threads: Optional[int] = None, spatial_multiple: Optional[int] = None
                      ) -> Tuple[ExportResult, Dict[str, Dict[str, object]]]:
    """Export (:func:`export_onnx`), then compare onnxruntime with PyTorch on random inputs at ``batch`` and
    ``batch + 1`` (dynamic batch), at a second resolution (input size + ``stride``) when the graph has dynamic H/W,
    and on ``real_inputs(data_config)``. The input size and the preprocessing are read back from the written file,
    so the checks feed the file what its metadata promises. If the second resolution fails, the model is
    re-exported at a fixed resolution.

    onnxruntime runs at ``threads`` intra-op threads (None: its default).

    Returns (export result, parity per input). Raises :class:`ExportError` when any parity check fails.
    """
    result = export_onnx(model, path, record, batch=batch, opset=opset, exporter=exporter,
                         dynamic_spatial=dynamic_spatial, spatial_multiple=spatial_multiple)
    data_config = dict(_read_record(path).data_config)
    c, h, w = data_config["input_size"]
    generator = torch.Generator().manual_seed(0)
    fixed = {f"random_b{batch}_{h}x{w}": torch.randn(batch, c, h, w, generator=generator),
             f"random_b{batch + 1}_{h}x{w}": torch.randn(batch + 1, c, h, w, generator=generator)}
    fixed.update(real_inputs(data_config) if real_inputs else {})
    alt = {f"random_b1_{h + stride}x{w + stride}": torch.randn(1, c, h + stride, w + stride, generator=generator)}

    checks = {**fixed, **alt} if result.dynamic_spatial else fixed
    parity = check_parity(model, ort_session(path, threads, quiet=True), checks, atol)
    if result.dynamic_spatial and not all(parity[k]["ok"] for k in alt):
        why = next(parity[k].get("error") or f"max abs diff {parity[k]['max_abs_diff']:.3g}" for k in alt)
        notes = result.notes + [f"dynamic height/width did not hold at {h + stride}x{w + stride} ({why}); "
                                "re-exported with a fixed resolution"]
        # keep the exporter that worked, so a dynamo failure is not retried
        result = export_onnx(model, path, record, batch=batch, opset=opset, exporter=result.exporter,
                             dynamic_spatial=False)
        result.notes = notes
        parity = check_parity(model, ort_session(path, threads, quiet=True), fixed, atol)
    failed = {k: v for k, v in parity.items() if not v["ok"]}
    if failed:
        detail = "; ".join(f"{k}: {v.get('error') or 'max abs diff %.3g' % v['max_abs_diff']}"
                           for k, v in failed.items())
        raise ExportError(f"onnxruntime output differs from PyTorch beyond {atol:g} for {path}: {detail}",
                          result, parity)
    return result, parity


def audit_onnx(model: Union[str, Path, Any]) -> GraphAudit:
    """Count the ops of an ONNX model (a path or an ``onnx.ModelProto``): local functions expanded at each call
    and control-flow subgraphs (If/Loop/Scan bodies) included, so nothing hides behind a function call."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False) if isinstance(model, (str, Path)) else model
    local_functions = {(f.domain, f.name): f for f in proto.functions}
    counts: Counter = Counter()
    calls: Counter = Counter()

    def visit(nodes, stack=()):
        for node in nodes:
            key = (node.domain, node.op_type)
            if key in local_functions:
                if key in stack:  # ONNX forbids recursion; guard anyway rather than loop forever
                    raise ValueError(f"recursive ONNX function {node.op_type}")
                calls[node.op_type] += 1
                visit(local_functions[key].node, stack + (key,))
                continue
            counts[node.op_type] += 1
            for attr in node.attribute:  # control-flow bodies
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g.node, stack)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        visit(g.node, stack)

    visit(proto.graph.node)
    return GraphAudit(op_counts=dict(sorted(counts.items())), kind="ONNX", functions=dict(sorted(calls.items())),
                      scope="functions expanded, subgraphs included")


def _copy_metadata(src_proto, dst: Path) -> None:
    import onnx

    quantized = onnx.load(str(dst))
    keys = {p.key for p in quantized.metadata_props}
    quantized.metadata_props.extend(p for p in src_proto.metadata_props if p.key not in keys)
    onnx.save(quantized, str(dst))


def quantize_static_int8(src: str | Path, dst: str | Path, calibration: torch.Tensor, batch_size: int = 16) -> Path:
    """Write a static int8 copy of the ONNX model ``src`` to ``dst`` (atomically): QDQ format, per-channel int8
    weights, activation scales calibrated (min-max) on ``calibration`` (preprocessed images), only
    :data:`QDQ_OP_TYPES` with a constant weight quantized; ``src``'s simattn metadata is carried over."""
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    proto = onnx.load(str(src))
    del proto.graph.value_info[:]  # stale initializer shapes from the dynamo exporter (see quantize_dynamic_int8)
    name = proto.graph.input[0].name
    # Products of two activations (the attention's own matmuls) stay float: a few percent of the model's
    # multiply-adds, where quantizing both inputs costs more QuantizeLinear passes than the int8 product saves.
    constants = {init.name for init in proto.graph.initializer} | {
        out for node in proto.graph.node if node.op_type == "Constant" for out in node.output}
    activation_products = [node.name for node in proto.graph.node
                           if node.op_type == "MatMul" and node.name and not set(node.input) & constants]
    batches = [calibration[i:i + batch_size].numpy() for i in range(0, len(calibration), batch_size)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(batches)

        def get_next(self):
            x = next(self.items, None)
            return None if x is None else {name: x}

    dst = Path(dst)
    with atomic_path(dst) as tmp, tempfile.TemporaryDirectory(prefix="simattn_qdq_") as work:
        plain = Path(work) / "fp32.onnx"
        onnx.save(proto, str(plain))
        with quiet_loggers(""):
            # u8 activations with s8 weights: the pairing onnxruntime's x86 int8 kernels (VNNI) are fastest at.
            # Weights in 7 bits (reduce_range): AVX2 without VNNI multiplies u8×s8 pairs into saturating int16
            # sums, so full-range weights gave other answers there (6 % of digits flipped on a Haswell) than on
            # a VNNI CPU; at 7 bits both give the same predictions.
            quantize_static(str(plain), str(tmp), Reader(), quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=list(QDQ_OP_TYPES), nodes_to_exclude=activation_products,
                            per_channel=True, reduce_range=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            # the int8 layers' outputs go on in float, and each quantized input gets its own
                            # Q/DQ pair, so the other readers of a tensor (SimA's norms, the residual) read float;
                            # a Conv's output is int8 too: onnxruntime fuses Q/DQ around a Conv into its int8
                            # kernel (QLinearConv) only with the output quantized (MatMul and Gemm have kernels
                            # with float outputs), as ExecuTorch's XNNPACK quantizer does for every conv
                            extra_options={"OpTypesToExcludeOutputQuantization": list(FLOAT_OUTPUT_OP_TYPES),
                                           "DedicatedQDQPair": True})
        _copy_metadata(proto, tmp)
    return dst


def quantize_dynamic_int8(src: str | Path, dst: str | Path) -> Path:
    """Write an int8 dynamically quantized copy of the ONNX model ``src`` (weights int8, activations quantized at
    run time) to ``dst`` (atomically), with ``onnxruntime.quantization.quantize_dynamic``; ``src``'s simattn
    metadata is carried over."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(src))
    # The dynamo exporter records value_info for initializers too; the quantizer transposes Gemm weights into
    # MatMul ones and its shape inference then trips over the stale [out, in] shapes. Inference recomputes them.
    del proto.graph.value_info[:]
    dst = Path(dst)
    with atomic_path(dst) as tmp:
        with quiet_loggers(""):  # quantize_dynamic logs a pre-processing advice on the root logger for every call
            # 7-bit weights: the same answers on AVX2 (saturating u8×s8 sums) as on VNNI CPUs
            quantize_dynamic(proto, str(tmp), weight_type=QuantType.QInt8, reduce_range=True)
        _copy_metadata(proto, tmp)
    return dst


#: onnxruntime's int8 kernels that Q/DQ groups around MatMul, Gemm and Conv are fused into (CPU execution provider)
INT8_KERNELS = ("QLinearMatMul", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeMatMul", "QGemm",
                "QLinearConv", "ConvInteger")


def ort_delegation(path: str | Path) -> Dict[str, Any]:
    """What onnxruntime's CPU execution provider leaves of the int8 layers of the ONNX file ``path`` after its
    graph optimizations (``ORT_ENABLE_EXTENDED``, the level with the Q/DQ fusions and no machine-specific layout):
    ``{'delegates_to', 'fused': {int8 kernel: count}, 'not_delegated': {op: count}, 'qdq_left': n,
    'beyond_allowance', 'line'}``. ``not_delegated`` counts the MatMul/Gemm/Conv that still read a
    DequantizeLinear output, i.e. were meant to be int8 but run in float with their Q/DQ standing around them
    (``qdq_left`` of those); float ops elsewhere (SimA's norms, the residual adds) are float by design. A float
    file (no Q/DQ) runs every op in the CPU execution provider: nothing is left out."""
    import onnx
    import onnxruntime as ort

    where = "onnxruntime's CPU execution provider"
    proto = onnx.load(str(path), load_external_data=False)
    if not {n.op_type for n in proto.graph.node} & {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}:
        return {"delegates_to": where, "fused": {}, "not_delegated": {}, "qdq_left": 0, "beyond_allowance": {},
                "line": f"not delegated: nothing (a float graph: {where} runs every op)"}
    with tempfile.TemporaryDirectory(prefix="simattn_ortopt_") as work:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(Path(work) / "optimized.onnx")
        ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        nodes = list(onnx.load(opts.optimized_model_filepath).graph.node)
    made_by = {o: n for n in nodes for o in n.output}
    fused = Counter(n.op_type for n in nodes if n.op_type in INT8_KERNELS)
    unfused, qdq = Counter(), set()
    for node in nodes:
        if node.op_type not in QDQ_OP_TYPES:
            continue
        dq = [made_by[i] for i in node.input if i in made_by and made_by[i].op_type == "DequantizeLinear"]
        if dq:
            unfused[node.op_type] += 1
            qdq.update(d.name for d in dq)
            qdq.update(made_by[d.input[0]].name for d in dq
                       if d.input[0] in made_by and made_by[d.input[0]].op_type == "QuantizeLinear")
    kernels = ", ".join(f"{op} ×{n}" for op, n in sorted(fused.items())) or "none"
    if unfused:
        calls = sum(unfused.values())
        line = (f"not delegated: {calls} int8 linear op{'s' if calls != 1 else ''} left in float by onnxruntime, "
                f"{len(qdq)} QuantizeLinear/DequantizeLinear standing around them ("
                + ", ".join(f"{op} ×{n}" for op, n in sorted(unfused.items())) + f"); fused: {kernels}")
    else:
        line = f"not delegated: nothing, every int8 linear op fused into onnxruntime's int8 kernels ({kernels})"
    return {"delegates_to": where, "fused": dict(sorted(fused.items())), "not_delegated": dict(sorted(unfused.items())),
            "qdq_left": len(qdq), "beyond_allowance": dict(sorted(unfused.items())), "line": line}


#: onnxruntime op types that compute a matmul, GEMM or convolution (fp32, int8 and fused variants); the rest of the
#: node time (norms, softmax/SimA's normalization, elementwise, reshapes, (de)quantize) is ``non_linear_share``
ORT_LINEAR_OPS = frozenset({
    "MatMul", "Gemm", "FusedMatMul", "FusedGemm", "QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "QGemm",
    "DynamicQuantizeMatMul", "MatMulNBits", "QLinearConv", "Conv", "FusedConv", "ConvInteger", "NhwcFusedConv"})


def ort_profile(path: Union[str, Path], x: torch.Tensor, threads: Optional[int], calls: int = PROFILE_CALLS,
                work_dir: Optional[str] = None) -> Dict[str, Any]:
    """``non_linear_share`` of an ONNX file in onnxruntime: with ``SessionOptions.enable_profiling`` (a session of
    its own, same threads as the timed one, CPU provider), ``calls`` runs on ``x`` after one warm-up; of the summed
    node kernel time (the profile's ``Node`` events), the share in ops other than :data:`ORT_LINEAR_OPS`. Also
    ``profile_ops``: the five op types with the most node time, as ``op: share``."""
    import onnxruntime as ort

    opts = _session_options(threads, quiet=True)
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(work_dir or tempfile.gettempdir()) / "ort_profile")
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.detach().cpu().numpy()}
    session.run(None, feed)
    for _ in range(calls):
        session.run(None, feed)
    profile = Path(session.end_profiling())
    try:
        events = json.loads(profile.read_text())
    finally:
        profile.unlink(missing_ok=True)
    by_op: Dict[str, float] = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time") and "op_name" in args:
            by_op[args["op_name"]] = by_op.get(args["op_name"], 0.0) + float(e.get("dur", 0))
    total = sum(by_op.values())
    if not total:
        return {"profile_note": "onnxruntime's profile listed no node times"}
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:5]
    return {"non_linear_share": sum(t for op, t in by_op.items() if op not in ORT_LINEAR_OPS) / total,
            "profile_ops": ", ".join(f"{op} {t / total:.2f}" for op, t in top)}


class OnnxFormat(Format):
    name, runtime, suffixes, extra = "onnx", "onnxruntime", (".onnx",), "export"
    packages = ("onnx", "onnxruntime", "onnxscript")
    quantize_modes, quantizes = ("dynamic", "static"), "file"
    options = {
        "opset": Opt(18, "ONNX opset", low=18, check=check_opset),
        "exporter": Opt("auto", "torch.onnx exporter; auto = dynamo, falling back to TorchScript",
                        choices=list(EXPORTERS)),
        "batch": Opt(2, "example batch for export and parity (the other formats' programs take one image)",
                     low=2),
    }
    bench_options = ("exporter",)
    dynamic_size = True
    one_image = False
    description = "onnxruntime"
    delegates_to = "onnxruntime's int8 kernels"

    def profile(self, path, x: torch.Tensor, threads: Optional[int] = None, calls: int = PROFILE_CALLS,
                work_dir: Optional[str] = None) -> Dict[str, Any]:
        """:func:`ort_profile`."""
        return ort_profile(path, x, threads, calls, work_dir)

    def delegation(self, path, exported: Optional[Exported] = None) -> Optional[Dict[str, Any]]:
        """:func:`ort_delegation` of the written file."""
        return ort_delegation(path)

    def export(self, model: nn.Module, path, record: WeightsRecord, *, on_ops: OnOps = None, quantize=None,
               calibration=None, fixed_size: bool = False, verify: bool = True, real_inputs=None, atol: float = 1e-4,
               threads: Optional[int] = None, batch: int = 2, opset: int = 18, exporter: str = "auto",
               stride: int = 32, spatial_multiple: Optional[int] = None, **unused: Any) -> Exported:
        """:func:`export_and_verify` (``verify=False``: :func:`export_onnx` alone); int8 is made from the written
        file (:meth:`quantize`). ``fixed_size`` keeps height and width fixed (the batch stays dynamic);
        ``spatial_multiple`` makes dynamic ones multiples of it (a segmenter's output stride)."""
        if quantize:
            raise ValueError("ONNX int8 is made from the written fp32 file: OnnxFormat.quantize")
        if verify:
            result, parity = export_and_verify(model, path, record, real_inputs=real_inputs, batch=batch,
                                               opset=opset, exporter=exporter, dynamic_spatial=not fixed_size,
                                               stride=stride, atol=atol, threads=threads,
                                               spatial_multiple=spatial_multiple)
        else:
            result, parity = export_onnx(model, path, record, batch=batch, opset=opset, exporter=exporter,
                                         dynamic_spatial=not fixed_size, spatial_multiple=spatial_multiple), None
        audit = audit_onnx(path)
        if on_ops is not None:
            on_ops(audit)
        dynamic = "dynamic height/width" if result.dynamic_spatial else "fixed height/width"
        notes = [f"note: {n}" for n in result.notes] + [
            f"{result.exporter} exporter, {result.seconds:.1f} s; input {result.input_shape} (dynamic batch, "
            f"{dynamic})"]
        return Exported(Path(path), audit, parity, notes, info={"export": result.to_dict()},
                        options={"exporter": result.exporter, "fixed_size": not result.dynamic_spatial})

    def quantize(self, source, calibration, mode: str, *, dst=None, **unused: Any) -> Path:
        """The int8 copy of the written file ``source`` at ``dst``: ``'static'`` (QDQ, calibrated on
        ``calibration``) or ``'dynamic'``."""
        if mode == "static":
            return quantize_static_int8(source, dst, calibration)
        if mode == "dynamic":
            return quantize_dynamic_int8(source, dst)
        raise ValueError(f"quantization mode {mode!r}: expected static or dynamic")

    def open(self, path, threads: Optional[int] = None) -> Program:
        try:
            session = ort_session(path, threads, quiet=True)
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types for a broken graph
            raise ValueError(f"{path}: onnxruntime cannot load it ({first_line(e)})") from None
        dims = list(session.get_inputs()[0].shape)
        name = session.get_inputs()[0].name

        def bind(x: torch.Tensor):
            feed = {name: x.detach().cpu().numpy()}
            return lambda: session.run(None, feed)

        return Program(lambda x: torch.from_numpy(run_onnx(session, x)),
                       [d if isinstance(d, int) else None for d in dims[1:]], threads, bind)

    def read_metadata(self, path) -> WeightsRecord:
        return _read_record(path)

    def ops(self, source) -> GraphAudit:
        return audit_onnx(source)


FORMAT = OnnxFormat()
