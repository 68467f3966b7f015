"""What a run tells people: progress lines (rank 0 only), ``metrics.jsonl`` records, and plain-text tables."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

from ..utils.io import atomic_write_text, json_dumps

__all__ = ["MetricsLog", "format_table"]


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
