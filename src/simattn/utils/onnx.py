"""Export a model to ONNX and prove the file computes what the PyTorch model computes.

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

import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..utils.io import atomic_path

__all__ = ["EXPORTERS", "ExportError", "ExportResult", "export_onnx", "ort_session", "run_onnx", "check_parity",
           "export_and_verify"]

EXPORTERS = ("auto", "dynamo", "torchscript")
INPUT_NAME = "input"


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


def export_onnx(model: nn.Module, path: str | Path, input_size: Sequence[int], *, batch: int = 2, opset: int = 18,
                exporter: str = "auto", dynamic_spatial: bool = True) -> ExportResult:
    """Write ``model`` (eval mode) to ``path`` as ONNX with a dynamic batch axis (and dynamic H/W if asked and the
    model allows). The file is written atomically. Raises :class:`ExportError` naming the failing exporter(s)."""
    import onnx

    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    if opset < 18:
        raise ValueError(f"opset must be >= 18, got {opset}")
    if batch < 2:
        raise ValueError(f"example batch must be >= 2 (a batch of 1 would be specialized), got {batch}")
    path = Path(path)
    model = model.eval()
    example = torch.randn(batch, *input_size)
    output_names = _output_names(model, example)
    notes: List[str] = []
    for name in (("dynamo", "torchscript") if exporter == "auto" else (exporter,)):
        start = time.perf_counter()
        try:
            with atomic_path(path) as tmp, torch.no_grad(), quiet_loggers("onnxscript"):
                _EXPORT_FNS[name](model, example, tmp, opset, output_names, dynamic_spatial)
        except Exception as e:  # exporters raise many types; keep the first line for the report
            notes.append(f"{name} exporter failed: {_first_line(e)}")
            continue
        proto = onnx.load(str(path), load_external_data=False)
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


def export_and_verify(model: nn.Module, path: str | Path, input_size: Sequence[int], *,
                      real_inputs: Optional[Mapping[str, torch.Tensor]] = None, batch: int = 2, opset: int = 18,
                      exporter: str = "auto", dynamic_spatial: bool = True, stride: int = 32,
                      atol: float = 1e-4) -> Tuple[ExportResult, Dict[str, Dict[str, object]]]:
    """Export, then compare onnxruntime with PyTorch on random inputs at ``batch`` and ``batch + 1`` (dynamic
    batch), at a second resolution (``input_size`` + ``stride``) when the graph has dynamic H/W, and on
    ``real_inputs``. If the second resolution fails, the model is re-exported at a fixed resolution.

    Returns (export result, parity per input). Raises :class:`ExportError` when any parity check fails.
    """
    c, h, w = input_size
    generator = torch.Generator().manual_seed(0)
    fixed = {f"random_b{batch}_{h}x{w}": torch.randn(batch, c, h, w, generator=generator),
             f"random_b{batch + 1}_{h}x{w}": torch.randn(batch + 1, c, h, w, generator=generator)}
    fixed.update(real_inputs or {})
    alt = {f"random_b1_{h + stride}x{w + stride}": torch.randn(1, c, h + stride, w + stride, generator=generator)}

    result = export_onnx(model, path, input_size, batch=batch, opset=opset, exporter=exporter,
                         dynamic_spatial=dynamic_spatial)
    checks = {**fixed, **alt} if result.dynamic_spatial else fixed
    parity = check_parity(model, ort_session(path, quiet=True), checks, atol)
    if result.dynamic_spatial and not all(parity[k]["ok"] for k in alt):
        why = next(parity[k].get("error") or f"max abs diff {parity[k]['max_abs_diff']:.3g}" for k in alt)
        notes = result.notes + [f"dynamic height/width did not hold at {h + stride}x{w + stride} ({why}); "
                                "re-exported with a fixed resolution"]
        # keep the exporter that worked, so a dynamo failure is not retried
        result = export_onnx(model, path, input_size, batch=batch, opset=opset, exporter=result.exporter,
                             dynamic_spatial=False)
        result.notes = notes
        parity = check_parity(model, ort_session(path, quiet=True), fixed, atol)
    failed = {k: v for k, v in parity.items() if not v["ok"]}
    if failed:
        detail = "; ".join(f"{k}: {v.get('error') or 'max abs diff %.3g' % v['max_abs_diff']}"
                           for k, v in failed.items())
        raise ExportError(f"onnxruntime output differs from PyTorch beyond {atol:g} for {path}: {detail}",
                          result, parity)
    return result, parity
