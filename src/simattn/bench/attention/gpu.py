"""``bench attention --device cuda``: every kind with GPU kernels, in torch and on its kernels, against softmax SDPA,
forward and forward+backward, timed between CUDA events eagerly and from a CUDA graph
(:func:`simattn.utils.timing.cuda_times`), with the bandwidth reached and each op's roofline."""
from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Dict, List, Optional

import torch

from ...utils.io import atomic_write_json
from ...utils.timing import cuda_times
from ..report import fmt_ms, relative_spread, rounds_median, triton_version
from .kinds import finish, kind_fn, make_qkv

TOKENS = (197, 1024, 4096, 16384)
PASSES = ("fwd", "fwd+bwd")
#: peak HBM bandwidth (GB/s, vendor figures) by a substring of ``torch.cuda.get_device_name()``, first match wins
HBM_GBPS = {"GH200": 4000, "H200": 4800, "H100 PCIe": 2000, "H100 NVL": 3900, "H100": 3350, "H800": 3350,
            "B200": 8000, "A100-PCIE-40GB": 1555, "A100-SXM4-40GB": 1555, "A100": 2039, "A800": 2039,
            "L40S": 864, "L4": 300, "A10": 600, "RTX 4090": 1008, "RTX 3090": 936, "V100": 900, "T4": 320}
DEFAULT_HBM_GBPS = 4800  # H200: the figure used when the device is not in HBM_GBPS and --hbm-gbps is not given


def hbm_gbps(device: torch.device) -> tuple:
    """(peak HBM GB/s, where the figure comes from) for a CUDA device, from :data:`HBM_GBPS` by name."""
    name = torch.cuda.get_device_name(device)
    for key, gbps in HBM_GBPS.items():
        if key in name:
            return gbps, f"{name}: {gbps} GB/s"
    return DEFAULT_HBM_GBPS, f"{name}: not in the table, {DEFAULT_HBM_GBPS} GB/s assumed (set --hbm-gbps)"


def min_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, pass_: str) -> int:
    """Bytes any implementation must move: forward reads q, k, v and writes the output; the backward pass reads
    q, k, v and the output gradient and writes dq, dk, dv."""
    io = sum(t.numel() * t.element_size() for t in (q, k, v))
    out_bytes = out.numel() * out.element_size()
    return io + out_bytes if pass_ == "fwd" else 2 * (io + out_bytes) + io


def run_gpu(tokens: List[int], kinds: List[str], batch: int, heads: int, head_dim: int, dtype: torch.dtype,
            device: str, peak_gbps: float, passes: List[str] = list(PASSES), layout: str = "qkv",
            repeats: int = 20, rounds: int = 1, timer: Optional[Callable] = None) -> List[dict]:
    """Every kind × pass × token count: the times of ``timer(fn)`` (default :func:`cuda_times`: eager median, p10,
    p90 and the CUDA graph's), each the median over ``rounds`` interleaved rounds, the bytes the op must move, the
    bandwidth achieved on them and the roofline time at ``peak_gbps``; a kind that cannot run (e.g. flash SDPA in
    fp32) gives a row with ``error``."""
    dev = torch.device(device)
    timer = timer or (lambda fn: cuda_times(fn, dev, repeats=repeats))
    if "sima_compile" in kinds:
        # one graph per N and grad mode: past dynamo's recompile limit (8) it would silently run eager
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 4 * len(tokens) * len(passes))
    rows = []
    for n in tokens:
        q, k, v = make_qkv(batch, heads, n, head_dim, layout, torch.Generator().manual_seed(n), device, dtype)
        fns = {kind: kind_fn(kind, q, k, v, heads, head_dim, sweep="cuda") for kind in kinds}
        # leaves that keep the views' strides: the backward pass differentiates the very tensors the forward reads
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        per_round: Dict[tuple, List[dict]] = {}
        errors: Dict[tuple, str] = {}
        sizes: Dict[tuple, int] = {}
        for r in range(rounds):
            for kind, fn in fns.items():
                for pass_ in passes:
                    key = (kind, pass_)
                    if key in errors:
                        continue
                    try:
                        with torch.no_grad():
                            out = fn(q, k, v)
                        grad = torch.randn_like(out)
                        sizes[key] = min_bytes(q, k, v, out, pass_)
                        if pass_ == "fwd":
                            def call(fn=fn, qkv=(q, k, v)):
                                with torch.no_grad():
                                    return fn(*qkv)
                        else:
                            def call(fn=fn, qkv=(q, k, v), grad=grad):
                                return torch.autograd.grad(fn(*qkv), qkv, grad)
                        t = timer(call)
                    except Exception as e:  # noqa: BLE001 - no kernel for this dtype/shape, out of memory, ...:
                        # that contender's row says why, the others are still measured
                        errors[key] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                        print(f"  N={n:6d} {kind:<15} {pass_:<8} failed: {errors[key]}", file=sys.stderr, flush=True)
                        continue
                    per_round.setdefault(key, []).append(t)
                    graph = f", graph {fmt_ms(t['graph_ms'])}" if "graph_ms" in t else ""
                    print(f"  round {r + 1}/{rounds} N={n:6d} {kind:<15} {pass_:<8} {fmt_ms(t['median_ms']):>11}"
                          f"{graph}", file=sys.stderr, flush=True)
        for kind in kinds:
            for pass_ in passes:
                key = (kind, pass_)
                row = {"kind": kind, "pass": pass_, "tokens": n, "batch": batch, "heads": heads, "head_dim": head_dim,
                       "dtype": str(dtype).replace("torch.", ""), "layout": layout}
                if key in errors:
                    rows.append({**row, "error": errors[key]})
                    continue
                stats = rounds_median(per_round[key])
                rows.append({**row, **stats, "bytes": sizes[key],
                             "spread": relative_spread(stats["p10_ms"], stats["p90_ms"], stats["median_ms"])})
    return add_roofline(rows, peak_gbps)


