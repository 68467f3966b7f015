"""Wall-clock timing that is fair between the things compared: fixed threads, warm-up, device sync, percentiles; on
CPU by the clock (:func:`time_fn`), on CUDA between events, eagerly and replayed from a CUDA graph
(:func:`cuda_times`)."""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

__all__ = ["set_threads", "keep_freed_memory", "time_fn", "sync", "percentiles", "cuda_times"]

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
    return {**percentiles(times), "min_ms": min(times), "mean_ms": statistics.fmean(times), "runs": len(times)}


def percentiles(times: List[float], prefix: str = "") -> Dict[str, float]:
    """``median_ms``, ``p10_ms`` and ``p90_ms`` (nearest rank) of ``times`` in ms, their names after ``prefix``."""
    times = sorted(times)
    rank = lambda p: times[min(len(times) - 1, int(round(p * (len(times) - 1))))]  # noqa: E731
    return {f"{prefix}median_ms": statistics.median(times), f"{prefix}p10_ms": rank(0.1), f"{prefix}p90_ms": rank(0.9)}


#: GPU timing: a sample runs back-to-back calls for about this long (ms), and a measurement's samples about this
#: long (s) in all, 3 samples at least
SAMPLE_MS, MEASUREMENT_S = 2.0, 1.0
#: calls longer than this (ms) are not replayed from a CUDA graph: the host's work of one call (well under a
#: millisecond) hides behind the GPU's, so the eager time is the GPU time there
GRAPH_MAX_MS = 10.0


def _per_call_ms(run: Callable[[], object], calls: int, head_start: bool = False) -> float:
    """Mean ms per call of ``calls`` back-to-back calls between two CUDA events. ``head_start``: queue GPU work
    (about half a millisecond) before the first event, so that the host's launches run ahead of the GPU and only
    the GPU's time counts."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if head_start:
        torch.cuda._sleep(1_000_000)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _captured(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """``fn`` captured in a CUDA graph (after two calls on a side stream, as capture needs); returns its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def cuda_times(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20) -> Dict:
    """Per-call times (ms) of ``fn``, each sample a mean over back-to-back calls between two CUDA events (about
    :data:`SAMPLE_MS`; up to ``repeats`` samples within about :data:`MEASUREMENT_S`, 3 at least): eagerly
    (``median_ms``, ``p10_ms``, ``p90_ms``: the host's work included wherever the GPU waits for it) and replayed
    from a CUDA graph (``graph_ms`` with ``graph_p10_ms``, ``graph_p90_ms``: GPU time alone; not for calls over
    :data:`GRAPH_MAX_MS`, nor where capture fails, ``graph_error``)."""
    for _ in range(warmup):
        fn()
    once = _per_call_ms(fn, 1)
    calls = max(1, min(200, round(SAMPLE_MS / max(once, 1e-3))))
    samples = max(3, min(repeats, math.ceil(MEASUREMENT_S * 1e3 / (calls * once))))
    out = {**percentiles([_per_call_ms(fn, calls) for _ in range(samples)]), "calls": calls, "samples": samples}
    if once > GRAPH_MAX_MS:
        return out
    try:
        replay = _captured(fn, device)
    except Exception as e:  # noqa: BLE001 - an op that cannot be captured: its eager time stands alone
        torch.cuda.synchronize(device)
        return {**out, "graph_error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
    replay()
    stats = percentiles([_per_call_ms(replay, calls, head_start=True) for _ in range(samples)], "graph_")
    return {**out, "graph_ms": stats["graph_median_ms"], "graph_p10_ms": stats["graph_p10_ms"],
            "graph_p90_ms": stats["graph_p90_ms"]}
