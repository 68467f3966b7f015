"""Optional dependencies: import them with a message that gives the line installing the extra that brings them
into the environment running simattn (:func:`install_line`).

``export`` needs onnx/onnxruntime, ``edge`` executorch (with torchao) and coremltools, ``openvino`` OpenVINO, ``viz``
scikit-image, ``ssl`` lightly and ``detect`` pycocotools (pyproject's ``[project.optional-dependencies]``).
"""
from __future__ import annotations

import importlib
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional, Tuple
from urllib.parse import unquote, urlparse

__all__ = ["MissingDependency", "EXTRAS", "require", "missing_extra", "install_line"]

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
    install = install_line(extra) if extra else f"pip install {top}"
    return MissingDependency(f"{need}the optional package {top!r}, which is not installed: {install}")


def _source_folder() -> Optional[Tuple[Path, bool]]:
    """(folder, editable) when simattn was installed from a folder on this machine (pip's ``direct_url.json``),
    else None."""
    from importlib import metadata
    try:
        url = json.loads(metadata.distribution("simattn").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    parsed = urlparse(url.get("url", ""))
    if "dir_info" not in url or parsed.scheme != "file":
        return None
    return Path(unquote(parsed.path)), bool(url["dir_info"].get("editable"))


def install_line(extra: str) -> str:
    """The shell line that installs ``extra`` into the environment running simattn. From a clone's ``.venv``, its
    set-up script (pip with the tested versions of ``constraints.txt``, which keep torch as it is); from another
    environment that installed a folder, that environment's pip with the folder's constraints; else pip from the
    package index."""
    source = _source_folder()
    if source is None:
        return f"pip install {shlex.quote(f'simattn[{extra}]')}"
    folder, editable = source
    script = folder / "scripts" / "setup_venv.sh"
    if script.is_file() and Path(sys.prefix).resolve() == (folder / ".venv").resolve():
        try:  # as typed from the working folder, where the script lies below it (it finds the clone itself)
            shown = "./" + str(script.relative_to(Path.cwd()))
        except (ValueError, OSError):
            shown = str(script)
        return f"{shlex.quote(shown)} {shlex.quote(extra)}"
    constraints = folder / "constraints.txt"
    pin = f"-c {shlex.quote(str(constraints))} " if constraints.is_file() else ""
    return (f"{shlex.quote(sys.executable)} -m pip install {pin}{'-e ' if editable else ''}"
            f"{shlex.quote(f'{folder}[{extra}]')}")
