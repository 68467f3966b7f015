"""TFLite (``.tflite``, run in LiteRT): capture at one input size, convert with ``litert_torch``, store the record in
the flatbuffer, run it in the LiteRT interpreter (XNNPACK) at a fixed thread count, audit the file's own ops.

``litert_torch`` and ``ai_edge_litert`` (the ``tflite`` extra) are imported inside the functions that need them.
Metadata: the weights' record (:mod:`simattn.models.weights`) as JSON text in the model's ``metadata`` entry
:data:`METADATA_NAME` (a named buffer, which TFLite keeps for exactly this).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn

from ..models.weights import WeightsRecord, read_deployed_record
from ..utils.io import atomic_path
from .base import Exported, Format, OnOps, Program, capture_fixed, first_line, quiet_loggers, quiet_stderr
from .ops import GraphAudit

__all__ = ["FORMAT", "TFLiteFormat", "METADATA_NAME"]

METADATA_NAME = "simattn"


def _model_bytes(path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TFLite file not found: {path}")
    data = path.read_bytes()
    if data[4:8] != b"TFL3":  # the flatbuffer identifier of a TFLite model
        raise ValueError(f"{path} is not a TFLite model (no TFL3 identifier)")
    return data


def _with_metadata(buffer: bytes, text: str) -> bytes:
    """The model ``buffer`` with ``text`` in its :data:`METADATA_NAME` metadata entry (any old one replaced)."""
    import flatbuffers
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(buffer, 0)
    data = schema.BufferT()
    data.data = np.frombuffer(text.encode("utf-8"), np.uint8)
    model.buffers.append(data)
    entry = schema.MetadataT()
    entry.name, entry.buffer = METADATA_NAME, len(model.buffers) - 1
    kept = [m for m in (model.metadata or []) if m.name not in (METADATA_NAME, METADATA_NAME.encode())]
    model.metadata = kept + [entry]
    builder = flatbuffers.Builder(len(buffer) + len(text) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@contextmanager
def _no_progress():
    """litert_torch draws a progress tree on stdout unless its environment switch says otherwise."""
    key = "LITERT_TORCH_SHOW_PROGRESS"
    old = os.environ.get(key)
    os.environ[key] = "n"
    try:
        yield
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


def _root(data: bytes):
    from ai_edge_litert import schema_py_generated as schema

    return schema.Model.GetRootAs(data, 0)


class TFLiteFormat(Format):
    name, runtime, suffixes, extra = "tflite", "litert", (".tflite",), "tflite"
    packages = ("litert_torch", "ai_edge_litert")
    description = "LiteRT, XNNPACK"

    def export(self, model: nn.Module, path, record: WeightsRecord, *, on_ops: OnOps = None, quantize=None,
               calibration=None, fixed_size: bool = True, **unused: Any) -> Exported:
        """Capture at ``record.input_size`` (batch 1; the model laid out for that size first, in place), convert
        with ``litert_torch``, audit the converted model's ops, write ``path`` atomically with the record."""
        if quantize:
            self.quantize(model, calibration, quantize)
        model, _ = capture_fixed(model, record.input_size)
        with quiet_loggers("", "absl", "litert_torch"), quiet_stderr(), _no_progress():
            import litert_torch

            converted = litert_torch.convert(model, (torch.randn(1, *record.input_size),))
            buffer = _with_metadata(bytes(converted.model_content()), json.dumps(record.to_metadata()))
        audit = self._audit(buffer)
        if on_ops is not None:
            on_ops(audit)
        with atomic_path(path) as tmp:
            Path(tmp).write_bytes(buffer)
        return Exported(Path(path), audit)

    def open(self, path, threads: Optional[int] = None) -> Program:
        _model_bytes(path)
        with quiet_stderr():
            from ai_edge_litert.interpreter import Interpreter

            try:
                interpreter = Interpreter(model_path=str(path), num_threads=threads)
                interpreter.allocate_tensors()
            except (RuntimeError, ValueError) as e:
                raise ValueError(f"{path}: LiteRT cannot load it ({first_line(e)})") from None
        signature = next(iter(interpreter.get_signature_list()))
        runner = interpreter.get_signature_runner(signature)
        name = interpreter.get_signature_list()[signature]["inputs"][0]
        shape = [int(d) for d in interpreter.get_input_details()[0]["shape"]]
        if len(shape) != 4 or shape[0] != 1:
            raise ValueError(f"{path}: its program takes {'x'.join(map(str, shape))} inputs; simattn runs programs "
                             "of one image (batch 1), as `simattn export --format tflite` writes them")

        def one(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(next(iter(runner(**{name: x.contiguous().numpy()}).values())).copy())

        def run(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([one(x[i:i + 1]) for i in range(len(x))])

        return Program(run, shape[1:], threads)

    def read_metadata(self, path) -> WeightsRecord:
        root = _root(_model_bytes(path))
        for i in range(root.MetadataLength()):
            entry = root.Metadata(i)
            if entry.Name() in (METADATA_NAME, METADATA_NAME.encode()):
                text = bytes(root.Buffers(entry.Buffer()).DataAsNumpy()).decode("utf-8")
                try:
                    meta = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: malformed simattn metadata ({e})") from None
                return read_deployed_record(meta if isinstance(meta, dict) else {}, str(path))
        raise ValueError(f"{path} lacks simattn metadata (no {METADATA_NAME} entry); export it with "
                         "`simattn export --format tflite`")

    def _audit(self, data: bytes) -> GraphAudit:
        from ai_edge_litert import schema_py_generated as schema

        names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
        root = _root(data)
        codes = [root.OperatorCodes(i) for i in range(root.OperatorCodesLength())]
        counts: Dict[str, int] = {}
        for s in range(root.SubgraphsLength()):
            graph = root.Subgraphs(s)
            for o in range(graph.OperatorsLength()):
                code = codes[graph.Operators(o).OpcodeIndex()]
                op = code.CustomCode().decode() if code.CustomCode() else \
                    names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "UNKNOWN")
                counts[op] = counts.get(op, 0) + 1
        return GraphAudit(dict(sorted(counts.items())), kind="TFLite")

    def ops(self, source) -> GraphAudit:
        """TFLite operators (builtin names, custom ones by their code) of a written file, every subgraph."""
        return self._audit(_model_bytes(source))


FORMAT = TFLiteFormat()
