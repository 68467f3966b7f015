"""Export a model to ONNX, describe it in the file, and prove the file computes what the PyTorch model computes.

The one ONNX core of ``simattn export`` and ``simattn bench model --runtime onnxruntime``.

Metadata: every file written here carries, in its ``metadata_props``, what a consumer needs to feed it
(:data:`METADATA_KEYS`): the model name and kwargs, the attention kind, the input size, the normalization mean and
std, and the simattn version that produced it. :func:`read_onnx_metadata` reads them back (a one-line ValueError
when they are missing or malformed), and the parity and latency checks take the input size and mean/std from the
file rather than from the caller.

Exporter choice: ``torch.onnx.export(dynamo=True)`` (torch.export) is the default because it records shape
arithmetic symbolically, so a ViT whose position embedding is resampled for the input size stays correct at
every input size. The legacy TorchScript tracer replays Python control flow with the example's sizes frozen in
(timm's position-embedding resampling becomes a fixed-size add, which fails at any other resolution), but it is
~10× faster and handles some code torch.export rejects; ``exporter='auto'`` falls back to it when the dynamo
export fails. Whatever exporter runs, the file is verified with onnxruntime at a second batch size and, when the
graph claims dynamic height/width, at a second resolution; a graph that fails there is re-exported with a fixed
resolution (recorded in the notes) rather than shipped broken.
"""
from __future__ import annotations

import json
import logging
import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from ..utils.io import atomic_path

__all__ = ["EXPORTERS", "METADATA_KEYS", "OPTIONAL_METADATA_KEYS", "check_metadata_values", "ExportError",
           "ExportResult", "onnx_metadata", "load_onnx", "read_onnx_metadata",
           "metadata_data_config", "export_onnx", "ort_session", "run_onnx", "check_parity", "export_and_verify",
           "quiet_loggers", "QDQ_OP_TYPES", "quantize_static_int8"]

EXPORTERS = ("auto", "dynamo", "torchscript")
INPUT_NAME = "input"
#: metadata_props keys of every exported file (values are JSON text) and what each holds
METADATA_KEYS = {
    "model": "registered model name",
    "model_kwargs": "create_model kwargs the model was built with",
    "attention": "attention kind ('mixed' when the model uses several)",
    "input_size": "[channels, height, width] the file was exported and verified at",
    "mean": "per-channel mean subtracted from [0, 1] images",
    "std": "per-channel std the centred images are divided by",
    "simattn_version": "version of simattn that wrote the file",
}
#: keys written when the weights record them, read when present: the rest of the evaluation preprocessing
OPTIONAL_METADATA_KEYS = {
    "crop_pct": "center-crop ratio of the evaluation transform",
    "interpolation": "resize interpolation of the evaluation transform",
    "classes": "class names, in output order, of the data the weights were trained on",
}


class ExportError(RuntimeError):
    """The model could not be exported, or the exported file does not match the model (then ``result`` and
    ``parity`` hold what was written and measured, for the report)."""

    def __init__(self, message: str, result: Optional["ExportResult"] = None,
                 parity: Optional[Dict[str, Dict[str, object]]] = None) -> None:
        super().__init__(message)
        self.result, self.parity = result, parity


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


@contextmanager
def quiet_loggers(*names: str, level: int = logging.ERROR):
    """Raise the level of the named loggers ('' = root) for the duration: the exporter's graph optimizer and the
    quantizer log routine advice as warnings, which would drown the command's own output."""
    loggers = [logging.getLogger(name or None) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, levels):
            lg.setLevel(old)


def _simattn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simattn")
    except PackageNotFoundError:  # running from a source tree that is not installed
        from .. import __version__

        return __version__


