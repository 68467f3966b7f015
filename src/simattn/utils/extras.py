"""Optional dependencies: import them with a message that says which ``pip install 'simattn[extra]'`` to run.

``export`` needs onnx/onnxruntime, ``edge`` executorch (with torchao) and coremltools, ``openvino`` OpenVINO, ``viz``
scikit-image, ``ssl`` lightly and ``detect`` pycocotools (pyproject's ``[project.optional-dependencies]``).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

__all__ = ["MissingDependency", "EXTRAS", "require", "missing_extra"]

#: top-level module → the simattn extra that installs it
EXTRAS = {
    "onnx": "export", "onnxruntime": "export", "onnxscript": "export",
    "executorch": "edge", "torchao": "edge", "coremltools": "edge",
    "openvino": "openvino",
    "skimage": "viz",
    "lightly": "ssl",
    "pycocotools": "detect",
}


class MissingDependency(ImportError):
    """An optional package a command needs is not installed (``simattn`` prints it as one line)."""


def require(module: str, what: str = "", extra: Optional[str] = None) -> ModuleType:
    """``import module``, or raise :class:`MissingDependency` naming the extra that provides it.

    ``what`` says what needs it (``'simattn ssl'``) for the message; ``extra`` names the extra where the caller
    knows it (a deployment format's), else :data:`EXTRAS` decides.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the package is there but one of its own imports failed: show the real error
        raise missing_extra(top, what, extra) from None


def missing_extra(module: str, what: str = "", extra: Optional[str] = None) -> MissingDependency:
    """The :class:`MissingDependency` for a missing ``module`` (its top-level name decides the extra, unless
    ``extra`` is given)."""
    top = module.split(".")[0]
    extra = extra or EXTRAS.get(top)
    need = f"{what} needs " if what else ""
    install = f"pip install 'simattn[{extra}]'" if extra else f"pip install {top}"
    return MissingDependency(f"{need}the optional package {top!r}, which is not installed: {install}")
