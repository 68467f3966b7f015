"""SimA's compiled CPU kernel (``sima_cpu.cpp`` beside this module): q̂(k̂ᵀv) for eager fp32 inference in one call.

Eager PyTorch runs SimA as about ten ops, and copies the strided q, k, v views of a fused projection; at small token
counts the launches cost more than the arithmetic, and at large ones the extra passes over memory do. The kernel
takes the norms of each block of tokens while it is in cache, runs both products as BLAS calls on the strided views
and writes the output token-major (merging the heads afterwards is a view). It has no autograd: SimA's ``'auto'``
backend runs it only where nothing asks for gradients.

It is built once per machine and torch version with ``torch.utils.cpp_extension`` (a C++ compiler with OpenMP, and
ninja) into ``$SIMATTN_KERNEL_DIR`` (default ``~/.cache/simattn/kernels``), by ``scripts/setup_venv.sh`` or
``simattn build-kernels``. Where it is not built SimA runs in torch; nothing builds it implicitly: a first call
that stops to compile would be a surprise.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
from pathlib import Path
from typing import List, Optional

import torch

__all__ = ["SOURCE", "library_path", "available", "build", "sima_kv_first", "unavailable_reason"]

SOURCE = Path(__file__).with_name("sima_cpu.cpp")
NAME = "simattn_sima_cpu"


def _flags() -> List[str]:
    """-fopenmp: ATen's parallel_for and the simd loops are OpenMP pragmas (the library joins torch's own libgomp).
    AVX2 only where this CPU has it (torch reports AVX2 or AVX512); the flags are part of the build's name, so a
    machine without AVX2 never loads a library built with it."""
    flags = ["-O3", "-fopenmp"]
    if platform.machine().lower() in ("x86_64", "amd64") and \
            torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


_lock = threading.Lock()
_loaded: Optional[bool] = None  # None: not tried in this process
_reason = "not built"


def library_path() -> Path:
    """Where this source, these flags (this CPU's) and this torch build put the library (any change builds anew)."""
    root = Path(os.environ.get("SIMATTN_KERNEL_DIR") or Path.home() / ".cache" / "simattn" / "kernels")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(_flags()).encode() + torch.__version__.encode()).hexdigest()
    return root / f"{NAME}-{digest[:16]}" / f"{NAME}.so"


def _load(path: Path) -> bool:
    global _loaded, _reason
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:  # a library this torch cannot load (missing BLAS symbol, other ABI)
        _loaded, _reason = False, f"{path} does not load: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return False
    from torch.utils.flop_counter import register_flop_formula

    @register_flop_formula(torch.ops.simattn.sima_kv_first)
    def _flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:  # FlopCounterMode: kᵀv and q·(kᵀv)
        B, H, N, d = q_shape
        return 2 * (2 * B * H * N * d * v_shape[-1])

    _loaded, _reason = True, ""
    return True


def available() -> bool:
    """Whether the kernel is built for this torch and loads; never builds."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        if path.exists():
            return _load(path)
        _loaded = False  # asked on every SimA call: the answer is kept (build() loads it)
        return False


def unavailable_reason() -> str:
    """Why :func:`available` is False (empty when it is True)."""
    available()
    return "" if _loaded else _reason + " (build it with: simattn build-kernels)"


def build(verbose: bool = False) -> Path:
    """Compile the kernel for this torch (about 10 s) unless it is built, load it and return its path.
    Raises RuntimeError naming what is missing (a C++ compiler, ninja) or what failed."""
    path = library_path()
    if not path.exists():
        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler ({compiler!r} is not on PATH)")
        log = logging.getLogger("torch.utils.cpp_extension")
        level = log.level
        log.setLevel(logging.ERROR)  # its import warns that a CPU-only machine has no CUDA runtime
        try:
            from torch.utils import cpp_extension
        finally:
            log.setLevel(level)
        env_path = os.environ.get("PATH", "")
        try:  # the ninja wheel's binary, where ninja is not installed system-wide
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + env_path
        except ImportError:
            pass
        try:
            if not cpp_extension.is_ninja_available():
                raise RuntimeError("ninja is not installed (pip install ninja)")
            path.parent.mkdir(parents=True, exist_ok=True)
            cpp_extension.load(NAME, [str(SOURCE)], extra_cflags=_flags(), extra_ldflags=["-fopenmp"],
                               build_directory=str(path.parent), is_python_module=False, verbose=verbose)
        except Exception as e:
            shutil.rmtree(path.parent, ignore_errors=True)  # no half-built library is found later
            raise RuntimeError(f"building {SOURCE.name} failed: {str(e).splitlines()[0] if str(e) else e!r}") from e
        finally:
            os.environ["PATH"] = env_path
    with _lock:
        if not _loaded and not _load(path):
            raise RuntimeError(_reason)
    return path


def sima_kv_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """q̂(k̂ᵀv) for CPU fp32 q, k (B, H, N, d) and v (B, H, N, e) with unit stride along the last dim; the
    (B, H, N, e) result is laid out (B, N, H, e). No autograd; the caller checks :func:`available`."""
    return torch.ops.simattn.sima_kv_first(q, k, v, eps)


def _options():
    from ...utils.recipe import Opt
    return {"verbose": Opt(False, "show the compiler's commands and output")}


def main(argv: Optional[List[str]] = None) -> int:
    """``simattn build-kernels``: build the kernel; exit 1 with the reason where it cannot be built."""
    from ...utils.recipe import checked_flags, command_parser

    parser = command_parser("simattn build-kernels", "Compile SimA's CPU kernel for this machine and torch "
                            "(scripts/setup_venv.sh runs this). Where it is not built, SimA runs in torch.", _options())
    options = checked_flags(parser.parse_args(argv), _options())
    try:
        path = build(verbose=options["verbose"])
    except RuntimeError as e:
        print(f"simattn: SimA's CPU kernel was not built: {e}; SimA runs in torch", file=sys.stderr)
        return 1
    print(f"SimA's CPU kernel: {path}")
    return 0
