"""Running one ``simattn`` subcommand, and turning user-facing faults into one line with an exit code.

The entry point and the subcommand table are in the top-level :mod:`simattn_cli`, which loads without torch and
calls :func:`run_command` with the module that implements the subcommand.
"""
from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import List

from .utils.extras import EXTRAS, MissingDependency, missing_extra


def run_command(name: str, module_name: str, rest: List[str]) -> int:
    """Run subcommand ``name``, implemented by ``module_name``'s ``main(argv)``, with arguments ``rest``; returns the
    exit code."""
    module = importlib.import_module(module_name)
    from .utils.global_state import preserved_global_state
    from .utils.io import terminate_as_interrupt

    code = 1
    try:
        # a command run in-process (tests, notebooks) leaves threads, random streams and backend flags as it found
        # them; SIGTERM stops it as Ctrl-C does, temporary files removed
        with preserved_global_state(), terminate_as_interrupt():
            code = _run(name, module, rest)
        return code
    except Exception as e:  # not a fault of the input: still one line; the traceback is for SIMATTN_DEBUG=1
        if os.environ.get("SIMATTN_DEBUG"):
            raise
        first = bounded((str(e).strip().splitlines() or [""])[0], 300)
        print(f"{_prog(name, rest)}: unexpected error {type(e).__name__}: {first} (a bug in simattn or a library it "
              "uses; SIMATTN_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    finally:
        # files an --overwrite run moved aside: dropped once it succeeded, put back when it failed or was stopped
        from .utils.runs import settle_replaced
        settle_replaced(code == 0)


def _run(name: str, module, rest: List[str]) -> int:
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt as e:
        if os.environ.get("SIMATTN_DEBUG"):
            raise
        from .utils.io import Terminated
        how = "stopped (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"\n{_prog(name, rest)}: {how}; files already written are complete, nothing is half-written",
              file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
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
    except RuntimeError as e:
        # a torchrun job whose other process died or froze: the collective timed out or lost its peer
        if not _lost_peer(e):
            raise
        return _fail(name, rest, "another process of the distributed job stopped answering (it died, froze or ran "
                     "out of time at a collective; see the dist_timeout option, --dist-timeout): "
                     f"{str(e).splitlines()[0][:200]}", 1)


def _lost_peer(e: RuntimeError) -> bool:
    """Whether ``e`` says that a collective of this distributed job timed out or lost another process (gloo raises
    plain RuntimeErrors for these)."""
    import torch.distributed as dist
    if isinstance(e, dist.DistError):
        return True
    text = str(e)  # the group is already torn down here, so the message is all there is to go by
    return "gloo" in text and any(s in text for s in ("Timed out", "timed out", "Connection closed by peer",
                                                     "Connection reset by peer"))


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
    message = bounded("; ".join(line.strip() for line in text.splitlines() if line.strip()), MAX_MESSAGE)
    print(f"{_prog(name, rest)}: error: {message} (SIMATTN_DEBUG=1 for the traceback)", file=sys.stderr)
    return code


#: the most characters of one error message printed: a value quoted in it (a recipe entry, a path) can be huge
MAX_MESSAGE = 1000


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def _prog(name: str, rest: List[str]) -> str:
    """The command as typed, for error messages: ``simattn train``, or with the subcommand of ``bench``, ``data``
    and ``hub`` (``simattn bench model``)."""
    if name in ("bench", "data", "hub") and rest and not rest[0].startswith("-"):
        return f"simattn {name} {rest[0]}"
    return f"simattn {name}"
