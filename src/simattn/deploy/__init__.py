"""Deployment formats: how a model becomes a file a runtime runs, and how such a file is run, read and audited.

This package owns every runtime simattn deploys to. One module per format implements :class:`~.base.Format`
(export with the weights' record in the file, int8, open as a callable, read the record back, list the ops for the
exp-free audit): :mod:`.onnx` (onnxruntime), :mod:`.executorch` (XNNPACK), :mod:`.coreml`, :mod:`.openvino`,
:mod:`.tflite` (LiteRT). The registry below maps format names, runtime names and file suffixes to them;
``simattn export``, ``simattn validate``, ``simattn bench model`` and :class:`DeployedModel` reach runtimes only
through it. :mod:`.ops` holds the one table of exp-like ops.

Adding a format: a module with a ``FORMAT`` object (a :class:`~.base.Format`), and its name in :data:`BUILTIN`.
Each format imports its runtime's packages only when used; a missing one is a one-line error naming the extra
(:meth:`~.base.Format.require`). Each declares the export options only it takes (``Format.options``); the commands
gather them here (:func:`format_options`, :func:`bench_options`). :func:`~.pipeline.deploy_model` is the one
sequence of export, int8, opening and parity that ``simattn export`` and ``simattn bench model`` run.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from ..models.sources import register_exported_records
from ..models.weights import WeightsRecord
from ..utils.recipe import Opt, maybe
from .base import Exported, ExportError, Format, Program, check_threads, dims

__all__ = ["BUILTIN", "Format", "Program", "Exported", "ExportError", "formats", "get", "for_path", "register",
           "unregister", "runtimes", "format_options", "option_takers", "bench_options", "read_metadata",
           "open_deployed", "DeployedModel"]

#: the formats simattn ships, by module: one line each
BUILTIN = (
    "simattn.deploy.onnx",
    "simattn.deploy.executorch",
    "simattn.deploy.coreml",
    "simattn.deploy.openvino",
    "simattn.deploy.tflite",
)

_FORMATS: Dict[str, Format] = {}


def formats() -> Dict[str, Format]:
    """Every registered format by name, the built-in ones first."""
    if not _FORMATS:
        for module in BUILTIN:
            fmt = importlib.import_module(module).FORMAT
            _FORMATS.setdefault(fmt.name, fmt)
    return dict(_FORMATS)


def register(fmt: Format) -> Format:
    """Add a format (a :class:`Format` instance); its name, runtime name and suffixes must be new."""
    taken = {n for f in formats().values() for n in (f.name, f.runtime)}
    suffixes = {s for f in formats().values() for s in f.suffixes}
    if {fmt.name, fmt.runtime} & taken or set(s.lower() for s in fmt.suffixes) & suffixes or not fmt.suffixes:
        raise ValueError(f"format {fmt.name!r} ({', '.join(fmt.suffixes)}): its name, runtime or a suffix is "
                         "already registered, or it has no suffix")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Remove a format added by :func:`register`."""
    formats()
    _FORMATS.pop(name, None)


def get(name: str) -> Format:
    """The format called ``name`` (a format name, as ``simattn export --format`` takes, or a runtime name, as
    ``simattn bench model --runtime`` takes); a one-line ValueError lists the known ones."""
    for fmt in formats().values():
        if name in (fmt.name, fmt.runtime):
            return fmt
    raise ValueError(f"unknown deployment format {name!r}; known: {', '.join(formats())}")


def for_path(path: Union[str, Path]) -> Optional[Format]:
    """The format whose file ``path`` is (by suffix), or None for any other file (e.g. weights)."""
    suffix = Path(path).suffix.lower()
    return next((f for f in formats().values() if suffix in f.suffixes), None)


def runtimes(runs_here: bool = True) -> List[str]:
    """Runtime names of the formats that run on this kind of machine (all of them with ``runs_here=False``)."""
    return [f.runtime for f in formats().values() if f.runs_here or not runs_here]


