"""onnxruntime CPU latency of exported models, measured the same way for each (fixed threads, warm-up, median)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import torch

from ..utils.timing import time_fn
from .onnx_export import ort_session, run_onnx

__all__ = ["ort_latency", "compare_latency"]


def ort_latency(path: str | Path, input_size: Sequence[int], *, batch: int = 1, threads: Optional[int] = None,
                warmup: int = 3, repeats: int = 20, min_time: float = 1.0, max_time: float = 60.0) -> Dict[str, float]:
    """Median/p90/min/mean milliseconds of one onnxruntime run on a random (batch, *input_size) input."""
    session = ort_session(path, threads)
    x = torch.randn(batch, *input_size)
    return time_fn(lambda: run_onnx(session, x), warmup=warmup, repeats=repeats, min_time=min_time,
                   max_time=max_time)


def compare_latency(model_path: str | Path, baseline_path: str | Path, input_size: Sequence[int],
                    **timing) -> Dict[str, object]:
    """Latency of ``model_path`` and ``baseline_path`` (e.g. the softmax twin) and ``baseline / model`` (> 1: the
    model is faster). Runs are interleaved in two rounds so background load hits both alike; the best median of
    each is kept."""
    rounds: Mapping[str, list] = {"model": [], "baseline": []}
    for _ in range(2):
        rounds["model"].append(ort_latency(model_path, input_size, **timing))
        rounds["baseline"].append(ort_latency(baseline_path, input_size, **timing))
    best = {k: min(v, key=lambda r: r["median_ms"]) for k, v in rounds.items()}
    return {
        "model": {"path": str(model_path), **best["model"]},
        "baseline": {"path": str(baseline_path), **best["baseline"]},
        "baseline_over_model": best["baseline"]["median_ms"] / best["model"]["median_ms"],
        "input_shape": [timing.get("batch", 1), *input_size],
        "threads": timing.get("threads"),
    }
