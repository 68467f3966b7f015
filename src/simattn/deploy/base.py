"""The one interface every deployment format implements (:class:`Format`), what its methods return
(:class:`Exported`, :class:`Program`), and the helpers several formats share: graph capture at one input size,
quieting the runtimes' own logs, keeping Ctrl-C from being swallowed."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..models.weights import WeightsRecord
from ..utils import extras
from ..utils.recipe import Opt

__all__ = ["Format", "Program", "Exported", "ExportError", "OnOps", "capture", "capture_fixed", "check_threads",
           "first_line", "quiet_loggers", "quiet_imports", "quiet_stderr", "kept_interrupts", "dims"]

PathLike = Union[str, Path]


class ExportError(RuntimeError):
    """The model could not be exported, or the written file does not compute what the model computes (then
    ``result`` and ``parity`` hold what was written and measured, for the report)."""

    def __init__(self, message: str, result: Any = None, parity: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
        super().__init__(message)
        self.result, self.parity = result, parity


#: what a format calls with the :class:`~simattn.deploy.ops.GraphAudit` of the graph it exports, before it writes
#: the file (an exception raised there, e.g. by an exp-free requirement, stops the export)
OnOps = Optional[Callable[[Any], None]]


@dataclass
class Exported:
    """What :meth:`Format.export` wrote: ``path``; ``audit``, the ops of the exported graph; ``parity``, the checks
    the format ran itself (None: the caller checks the file with :meth:`Format.open`); ``notes`` (lines worth
    printing); ``info`` (format-specific facts for the report, by key); ``options`` (the format options that
    export another model the same way, e.g. the ONNX exporter that worked)."""

    path: Path
    audit: Any = None
    parity: Optional[Dict[str, Dict[str, Any]]] = None
    notes: List[str] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)


class Program:
    """An exported file opened in its runtime: called on a float batch of images of the recorded size, it returns
    the first output as a tensor. ``takes`` is (channels, height, width) the program accepts (None where dynamic);
    ``threads`` the CPU threads the runtime runs on (None: its default)."""

    def __init__(self, run: Callable[[torch.Tensor], Any], takes: Sequence[Optional[int]],
                 threads: Optional[int] = None, bind: Optional[Callable[[torch.Tensor], Callable[[], Any]]] = None):
        self._run, self.takes, self.threads, self._bind = run, tuple(takes), threads, bind

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self._run(x))

    def bind(self, x: torch.Tensor) -> Callable[[], Any]:
        """A call on ``x`` with its conversion to the runtime's input done once, here: what a benchmark times."""
        return self._bind(x) if self._bind is not None else (lambda: self._run(x))


#: profiled calls of :meth:`Format.profile` (after one warm-up call)
PROFILE_CALLS = 10


