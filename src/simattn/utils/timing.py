"""Wall-clock timing that is fair between the things compared: fixed threads, warm-up, device sync, percentiles."""
from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time
from typing import Callable, Dict, Optional

import torch

__all__ = ["set_threads", "keep_freed_memory", "time_fn", "sync"]

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = (1 << 31) - 1  # mallopt's largest (a C int): blocks up to 2 GiB


def set_threads(num_threads: Optional[int]) -> int:
    """Fix the CPU intra-op thread count (None = leave as is) and return the count in force."""
    if num_threads:
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


def keep_freed_memory() -> str:
    """Stop glibc from handing freed memory back to the OS between timed calls; returns what was done, for the log.

    PyTorch's CPU allocator has no cache: each large tensor is malloc'd and freed. By default glibc serves large
    blocks with mmap and trims the heap after frees, so when several functions are timed in turn every call
    page-faults its buffers in again, and kernel time (not the function) dominates and varies run to run. Raising
    the mmap and trim thresholds (what PyTorch's CPU tuning guide gets from jemalloc/tcmalloc) makes each call
    reuse memory, so the timings measure compute. It favours whatever allocates most, i.e. the baselines.
    """
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
    except (OSError, AttributeError, TypeError):
        ok = False
    return "glibc: freed memory kept (mmap/trim thresholds 2 GiB)" if ok else "system allocator defaults"


def sync(device: torch.device | str) -> None:
    """Wait for queued device work so a timer measures it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10, device: str | torch.device = "cpu",
            min_time: float = 0.0, max_time: float = float("inf")) -> Dict[str, float]:
    """Run ``fn`` ``warmup`` times, then at least ``repeats`` timed runs (more while under ``min_time`` seconds,
    stopping once ``max_time`` is spent); returns median/p10/p90/min/mean in milliseconds and the run count."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        spent = time.perf_counter() - start
        if (len(times) >= repeats and spent >= min_time) or (spent >= max_time and times):
            break
    times.sort()

    def percentile(p: float) -> float:  # nearest rank
        return times[min(len(times) - 1, int(round(p * (len(times) - 1))))]

    return {
        "median_ms": statistics.median(times),
        "p10_ms": percentile(0.1),
        "p90_ms": percentile(0.9),
        "min_ms": times[0],
        "mean_ms": statistics.fmean(times),
        "runs": len(times),
    }
