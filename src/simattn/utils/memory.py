"""Inputs that would need more memory than the machine has are refused in one line, before anything is allocated.

The estimates are lower bounds (what the named arrays alone take), so a refusal is certain to be right; an input
that passes may still be too large for a model's activations, which the run then reports as usual.
"""
from __future__ import annotations

import os

__all__ = ["available_bytes", "check_memory", "image_batch_bytes"]


def available_bytes() -> int:
    """Memory the system can give this process now (``MemAvailable``; total physical memory where that is not
    reported)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def check_memory(nbytes: float, what: str) -> None:
    """A one-line ValueError when ``nbytes`` (a lower bound of what ``what`` needs) exceeds the available memory."""
    have = available_bytes()
    if nbytes > have:
        raise ValueError(f"{what} would need at least {_gib(nbytes)} of memory; this machine has {_gib(have)} "
                         "available")


def image_batch_bytes(batch: int, height: int, width: int, channels: int = 3, copies: int = 4) -> float:
    """A lower bound of what a batch of float32 images takes through a network: the input and ``copies`` more
    tensors of its size (normalized input, patch embedding, its transpose, the first block's output)."""
    return float(batch) * channels * height * width * 4 * (1 + copies)
