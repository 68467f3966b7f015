"""The one way a model becomes a checked deployed file, for every format of the registry: export (with the weights'
record in the file), int8 (from the written file or from the model, as the format makes it, calibrated on the
images given), parity with PyTorch in the file's runtime, and the file opened for use. ``simattn export`` and
``simattn bench model`` both run :func:`deploy_model`; they differ only in what they pass."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch
from torch import nn

from ..models.weights import WeightsRecord
from .base import Exported, ExportError, Format, OnOps, Program, check_threads, first_line

__all__ = ["Deployment", "deploy_model", "parity", "compare_outputs", "Inputs"]

#: named input batches, or a function that makes them (called only when a check needs them)
Inputs = Union[Mapping[str, torch.Tensor], Callable[[], Mapping[str, torch.Tensor]]]
Checks = Dict[str, Dict[str, Any]]


@dataclass
class Deployment:
    """What :func:`deploy_model` wrote and measured.

    ``path``: the deployed file (the int8 one when int8 was asked for); ``float_path``: the float file that int8 was
    made from (formats that quantize the written file), else None; ``exported``: what the format's export returned
    for the file it wrote; ``parity``: the written file against the model, per input (None when no check ran:
    none asked for, or a format that does not run here); ``int8_parity``: the int8 file made from the written one,
    reported, not judged; ``program``: ``path`` opened at the threads asked for (None unless asked)."""

    path: Path
    exported: Exported
    quantize: Optional[str] = None
    float_path: Optional[Path] = None
    parity: Optional[Checks] = None
    int8_parity: Optional[Checks] = None
    program: Optional[Program] = None

    @property
    def checks(self) -> Optional[Checks]:
        """The parity of the deployed file at ``path`` (the int8 one's where int8 was made from the written file)."""
        return self.int8_parity if self.int8_parity is not None else self.parity

    @property
    def max_abs_diff(self) -> Optional[float]:
        """The largest |runtime - PyTorch| of :attr:`checks` (None without checks)."""
        return max(r.get("max_abs_diff", float("inf")) for r in self.checks.values()) if self.checks else None


def compare_outputs(ref: torch.Tensor, out: torch.Tensor) -> Dict[str, float]:
    """Max |difference|, cosine similarity and argmax agreement (%) of two (N, classes) outputs, or of two
    (N, classes, H, W) segmentation logits (the class argmax per pixel)."""
    ref, out = ref.float(), out.float()
    dim = 1 if ref.dim() == 4 else -1
    return {"max_abs_diff": float((ref - out).abs().max()),
            "cosine": float(torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0)),
            "argmax_agreement": float((ref.argmax(dim) == out.argmax(dim)).float().mean() * 100)}


def _first(out: Any) -> torch.Tensor:
    while not isinstance(out, torch.Tensor):
        out = out[0]
    return out


def parity(fmt: Format, path: Path, model: nn.Module, inputs: Mapping[str, torch.Tensor], atol: Optional[float],
           threads: Optional[int], quantized: bool, program: Optional[Program] = None) -> Checks:
    """The file run in its runtime (``program``, or the file opened at ``threads``) against ``model`` on each
    input: ``ok`` when within ``atol`` (relative to the outputs' scale, ``max(1, max |logit|)``, for formats whose
    runtime sums in another order); int8 files (``quantized``) and ``atol=None`` are reported, not judged."""
    program = program if program is not None else fmt.open(path, threads)
    results: Checks = {}
    for name, x in inputs.items():
        entry: Dict[str, Any] = {"shape": list(x.shape)}
        with torch.no_grad():
            ref = _first(model(x))
        try:
            with torch.no_grad():
                out = program(x)
        except Exception as e:  # runtimes raise their own types for inputs they cannot take
            entry.update(ok=False, error=first_line(e))
        else:
            entry.update(compare_outputs(ref, out) if out.shape == ref.shape else {"max_abs_diff": float("inf")})
            bound = None if atol is None else atol * max(1.0, float(ref.abs().max())) if fmt.relative_atol else atol
            entry["ok"] = bool(quantized or bound is None or entry["max_abs_diff"] <= bound)
        results[name] = entry
    return results


