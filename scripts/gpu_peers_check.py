"""The newer kinds' GPU criteria, read off the sweep ``scripts/gpu_check.py`` (run 1) writes
(``attention_peers_b128.json``: ``simattn bench attention --device cuda`` at B 128, H 6, d 64, bf16, eager times):
one line per criterion with its numbers and PASS or FAIL.

* Each linear-family kind on its kernels (SLAB, FLatten, InLine, PolaFormer, Agent): forward+backward at or under
  flash attention's time at every N ≥ 577.
* Sigmoid attention's kernel: within 1.2× of flash attention's time at every N, forward and forward+backward.

A row that is missing or ran into an error is a FAIL line. Usage: ``python scripts/gpu_peers_check.py FILE``; exit
code 1 when any criterion fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

LINEAR_KINDS = ("slab_triton", "flatten_triton", "inline_triton", "polaformer_triton", "agent_triton")
LINEAR_FROM_TOKENS = 577
SIGMOID_WITHIN = 1.2
FLASH = "sdpa_flash"


def verdict_lines(rows: List[dict]) -> List[str]:
    """The criteria's lines for the sweep's result rows (each with kind, pass, tokens and median_ms or error)."""
    ran: Dict[Tuple[str, str, int], dict] = {(r["kind"], r["pass"], r["tokens"]): r for r in rows}
    tokens = sorted({r["tokens"] for r in rows})
    checks = [(kind, "fwd+bwd", n, 1.0) for kind in LINEAR_KINDS for n in tokens if n >= LINEAR_FROM_TOKENS]
    checks += [("sigmoid_triton", pass_, n, SIGMOID_WITHIN) for pass_ in ("fwd", "fwd+bwd") for n in tokens]
    lines = []
    for kind, pass_, n, within in checks:
        row, flash = ran.get((kind, pass_, n)), ran.get((FLASH, pass_, n))
        what = f"{kind} {pass_} N={n}"
        broken = [f"{name}: {r.get('error', 'no row') if r else 'no row'}" for name, r in ((kind, row), (FLASH, flash))
                  if r is None or "error" in r]
        if broken:
            lines.append(f"FAIL {what}: " + "; ".join(broken))
            continue
        ratio = row["median_ms"] / flash["median_ms"]
        ok = ratio <= within
        lines.append(f"{'PASS' if ok else 'FAIL'} {what}: {row['median_ms']:.3f} ms, flash {flash['median_ms']:.3f} "
                     f"ms: {ratio:.2f}x flash's time (want <= {within}x)")
    if not checks:
        lines.append("FAIL: the sweep has no rows")
    return lines


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_peers_check.py attention_peers_b128.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"FAIL: no file {path} (see the sweep's log)")
        return 1
    data = json.loads(path.read_text())
    lines = verdict_lines(data["rows"] if "rows" in data else data["results"])  # "results": sweeps before {meta, rows}
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
