"""``simattn bench attention``: every attention kind's forward latency against softmax SDPA and the official SimA.

All kinds run in one process, interleaved per token count, on the same inputs and a fixed thread count, so the
printed ratios compare like with like. The functional ops are timed (no projections), which is exactly where the
kinds differ. By default q, k, v are what every module (timm's, the official SimA code's, ours) feeds its
attention: strided (B, H, N, d) views of one fused qkv projection (``--layout qkv``); ``--layout contiguous`` gives
each its own contiguous tensor instead.

The ``sima_matmuls`` row times SimA's two matrix products alone, on contiguous (B·H, N, d) operands made before
the clock starts: a floor that no SimA implementation can beat with this BLAS, printed beside each target.
"""
from __future__ import annotations

import argparse
import math
import os
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
#: Issue targets: SimA vs SDPA at N=197 (B=8) and N=9217, SimA vs official at every N >= 197.
TARGETS = {"sdpa_197": 5.0, "sdpa_9217": 150.0, "official": 2.0}


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
    """The issue's sweep: batch 8 at N = 197 (DeiT at 224 px), batch 1 elsewhere."""
    return 8 if n == 197 else 1


def run(tokens: List[int], kinds: List[str], heads: int, head_dim: int, threads: int, repeats: int,
        device: str, dtype: torch.dtype, max_seconds: float, layout: str = "qkv", rounds: int = 3) -> List[dict]:
    """Median latency of every kind at every token count: per round the median of ``repeats`` runs, then the
    median over ``rounds`` interleaved rounds."""
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
        per_round: Dict[str, List[float]] = {kind: [] for kind in kinds}
        for r in range(rounds):  # kinds interleaved round by round, so a drift in the machine hits them all alike
            for kind, fn in fns.items():
                with torch.inference_mode():
                    t = time_fn(lambda: fn(q, k, v), warmup=2, repeats=repeats, device=device, max_time=max_seconds)
                per_round[kind].append(t["median_ms"])
                print(f"  round {r + 1}/{rounds} N={n:5d} B={b} {kind:<14} {t['median_ms']:10.3f} ms  "
                      f"({t['runs']} runs)", file=sys.stderr, flush=True)
        times = {kind: statistics.median(ms) for kind, ms in per_round.items()}
        for kind in kinds:
            rows.append({
                "kind": kind, "tokens": n, "batch": b, "heads": heads, "head_dim": head_dim, "layout": layout,
                "median_ms": times[kind],
                "speedup_vs_sdpa": times["softmax"] / times[kind] if "softmax" in times else None,
                "speedup_vs_official_sima": times["sima_official"] / times[kind] if "sima_official" in times else None,
            })
    return rows


def format_table(rows: List[dict]) -> str:
    head = f"{'kind':<14} {'N':>6} {'B':>3} {'median ms':>11} {'x vs SDPA':>10} {'x vs official SimA':>19}"
    lines = [head, "-" * len(head)]
    for r in rows:
        sdpa = f"{r['speedup_vs_sdpa']:.2f}" if r["speedup_vs_sdpa"] else "-"
        off = f"{r['speedup_vs_official_sima']:.2f}" if r["speedup_vs_official_sima"] else "-"
        lines.append(f"{r['kind']:<14} {r['tokens']:>6} {r['batch']:>3} {r['median_ms']:>11.3f} {sdpa:>10} {off:>19}")
    return "\n".join(lines)


def check_targets(rows: List[dict]) -> List[str]:
    """One line per issue target that this run could check: PASS/MISS with the measured ratio."""
    ms = {(r["kind"], r["tokens"]): r["median_ms"] for r in rows}
    sima = {r["tokens"]: r for r in rows if r["kind"] == "sima"}
    out = []

    def line(x: float, target: float, what: str, baseline: str, n: int) -> str:
        needed = ms[(baseline, n)] / target
        floor = ms.get(("sima_matmuls", n))
        floor_note = f"; SimA's two matmuls alone take {floor:.3f} ms" if floor is not None else ""
        return (f"{'PASS' if x >= target else 'MISS'}  {what} at N={n}: {x:.2f}x (target >= {target:g}x needs "
                f"<= {needed:.3f} ms{floor_note})")

    for n, key in ((197, "sdpa_197"), (9217, "sdpa_9217")):
        if n in sima and sima[n]["speedup_vs_sdpa"]:
            out.append(line(sima[n]["speedup_vs_sdpa"], TARGETS[key], "SimA vs SDPA", "softmax", n))
    for n, r in sorted(sima.items()):
        if n >= 197 and r["speedup_vs_official_sima"]:
            out.append(line(r["speedup_vs_official_sima"], TARGETS["official"], "SimA vs official SimA",
                            "sima_official", n))
    return out


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="simattn bench attention", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS), help="token counts N")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), help="attention kinds")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads (fixed for the whole run)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per measurement (median reported)")
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
    if args.rounds < 1 or args.repeats < 1 or min(args.tokens) < 1:
        p.error("--rounds, --repeats and --tokens must be positive")
    for required in ("softmax", "sima_official"):
        if required not in args.kinds:
            args.kinds.insert(0, required)  # the ratios are against these two
    threads = set_threads(args.threads)
    allocator = keep_freed_memory() if args.keep_freed_memory else "system allocator defaults"
    print(f"simattn bench attention: torch {torch.__version__}, device {args.device}, {threads} CPU threads, "
          f"H={args.heads} d={args.head_dim} {args.dtype}, {args.layout} q/k/v layout; {allocator}", flush=True)
    rows = run(args.tokens, args.kinds, args.heads, args.head_dim, threads, args.repeats, args.device,
               getattr(torch, args.dtype), args.max_seconds, args.layout, args.rounds)
    print(format_table(rows))
    targets = check_targets(rows)
    print("\n".join(targets))
    atomic_write_json({
        "config": {**vars(args), "threads": threads, "allocator": allocator, "torch": torch.__version__, "machine": platform.machine(),
                   "processor": platform.processor()},
        "results": rows, "targets": targets,
    }, args.out)
    print(f"wrote {args.out}")
    return 0
