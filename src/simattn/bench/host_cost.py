"""``simattn bench attention --host-cost``: the microseconds of Python work per SimA Triton call, without a GPU.

SimA's public path, ``sima_attention(q, k, v, backend="triton")`` and its backward through autograd, runs on tiny
CPU tensors inside :func:`simattn.attention.linear_triton.dry_run`, which runs the whole host path (checks, the
choice of backend and order, the launch plan, autograd, allocating the outputs) and skips the kernel launches: what
is timed is what a call costs the host, the part a GPU waits for in eager mode. Beside it,
``F.scaled_dot_product_attention`` (kind ``sdpa``) on the same tiny tensors: its host path plus a CPU computation
small enough not to matter. Each figure is a mean over a batch of back-to-back calls with Python's garbage collector
paused; the rows give the median over batches and rounds with p10 and p90, and ``x_sdpa`` is SimA's median over
SDPA's for the same pass. The kinds alternate batch by batch, so a drift in the machine's load hits both alike.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from .report import relative_spread

__all__ = ["KINDS", "PASSES", "SHAPE", "host_fns", "measure", "add_ratios", "format_rows", "summary", "spread_rows"]

KINDS = ("sima", "sdpa")
PASSES = ("fwd", "fwd+bwd")
#: (B, H, N, d) of the tiny tensors: the host path does not depend on the size
SHAPE = (2, 2, 16, 16)


def host_fns() -> Dict[Tuple[str, str], Callable[[], object]]:
    """One call of each (kind, pass) on tiny fp32 CPU tensors: the forward on tensors that need no gradient, the
    forward and backward (``torch.autograd.grad``) on leaves that do."""
    from ..attention.sima import sima_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, generator=gen) for _ in range(3))
    leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(*SHAPE, generator=gen)
    ops = {"sima": lambda *qkv: sima_attention(*qkv, backend="triton"),
           "sdpa": lambda *qkv: F.scaled_dot_product_attention(*qkv)}
    fns = {}
    for kind, op in ops.items():
        fns[(kind, "fwd")] = lambda op=op: op(q, k, v)
        fns[(kind, "fwd+bwd")] = lambda op=op: torch.autograd.grad(op(*leaves), leaves, grad)
    return fns


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def measure(repeats: int, rounds: int, calls: int = 200, fns=None) -> List[dict]:
    """Rows (kind, pass, host_us with its p10 and p90 over ``repeats`` batches of ``calls`` calls in each of
    ``rounds`` rounds, spread), ratios added by :func:`add_ratios`. Runs within ``dry_run()``."""
    from ..attention.linear_triton import dry_run

    samples: Dict[Tuple[str, str], List[float]] = {}
    with dry_run():
        fns = fns or host_fns()
        for fn in fns.values():  # plans, caches and lazy initialization, untimed
            _per_call_us(fn, 20)
        enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(rounds * repeats):  # one batch of each in turn: a drift in the load hits all alike
                for key, fn in fns.items():
                    samples.setdefault(key, []).append(_per_call_us(fn, calls))
        finally:
            if enabled:
                gc.enable()
    rows = []
    for (kind, pass_), times in samples.items():
        times = sorted(times)
        rank = lambda p: times[min(len(times) - 1, int(round(p * (len(times) - 1))))]  # noqa: E731 - nearest rank
        median = statistics.median(times)
        rows.append({"kind": kind, "pass": pass_, "host_us": median, "host_us_p10": rank(0.1),
                     "host_us_p90": rank(0.9), "spread": relative_spread(rank(0.1), rank(0.9), median),
                     "calls": calls * len(times)})
    return add_ratios(rows)


def add_ratios(rows: List[dict]) -> List[dict]:
    """``x_sdpa``: host_us over SDPA's for the same pass (None where SDPA was not timed)."""
    sdpa = {r["pass"]: r["host_us"] for r in rows if r["kind"] == "sdpa"}
    for r in rows:
        r["x_sdpa"] = r["host_us"] / sdpa[r["pass"]] if sdpa.get(r["pass"]) else None
    return rows


def format_rows(rows: List[dict]) -> str:
    head = f"{'kind':<6} {'pass':<8} {'host µs':>9} {'p10 µs':>8} {'p90 µs':>8} {'x SDPA':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['x_sdpa']:.2f}" if r["x_sdpa"] is not None else "-"
        lines.append(f"{r['kind']:<6} {r['pass']:<8} {r['host_us']:>9.1f} {r['host_us_p10']:>8.1f} "
                     f"{r['host_us_p90']:>8.1f} {ratio:>7}")
    return "\n".join(lines)


def summary(rows: List[dict], machine: str) -> str:
    """One line: SimA's host cost per forward and per forward+backward, in µs and as a multiple of SDPA's, and the
    machine."""
    sima = {r["pass"]: r for r in rows if r["kind"] == "sima"}
    parts = [f"{p} {sima[p]['host_us']:.1f} µs ({sima[p]['x_sdpa']:.2f}x SDPA's)" for p in PASSES
             if p in sima and sima[p]["x_sdpa"] is not None]
    return f"SimA Triton host cost per call: {', '.join(parts)}; on {machine}"


def spread_rows(rows: List[dict]) -> Dict[str, float]:
    """name → relative spread, for :func:`simattn.bench.report.spread_warning`."""
    return {f"{r['kind']} {r['pass']}": r["spread"] for r in rows}
