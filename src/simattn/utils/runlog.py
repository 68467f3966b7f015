"""Run outputs: per-epoch history as JSON and a PNG of the curves (``simattn ssl`` and ``simattn detect``), and
progress that is a tqdm bar on a terminal and plain lines otherwise (those and ``simattn train``/``validate``)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .io import atomic_path, atomic_write_json

__all__ = ["EpochResults", "progress", "use_tqdm"]


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


class EpochResults:
    """Per-epoch records of a run, rewritten whole (atomically) to ``results.json`` after every epoch.

    ``results`` holds everything that is not per-epoch (final metrics, the recipe, ...).
    """

    def __init__(self, output_dir: str | Path, enabled: bool = True, results: Optional[Dict[str, Any]] = None) -> None:
        self.output_dir = Path(output_dir)
        self.enabled = enabled
        self.history: List[Dict[str, Any]] = []
        self.results: Dict[str, Any] = dict(results or {})

    @property
    def json_path(self) -> Path:
        return self.output_dir / "results.json"

    def log_epoch(self, record: Dict[str, Any]) -> None:
        """Append one epoch's record, print it as one plain line, and rewrite the JSON."""
        self.history.append(record)
        if self.enabled:
            print("  ".join(f"{k}={_fmt(v)}" for k, v in record.items()), flush=True)
            self.save()

    def save(self) -> None:
        if self.enabled:
            atomic_write_json({**self.results, "history": self.history}, self.json_path)

    def plot(self, keys: Sequence[str], filename: str = "curves.png", title: str = "",
             references: Optional[Dict[str, float]] = None, reference_label: str = "") -> Optional[Path]:
        """One panel per key of the history (e.g. losses) against epoch, with ``references[key]`` (e.g. the
        random-init accuracy) as a dashed line; returns the PNG path."""
        keys = [k for k in keys if any(k in r for r in self.history)]
        if not self.enabled or not keys:
            return None
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
        for ax, key in zip(axes[0], keys):
            points = [(r["epoch"], r[key]) for r in self.history if key in r]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
            if references and key in references:
                ax.axhline(references[key], linestyle="--", color="gray", label=reference_label or None)
                if reference_label:
                    ax.legend(fontsize=8)
            ax.set_xlabel("epoch")
            ax.set_title(key)
            ax.grid(alpha=0.3)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        path = self.output_dir / filename
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
