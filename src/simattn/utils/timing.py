"""Wall-clock timing that is fair between the things compared: fixed threads, warm-up, device sync, percentiles."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Optional

import torch

__all__ = ["set_threads", "time_fn", "sync"]


def set_threads(num_threads: Optional[int]) -> int:
    """Fix the CPU intra-op thread count (None = leave as is) and return the count in force."""
    if num_threads:
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


def sync(device: torch.device | str) -> None:
    """Wait for queued device work so a timer measures it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10, device: str | torch.device = "cpu",
            min_time: float = 0.0, max_time: float = float("inf")) -> Dict[str, float]:
    """Run ``fn`` ``warmup`` times, then at least ``repeats`` timed runs (more while under ``min_time`` seconds,
    stopping once ``max_time`` is spent); returns median/p90/min/mean in milliseconds and the run count."""
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
    return {
        "median_ms": statistics.median(times),
        "p90_ms": times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))],
        "min_ms": times[0],
        "mean_ms": statistics.fmean(times),
        "runs": len(times),
    }
