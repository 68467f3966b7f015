"""The per-class IoU bar chart of a segmentation run's report."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["plot_class_iou"]


def plot_class_iou(per_class: Dict[str, Dict[str, Any]], path: Path, title: str = "",
                   miou: Optional[float] = None) -> Optional[Path]:
    """Horizontal bars of each class's IoU (classes never seen nor predicted are left out), written as a PNG, with
    the mIoU line at ``miou`` (the evaluation's; else the mean of the bars), labelled as the title gives it."""
    rows = [(name, v["iou"]) for name, v in per_class.items() if v.get("iou") is not None]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..utils.io import atomic_write_bytes
    import io
    names, values = zip(*rows)
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.22 * len(rows) + 1)))
    ax.barh(range(len(rows)), values, color="tab:blue")
    ax.set_yticks(range(len(rows)), names, fontsize=8 if len(rows) < 40 else 5)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("IoU (%)")
    mean = miou if miou is not None else sum(values) / len(values)
    ax.axvline(mean, color="k", ls="--", lw=1, label=f"mIoU {mean:.2f}")
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(buffer.getvalue(), path)
    return path