def format_options() -> Dict[str, Opt]:
    """The export options the registered formats declare (``Format.options``), by name, each one's help led by
    the formats that take it (``--format onnx: ...``); where two formats declare one name, the first's declaration
    (``simattn export`` takes each once)."""
    from dataclasses import replace

    found: Dict[str, Opt] = {}
    for fmt in formats().values():
        for name, spec in fmt.options.items():
            if name not in found:
                found[name] = replace(spec, help=f"--format {' or '.join(option_takers(name))}: {spec.help}")
    return found


def option_takers(name: str) -> List[str]:
    """The names of the formats that declare the export option ``name``."""
    return [fmt.name for fmt in formats().values() if name in fmt.options]


def bench_options() -> Dict[str, Opt]:
    """The options ``simattn bench model`` takes for the formats' ``bench_options``, by
    :meth:`~.base.Format.bench_flags` name (``onnx_exporter``): each the format's declaration with default None
    (meaning the format's default), so that one given for a runtime that is not run can be told apart;
    :meth:`~.base.Format.bench_values` reads them back."""
    from dataclasses import replace

    found: Dict[str, Opt] = {}
    for fmt in formats().values():
        for flag, name in fmt.bench_flags().items():
            spec = fmt.options[name]
            found[flag] = replace(spec, default=None, type=maybe(spec.hint),
                                  help=f"{spec.help} (--runtime {fmt.runtime}; default {spec.default})")
    return found


def _format_of(path: Union[str, Path]) -> Format:
    fmt = for_path(path)
    if fmt is None:
        known = ", ".join(s for f in formats().values() for s in f.suffixes)
        raise ValueError(f"{path}: not an exported file (expected {known})")
    return fmt


def read_metadata(path: Union[str, Path]) -> WeightsRecord:
    """The record an exported file carries (a one-line ValueError when it has none)."""
    fmt = _format_of(path)
    fmt.require(f"reading {Path(path).name}")
    return fmt.read_metadata(path)


# a weights name that is an exported file resolves to a source whose record its format reads
register_exported_records(lambda path: for_path(path) is not None, read_metadata)


def open_deployed(path: Union[str, Path], threads: Optional[int] = None,
                  record: Optional[WeightsRecord] = None) -> Tuple[Program, WeightsRecord]:
    """(program, record) of an exported file: the program maps a float batch of the recorded input size to the
    first output (a ValueError naming both sizes for any other size); ``threads`` fixes the runtime's CPU threads;
    ``record``: the file's record where it was read already. A file whose program does not take the input size
    its record says is refused."""
    path = Path(path)
    fmt = _format_of(path)
    if not path.exists() or (path.is_dir() and not fmt.folder):
        raise FileNotFoundError(f"exported file not found: {path}")
    check_threads(threads)
    fmt.require(f"running {path.name}")
    record = fmt.read_metadata(path) if record is None else record
    program = fmt.open(path, threads)
    size = list(record.input_size)
    taken = list(program.takes)
    if len(taken) != 3 or any(t is not None and t != s for t, s in zip(taken, size)):
        raise ValueError(f"{path}: its program takes {dims(taken)} inputs but its metadata says input_size "
                         f"{dims(size)}; re-export it with `simattn export`")

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or any(t is not None and t != g for t, g in zip(taken, x.shape[1:])):
            given = dims(x.shape[1:]) if x.dim() == 4 else f"a {x.dim()}-D tensor of shape {dims(x.shape)}"
            raise ValueError(f"{path.name} takes batches of {dims(taken)} images (channels x height x width); "
                             f"got {given}")
        return program(x)

    return Program(run, taken, program.threads, program.bind), record


class DeployedModel(nn.Module):
    """An exported file behind ``nn.Module``'s call, so evaluation loops written for PyTorch models run it.
    ``runtime`` names what runs it, ``metadata`` is the record it carries, ``takes`` the (channels, height, width)
    its program accepts (None where dynamic)."""

    def __init__(self, path: Union[str, Path], threads: Optional[int] = None,
                 record: Optional[WeightsRecord] = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.runtime = _format_of(self.path).runtime
        self._run, self.metadata = open_deployed(path, threads, record)
        self.takes = self._run.takes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.float().cpu())