class Format:
    """One deployment format: how a model becomes a file, and how the file is run, read and audited.

    Attributes: ``name`` (``simattn export --format``), ``runtime`` (what runs the file: ``simattn bench model
    --runtime``, the ``runtime`` validate reports), ``suffixes`` (the first is the one export writes), ``extra`` (the
    pip extra that installs ``packages``, the modules it imports), ``quantize_modes`` (``--quantize`` modes;
    ``quantizes`` says whether int8 is made from the written ``'file'`` or from the ``'model'`` before export),
    ``options`` (the ``simattn export`` options it takes beyond the shared ones), ``one_image`` (its programs take
    one image per call, as devices run them), ``relative_atol`` (parity is judged relative to the outputs' scale),
    ``folder`` (the file is a folder), ``runs_here`` (:meth:`open` works on this machine; when False, ``not_here``
    says where it runs), ``delegates_to`` (the fast kernels whose coverage :meth:`delegation` reports, e.g.
    ``'XNNPACK'``; empty where the format cannot tell).

    Methods: :meth:`export`, :meth:`quantize`, :meth:`open`, :meth:`read_metadata`, :meth:`ops`,
    :meth:`delegation`, :meth:`profile`; :meth:`require`, :meth:`option_values` and :meth:`files` come with the
    base class.
    """

    name: str = ""
    runtime: str = ""
    suffixes: Tuple[str, ...] = ()
    extra: str = ""
    packages: Tuple[str, ...] = ()
    quantize_modes: Tuple[str, ...] = ()
    quantizes: str = "model"
    options: Mapping[str, Opt] = {}
    bench_options: Tuple[str, ...] = ()
    dynamic_size: bool = False
    one_image: bool = True
    relative_atol: bool = False
    folder: bool = False
    runs_here: bool = True
    not_here: str = ""
    description: str = ""
    delegates_to: str = ""

    def export(self, model: nn.Module, path: PathLike, record: WeightsRecord, *, on_ops: OnOps = None,
               quantize: Optional[str] = None, calibration: Optional[torch.Tensor] = None, fixed_size: bool = False,
               **options: Any) -> Exported:
        """Write ``model`` (eval mode) to ``path``, taking ``record.input_size``, with ``record`` in the file's
        metadata; ``on_ops`` gets the graph's audit before the file is written; ``quantize`` (a mode of
        ``quantize_modes``, for formats that quantize the ``'model'``) with ``calibration`` (preprocessed images);
        ``fixed_size`` asks for one input size where the format could keep height/width dynamic."""
        raise NotImplementedError

    def quantize(self, source: Any, calibration: Optional[torch.Tensor], mode: str, **options: Any) -> Any:
        """int8 of the matmul-type layers: of the written file ``source`` (``quantizes='file'``; ``dst=`` the int8
        file) or of the model (``'model'``; returns the module to export)."""
        raise ValueError(f"--format {self.name} has no int8 mode")

    def open(self, path: PathLike, threads: Optional[int] = None) -> Program:
        """The file as a :class:`Program` running on ``threads`` CPU threads (None: the runtime's default)."""
        raise ValueError(f"{path}: {self.name} files do not run here{f' ({self.not_here})' if self.not_here else ''}")

    def read_metadata(self, path: PathLike) -> WeightsRecord:
        """The record stored in the file (one-line ValueError when it has none or a malformed one)."""
        raise NotImplementedError

    def ops(self, source: Any) -> Any:
        """The :class:`~simattn.deploy.ops.GraphAudit` (op counts, exp-like ones marked) of a written file or of
        the captured program, whichever the format can read ops from."""
        raise NotImplementedError

    def delegation(self, path: PathLike, exported: Optional[Exported] = None) -> Optional[Dict[str, Any]]:
        """What of the written file ``path`` (``exported``: what :meth:`export` returned for it, when it did) runs
        outside ``delegates_to``: ``{'not_delegated': {op: count}, 'beyond_allowance': {op: count}, 'line': str,
        ...}``, ``beyond_allowance`` being what exceeds what the format allows outside (see
        ``simattn export --require-delegated``); None where the format cannot tell."""
        return None

    def profile(self, path: PathLike, x: torch.Tensor, threads: Optional[int] = None, calls: int = PROFILE_CALLS,
                work_dir: Optional[str] = None) -> Dict[str, Any]:
        """Where the written file's time goes in its runtime, from ``calls`` profiled runs on ``x`` of its own
        (profiling slows the calls it records): ``non_linear_share`` (time outside matmul/GEMM/convolution
        kernels), ``non_delegated_share`` (outside ``delegates_to``), ``profile_ops``, or a ``profile_note`` saying
        why there are none. Empty where the runtime cannot say."""
        return {}

    def files(self, path: PathLike) -> List[Path]:
        """Every file or folder that makes up the exported ``path`` (OpenVINO: the .xml and its .bin)."""
        return [Path(path)]

    def require(self, what: str = "") -> None:
        """Import each of ``packages``; a missing one is a one-line
        :class:`~simattn.utils.extras.MissingDependency` naming ``extra``."""
        for module in self.packages:
            with quiet_imports():
                extras.require(module, what, self.extra)

    def option_values(self, values: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
        """The keywords of :meth:`export` for this format's ``options``: each read from ``values`` (parsed flags)
        under ``prefix + name``; one absent or None takes its declared default."""
        found = {name: values.get(prefix + name) for name in self.options}
        return {name: spec.default if found[name] is None else found[name] for name, spec in self.options.items()}

    def bench_flags(self) -> Dict[str, str]:
        """``simattn bench model``'s names of ``bench_options`` (``<format>_<option>``, e.g. ``onnx_exporter``),
        each mapped to its option's name."""
        return {f"{self.name}_{name}": name for name in self.bench_options}

    def bench_values(self, values: Mapping[str, Any]) -> Dict[str, Any]:
        """The keywords of :meth:`export` from ``simattn bench model``'s values (by :meth:`bench_flags` names;
        one absent or None, and every option bench does not take, at its declared default)."""
        return self.option_values(values, prefix=f"{self.name}_")

    def __repr__(self) -> str:
        return f"<deploy format {self.name!r} ({', '.join(self.suffixes)})>"


def dims(shape: Sequence[Optional[int]]) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def check_threads(threads: Optional[int], what: str = "threads") -> Optional[int]:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"{what} {threads!r}: expected an integer >= 1 (or None for the runtime's default)")
    return threads