def add_roofline(rows: List[dict], peak_gbps: float) -> List[dict]:
    """``host_ms`` (eager time - graph time; None without a graph time), ``gbps`` (bytes / time), ``roofline_ms``
    (bytes at ``peak_gbps``), ``roofline_frac`` (roofline / time) and ``speedup_vs_sdpa`` (the faster SDPA backend's
    time / time, same N and pass; None where none ran), all on the eager time."""
    sdpa: Dict[tuple, float] = {}
    for r in rows:
        if r["kind"].startswith("sdpa") and "error" not in r:
            key = (r["tokens"], r["pass"])
            sdpa[key] = min(sdpa.get(key, math.inf), r["median_ms"])
    for r in rows:
        if "error" in r:
            continue
        ms = r["median_ms"]
        r["host_ms"] = ms - r["graph_ms"] if r.get("graph_ms") is not None else None
        r["gbps"] = r["bytes"] / ms / 1e6
        r["roofline_ms"] = r["bytes"] / peak_gbps / 1e6
        r["roofline_frac"] = r["roofline_ms"] / ms
        best = sdpa.get((r["tokens"], r["pass"]))
        r["speedup_vs_sdpa"] = best / ms if best else None
    return rows


def table_points(rows: List[dict], capability: str, measured: dict) -> List[dict]:
    """SimA's backend table's points from a sweep (:func:`simattn.attention.backends.gpu_table`): per pass and N
    where both ``sima_triton`` and ``sima`` (torch) ran, their GPU times (the graph's, the eager one where a call was
    too long to replay), keyed by the compute ``capability``, dtype, head dim, B·H and N; ``measured`` (the GPU's
    name, torch and Triton) is kept with each."""
    time = {(r["kind"], r["pass"], r["tokens"]): r for r in rows if "error" not in r}
    points = []
    for (kind, pass_, n), triton in sorted(time.items(), key=lambda item: (item[0][1], item[0][2])):
        torch_row = time.get(("sima", pass_, n))
        if kind != "sima_triton" or torch_row is None:
            continue
        gpu_ms = [r["graph_ms"] if r.get("graph_ms") is not None else r["median_ms"] for r in (triton, torch_row)]
        points.append({"capability": capability, "dtype": triton["dtype"], "head_dim": triton["head_dim"],
                       "pass": pass_, "bh": triton["batch"] * triton["heads"], "tokens": n,
                       "triton_ms": gpu_ms[0], "torch_ms": gpu_ms[1], **measured})
    return points


_POINT_KEY = ("capability", "dtype", "head_dim", "pass", "bh", "tokens")


