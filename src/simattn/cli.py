"""The ``simattn`` command: one entry point, each subcommand in its own module, imported only when used."""
from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import List, Optional

from .utils.extras import EXTRAS, MissingDependency, missing_extra

#: subcommand → (module with ``main(argv)``, one-line help)
COMMANDS = {
    "bench": ("simattn.bench.cli", "benchmarks: attention kernels, whole models, the paper's tables"),
    "train": ("simattn.train.cli", "train a model from a YAML recipe (torchrun for DDP)"),
    "validate": ("simattn.train.validate", "top-1/top-5 accuracy and loss of a model + weights"),
    "demo": ("simattn.demo", "train SimA and softmax twins on the embedded digits data and compare"),
    "export": ("simattn.export.cli", "export to ONNX, audit exp-like ops, check onnxruntime parity"),
    "viz": ("simattn.viz.cli", "q̂/k̂ token-importance heatmaps"),
    "ssl": ("simattn.ssl.cli", "DINO self-supervised pretraining with k-NN / linear evaluation"),
    "detect": ("simattn.detect.cli", "Mask R-CNN detection with a SimA backbone"),
    "convert": ("simattn.convert.cli", "turn a pretrained softmax ViT into a SimA (or other softmax-free) ViT"),
}


def _usage() -> str:
    lines = ["usage: simattn <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'simattn <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"simattn: unknown command {name!r}; known: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except (ValueError, FileNotFoundError, MissingDependency) as e:
        # bad input (CheckpointError is a ValueError) or a missing optional package: one line, no traceback
        return _fail(name, rest, str(e), 2)
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        return _fail(name, rest, str(missing_extra(top, f"simattn {name}")), 2)
    except OSError as e:
        if e.errno not in USER_FAULTS:
            raise
        return _fail(name, rest, _os_message(e), 2)
    except FloatingPointError as e:  # a run that diverged: its output is not written
        return _fail(name, rest, str(e), 1)


#: errno values that are faults of the file system or of the paths given, not of simattn (one-line errors)
USER_FAULTS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR,
               errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG, errno.EFBIG, errno.ELOOP, errno.EIO}


def _os_message(e: OSError) -> str:
    what = e.strerror or str(e)
    paths = [str(p) for p in (e.filename, e.filename2) if p]
    writable = " (choose a writable --output)"
    hint = {errno.ENOSPC: " (the disk is full: free space or choose another --output)",
            errno.EDQUOT: " (disk quota exceeded)", errno.EROFS: writable, errno.EACCES: writable}.get(e.errno, "")
    return f"{what}: {' -> '.join(paths)}{hint}" if paths else f"{what}{hint}"


def _fail(name: str, rest: List[str], text: str, code: int) -> int:
    if os.environ.get("SIMATTN_DEBUG"):
        raise
    message = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    print(f"{_prog(name, rest)}: error: {message} (SIMATTN_DEBUG=1 for the traceback)", file=sys.stderr)
    return code


def _prog(name: str, rest: List[str]) -> str:
    """The command as typed, for error messages: ``simattn train``, or ``simattn bench model`` for a benchmark."""
    if name == "bench" and rest and not rest[0].startswith("-"):
        return f"simattn bench {rest[0]}"
    return f"simattn {name}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
