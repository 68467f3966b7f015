"""Deployment: ONNX export with onnxruntime parity checks, ExecuTorch and Core ML export (:mod:`.edge`, core in
:mod:`simattn.utils.edge`), an exp-op graph audit, latency and int8 quantization (dynamic, or static calibrated on
real images).

onnx/onnxruntime (the ``export`` extra) and executorch/coremltools (the ``edge`` extra) are imported inside the
functions that need them, so importing this package stays cheap.
"""
from .audit import EXP_LIKE_OPS, ExpFreeError, GraphAudit, audit_onnx
from .architecture import attention_kind, model_stride, softmax_twin
from ..utils.onnx import (ExportError, ExportResult, check_parity, export_and_verify, export_onnx, onnx_metadata,
                          ort_session, read_onnx_metadata)

__all__ = [
    "EXP_LIKE_OPS", "ExpFreeError", "GraphAudit", "audit_onnx",
    "attention_kind", "model_stride", "softmax_twin",
    "ExportError", "ExportResult", "check_parity", "export_and_verify", "export_onnx", "onnx_metadata", "ort_session",
    "read_onnx_metadata",
]
