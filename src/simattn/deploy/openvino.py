"""OpenVINO (IR: ``.xml`` with its ``.bin`` beside it, CPU plugin): convert, save in fp32, run at a fixed thread
count in fp32, read the metadata and the ops back.

``openvino`` (the ``openvino`` extra) is imported inside the functions that need it. Metadata: the weights' record
(:mod:`simattn.models.weights`), each key under ``simattn`` in the model's ``rt_info``.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, List, Optional

import torch
from torch import nn

from ..models.weights import WeightsRecord, read_deployed_record
from .base import Exported, Format, OnOps, Program, first_line
from .ops import GraphAudit

__all__ = ["FORMAT", "OpenVINOFormat", "RT_INFO_KEY"]

RT_INFO_KEY = "simattn"


def _read(path):
    import openvino as ov

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"OpenVINO file not found: {path}")
    try:
        return ov.Core().read_model(str(path))
    except RuntimeError as e:
        raise ValueError(f"{path} is not a readable OpenVINO model ({first_line(e)})") from None


class OpenVINOFormat(Format):
    name, runtime, suffixes, extra = "openvino", "openvino", (".xml",), "openvino"
    packages = ("openvino",)
    description = "IR, CPU plugin, fp32"

    def export(self, model: nn.Module, path, record: WeightsRecord, *, on_ops: OnOps = None, quantize=None,
               calibration=None, fixed_size: bool = True, **unused: Any) -> Exported:
        """``openvino.convert_model`` of the eager model at ``record.input_size`` (batch 1), saved in fp32 (not
        the fp16 weights ``save_model`` writes by default) as ``path`` and the ``.bin`` beside it."""
        import openvino as ov

        if quantize:
            self.quantize(model, calibration, quantize)
        size = list(record.input_size)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript tracer's deprecation and shape-check warnings
            converted = ov.convert_model(model.eval(), example_input=torch.randn(1, *size))
        converted.reshape([1, *size])
        audit = self.ops(converted)
        if on_ops is not None:
            on_ops(audit)
        for key, value in record.to_metadata().items():
            converted.set_rt_info(value, [RT_INFO_KEY, key])
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ov.save_model(converted, str(path), compress_to_fp16=False)
        return Exported(path, audit)

    def files(self, path) -> List[Path]:
        return [Path(path), Path(path).with_suffix(".bin")]

    def open(self, path, threads: Optional[int] = None) -> Program:
        """Compiled for the CPU in fp32 (the plugin would pick bf16 on CPUs with AMX/AVX-512 bf16), at ``threads``
        inference threads; a batch runs one image at a time, as the program takes batch 1."""
        import openvino as ov

        model = _read(path)
        config = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        compiled = ov.Core().compile_model(model, "CPU", config)
        request = compiled.create_infer_request()
        shape = [d.get_length() if d.is_static else None for d in model.inputs[0].get_partial_shape()]

        def run(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([torch.from_numpy(request.infer([x[i:i + 1].numpy()])[0].copy())
                              for i in range(len(x))])

        return Program(run, shape[1:], int(compiled.get_property("INFERENCE_NUM_THREADS")))

    def read_metadata(self, path) -> WeightsRecord:
        model = _read(path)
        meta = {}
        if model.has_rt_info([RT_INFO_KEY]):
            entries = model.get_rt_info([RT_INFO_KEY]).astype(dict)
            meta = {str(k): v.astype(str) if hasattr(v, "astype") else str(v) for k, v in entries.items()}
        return read_deployed_record(meta, str(path))

    def ops(self, source) -> GraphAudit:
        """OpenVINO op types of a written ``.xml`` or a converted ``openvino.Model`` (parameters, constants and
        results left out)."""
        model = _read(source) if isinstance(source, (str, Path)) else source
        counts: dict = {}
        for op in model.get_ordered_ops():
            kind = op.get_type_name()
            if kind not in ("Parameter", "Constant", "Result"):
                counts[kind] = counts.get(kind, 0) + 1
        return GraphAudit(dict(sorted(counts.items())), kind="OpenVINO")


FORMAT = OpenVINOFormat()
