"""Progress that is a tqdm bar on a terminal and plain lines otherwise (every command that loops over data)."""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Optional, TypeVar

T = TypeVar("T")


__all__ = ["progress", "use_tqdm"]


def use_tqdm(enabled: bool = True) -> bool:
    """tqdm bars only when asked (e.g. on the main process) and stderr is a terminal; logs and pipes get plain
    lines instead."""
    return enabled and sys.stderr.isatty()


def progress(iterable: Iterable[T], desc: str, total: Optional[int] = None, enabled: bool = True,
             describe: Optional[Callable[[T], str]] = None) -> Iterable[T]:
    """``iterable`` with a tqdm bar when :func:`use_tqdm` says so (``describe(item)`` shown beside it). Otherwise the
    bare iterable, so logs written to files only get a task's own lines, or, with ``describe``, one plain
    ``[i/n] desc: item`` line per item (long items such as benchmark cases)."""
    if use_tqdm(enabled):
        from tqdm import tqdm
        bar = tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)
        if describe is None:
            return bar
        return _described(bar, describe)
    if describe is None or not enabled:
        return iterable
    return _lines(iterable, desc, total, describe)


def _described(bar, describe):
    for item in bar:
        bar.set_postfix_str(describe(item), refresh=True)
        yield item


def _lines(iterable, desc, total, describe):
    n = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else "?")
    for i, item in enumerate(iterable, 1):
        print(f"[{i}/{n}] {desc}: {describe(item)}", file=sys.stderr, flush=True)
        yield item
