"""Progress that is a tqdm bar on a terminal and plain lines otherwise (every command that loops over data)."""
from __future__ import annotations

import sys
from typing import Iterable, Optional


__all__ = ["progress", "use_tqdm"]


def use_tqdm(enabled: bool = True) -> bool:
    """tqdm bars only when asked (e.g. on the main process) and stderr is a terminal; logs and pipes get plain
    lines instead."""
    return enabled and sys.stderr.isatty()


def progress(iterable: Iterable, desc: str, total: Optional[int] = None, enabled: bool = True) -> Iterable:
    """``iterable`` wrapped in a tqdm bar when :func:`use_tqdm` says so; the bare iterable otherwise, so logs
    written to files only get the plain per-epoch lines."""
    if not use_tqdm(enabled):
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)
