"""CPU latency of exported files in their runtimes (:mod:`simattn.deploy`), measured the same way for each (fixed
threads, warm-up, median), at the input size each file's record says."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from .. import deploy
from ..utils.timing import time_fn

__all__ = ["file_latency", "compare_latency"]


def file_latency(path: str | Path, *, batch: int = 1, threads: Optional[int] = None, warmup: int = 3,
                 repeats: int = 20, min_time: float = 1.0, max_time: float = 60.0) -> Dict[str, Any]:
    """Median/p10/p90/min/mean milliseconds of one run of the file on a random input of the size in its record
    (``input_shape`` says which)."""
    program, record = deploy.open_deployed(path, threads)
    x = torch.randn(batch, *record.input_size)
    t = time_fn(program.bind(x), warmup=warmup, repeats=repeats, min_time=min_time, max_time=max_time)
    return {**t, "input_shape": [batch, *record.input_size]}


def compare_latency(model_path: str | Path, baseline_path: str | Path, **timing) -> Dict[str, object]:
    """Latency of ``model_path`` and ``baseline_path`` (e.g. the softmax twin) and ``baseline / model`` (> 1: the
    model is faster). Runs are interleaved in two rounds so background load hits both alike; the best median of
    each is kept. Both files must record the same input size."""
    rounds: Mapping[str, list] = {"model": [], "baseline": []}
    for _ in range(2):
        rounds["model"].append(file_latency(model_path, **timing))
        rounds["baseline"].append(file_latency(baseline_path, **timing))
    best = {k: min(v, key=lambda r: r["median_ms"]) for k, v in rounds.items()}
    if best["model"]["input_shape"] != best["baseline"]["input_shape"]:
        raise ValueError(f"{model_path} and {baseline_path} record different input sizes "
                         f"({best['model']['input_shape']} vs {best['baseline']['input_shape']})")
    return {
        "model": {"path": str(model_path), **best["model"]},
        "baseline": {"path": str(baseline_path), **best["baseline"]},
        "baseline_over_model": best["baseline"]["median_ms"] / best["model"]["median_ms"],
        "input_shape": best["model"]["input_shape"],
        "threads": timing.get("threads"),
    }
