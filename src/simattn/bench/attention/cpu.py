"""``bench attention`` on CPU: every kind's forward latency by token count, against softmax SDPA, the official SimA
and SimA's two matmuls alone (the floor), interleaved round by round."""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from typing import Callable, Dict, List, Optional

import torch

from ...kernels.cpu import sima as sima_cpu
from ...utils.timing import keep_freed_memory, set_threads, time_fn
from ..report import WIDE_SPREAD, cpu_info, fmt_ms, quiet_advice, relative_spread, spread_warning
from .kinds import finish, kind_fn, make_qkv

TOKENS = (64, 197, 785, 3137, 9217)


def batch_for(n: int) -> int:
    """Batch 8 at N = 197 (DeiT at 224 px, a typical inference batch), batch 1 elsewhere."""
    return 8 if n == 197 else 1


def run(tokens: List[int], kinds: List[str], heads: int, head_dim: int, threads: int, repeats: int,
        device: str, dtype: torch.dtype, max_seconds: float, layout: str = "qkv", rounds: int = 3) -> List[dict]:
    """Latency of every kind at every token count: per round the median, p10 and p90 of ``repeats`` runs, then
    the median of each over ``rounds`` interleaved rounds; ratios added by :func:`add_ratios`."""
    rows = []
    for i, n in enumerate(tokens):
        b = batch_for(n)
        q, k, v = make_qkv(b, heads, n, head_dim, layout, torch.Generator().manual_seed(n), device, dtype)
        fns: Dict[str, Callable] = {kind: kind_fn(kind, q, k, v, heads, head_dim) for kind in kinds}
        if i == 0:  # one untimed pass of every kind first: thread pools and lazy initialization
            with torch.inference_mode():
                for fn in fns.values():
                    fn(q, k, v)
        per_round: Dict[str, List[dict]] = {kind: [] for kind in kinds}
        for r in range(rounds):  # kinds interleaved round by round, so a drift in the machine hits them all alike
            for kind, fn in fns.items():
                with torch.inference_mode():
                    t = time_fn(lambda: fn(q, k, v), warmup=2, repeats=repeats, device=device, max_time=max_seconds)
                per_round[kind].append(t)
                print(f"  round {r + 1}/{rounds} N={n:5d} B={b} {kind:<14} {fmt_ms(t['median_ms']):>11}  "
                      f"({t['runs']} runs)", file=sys.stderr, flush=True)
        for kind in kinds:
            stats = {key: statistics.median(t[key] for t in per_round[kind])
                     for key in ("median_ms", "p10_ms", "p90_ms")}
            rows.append({"kind": kind, "tokens": n, "batch": b, "heads": heads, "head_dim": head_dim,
                         "layout": layout, **stats,
                         "spread": relative_spread(stats["p10_ms"], stats["p90_ms"], stats["median_ms"])})
    return add_ratios(rows)


def add_ratios(rows: List[dict]) -> List[dict]:
    """Per token count: ``speedup_vs_sdpa`` (softmax time / time), ``speedup_vs_official_sima`` (official SimA
    time / time) and ``x_floor`` (time / SimA's two matmuls alone); None where the reference was not timed."""
    ref = {(r["kind"], r["tokens"]): r["median_ms"] for r in rows}
    for r in rows:
        n, ms = r["tokens"], r["median_ms"]
        sdpa, official, floor = (ref.get((k, n)) for k in ("softmax", "sima_official", "sima_matmuls"))
        r["speedup_vs_sdpa"] = sdpa / ms if sdpa else None
        r["speedup_vs_official_sima"] = official / ms if official else None
        r["x_floor"] = ms / floor if floor else None
    return rows


def format_table(rows: List[dict]) -> str:
    """The printed table: median with its p10-p90 range (µs under 1 ms), speed-ups (> 1: faster than the reference)
    and the time as a multiple of SimA's two matmuls alone (the floor)."""
    def ratio(x):
        return f"{x:.2f}" if x else "-"

    head = (f"{'kind':<14} {'N':>6} {'B':>3} {'median':>11} {'p10':>11} {'p90':>11} {'x vs SDPA':>10} "
            f"{'x vs official SimA':>19} {'x floor':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kind']:<14} {r['tokens']:>6} {r['batch']:>3} {fmt_ms(r['median_ms']):>11} "
                     f"{fmt_ms(r['p10_ms']):>11} {fmt_ms(r['p90_ms']):>11} {ratio(r['speedup_vs_sdpa']):>10} "
                     f"{ratio(r['speedup_vs_official_sima']):>19} {ratio(r['x_floor']):>8}")
    return "\n".join(lines)


def floor_warning(rows: List[dict]) -> Optional[str]:
    """One warning line naming the SimA timings under SimA's own floor (``x floor`` < 1: faster than its two
    matmuls alone, which no SimA implementation is), or None."""
    under = [r for r in rows if r["kind"].startswith("sima") and r["kind"] != "sima_matmuls"
             and r.get("x_floor") is not None and r["x_floor"] < 1]
    if not under:
        return None
    named = ", ".join(f"{r['kind']} N={r['tokens']} (x floor {r['x_floor']:.2f})" for r in under)
    return (f"warning: impossible ratio: {named} ran faster than SimA's two matmuls alone, which no SimA "
            f"implementation can; the machine's load changed between those timings, so their ratios are not "
            f"measurements. {quiet_advice()}")


def sima_note() -> str:
    """Which implementation the CPU sweep's ``sima`` row runs."""
    if sima_cpu.available():
        return "sima: SimA's CPU kernel (backend 'auto'); sima_torch: the same op in torch ops (backend 'torch')"
    return f"sima: SimA in torch ops, as sima_torch (its CPU kernel: {sima_cpu.unavailable_reason()})"


def table_notes(rows: List[dict]) -> List[str]:
    """What the ratio columns mean, which SimA implementation ran, and a warning line each when a SimA timing is under
    its floor or some timing's spread is wide."""
    notes = ["x vs SDPA, x vs official SimA: reference time / time (> 1 is faster); x floor: time / SimA's two "
             "matmuls alone (sima_matmuls), the least any SimA implementation can take here"]
    if any(r["kind"] == "sima" for r in rows):
        notes.append(sima_note())
    warnings = [floor_warning(rows),
                spread_warning({f"{r['kind']} N={r['tokens']}": r["spread"] for r in rows}, WIDE_SPREAD)]
    return notes + [w for w in warnings if w]


def main_cpu(args: argparse.Namespace) -> int:
    """The CPU sweep (see :mod:`simattn.bench.attention`)."""
    threads = set_threads(args.threads)
    allocator = keep_freed_memory() if args.keep_freed_memory else "system allocator defaults"
    cpu = cpu_info()
    features = ", ".join(cpu.get("cpu_features") or ["no feature list"])
    print(f"simattn bench attention: torch {torch.__version__}, device {args.device}, {threads} CPU threads "
          f"({cpu.get('cpu_name') or 'CPU name unknown'}: {features}), H={args.heads} d={args.head_dim} "
          f"{args.dtype}, {args.layout} q/k/v layout; {allocator}", flush=True)
    rows = run(args.tokens, args.kinds, args.heads, args.head_dim, threads, args.repeats, args.device,
               getattr(torch, args.dtype), args.max_seconds, args.layout, args.rounds)
    return finish(args.output, {**vars(args), "threads": threads, "allocator": allocator, "torch": torch.__version__,
                                "machine": platform.machine(), "processor": platform.processor(), **cpu,
                                "sima_cpu_kernel": sima_cpu.available()}, rows, format_table(rows), table_notes(rows))
