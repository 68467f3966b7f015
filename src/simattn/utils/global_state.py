"""Process-wide settings a command or library call may change, put back as they were when it returns.

torch keeps its thread count, random generators and backend flags per process. A command run in-process (the tests,
or a user's notebook calling ``simattn.cli.main``) or a library call such as ``validate_weights(threads=1)`` would
otherwise leave its settings behind for whatever runs next, and a later result would depend on what ran before it.
"""
from __future__ import annotations

import functools
import random
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, TypeVar

import numpy as np
import torch

__all__ = ["GlobalState", "preserved_global_state", "restores_global_state"]

F = TypeVar("F", bound=Callable[..., Any])


class GlobalState:
    """A snapshot of torch's, numpy's and Python's process-wide settings; :meth:`restore` puts it back."""

    def __init__(self) -> None:
        self.values: Dict[str, Any] = self._read()
        self._rng = (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @staticmethod
    def _read() -> Dict[str, Any]:
        return {
            "num_threads": torch.get_num_threads(),
            "default_dtype": torch.get_default_dtype(),
            "grad_enabled": torch.is_grad_enabled(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "mkldnn_enabled": torch.backends.mkldnn.enabled,
        }

    def restore(self) -> None:
        v = self.values
        if torch.get_num_threads() != v["num_threads"]:  # setting it re-creates the pool: only when it moved
            torch.set_num_threads(v["num_threads"])
        torch.set_default_dtype(v["default_dtype"])
        torch.set_grad_enabled(v["grad_enabled"])
        torch.use_deterministic_algorithms(v["deterministic_algorithms"])
        torch.set_float32_matmul_precision(v["float32_matmul_precision"])
        torch.backends.cudnn.benchmark = v["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = v["cudnn_deterministic"]
        torch.backends.cudnn.allow_tf32 = v["cudnn_allow_tf32"]
        torch.backends.cuda.matmul.allow_tf32 = v["cuda_matmul_allow_tf32"]
        torch.backends.mkldnn.enabled = v["mkldnn_enabled"]
        torch_rng, np_rng, py_rng = self._rng
        torch.random.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)


@contextmanager
def preserved_global_state() -> Iterator[GlobalState]:
    """Run the body, then put thread count, random streams and backend flags back as they were."""
    state = GlobalState()
    try:
        yield state
    finally:
        state.restore()


def restores_global_state(fn: F) -> F:
    """Decorate a library entry point so that it leaves the process-wide settings as it found them."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with preserved_global_state():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