def onnx_metadata(model: str, attention: Optional[str], data_config: Mapping[str, Any],
                  model_kwargs: Optional[Mapping[str, Any]] = None,
                  classes: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The :data:`METADATA_KEYS` values for a model exported at ``data_config['input_size']`` (and ``classes``,
    the class names the weights record, when given)."""
    meta = {"model": model, "model_kwargs": dict(model_kwargs or {}), "attention": attention or "mixed",
            "input_size": [int(v) for v in data_config["input_size"]],
            "mean": [float(v) for v in data_config["mean"]], "std": [float(v) for v in data_config["std"]],
            "simattn_version": _simattn_version()}
    if data_config.get("crop_pct") is not None:
        meta["crop_pct"] = float(data_config["crop_pct"])
    if data_config.get("interpolation"):
        meta["interpolation"] = str(data_config["interpolation"])
    if classes is not None:
        meta["classes"] = [str(c) for c in classes]
    return meta


def _check_metadata(metadata: Mapping[str, Any]) -> None:
    missing = [k for k in METADATA_KEYS if k not in metadata]
    if missing:
        raise ValueError(f"ONNX metadata lacks {', '.join(missing)} (build it with onnx_metadata)")
    check_metadata_values(metadata, what="ONNX metadata")


def _write_metadata(proto, metadata: Mapping[str, Any]) -> None:
    kept = [p for p in proto.metadata_props if p.key not in metadata]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value, default=str)


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
                         f"{_first_line(e)})") from None


def read_onnx_metadata(model: Union[str, Path, Any]) -> Dict[str, Any]:
    """The :data:`METADATA_KEYS` of an ONNX file (a path or an ``onnx.ModelProto``), JSON-decoded and checked:
    a ValueError names what is missing or malformed."""
    proto = load_onnx(model) if isinstance(model, (str, Path)) else model
    what = model if isinstance(model, (str, Path)) else "ONNX model"
    props = {p.key: p.value for p in proto.metadata_props}
    try:
        meta = {k: json.loads(props[k]) for k in (*METADATA_KEYS, *OPTIONAL_METADATA_KEYS) if k in props}
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: malformed simattn metadata ({e})") from None
    return check_metadata_values(meta, what=str(what))


def check_metadata_values(meta: Mapping[str, Any], what: str = "metadata") -> Dict[str, Any]:
    """``meta`` (decoded :data:`METADATA_KEYS`, plus any :data:`OPTIONAL_METADATA_KEYS`) checked: a one-line
    ValueError names what is missing or malformed. Shared by every format's reader."""
    missing = [k for k in METADATA_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{what} lacks simattn metadata ({', '.join(missing)}); export it with `simattn export`")
    from .recipe import INTERPOLATIONS

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def shown(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 200 else text[:200] + "..."

    size, mean, std = meta["input_size"], meta["mean"], meta["std"]
    if not (isinstance(size, (list, tuple)) and len(size) == 3 and
            all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        raise ValueError(f"{what}: metadata input_size {shown(size)} is not [channels, height, width]")
    for name, values in (("mean", mean), ("std", std)):
        if not (isinstance(values, (list, tuple)) and len(values) == size[0] and all(number(v) for v in values)):
            raise ValueError(f"{what}: metadata {name} {shown(values)} is not {size[0]} finite numbers (one per "
                             "channel)")
    if any(v <= 0 for v in std):
        raise ValueError(f"{what}: metadata std {shown(std)} has a value <= 0")
    for key in ("model", "attention"):
        if not isinstance(meta[key], str) or not meta[key]:
            raise ValueError(f"{what}: metadata {key} {shown(meta[key])} is not a name")
    if not isinstance(meta["model_kwargs"], dict):
        raise ValueError(f"{what}: metadata model_kwargs {shown(meta['model_kwargs'])} is not a mapping")
    crop = meta.get("crop_pct")
    if crop is not None and not (number(crop) and 0 < crop <= 1):
        raise ValueError(f"{what}: metadata crop_pct {shown(crop)} is not a number in (0, 1]")
    interpolations = [i for i in INTERPOLATIONS if i != "random"]
    interpolation = meta.get("interpolation")
    if interpolation is not None and interpolation not in interpolations:
        raise ValueError(f"{what}: metadata interpolation {shown(interpolation)} is not one of "
                         f"{', '.join(interpolations)}")
    classes = meta.get("classes")
    if classes is not None and not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{what}: metadata classes {shown(classes)} is not a list of class names")
    return {k: meta[k] for k in (*METADATA_KEYS, *OPTIONAL_METADATA_KEYS) if k in meta}


def metadata_data_config(meta: Mapping[str, Any]) -> Dict[str, Any]:
    """The preprocessing part of :func:`read_onnx_metadata`'s result: ``input_size``, ``mean``, ``std``."""
    config = {"input_size": tuple(meta["input_size"]), "mean": tuple(meta["mean"]), "std": tuple(meta["std"])}
    config.update({k: meta[k] for k in OPTIONAL_METADATA_KEYS if k in meta})
    return config


def _output_names(model: nn.Module, example: torch.Tensor) -> List[str]:
    with torch.no_grad():
        out = model(example)
    return ["logits"] if isinstance(out, torch.Tensor) else [f"output{i}" for i in range(len(out))]


def _export_dynamo(model, example, path, opset, output_names, dynamic_spatial):
    dim = torch.export.Dim
    # Batch must stay symbolic (an error otherwise); height/width stay symbolic where the model allows (AUTO lets
    # torch.export specialize them instead of failing; the written input shape tells which happened).
    dims = {0: dim.DYNAMIC, 2: dim.AUTO, 3: dim.AUTO} if dynamic_spatial else {0: dim.DYNAMIC}
    program = torch.onnx.export(model, (example,), dynamo=True, dynamic_shapes=(dims,), opset_version=opset,
                                input_names=[INPUT_NAME], output_names=output_names, external_data=False,
                                verbose=False)
    program.save(str(path), external_data=False)


def _export_torchscript(model, example, path, opset, output_names, dynamic_spatial):
    axes = {0: "batch", 2: "height", 3: "width"} if dynamic_spatial else {0: "batch"}
    dynamic_axes = {INPUT_NAME: axes, **{name: {0: "batch"} for name in output_names}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python-side shape checks are expected
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=True)


_EXPORT_FNS = {"dynamo": _export_dynamo, "torchscript": _export_torchscript}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def export_onnx(model: nn.Module, path: str | Path, metadata: Mapping[str, Any], *, batch: int = 2, opset: int = 18,
                exporter: str = "auto", dynamic_spatial: bool = True) -> ExportResult:
    """Write ``model`` (eval mode) to ``path`` as ONNX with a dynamic batch axis (and dynamic H/W if asked and the
    model allows), exported at ``metadata['input_size']`` and carrying ``metadata`` (:func:`onnx_metadata`) in its
    ``metadata_props``. The file is written atomically. Raises :class:`ExportError` naming the failing
    exporter(s)."""
    import onnx

    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    if opset < 18:
        raise ValueError(f"opset must be >= 18, got {opset}")
    if batch < 2:
        raise ValueError(f"example batch must be >= 2 (a batch of 1 would be specialized), got {batch}")
    _check_metadata(metadata)
    path = Path(path)
    model = model.eval()
    example = torch.randn(batch, *metadata["input_size"])
    output_names = _output_names(model, example)
    notes: List[str] = []
    for name in (("dynamo", "torchscript") if exporter == "auto" else (exporter,)):
        start = time.perf_counter()
        try:
            with atomic_path(path) as tmp:
                with torch.no_grad(), quiet_loggers("onnxscript"):
                    _EXPORT_FNS[name](model, example, tmp, opset, output_names, dynamic_spatial)
                proto = onnx.load(str(tmp), load_external_data=False)
                _write_metadata(proto, metadata)
                onnx.save(proto, str(tmp))
        except Exception as e:  # exporters raise many types; keep the first line for the report
            notes.append(f"{name} exporter failed: {_first_line(e)}")
            continue
        dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
        result = ExportResult(
            path=str(path), exporter=name, opset=opset, input_shape=dims,
            output_names=[o.name for o in proto.graph.output],
            dynamic_batch=isinstance(dims[0], str), dynamic_spatial=all(isinstance(d, str) for d in dims[2:]),
            seconds=round(time.perf_counter() - start, 2), notes=notes)
        if not result.dynamic_batch:
            raise ExportError(f"{name} exporter produced a fixed batch size ({dims}) for {path}")
        return result
    raise ExportError(f"could not export {type(model).__name__} to ONNX: " + "; ".join(notes))


def ort_session(path: str | Path, threads: Optional[int] = None, quiet: bool = False):
    """An onnxruntime CPU session; ``threads`` fixes intra-op threads (None = onnxruntime's default); ``quiet``
    silences onnxruntime's own error log (for probing runs whose errors the caller reports itself)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if quiet:
        opts.log_severity_level = 4  # fatal only
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


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
            entry.update(ok=False, error=_first_line(e))
        else:
            diff = float(np.abs(out - ref).max()) if out.shape == ref.shape else float("inf")
            entry.update(ok=bool(diff <= atol), max_abs_diff=diff)
        results[name] = entry
    return results


RealInputs = Callable[[Mapping[str, Any]], Mapping[str, torch.Tensor]]


def export_and_verify(model: nn.Module, path: str | Path, metadata: Mapping[str, Any], *,
                      real_inputs: Optional[RealInputs] = None, batch: int = 2, opset: int = 18,
                      exporter: str = "auto", dynamic_spatial: bool = True, stride: int = 32,
                      atol: float = 1e-4, threads: Optional[int] = None
                      ) -> Tuple[ExportResult, Dict[str, Dict[str, object]]]:
    """Export (:func:`export_onnx`), then compare onnxruntime with PyTorch on random inputs at ``batch`` and
    ``batch + 1`` (dynamic batch), at a second resolution (input size + ``stride``) when the graph has dynamic H/W,
    and on ``real_inputs(data_config)``. The input size and the data config (mean/std) are read back from the
    written file, so the checks feed the file what its metadata promises. If the second resolution fails, the
    model is re-exported at a fixed resolution.

    onnxruntime runs at ``threads`` intra-op threads (None: its default).

    Returns (export result, parity per input). Raises :class:`ExportError` when any parity check fails.
    """
    result = export_onnx(model, path, metadata, batch=batch, opset=opset, exporter=exporter,
                         dynamic_spatial=dynamic_spatial)
    data_config = metadata_data_config(read_onnx_metadata(path))
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
        result = export_onnx(model, path, metadata, batch=batch, opset=opset, exporter=result.exporter,
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


#: the matmul-type ONNX ops static QDQ quantizes; adds, norms and SimA's normalization between them stay float
QDQ_OP_TYPES = ("MatMul", "Gemm", "Conv")


def quantize_static_int8(src: str | Path, dst: str | Path, calibration: torch.Tensor, batch_size: int = 16) -> Path:
    """Write a static int8 copy of the ONNX model ``src`` to ``dst`` (atomically): QDQ format, per-channel int8
    weights, activation scales calibrated (min-max) on ``calibration`` (preprocessed images), only
    :data:`QDQ_OP_TYPES` quantized; ``src``'s simattn metadata is carried over."""
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    proto = onnx.load(str(src))
    del proto.graph.value_info[:]  # stale initializer shapes from the dynamo exporter (see export.quantize_int8)
    name = proto.graph.input[0].name
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
                            op_types_to_quantize=list(QDQ_OP_TYPES), per_channel=True, reduce_range=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            # the int8 layers' outputs go on in float, and each quantized input gets its own
                            # Q/DQ pair, so the other readers of a tensor (SimA's norms, the residual) read float
                            extra_options={"OpTypesToExcludeOutputQuantization": list(QDQ_OP_TYPES),
                                           "DedicatedQDQPair": True})
        quantized = onnx.load(str(tmp))
        keys = {p.key for p in quantized.metadata_props}
        quantized.metadata_props.extend(p for p in proto.metadata_props if p.key not in keys)
        onnx.save(quantized, str(tmp))
    return dst