def capture(model: nn.Module, input_size: Iterable[int], batch: int = 1):
    """``torch.export.export`` of ``model`` (in eval mode already: a PT2E-converted graph refuses ``.eval()``;
    no grad) at a fixed ``(batch, *input_size)``."""
    example = torch.randn(batch, *[int(v) for v in input_size])
    with torch.no_grad():
        return torch.export.export(model, (example,))


def capture_fixed(model: nn.Module, input_size: Sequence[int]):
    """(prepared model, program): ``model`` laid out for ``input_size`` by
    :func:`~simattn.models.prepare_for_export` (in place), then captured at batch 1; a graph that still resamples
    its position embeddings is refused."""
    from ..models import prepare_for_export
    from .ops import aten_op_counts

    model = prepare_for_export(model, tuple(input_size[1:]))
    program = capture(model, input_size)
    # position embeddings are resampled bicubically (timm's resample_abs_pos_embed), which the preparation removes;
    # the bilinear/nearest upsampling of a segmentation decoder is part of the network
    resample = {op: n for op, n in aten_op_counts(program).items() if "upsample_bicubic" in op}
    if resample:
        raise RuntimeError(f"the captured graph still resamples ({resample}); {type(model).__name__} is not "
                           "prepared for a fixed input size")
    return model, program


@contextmanager
def quiet_loggers(*names: str, level: int = logging.ERROR):
    """Raise the level of the named loggers ('' = root) for the duration: exporters and quantizers log routine
    advice as warnings, which would drown the command's own output."""
    loggers = [logging.getLogger(name or None) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, levels):
            lg.setLevel(old)


@contextmanager
def quiet_imports():
    """First imports of the runtimes' packages: what they print about untested versions and missing native parts
    (coremltools), their C++ start-up logs (LiteRT) and deprecation notices (torchao registering pytree nodes)
    stay off the terminal; a Ctrl-C is
    kept even where a package imports its optional parts under bare ``except:`` clauses (coremltools)."""
    import contextlib
    import io
    import warnings

    with kept_interrupts(), quiet_loggers("", "coremltools", "torch.utils._pytree"), quiet_stderr(), \
            contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextmanager
def quiet_stderr():
    """Runtimes written in C++ (ExecuTorch, LiteRT) log to stderr (fd 2) on first use; keep it off the terminal."""
    try:
        fd = os.dup(2)
    except OSError:  # no stderr to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        os.close(devnull)


@contextmanager
def kept_interrupts(defer: bool = False):
    """Ctrl-C (SIGINT) inside the block is never lost. A KeyboardInterrupt raised inside library code that catches
    everything (bare ``except:``, as coremltools' optional imports do) would be swallowed and the work would go on;
    here each SIGINT is also recorded, and a recorded one is raised when the block ends, whatever the block did.
    ``defer=True`` only records it (for a few steps that must not be cut in two). Python's own handler is put back
    on leaving. Nothing changes off the main thread or when SIGINT has another handler (ignored, or the caller's)."""
    import signal

    from ..utils.io import signal_handler

    hits = []

    def handler(signum, frame):
        hits.append(signum)
        if not defer:
            raise KeyboardInterrupt

    try:
        with signal_handler(signal.SIGINT, handler):
            yield
    finally:
        if hits:
            raise KeyboardInterrupt
