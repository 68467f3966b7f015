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
comes with its p10 and p90; tables print times under 1 ms in µs (the JSON fields keep their unit in their name,
``median_ms``). A warning line names the timings whose p10-p90 range is wider than
:data:`simattn.bench.report.WIDE_SPREAD` of the median, another the SimA timings under their own floor (``x floor``
below 1, which no SimA implementation can reach: the machine's load changed between the measurements), and both say
how to measure quietly.

``--device cuda`` runs the GPU sweep instead (:func:`run_gpu`): SimA in torch (``sima``), under ``torch.compile``
(``sima_compile``) and as the fused Triton kernels (``sima_triton``) against softmax SDPA with its flash and
memory-efficient backends (``sdpa_flash``, ``sdpa_efficient``), ELU linear attention and XNorm (``elu``, ``xnorm``:
their forward is the same fused kernel's, their forward+backward torch ops), the newer linear kinds on the same
skeleton (``slab_triton``, ``flatten_triton``, ``inline_triton``, ``polaformer_triton``), sigmoid and ReLU
attention's flash-style Triton kernels (``sigmoid_triton``, ``relu_triton``) and Agent attention in torch
(``agent``) and on its Triton kernels (``agent_triton``; N less a square grid's tokens is its prefix), forward and
forward+backward, B = 8, H = 16, d = 64, bf16 by default. Each time is a mean per call over back-to-back calls
between CUDA events (:func:`cuda_times`): eagerly (``median_ms``: what a user's loop sees, host work included) and
replayed from a CUDA graph (``graph_ms``: GPU time alone; ``host_ms`` is the difference). Beside each time: the
bandwidth achieved on the bytes the op must move at least (forward: read q, k, v, write the output; backward: read
q, k, v and the output gradient, write the three gradients) and the time those bytes take at the GPU's peak HBM
bandwidth (the op's roofline; ``--hbm-gbps``, default from :data:`HBM_GBPS` by device name), and the share of that
peak the row reaches (``% HBM``: bytes / time / peak). The JSON names the GPU, torch and Triton.
``--write-table PATH`` also writes SimA's backend table (:func:`simattn.attention.backends.gpu_table`) with this
sweep's points (:func:`table_points`): per pass and N, the GPU times of ``sima_triton`` and ``sima``, for ``auto``.
Without a CUDA device it stops at once with a one-line error (exit code 2).

``--host-cost`` measures the host's work per Triton call of one kind per kernel family instead, on CPU
(:mod:`simattn.bench.host_cost`).
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
from typing import Callable, Dict, List, Optional

import torch

from ..attention import (agent_attention, elu_attention, flatten_attention, inline_attention, polaformer_attention,
                         relu_attention, sigmoid_attention, sima_attention, sima_attention_reference,
                         slab_attention, soft_attention, softmax_attention, xca_attention, xnorm_attention)
from ..attention.sima import resolve_sima_order
from ..kernels.cpu import sima as sima_cpu
from ..utils.io import atomic_write_json
from ..utils.timing import keep_freed_memory, set_threads, time_fn
from .cli import check_bench_flags, check_out, refuse_unused, require_cuda
from .report import WIDE_SPREAD, cpu_info, fmt_ms, quiet_advice, relative_spread, spread_warning

DEFAULT_TOKENS = (64, 197, 785, 3137, 9217)
#: (label, fn). 'sima_official' is the official normalize-then-multiply formulation, the baseline for SimA's fold.
KINDS: Dict[str, Callable] = {
    "softmax": softmax_attention,
    "sima": sima_attention,  # SimA's 'auto' backend: the compiled CPU kernel where it is built (see sima_note)
    "sima_torch": lambda q, k, v: sima_attention(q, k, v, backend="torch"),
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

# ------------------------------------------------------------------ the GPU sweep (--device cuda)
GPU_KINDS = ("sima", "sima_compile", "sima_triton", "sdpa_flash", "sdpa_efficient", "elu", "xnorm", "sigmoid_triton",
             "relu_triton", "slab_triton", "flatten_triton", "inline_triton", "polaformer_triton", "agent",
             "agent_triton")
GPU_TOKENS = (197, 1024, 4096, 16384)
PASSES = ("fwd", "fwd+bwd")
#: peak HBM bandwidth (GB/s, vendor figures) by a substring of ``torch.cuda.get_device_name()``, first match wins
HBM_GBPS = {"GH200": 4000, "H200": 4800, "H100 PCIe": 2000, "H100 NVL": 3900, "H100": 3350, "H800": 3350,
            "B200": 8000, "A100-PCIE-40GB": 1555, "A100-SXM4-40GB": 1555, "A100": 2039, "A800": 2039,
            "L40S": 864, "L4": 300, "A10": 600, "RTX 4090": 1008, "RTX 3090": 936, "V100": 900, "T4": 320}
DEFAULT_HBM_GBPS = 4800  # H200: the figure used when the device is not in HBM_GBPS and --hbm-gbps is not given


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


def token_kinds() -> List[str]:
    """The registered attention kinds the CPU sweep runs through their module's ``attend`` beside :data:`KINDS`:
    those that need no token grid (a kind added to the registry is measured without an entry here)."""
    from ..attention import get_attention_class, list_attentions
    return [name for name in list_attentions() if name not in KINDS
            and not (get_attention_class(name).uses_grid or get_attention_class(name).attend_uses_grid)]


def _module_attend(kind: str, heads: int, head_dim: int, device: str, dtype: torch.dtype) -> Callable:
    """``attend`` of a ``kind`` module (its default options) on (B, H, N, d) q, k, v, no mask."""
    from ..attention import create_attention
    module = create_attention(kind, heads * head_dim, num_heads=heads).to(device, dtype).eval()
    return lambda q, k, v: module.attend(q, k, v, None)


def _cpu_kinds(values: List[str]) -> Optional[str]:
    allowed = list(KINDS) + [k for k in GPU_KINDS if k not in KINDS] + token_kinds()
    bad = [v for v in values if v not in allowed]
    return f"{', '.join(map(repr, bad))} not allowed; allowed: some of {', '.join(allowed)}" if bad else None


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
        fns = {kind: _soft(n) if kind == "soft" else _sima_matmuls(q, k, v) if kind == "sima_matmuls" else
               KINDS[kind] if kind in KINDS else _module_attend(kind, heads, head_dim, device, dtype)
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


def gpu_fns(kinds: List[str]) -> Dict[str, Callable]:
    """The GPU contenders by name. The compiled SimA is built here and specializes on first call per shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return fn

    def sima(backend):
        def fn(q, k, v):
            return sima_attention(q, k, v, backend=backend)
        return fn

    table = {"sima": lambda: sima("torch"), "sima_compile": lambda: torch.compile(sima("torch"), dynamic=False),
             "sima_triton": lambda: sima("triton"), "sdpa_flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa_efficient": lambda: sdpa(SDPBackend.EFFICIENT_ATTENTION),
             "elu": lambda: elu_attention, "xnorm": lambda: xnorm_attention,
             "sigmoid_triton": lambda: lambda q, k, v: sigmoid_attention(q, k, v, backend="triton"),
             "relu_triton": lambda: lambda q, k, v: relu_attention(q, k, v, backend="triton"),
             "slab_triton": lambda: lambda q, k, v: slab_attention(q, k, v, backend="triton"),
             # the papers' settings: FLatten's focusing factor 3, PolaFormer's power 3 at initialization
             "flatten_triton": lambda: lambda q, k, v: flatten_attention(q, k, v, backend="triton"),
             "inline_triton": lambda: lambda q, k, v: inline_attention(q, k, v, backend="triton"),
             "polaformer_triton": lambda: lambda q, k, v: polaformer_attention(q, k, v, power=3.0, backend="triton"),
             # the 49 agents' two softmax steps in torch or on its kernels (the grid inferred from N)
             "agent": lambda: lambda q, k, v: agent_attention(q, k, v, backend="torch"),
             "agent_triton": lambda: lambda q, k, v: agent_attention(q, k, v, backend="triton")}
    return {kind: table[kind]() for kind in kinds}


#: GPU timing: a sample runs back-to-back calls for about this long (ms), and a measurement's samples about this
#: long (s) in all, 3 samples at least
SAMPLE_MS, MEASUREMENT_S = 2.0, 1.0
#: calls longer than this (ms) are not replayed from a CUDA graph: the host's work of one call (well under a
#: millisecond) hides behind the GPU's, so the eager time is the GPU time there
GRAPH_MAX_MS = 10.0


def _per_call_ms(run: Callable[[], object], calls: int, head_start: bool = False) -> float:
    """Mean ms per call of ``calls`` back-to-back calls between two CUDA events. ``head_start``: queue GPU work
    (about half a millisecond) before the first event, so that the host's launches run ahead of the GPU and only
    the GPU's time counts."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if head_start:
        torch.cuda._sleep(1_000_000)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _captured(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """``fn`` captured in a CUDA graph (after two calls on a side stream, as capture needs); returns its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _stats(times: List[float], prefix: str = "") -> Dict[str, float]:
    times = sorted(times)
    rank = lambda p: times[min(len(times) - 1, int(round(p * (len(times) - 1))))]  # noqa: E731 - nearest rank
    return {f"{prefix}median_ms": statistics.median(times), f"{prefix}p10_ms": rank(0.1),
            f"{prefix}p90_ms": rank(0.9)}


def cuda_times(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20) -> Dict:
    """Per-call times (ms) of ``fn``, each sample a mean over back-to-back calls between two CUDA events (about
    :data:`SAMPLE_MS`; up to ``repeats`` samples within about :data:`MEASUREMENT_S`, 3 at least): eagerly
    (``median_ms``, ``p10_ms``, ``p90_ms``: the host's work included wherever the GPU waits for it) and replayed
    from a CUDA graph (``graph_ms`` with ``graph_p10_ms``, ``graph_p90_ms``: GPU time alone; not for calls over
    :data:`GRAPH_MAX_MS`, nor where capture fails, ``graph_error``)."""
    for _ in range(warmup):
        fn()
    once = _per_call_ms(fn, 1)
    calls = max(1, min(200, round(SAMPLE_MS / max(once, 1e-3))))
    samples = max(3, min(repeats, math.ceil(MEASUREMENT_S * 1e3 / (calls * once))))
    out = {**_stats([_per_call_ms(fn, calls) for _ in range(samples)]), "calls": calls, "samples": samples}
    if once > GRAPH_MAX_MS:
        return out
    try:
        replay = _captured(fn, device)
    except Exception as e:  # noqa: BLE001 - an op that cannot be captured: its eager time stands alone
        torch.cuda.synchronize(device)
        return {**out, "graph_error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
    replay()
    stats = _stats([_per_call_ms(replay, calls, head_start=True) for _ in range(samples)], "graph_")
    return {**out, "graph_ms": stats["graph_median_ms"], "graph_p10_ms": stats["graph_p10_ms"],
            "graph_p90_ms": stats["graph_p90_ms"]}


def run_gpu(tokens: List[int], kinds: List[str], batch: int, heads: int, head_dim: int, dtype: torch.dtype,
            device: str, peak_gbps: float, passes: List[str] = list(PASSES), layout: str = "qkv",
            repeats: int = 20, rounds: int = 1, timer: Optional[Callable] = None) -> List[dict]:
    """Every kind × pass × token count: the times of ``timer(fn)`` (default :func:`cuda_times`: eager median, p10,
    p90 and the CUDA graph's), each the median over ``rounds`` interleaved rounds, the bytes the op must move, the
    bandwidth achieved on them and the roofline time at ``peak_gbps``; a kind that cannot run (e.g. flash SDPA in
    fp32) gives a row with ``error``."""
    dev = torch.device(device)
    timer = timer or (lambda fn: cuda_times(fn, dev, repeats=repeats))
    fns = gpu_fns(kinds)
    if "sima_compile" in kinds:
        # one graph per N and grad mode: past dynamo's recompile limit (8) it would silently run eager
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 4 * len(tokens) * len(passes))
    rows = []
    for n in tokens:
        q, k, v = make_qkv(batch, heads, n, head_dim, layout, torch.Generator().manual_seed(n), device, dtype)
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


def rounds_median(times: List[dict]) -> dict:
    """The median over rounds of each time (``*_ms``) the timer gave in every round; a graph capture's error kept."""
    out = {key: statistics.median(t[key] for t in times) for key in times[0]
           if key.endswith("_ms") and all(key in t for t in times)}
    errors = [t["graph_error"] for t in times if "graph_error" in t]
    return {**out, "graph_error": errors[0]} if errors else out


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

    from ..attention.backends import gpu_table

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


def triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def main_gpu(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    """``--device cuda``: the GPU sweep (see the module docstring)."""
    bad = [kind for kind in args.kinds if kind not in GPU_KINDS]
    if bad:
        raise ValueError(f"--kinds {' '.join(bad)}: not GPU kinds; with --device cuda choose from "
                         f"{', '.join(GPU_KINDS)}")
    device = torch.device(args.device)
    peak, source = (args.hbm_gbps, f"--hbm-gbps {args.hbm_gbps:g}") if args.hbm_gbps else hbm_gbps(device)
    dtype = getattr(torch, args.dtype)
    versions = {"torch": torch.__version__, "triton": triton_version()}
    print(f"simattn bench attention: torch {versions['torch']}, Triton {versions['triton']}, "
          f"{torch.cuda.get_device_name(device)}, B={args.batch} "
          f"H={args.heads} d={args.head_dim} {args.dtype}, {args.layout} q/k/v layout; peak HBM {source}", flush=True)
    rows = run_gpu(args.tokens, args.kinds, args.batch, args.heads, args.head_dim, dtype, args.device, peak,
                   args.passes, args.layout, args.repeats, args.rounds)
    print(format_gpu_table(rows))
    notes = [f"bytes: the least any implementation moves (forward: q, k, v in, output out; backward: q, k, v and the "
             f"output gradient in, three gradients out); roofline: those bytes at {peak:g} GB/s; x vs SDPA: the "
             f"faster SDPA backend's time / time (> 1 is faster); % HBM: bytes / time / peak"]
    notes[0] += ("; graph: the same calls replayed from a CUDA graph (GPU time alone); host: median - graph, the "
                 "host's work the GPU waited for")
    warning = spread_warning({f"{r['kind']} {r['pass']} N={r['tokens']}": r.get("spread") for r in rows}, WIDE_SPREAD)
    notes += [warning] if warning else []
    print("\n".join(notes))
    atomic_write_json({
        "config": {**vars(args), "device_name": torch.cuda.get_device_name(device), "hbm_gbps": peak,
                   "hbm_source": source, **versions, "wide_spread": WIDE_SPREAD},
        "results": rows, "notes": notes,
    }, args.output)
    print(f"wrote {args.output}")
    if args.write_table:
        from ..attention.backends import gpu_capability

        capability = gpu_capability(device)
        points = table_points(rows, capability, {"gpu": torch.cuda.get_device_name(device), **versions})
        write_backend_table(points, args.write_table)
        faster = sum(p["triton_ms"] <= p["torch_ms"] for p in points)
        print(f"wrote {args.write_table}: {len(points)} points for {capability} (Triton at least as fast as torch "
              f"at {faster})")
    return 0


def main_host_cost(args: argparse.Namespace) -> int:
    """``--host-cost``: the host's work per Triton call against SDPA's (:mod:`simattn.bench.host_cost`)."""
    from . import host_cost

    try:
        import simattn.kernels.linear.launch  # noqa: F401 - the path measured
    except ImportError as e:
        raise ValueError(f"--host-cost times the Triton paths and needs the triton package ({e})") from None
    threads = set_threads(args.threads or 1)
    cpu = cpu_info()
    machine = (f"{cpu.get('cpu_name') or platform.processor() or 'CPU name unknown'}, {threads} thread(s), "
               f"torch {torch.__version__}, Triton {triton_version()}")
    print(f"simattn bench attention --host-cost: {', '.join(host_cost.TRITON_KINDS)} (backend 'triton'; <kind>: "
          f"launches skipped, <kind>_launch: through Triton's launch path to a stubbed launcher) and SDPA on "
          f"{'x'.join(map(str, host_cost.SHAPE))} fp32 CPU tensors; {machine}", flush=True)
    rows = host_cost.measure(args.repeats, args.rounds)
    print(host_cost.format_rows(rows))
    notes = [host_cost.summary(rows, machine)]
    warning = spread_warning(host_cost.spread_rows(rows), WIDE_SPREAD)
    notes += [warning] if warning else []
    print("\n".join(notes))
    atomic_write_json({"config": {**vars(args), "threads": threads, "torch": torch.__version__,
                                  "triton": triton_version(), "shape": list(host_cost.SHAPE), **cpu,
                                  "wide_spread": WIDE_SPREAD},
                       "results": rows, "notes": notes}, args.output)
    print(f"wrote {args.output}")
    return 0


def _options():
    """Every option of ``bench attention`` (the shared ones from :mod:`simattn.bench.cli`) with its allowed values."""
    from ..utils.recipe import Opt, check_path, maybe
    from .cli import shared, some_of
    counts = dict(type=maybe(int), low=1)
    return {
        "tokens": Opt(None, f"token counts N (default: {' '.join(map(str, DEFAULT_TOKENS))} on CPU, "
                            f"{' '.join(map(str, GPU_TOKENS))} with --device cuda)", type=maybe(List[int]), low=1),
        "kinds": Opt(None, f"attention kinds (default: all; with --device cuda: {', '.join(GPU_KINDS)}; on CPU also "
                           "any registered kind that needs no token grid, through its module)",
                     type=maybe(List[str]), check=_cpu_kinds),
        "heads": Opt(None, "heads H (default 6 on CPU, 16 with --device cuda)", **counts),
        "head_dim": Opt(64, "head dim d", low=1),
        "batch": shared("batch", help="batch B with --device cuda (default 8; the CPU sweep uses 8 at N = 197, 1 "
                                      "elsewhere)"),
        "passes": Opt(None, f"with --device cuda: forward alone and/or forward + backward ({', '.join(PASSES)}; "
                            "default both)", type=maybe(List[str]), check=some_of(list(PASSES))),
        "hbm_gbps": Opt(None, f"peak HBM bandwidth for the roofline with --device cuda (default: by device name "
                              f"from a table, else {DEFAULT_HBM_GBPS} GB/s, the H200's)", type=maybe(float), low=0.0,
                        low_open=True),
        "threads": shared("threads", help="CPU threads, fixed for the whole run (default: torch's count, which "
                                          "follows OMP_NUM_THREADS)"),
        "repeats": shared("repeats", help="timed runs per measurement (median, p10, p90 reported; default 10 on "
                                          "CPU, 20 on CUDA, each a mean over back-to-back calls there)"),
        "rounds": shared("rounds", 3, "interleaved rounds over the kinds (median reported)"),
        "max_seconds": Opt(None, "CPU: stop repeating a measurement after this long (default 10)",
                           type=maybe(float), low=0.0, low_open=True),
        "layout": Opt("qkv", "q, k, v as views of one fused qkv projection (what modules run) or contiguous tensors",
                      choices=list(LAYOUTS)),
        "keep_freed_memory": Opt(True, "CPU: keep freed memory mapped between calls (--no-keep-freed-memory leaves "
                                       "glibc's trim/mmap defaults: calls then page-fault their buffers in, noisily)"),
        "device": shared("device", help="cpu, or cuda[:i] for the GPU sweep"),
        "dtype": Opt(None, "float32, bfloat16 or float16 (default float32 on CPU, bfloat16 with --device cuda)",
                     type=maybe(str), choices=["float32", "bfloat16", "float16"]),
        "output": shared("output", "runs/bench_attention.json", "JSON results file"),
        "overwrite": shared("overwrite"),
        "write_table": Opt(None, "with --device cuda: also write SimA's backend table (sima_gpu_table.json's format) "
                                 "here, with this sweep's points (GPU times of kinds sima and sima_triton, both "
                                 "needed); an existing table is updated",
                           type=maybe(str), check=check_path),
        "host_cost": Opt(False, "instead of a sweep: the microseconds of host work per Triton forward and "
                                "forward+backward of SimA, FLatten, sigmoid and Agent (on CPU, no GPU needed: launches skipped, and through Triton's "
                                "launch path to a stubbed launcher) beside SDPA's"),
    }


def build_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import command_parser
    return command_parser("simattn bench attention", __doc__.splitlines()[0], _options())


def main(argv: List[str]) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    check_bench_flags(args, _options())
    gpu = torch.device(args.device).type == "cuda"
    if args.host_cost:
        refuse_unused(args, ["tokens", "kinds", "heads", "batch", "passes", "hbm_gbps", "write_table", "max_seconds",
                             "dtype"], "to the sweeps, not --host-cost (it times one tiny fixed shape)")
        if gpu:
            raise ValueError("--host-cost runs on CPU with the launches skipped (no GPU needed): drop --device")
        check_out(args.output, args.overwrite)
        args.repeats = args.repeats or 10
        return main_host_cost(args)
    if gpu:
        require_cuda(args.device)
        refuse_unused(args, ["threads", "max_seconds"], "to the CPU sweep, not --device cuda")
        if not args.keep_freed_memory:
            raise ValueError("--no-keep-freed-memory applies to the CPU sweep, not --device cuda")
    else:
        refuse_unused(args, ["batch", "passes", "hbm_gbps", "write_table"],
                      "to --device cuda (the CPU sweep's batch is 8 at N = 197, 1 elsewhere, forward only)")
    check_out(args.output, args.overwrite)
    args.batch = args.batch or 8
    args.passes = args.passes or list(PASSES)
    args.max_seconds = args.max_seconds or 10.0
    args.tokens = args.tokens or list(GPU_TOKENS if gpu else DEFAULT_TOKENS)
    args.kinds = args.kinds or list(GPU_KINDS if gpu else KINDS)
    if args.write_table:
        missing = [kind for kind in ("sima", "sima_triton") if kind not in args.kinds]
        if missing:
            raise ValueError(f"--write-table compares sima with sima_triton: add {' '.join(missing)} to --kinds")
        check_out(args.write_table, True, flag="--write-table")  # an existing table is updated
    args.heads = args.heads or (16 if gpu else 6)
    args.repeats = args.repeats or (20 if gpu else 10)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if gpu:
        return main_gpu(args, p)
    bad = [kind for kind in args.kinds if kind not in KINDS and kind not in token_kinds()]
    if bad:
        raise ValueError(f"--kinds {' '.join(bad)}: GPU kinds, for --device cuda; on CPU choose from "
                         f"{', '.join(list(KINDS) + token_kinds())}")
    for required in reversed(REQUIRED):
        if required not in args.kinds:
            args.kinds.insert(0, required)  # the ratios are against these
    threads = set_threads(args.threads)
    allocator = keep_freed_memory() if args.keep_freed_memory else "system allocator defaults"
    cpu = cpu_info()
    features = ", ".join(cpu.get("cpu_features") or ["no feature list"])
    print(f"simattn bench attention: torch {torch.__version__}, device {args.device}, {threads} CPU threads "
          f"({cpu.get('cpu_name') or 'CPU name unknown'}: {features}), H={args.heads} d={args.head_dim} "
          f"{args.dtype}, {args.layout} q/k/v layout; {allocator}", flush=True)
    rows = run(args.tokens, args.kinds, args.heads, args.head_dim, threads, args.repeats, args.device,
               getattr(torch, args.dtype), args.max_seconds, args.layout, args.rounds)
    print(format_table(rows))
    notes = table_notes(rows)
    print("\n".join(notes))
    atomic_write_json({
        "config": {**vars(args), "threads": threads, "allocator": allocator, "torch": torch.__version__,
                   "machine": platform.machine(), "processor": platform.processor(), **cpu,
                   "sima_cpu_kernel": sima_cpu.available(), "wide_spread": WIDE_SPREAD},
        "results": rows, "notes": notes,
    }, args.output)
    print(f"wrote {args.output}")
    return 0