def deploy_model(fmt: Union[str, Format], model: nn.Module, record: WeightsRecord, path: Union[str, Path], *,
                 quantize: Optional[str] = None, calibration: Optional[torch.Tensor] = None,
                 options: Optional[Mapping[str, Any]] = None, fixed_size: bool = True,
                 parity_inputs: Optional[Inputs] = None, atol: Optional[float] = 1e-4, threads: Optional[int] = None,
                 open_program: bool = False, on_ops: OnOps = None,
                 on_checked: Optional[Callable[[Deployment], None]] = None,
                 progress: Optional[Callable[[str], None]] = None, shown: Optional[Union[str, Path]] = None,
                 **export_kwargs: Any) -> Deployment:
    """Write ``model`` (eval mode) as a ``fmt`` file at ``path`` with ``record`` in it, check it, and return what
    was done (:class:`Deployment`).

    - ``quantize`` (one of the format's ``quantize_modes``) makes the file int8, with ``calibration`` (preprocessed
      images) for ``'static'``. A format that quantizes the written file (``quantizes='file'``) first writes the
      float file in the ``fp32/`` folder beside ``path``; ``path``'s folder is the work folder.
    - ``options``: the format's own options (:meth:`~.base.Format.option_values`); ``fixed_size`` asks for one input
      size where the format could keep height and width dynamic; ``export_kwargs`` go to the format's export too
      (ONNX: ``verify``, ``real_inputs``, ``stride``, ``spatial_multiple``).
    - ``parity_inputs`` (named batches, or a function making them): the written file is run in its runtime at
      ``threads`` against ``model`` on them, unless the format checked it itself or does not run here; any input
      beyond ``atol`` (None: measured, not judged) raises :class:`~.base.ExportError` with the checks, before int8
      is made from the file. The int8 file made from it is checked on the same inputs, reported, not judged.
    - ``open_program``: the deployed file opened at ``threads`` (:attr:`Deployment.program`).
    - ``on_ops`` gets the graph's audit before the file is written; ``on_checked`` the :class:`Deployment` once
      the written file passed its checks (before int8 is made from it); ``progress`` a line before each long step,
      naming the file as ``shown`` (default ``path``).
    """
    from . import get

    fmt = get(fmt) if isinstance(fmt, str) else fmt
    if quantize is not None and quantize not in fmt.quantize_modes:
        raise ValueError(f"int8 {quantize!r} is not available for {fmt.name}; it has "
                         f"{', '.join(fmt.quantize_modes) or 'no int8 mode'}")
    check_threads(threads)
    say = progress or (lambda line: None)
    path = Path(path)
    shown = shown or path
    from_file = bool(quantize) and fmt.quantizes == "file"
    written = path.parent / "fp32" / path.name if from_file else path
    written.parent.mkdir(parents=True, exist_ok=True)
    say(f"exporting to {'a temporary fp32 file' if from_file else shown} ({fmt.description or fmt.runtime}"
        f"{', int8 ' + quantize if quantize and not from_file else ''}) ...")
    if atol is not None:  # the bound of the checks a format runs itself
        export_kwargs["atol"] = atol
    exported = fmt.export(model, written, record, on_ops=on_ops, quantize=None if from_file else quantize,
                          calibration=calibration, fixed_size=fixed_size, threads=threads,
                          **export_kwargs, **dict(options or {}))
    done = Deployment(path, exported, quantize, written if from_file else None)
    inputs: Optional[Mapping[str, torch.Tensor]] = None
    if parity_inputs is not None and fmt.runs_here:
        if exported.parity is None or from_file:
            inputs = parity_inputs() if callable(parity_inputs) else parity_inputs
        if exported.parity is None and open_program and not from_file:  # the deployed file: opened once
            done.program = fmt.open(written, threads)
        done.parity = dict(exported.parity) if exported.parity is not None else \
            parity(fmt, written, model, inputs, atol, threads, bool(quantize) and not from_file, done.program)
        failed = {name: r for name, r in done.parity.items() if not r["ok"]}
        if failed and atol is None:  # only measured: what failed is an input the runtime could not run
            name, entry = next(iter(failed.items()))
            raise ExportError(f"{fmt.runtime} could not run {shown} on {name}: {entry.get('error')}", exported,
                              done.parity)
        if failed:
            scale = " (relative to the logits scale)" if fmt.relative_atol else ""
            raise ExportError(f"{fmt.runtime} output differs from PyTorch beyond {atol:g}{scale}; {shown} not "
                              "written", exported, done.parity)
    if on_checked is not None:
        on_checked(done)
    if from_file:
        say(f"int8 {quantize} quantization (matmul-type layers{', per-channel' if quantize == 'static' else ''}) to "
            f"{shown} ...")
        fmt.quantize(written, calibration, quantize, dst=path)
    if open_program and done.program is None:
        done.program = fmt.open(path, threads)
    if from_file and inputs is not None:
        done.int8_parity = parity(fmt, path, model, inputs, atol, threads, True, done.program)
    return done
