"""Run an exported file (``.onnx`` in onnxruntime, ``.pte`` in ExecuTorch) as a function of a batch of images,
with the metadata it carries: what ``simattn validate`` and ``simattn bench model`` need of a deployed model."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn

__all__ = ["DEPLOYED_SUFFIXES", "is_deployed", "read_deployed_metadata", "open_deployed", "DeployedModel"]

#: file suffix → runtime that runs it
DEPLOYED_SUFFIXES = {".onnx": "onnxruntime", ".pte": "executorch"}


def is_deployed(path: Union[str, Path]) -> bool:
    return Path(path).suffix.lower() in DEPLOYED_SUFFIXES


def read_deployed_metadata(path: Union[str, Path]) -> Dict[str, Any]:
    """The simattn metadata of an exported file (a one-line ValueError when it has none)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".onnx":
        from .onnx import read_onnx_metadata

        return read_onnx_metadata(path)
    if suffix == ".pte":
        from .edge import read_pte_metadata

        return read_pte_metadata(path)
    raise ValueError(f"{path}: not an exported file (expected {', '.join(DEPLOYED_SUFFIXES)})")


def _dims(shape: Sequence[Optional[int]]) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


def _check_program_takes(path: Path, taken: Sequence[Optional[int]], meta: Dict[str, Any]) -> None:
    """The program's input (channels, height, width; None where dynamic) must admit the metadata's input_size,
    which is what validate and bench feed it."""
    size = list(meta["input_size"])
    if len(taken) != 3 or any(t is not None and t != s for t, s in zip(taken, size)):
        raise ValueError(f"{path}: its program takes {_dims(taken)} inputs but its metadata says input_size "
                         f"{_dims(size)}; re-export it with `simattn export`")


def open_deployed(path: Union[str, Path], threads: Optional[int] = None
                  ) -> Tuple[Callable[[torch.Tensor], torch.Tensor], Dict[str, Any]]:
    """(run, metadata): ``run`` maps a float batch of the recorded input size to the first output (a ValueError
    naming both sizes for any other size); ``threads`` fixes the runtime's CPU threads (ExecuTorch: XNNPACK's
    pool). A file whose program does not take the input size its metadata records is refused."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"exported file not found: {path}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads {threads!r}: expected an integer >= 1 (or None for the runtime's default)")
    meta = read_deployed_metadata(path)
    if path.suffix.lower() == ".onnx":
        from .onnx import _first_line, ort_session, run_onnx

        try:
            session = ort_session(path, threads, quiet=True)
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types for a broken graph
            raise ValueError(f"{path}: onnxruntime cannot load it ({_first_line(e)})") from None
        dims = list(session.get_inputs()[0].shape)
        taken = [d if isinstance(d, int) else None for d in dims[1:]]  # names: dynamic axes
        _check_program_takes(path, taken, meta)

        def call(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(run_onnx(session, x))
    else:
        from .edge import executorch_method, pte_input_shape, run_executorch

        shape = pte_input_shape(path)
        if len(shape) != 4 or shape[0] != 1:
            raise ValueError(f"{path}: its program takes {_dims(shape)} inputs; simattn runs programs of one "
                             "image (batch 1), as `simattn export --format executorch` writes them")
        taken = list(shape[1:])
        _check_program_takes(path, taken, meta)
        method = executorch_method(path, threads)

        def call(x: torch.Tensor) -> torch.Tensor:
            return run_executorch(method, x)

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or any(t is not None and t != g for t, g in zip(taken, x.shape[1:])):
            given = _dims(x.shape[1:]) if x.dim() == 4 else f"a {x.dim()}-D tensor of shape {_dims(x.shape)}"
            raise ValueError(f"{path.name} takes batches of {_dims(taken)} images (channels x height x width); "
                             f"got {given}")
        return call(x)

    return run, meta


class DeployedModel(nn.Module):
    """An exported file behind ``nn.Module``'s call, so evaluation loops written for PyTorch models run it."""

    def __init__(self, path: Union[str, Path], threads: Optional[int] = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.runtime = DEPLOYED_SUFFIXES.get(self.path.suffix.lower(), "")
        self._run, self.metadata = open_deployed(path, threads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.float().cpu())
