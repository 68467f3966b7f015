"""Run an exported file (``.onnx`` in onnxruntime, ``.pte`` in ExecuTorch) as a function of a batch of images,
with the metadata it carries: what ``simattn validate`` and ``simattn bench model`` need of a deployed model."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

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


def open_deployed(path: Union[str, Path], threads: Optional[int] = None
                  ) -> Tuple[Callable[[torch.Tensor], torch.Tensor], Dict[str, Any]]:
    """(run, metadata): ``run`` maps a float batch of the recorded input size to the first output; ``threads``
    fixes the runtime's CPU threads (ExecuTorch: XNNPACK's pool)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"exported file not found: {path}")
    meta = read_deployed_metadata(path)
    if path.suffix.lower() == ".onnx":
        from .onnx import ort_session, run_onnx

        session = ort_session(path, threads)
        return (lambda x: torch.from_numpy(run_onnx(session, x))), meta
    from .edge import executorch_method, run_executorch

    method = executorch_method(path, threads)
    return (lambda x: run_executorch(method, x)), meta


class DeployedModel(nn.Module):
    """An exported file behind ``nn.Module``'s call, so evaluation loops written for PyTorch models run it."""

    def __init__(self, path: Union[str, Path], threads: Optional[int] = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.runtime = DEPLOYED_SUFFIXES.get(self.path.suffix.lower(), "")
        self._run, self.metadata = open_deployed(path, threads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.float().cpu())
