"""Core ML (``.mlpackage``, mlprogram): capture at one input size, convert, save; the metadata read back.

Core ML runs on macOS/iOS only, so files are written here but not run. ``coremltools`` (the ``edge`` extra) is
imported inside the functions that need it. Metadata: the weights' record (:mod:`simattn.models.weights`), each key
under ``simattn.<key>`` in ``user_defined_metadata`` (shared with coremltools' own entries).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from ..models.weights import WeightsRecord, read_deployed_record
from ..utils.recipe import Opt, maybe
from .base import Exported, Format, OnOps, capture_fixed, kept_interrupts
from .ops import GraphAudit, aten_op_counts

__all__ = ["FORMAT", "CoreMLFormat", "COREML_KEY_PREFIX", "PRECISIONS", "coreml_ready", "convert_coreml",
           "save_coreml"]

COREML_KEY_PREFIX = "simattn."
PRECISIONS = ("fp32", "fp16")


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


def convert_coreml(program, record: WeightsRecord, precision: str = "fp32"):
    """An mlprogram ``MLModel`` from an exported program, with ``record`` in ``user_defined_metadata``.

    ``precision``: compute precision, ``fp32`` or ``fp16`` (Core ML's own default), recorded in the record's extra
    entries."""
    if precision not in PRECISIONS:
        raise ValueError(f"Core ML precision {precision!r}: expected fp32 or fp16")
    # coremltools imports its optional dependencies under bare ``except:`` clauses, which would swallow a Ctrl-C;
    # one pressed during the (slow) first import stops the export as soon as it is done, before the conversion
    with kept_interrupts(), _quiet_coremltools():
        import coremltools as ct
    with kept_interrupts(), _quiet_coremltools():
        compute = ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16
        mlmodel = ct.convert(coreml_ready(program), convert_to="mlprogram", compute_precision=compute)
    record = replace(record, extra={**record.extra, "precision": precision})
    for key, value in record.to_metadata().items():
        mlmodel.user_defined_metadata[COREML_KEY_PREFIX + key] = value
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


class CoreMLFormat(Format):
    name, runtime, suffixes, extra = "coreml", "coreml", (".mlpackage",), "edge"
    packages = ("coremltools",)
    options = {"precision": Opt(None, "compute precision (default fp32; Core ML's own default is fp16)",
                                type=maybe(str), choices=list(PRECISIONS))}
    folder = True
    runs_here = False
    not_here = "Core ML runs on macOS/iOS only"
    description = "mlprogram"

    def export(self, model: nn.Module, path, record: WeightsRecord, *, on_ops: OnOps = None, quantize=None,
               calibration=None, fixed_size: bool = True, precision: Optional[str] = None,
               **unused: Any) -> Exported:
        """Capture at ``record.input_size`` (the model laid out for that size first, in place), audit, convert
        (``precision`` compute, default fp32) and save the package at ``path`` (a folder that must not exist
        yet)."""
        precision = precision or "fp32"
        if quantize:
            self.quantize(model, calibration, quantize)
        model, program = capture_fixed(model, record.input_size)
        audit = self.ops(program)
        if on_ops is not None:
            on_ops(audit)
        save_coreml(convert_coreml(program, record, precision), path)
        return Exported(Path(path), audit, None, [f"{precision} compute"], info={"precision": precision})

    def read_metadata(self, path) -> WeightsRecord:
        """The record of an ``.mlpackage`` (read without loading the model, which needs macOS)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"Core ML package not found: {path}")
        with _quiet_coremltools():
            import coremltools as ct

            props = dict(ct.models.MLModel(str(path), skip_model_load=True).user_defined_metadata)
        meta = {k[len(COREML_KEY_PREFIX):]: v for k, v in props.items() if k.startswith(COREML_KEY_PREFIX)}
        return read_deployed_record(meta, str(path))

    def ops(self, source) -> GraphAudit:
        """ATen ops of the captured program that is converted."""
        if isinstance(source, (str, Path)):
            raise ValueError(f"{source}: audit the captured program (simattn export prints it)")
        return GraphAudit(aten_op_counts(source), kind="ATen")


FORMAT = CoreMLFormat()