def write_backend_table(points: List[dict], path: str) -> dict:
    """SimA's backend table at ``path`` (updated where it exists, else a copy of the package's) with ``points``: a
    point measured again replaces the old one; the others stay as they are."""
    import json
    from pathlib import Path

    from ...attention.backends import gpu_table

    table = json.loads(Path(path).read_text()) if Path(path).exists() else dict(gpu_table())
    new = {tuple(p[k] for k in _POINT_KEY) for p in points}
    kept = [p for p in table.get("points", []) if tuple(p[k] for k in _POINT_KEY) not in new]
    table["points"] = sorted(kept + points, key=lambda p: tuple(p[k] for k in _POINT_KEY))
    atomic_write_json(table, path)
    return table


def format_gpu_table(rows: List[dict]) -> str:
    """The GPU table: eager median with p10-p90, the CUDA graph's time and the host's share (eager - graph),
    achieved bandwidth, the roofline time, the share of the peak HBM bandwidth reached (= roofline / time),
    speed-up over the faster SDPA backend. Times under 1 ms in µs."""
    head = (f"{'kind':<15} {'pass':<8} {'N':>6} {'median':>11} {'p10':>11} {'p90':>11} {'graph':>11} {'host':>11} "
            f"{'GB/s':>7} {'roofline':>11} {'% HBM':>7} {'x vs SDPA':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['kind']:<15} {r['pass']:<8} {r['tokens']:>6} not run: {r['error'][:80]}")
            continue
        up = f"{r['speedup_vs_sdpa']:.2f}" if r.get("speedup_vs_sdpa") else "-"
        lines.append(f"{r['kind']:<15} {r['pass']:<8} {r['tokens']:>6} {fmt_ms(r['median_ms']):>11} "
                     f"{fmt_ms(r['p10_ms']):>11} {fmt_ms(r['p90_ms']):>11} {fmt_ms(r.get('graph_ms')):>11} "
                     f"{fmt_ms(r.get('host_ms')):>11} {r['gbps']:>7.0f} {fmt_ms(r['roofline_ms']):>11} "
                     f"{100 * r['roofline_frac']:>6.1f}% {up:>10}")
    return "\n".join(lines)


def main_gpu(args: argparse.Namespace) -> int:
    """``--device cuda``: the GPU sweep (see :mod:`simattn.bench.attention`)."""
    device = torch.device(args.device)
    peak, source = (args.hbm_gbps, f"--hbm-gbps {args.hbm_gbps:g}") if args.hbm_gbps else hbm_gbps(device)
    dtype = getattr(torch, args.dtype)
    versions = {"torch": torch.__version__, "triton": triton_version()}
    print(f"simattn bench attention: torch {versions['torch']}, Triton {versions['triton']}, "
          f"{torch.cuda.get_device_name(device)}, B={args.batch} "
          f"H={args.heads} d={args.head_dim} {args.dtype}, {args.layout} q/k/v layout; peak HBM {source}", flush=True)
    rows = run_gpu(args.tokens, args.kinds, args.batch, args.heads, args.head_dim, dtype, args.device, peak,
                   args.passes, args.layout, args.repeats, args.rounds)
    notes = [f"bytes: the least any implementation moves (forward: q, k, v in, output out; backward: q, k, v and the "
             f"output gradient in, three gradients out); roofline: those bytes at {peak:g} GB/s; x vs SDPA: the "
             f"faster SDPA backend's time / time (> 1 is faster); % HBM: bytes / time / peak; graph: the same calls "
             f"replayed from a CUDA graph (GPU time alone); host: median - graph, the host's work the GPU waited for"]
    finish(args.output, {**vars(args), "device_name": torch.cuda.get_device_name(device), "hbm_gbps": peak,
                         "hbm_source": source, **versions}, rows, format_gpu_table(rows), notes,
           {f"{r['kind']} {r['pass']} N={r['tokens']}": r.get("spread") for r in rows})
    if args.write_table:
        from ...attention.backends import gpu_capability

        capability = gpu_capability(device)
        points = table_points(rows, capability, {"gpu": torch.cuda.get_device_name(device), **versions})
        write_backend_table(points, args.write_table)
        faster = sum(p["triton_ms"] <= p["torch_ms"] for p in points)
        print(f"wrote {args.write_table}: {len(points)} points for {capability} (Triton at least as fast as torch "
              f"at {faster})")
    return 0


