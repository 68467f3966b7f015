"""``simattn bench attention``: every attention kind's forward latency against softmax SDPA and the official SimA.

All kinds run in one process, interleaved per token count, on the same inputs and a fixed thread count, so the
printed ratios compare like with like. The functional ops are timed (no projections), which is exactly where the
kinds differ. By default q, k, v are what every module (timm's, the official SimA code's, ours) feeds its
attention: strided (B, H, N, d) views of one fused qkv projection (``--layout qkv``); ``--layout contiguous`` gives
each its own contiguous tensor instead.

The ``sima_matmuls`` row times SimA's two matrix products alone, on contiguous (B·H, N, d) operands made before
the clock starts: a floor that no SimA implementation can beat with this BLAS. Every kind's time is also printed as
a multiple of it (``x floor``: 1.0 would be SimA's matmuls alone).

The thread count defaults to torch's (``torch.get_num_threads()``, which follows ``OMP_NUM_THREADS``). Every median
comes with its p10 and p90, and a one-line warning names the timings whose p10-p90 range is wider than
:data:`simattn.bench.report.WIDE_SPREAD` of the median.
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
from typing import Callable, Dict, List

import torch

from ..attention import (elu_attention, relu_attention, sima_attention, sima_attention_reference, soft_attention,
                         softmax_attention, xca_attention, xnorm_attention)
from ..attention.sima import resolve_sima_order
from ..utils.io import atomic_write_json
from ..utils.timing import keep_freed_memory, set_threads, time_fn
from .report import WIDE_SPREAD, relative_spread, spread_warning

DEFAULT_TOKENS = (64, 197, 785, 3137, 9217)
#: (label, fn). 'sima_official' is the official normalize-then-multiply formulation, the baseline for SimA's fold.
KINDS: Dict[str, Callable] = {
    "softmax": softmax_attention,
    "sima": sima_attention,
    "sima_official": sima_attention_reference,
    "elu": elu_attention,
    "relu": relu_attention,
    "xca": xca_attention,
    "xnorm": xnorm_attention,
    "soft": None,  # needs a landmark ratio per N, see _soft
    "sima_matmuls": None,  # the floor, see _sima_matmuls
}
LAYOUTS = ("qkv", "contiguous")
#: kinds every run includes: the ratios are against them
REQUIRED = ("softmax", "sima_official", "sima_matmuls")


def _soft(n: int) -> Callable:
    side = math.isqrt(n - 1) if math.isqrt(n) ** 2 != n else math.isqrt(n)
    ratio = max(1, math.ceil(side / 7))  # ~49 landmarks, as SOFT uses at 224 px

    def fn(q, k, v):
        return soft_attention(q, q, v, ratio=ratio)

    return fn


def _sima_matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable:
    """SimA's two products alone (no norms, no scaling) on contiguous (B·H, N, d) copies made here, untimed."""
    B, H, n, d = q.shape
    q3, k3, v3 = [t.reshape(B * H, n, d).contiguous() for t in (q, k, v)]
    kv_first = resolve_sima_order("auto", n, n, d) == "kv_first"

    def fn(*_):
        if kv_first:
            return torch.bmm(q3, torch.bmm(k3.transpose(1, 2), v3)).view(B, H, n, d)
        return torch.bmm(torch.bmm(q3, k3.transpose(1, 2)), v3).view(B, H, n, d)

    return fn


