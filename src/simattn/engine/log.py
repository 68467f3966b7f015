"""What a run tells people: progress lines (rank 0 only), ``metrics.jsonl`` records, and plain-text tables."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..utils.io import atomic_write_text, json_dumps, save_figure

__all__ = ["MetricsLog", "format_table", "plot_history"]


class MetricsLog:
    """Prints (main process only) and appends JSON records to ``<output>/metrics.jsonl``.

    ``keep_records``: when resuming, the file is cut back to the records the checkpoint had seen, so records of
    steps that are about to be redone are not duplicated; ``source`` is the metrics file of the run being resumed
    when it lives in another folder. Non-finite numbers are written as null (JSON has no NaN).
    """

    def __init__(self, output: Path, enabled: bool, keep_records: Optional[int] = None,
                 source: Optional[Path] = None) -> None:
        self.enabled = enabled
        self.path = Path(output) / "metrics.jsonl"
        self.records = 0
        if not enabled:
            return
        kept: List[str] = []
        source = Path(source) if source is not None else self.path
        if keep_records and source.is_file():
            kept = source.read_text().splitlines()[:keep_records]
        atomic_write_text("".join(line + "\n" for line in kept), self.path)
        self.records = len(kept)

    def info(self, message: str) -> None:
        if self.enabled:
            print(message, flush=True)

    def record(self, kind: str, **fields: Any) -> None:
        """Append one ``{"type": kind, ...}`` JSON line (with a wall-clock ``time``)."""
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json_dumps({"type": kind, **fields, "time": round(time.time(), 3)}) + "\n")
        self.records += 1


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned plain-text table (numbers as given: format them before)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_history(history: Sequence[Mapping[str, Any]], keys: Sequence[str], path: Path, title: str = "",
                 references: Optional[Dict[str, float]] = None, reference_label: str = "") -> Optional[Path]:
    """One panel per key of ``history`` (e.g. losses, accuracies) against epoch, with ``references[key]`` (e.g. the
    random-init accuracy) as a dashed line, written as a PNG to ``path``; None when no key has values."""
    keys = [k for k in keys if any(r.get(k) is not None for r in history)]
    if not keys:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        points = [(r["epoch"], r[key]) for r in history if r.get(key) is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        if references and references.get(key) is not None:
            ax.axhline(references[key], linestyle="--", color="gray", label=reference_label or None)
            if reference_label:
                ax.legend(fontsize=8)
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
