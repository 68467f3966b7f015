"""Output pieces the benchmarks share: progress, machine description, CSV/JSON/markdown writers, figure saving."""
from __future__ import annotations

import csv
import io
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar

import torch

from ..utils.io import atomic_write_json, atomic_write_text, save_figure as _save_png
from ..utils.runlog import progress as runlog_progress

__all__ = ["progress", "machine_info", "triton_version", "rounds_median", "gap_pct", "write_result_files", "write_csv",
           "markdown_table", "fmt", "new_figure", "save_figure", "WIDE_SPREAD", "relative_spread", "spread_warning", "quiet_advice", "fmt_ms"]

T = TypeVar("T")

#: A timing's spread is "wide" when its p10-p90 range exceeds this fraction of its median: then the machine's load
#: moved the numbers more than most differences between the things compared.
WIDE_SPREAD = 0.2


def relative_spread(p10: Optional[float], p90: Optional[float], median: Optional[float]) -> Optional[float]:
    """(p90 - p10) / median, or None when a value is missing."""
    if p10 is None or p90 is None or not median:
        return None
    return (p90 - p10) / median


def spread_warning(spreads: Mapping[str, Optional[float]], limit: float = WIDE_SPREAD) -> Optional[str]:
    """One warning line naming the measurements (name → relative spread) whose spread exceeds ``limit``, or None."""
    wide = {name: s for name, s in spreads.items() if s is not None and s > limit}
    if not wide:
        return None
    worst = max(wide, key=wide.get)
    return (f"warning: wide spread in {len(wide)} of {len(spreads)} timings (p10-p90 range above {limit:.0%} of the "
            f"median; widest: {worst}, {wide[worst]:.0%}): the machine was busy or the runs were too few; compare "
            f"those medians with care. {quiet_advice()}")


def quiet_advice() -> str:
    """How to get a quiet measurement, for the warnings that say a timing was not."""
    return (f"For a quiet measurement: an idle machine, fewer threads than its {os.cpu_count() or 'several'} cores "
            f"(--threads), more --repeats and --rounds")


def fmt_ms(ms: Optional[float]) -> str:
    """A time given in milliseconds, as tables print it: in µs under 1 ms (``18.2 µs``), else in ms (``2.500 ms``);
    ``-`` for None."""
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


def progress(items: Sequence[T], desc: str, describe: Callable[[T], str] = str) -> Iterable[T]:
    """Benchmark cases with a tqdm bar on a terminal, or one plain ``[i/n] desc: case`` line each otherwise."""
    return runlog_progress(items, desc, len(items), describe=describe)


def machine_info(device: str, threads: int) -> Dict[str, Any]:
    """What the numbers were measured on."""
    info: Dict[str, Any] = {
        "device": device,
        "threads": threads,
        "cpu": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import timm

        info["timm"] = timm.__version__
    except ImportError:  # pragma: no cover - timm is a dependency
        pass
    info.update(cpu_info())
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info.update({"triton": triton_version()} if triton_version() else {})  # no Triton: the kinds run torch
    return info


def triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


#: /proc/cpuinfo flag → what the int8 and fp32 kernels can use
CPU_FEATURES = {"avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI",
                "avx_vnni": "AVX-VNNI", "avx512_bf16": "AVX-512 BF16", "amx_int8": "AMX-INT8", "asimddp": "NEON dot"}


def cpu_info() -> Dict[str, Any]:
    """The CPU's name and the vector features int8/fp32 speed depends on (Linux ``/proc/cpuinfo``; empty
    elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags: set = set()
    name = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "model name" and name is None:
            name = value.strip()
    return {"cpu_name": name, "cpu_features": [label for flag, label in CPU_FEATURES.items() if flag in flags]}


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path, columns: Optional[Sequence[str]] = None) -> None:
    """Rows (dicts) as CSV: ``columns`` first, then the others in first-seen order; nested values are skipped."""
    columns = [c for c in dict.fromkeys([*(columns or ()), *(key for row in rows for key in row)])
               if not any(isinstance(r.get(c), (dict, list)) for r in rows)]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(buf.getvalue(), path)


def rounds_median(times: List[dict]) -> dict:
    """The median over rounds of each time (``*_ms``) a timer gave in every round; a CUDA graph's capture error kept."""
    out = {key: statistics.median(t[key] for t in times) for key in times[0]
           if key.endswith("_ms") and all(key in t for t in times)}
    errors = [t["graph_error"] for t in times if "graph_error" in t]
    return {**out, "graph_error": errors[0]} if errors else out


def gap_pct(ours: Optional[float], paper: Optional[float]) -> Optional[float]:
    """How far ``ours`` is from the published figure, in % of it; None where either is missing."""
    return None if ours is None or not paper else (ours / paper - 1) * 100


def write_result_files(path: Path, meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                       notes: Sequence[str] = (), *, csv: bool = True,
                       table: Optional[Sequence[Mapping[str, Any]]] = None, columns: Optional[Sequence[str]] = None,
                       markdown: Optional[str] = None, plot: Optional[Callable[[Path], Any]] = None,
                       **more: Any) -> Any:
    """A benchmark's results in the one layout they all share: the JSON file ``path`` holding ``{meta, rows,
    notes}`` (and ``more``, the benchmark's own summaries), beside it the CSV of ``table`` (default the rows;
    ``columns`` first; none with ``csv`` False), the ``markdown`` summary and the PNG drawn by ``plot(png_path)``, each
    where given; returns what ``plot`` returned."""
    path = Path(path)
    atomic_write_json({"meta": dict(meta), "rows": list(rows), "notes": list(notes), **more}, path)
    if csv:
        write_csv(rows if table is None else table, path.with_suffix(".csv"), columns)
    if markdown is not None:
        atomic_write_text(markdown, path.with_suffix(".md"))
    return plot(path.with_suffix(".png")) if plot is not None else None


def fmt(value: Any, digits: int = 4) -> str:
    """Compact human formatting: ints with thousands separators, floats to ``digits`` significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   headers: Optional[Sequence[str]] = None) -> str:
    """A GitHub markdown table of ``columns`` of ``rows`` (values through :func:`fmt`)."""
    headers = list(headers or columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def new_figure(ncols: int, nrows: int = 1, size: float = 4.8):
    """A matplotlib (Agg) figure and its axes as a flat list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * 0.8 * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig, path: Path) -> None:
    """The benchmarks' figures: laid out tight, saved as a 120 dpi PNG (atomically) and closed."""
    fig.tight_layout()
    _save_png(fig, path, dpi=120)