def make_qkv(b: int, heads: int, n: int, head_dim: int, layout: str, gen: torch.Generator, device: str,
             dtype: torch.dtype) -> List[torch.Tensor]:
    """q, k, v of shape (B, H, N, d): views of one fused (B, N, 3, H, d) projection, or three contiguous tensors."""
    if layout == "qkv":
        fused = torch.randn(b, n, 3, heads, head_dim, generator=gen).to(device, dtype)
        return list(fused.permute(2, 0, 3, 1, 4).unbind(0))
    return [torch.randn(b, heads, n, head_dim, generator=gen).to(device, dtype) for _ in range(3)]


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
        fns = {kind: _soft(n) if kind == "soft" else _sima_matmuls(q, k, v) if kind == "sima_matmuls" else KINDS[kind]
               for kind in kinds}
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
                print(f"  round {r + 1}/{rounds} N={n:5d} B={b} {kind:<14} {t['median_ms']:10.3f} ms  "
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
    """The printed table: median with its p10-p90 range, speed-ups (> 1: faster than the reference) and the time
    as a multiple of SimA's two matmuls alone (the floor)."""
    def ratio(x):
        return f"{x:.2f}" if x else "-"

    head = (f"{'kind':<14} {'N':>6} {'B':>3} {'median ms':>11} {'p10 ms':>10} {'p90 ms':>10} {'x vs SDPA':>10} "
            f"{'x vs official SimA':>19} {'x floor':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kind']:<14} {r['tokens']:>6} {r['batch']:>3} {r['median_ms']:>11.3f} {r['p10_ms']:>10.3f} "
                     f"{r['p90_ms']:>10.3f} {ratio(r['speedup_vs_sdpa']):>10} "
                     f"{ratio(r['speedup_vs_official_sima']):>19} {ratio(r['x_floor']):>8}")
    return "\n".join(lines)


def table_notes(rows: List[dict]) -> List[str]:
    """What the ratio columns mean, and a warning line when some timing's spread is wide."""
    notes = ["x vs SDPA, x vs official SimA: reference time / time (> 1 is faster); x floor: time / SimA's two "
             "matmuls alone (sima_matmuls), the least any SimA implementation can take here"]
    warning = spread_warning({f"{r['kind']} N={r['tokens']}": r["spread"] for r in rows}, WIDE_SPREAD)
    return notes + ([warning] if warning else [])


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="simattn bench attention", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS), help="token counts N")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), help="attention kinds")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, fixed for the whole run (default: torch's count, which follows OMP_NUM_THREADS)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per measurement (median, p10, p90 reported)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the kinds (median reported)")
    p.add_argument("--max-seconds", type=float, default=10.0, help="stop repeating a measurement after this long")
    p.add_argument("--layout", default="qkv", choices=LAYOUTS,
                   help="q, k, v as views of one fused qkv projection (what modules run) or contiguous tensors")
    p.add_argument("--no-keep-freed-memory", dest="keep_freed_memory", action="store_false",
                   help="leave glibc's trim/mmap defaults (calls then page-fault their buffers in, noisily)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--out", default="runs/bench_attention.json", help="JSON results file")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or min(args.tokens) < 1 or (args.threads is not None and args.threads < 1):
        p.error("--rounds, --repeats, --threads and --tokens must be positive")
    for required in reversed(REQUIRED):
        if required not in args.kinds:
            args.kinds.insert(0, required)  # the ratios are against these
    threads = set_threads(args.threads)
    allocator = keep_freed_memory() if args.keep_freed_memory else "system allocator defaults"
    print(f"simattn bench attention: torch {torch.__version__}, device {args.device}, {threads} CPU threads, "
          f"H={args.heads} d={args.head_dim} {args.dtype}, {args.layout} q/k/v layout; {allocator}", flush=True)
    rows = run(args.tokens, args.kinds, args.heads, args.head_dim, threads, args.repeats, args.device,
               getattr(torch, args.dtype), args.max_seconds, args.layout, args.rounds)
    print(format_table(rows))
    notes = table_notes(rows)
    print("\n".join(notes))
    atomic_write_json({
        "config": {**vars(args), "threads": threads, "allocator": allocator, "torch": torch.__version__,
                   "machine": platform.machine(), "processor": platform.processor(), "wide_spread": WIDE_SPREAD},
        "results": rows, "notes": notes,
    }, args.out)
    print(f"wrote {args.out}")
    return 0
