"""``simattn bench attention --host-cost``: the microseconds of Python work per Triton call, without a GPU.

The public op of one kind of each kernel family, with ``backend="triton"``, and its backward through autograd, runs
on tiny CPU tensors: SimA (``sima_attention``) and FLatten (``flatten_attention``, a feature kind of the same linear
family), sigmoid attention (the point-wise family) and Agent attention (its own two-step family). Each two ways:

* ``<kind>``: inside :func:`simattn.kernels.host.dry_run`, which runs simattn's whole host path (checks,
  the choice of backend and order, the launch plan, autograd, allocating the outputs) and skips the kernel launches;
* ``<kind>_launch``: inside :func:`simattn.kernels.host.hopper_stand_in`, where the kernels are compiled
  for an H100/H200 and every launch goes through Triton's launch path as on the GPU, up to Triton's CUDA launcher,
  which is replaced by a no-op: simattn's host path plus Triton's. Left out: the launcher's C code and
  ``cuLaunchKernel`` itself. Not measured (its row says why) where the kernels cannot be compiled here.

What is timed is what a call costs the host, the part a GPU waits for in eager mode. Beside them,
``F.scaled_dot_product_attention`` (kind ``sdpa``) on the same tiny tensors: its host path plus a CPU computation
small enough not to matter. Each figure is a mean over a batch of back-to-back calls with Python's garbage collector
paused; the rows give the median over batches and rounds with p10 and p90, and ``x_sdpa`` is the median over
SDPA's for the same pass. The kinds alternate batch by batch, so a drift in the machine's load hits all alike.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import platform
import time
from typing import Callable, ContextManager, Dict, List, Tuple

import torch
import torch.nn.functional as F

from ...utils.timing import percentiles, set_threads
from ..report import cpu_info, relative_spread, triton_version
from .kinds import finish

__all__ = ["KINDS", "PASSES", "SHAPE", "host_fns", "measure", "add_ratios", "format_rows", "summary", "spread_rows",
           "main_host_cost"]

#: the kinds timed through their Triton kernels, one per kernel family (FLatten for the linear family's features)
TRITON_KINDS = ("sima", "flatten", "sigmoid", "agent")
KINDS = tuple(k for kind in TRITON_KINDS for k in (kind, f"{kind}_launch")) + ("sdpa",)
PASSES = ("fwd", "fwd+bwd")
#: (B, H, N, d) of the tiny tensors: the host path does not depend on the size (N = 16: a 4×4 grid for Agent)
SHAPE = (2, 2, 16, 16)


def _triton_ops() -> Dict[str, Callable[..., torch.Tensor]]:
    """Each kind's public op with ``backend='triton'`` and its defaults (Agent: 2×2 agents pooled from q)."""
    from ...attention.agent import agent_attention
    from ...attention.flatten import flatten_attention
    from ...attention.sigmoid import sigmoid_attention
    from ...attention.sima import sima_attention

    return {"sima": lambda *qkv: sima_attention(*qkv, backend="triton"),
            "flatten": lambda *qkv: flatten_attention(*qkv, backend="triton"),
            "sigmoid": lambda *qkv: sigmoid_attention(*qkv, backend="triton"),
            "agent": lambda *qkv: agent_attention(*qkv, agent_num=4, backend="triton")}


def host_fns() -> Dict[Tuple[str, str], Callable[[], object]]:
    """One call of each (kind, pass) on tiny fp32 CPU tensors: the forward on tensors that need no gradient, the
    forward and backward (``torch.autograd.grad``) on leaves that do."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, generator=gen) for _ in range(3))
    leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(*SHAPE, generator=gen)
    ops = {"sdpa": lambda *qkv: F.scaled_dot_product_attention(*qkv)}
    for kind, op in _triton_ops().items():
        ops[kind] = ops[f"{kind}_launch"] = op
    ops = {kind: ops[kind] for kind in KINDS}
    fns = {}
    for kind, op in ops.items():
        fns[(kind, "fwd")] = lambda op=op: op(q, k, v)
        fns[(kind, "fwd+bwd")] = lambda op=op: torch.autograd.grad(op(*leaves), leaves, grad)
    return fns


def _contexts() -> Dict[str, Callable[[], ContextManager]]:
    """The setting each kind's calls run in."""
    from ...kernels.host import dry_run, hopper_stand_in
    return {kind: contextlib.nullcontext if kind == "sdpa" else hopper_stand_in if kind.endswith("_launch")
            else dry_run for kind in KINDS}


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def measure(repeats: int, rounds: int, calls: int = 200, fns=None) -> List[dict]:
    """Rows (kind, pass, host_us with its p10 and p90 over ``repeats`` batches of ``calls`` calls in each of
    ``rounds`` rounds, spread), ratios added by :func:`add_ratios`; a kind that cannot run here gets a row with its
    ``error`` instead. Each batch runs in its kind's setting (:func:`_contexts`)."""
    contexts = _contexts()
    fns = fns or host_fns()
    samples: Dict[Tuple[str, str], List[float]] = {}
    errors: Dict[Tuple[str, str], str] = {}
    for key, fn in fns.items():  # plans, caches, compiles and lazy initialization, untimed
        try:
            with contexts[key[0]]():
                _per_call_us(fn, 20)
        except Exception as e:  # e.g. no ptxas to compile for the GPU stood in for
            errors[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds * repeats):  # one batch of each in turn: a drift in the load hits all alike
            for key, fn in fns.items():
                if key not in errors:
                    with contexts[key[0]]():
                        fn()  # its plan, untimed: hopper_stand_in drops every plan where it starts and ends
                        samples.setdefault(key, []).append(_per_call_us(fn, calls))
    finally:
        if enabled:
            gc.enable()
    rows = [{"kind": kind, "pass": pass_, "error": error} for (kind, pass_), error in errors.items()]
    for (kind, pass_), times in samples.items():
        us = percentiles(times)  # in µs here
        rows.append({"kind": kind, "pass": pass_, "host_us": us["median_ms"], "host_us_p10": us["p10_ms"],
                     "host_us_p90": us["p90_ms"], "spread": relative_spread(us["p10_ms"], us["p90_ms"],
                                                                            us["median_ms"]),
                     "calls": calls * len(times)})
    return add_ratios(rows)


def add_ratios(rows: List[dict]) -> List[dict]:
    """``x_sdpa``: host_us over SDPA's for the same pass (None where either was not timed)."""
    sdpa = {r["pass"]: r["host_us"] for r in rows if r["kind"] == "sdpa" and "host_us" in r}
    for r in rows:
        r["x_sdpa"] = r["host_us"] / sdpa[r["pass"]] if sdpa.get(r["pass"]) and "host_us" in r else None
    return rows


def format_rows(rows: List[dict]) -> str:
    head = f"{'kind':<14} {'pass':<8} {'host µs':>9} {'p10 µs':>8} {'p90 µs':>8} {'x SDPA':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['kind']:<14} {r['pass']:<8} not measured: {r['error']}")
            continue
        ratio = f"{r['x_sdpa']:.2f}" if r["x_sdpa"] is not None else "-"
        lines.append(f"{r['kind']:<14} {r['pass']:<8} {r['host_us']:>9.1f} {r['host_us_p10']:>8.1f} "
                     f"{r['host_us_p90']:>8.1f} {ratio:>7}")
    return "\n".join(lines)


def summary(rows: List[dict], machine: str) -> str:
    """One line: each kind's host cost per forward and per forward+backward, in µs and as a multiple of SDPA's,
    without and with Triton's launch path, and the machine."""
    parts = []
    for kind in TRITON_KINDS:
        for key, what in ((kind, "simattn's path"), (f"{kind}_launch", "with Triton's launch path")):
            timed = {r["pass"]: r for r in rows if r["kind"] == key and r.get("x_sdpa") is not None}
            if timed:
                parts.append(f"{kind} {what}: " + ", ".join(
                    f"{p} {timed[p]['host_us']:.1f} µs ({timed[p]['x_sdpa']:.2f}x SDPA's)" for p in PASSES if p in timed))
    return f"Triton host cost per call, {'; '.join(parts)}; on {machine}"


def spread_rows(rows: List[dict]) -> Dict[str, float]:
    """name → relative spread, for :func:`simattn.bench.report.spread_warning`."""
    return {f"{r['kind']} {r['pass']}": r["spread"] for r in rows if "spread" in r}


def main_host_cost(args: argparse.Namespace) -> int:
    """``--host-cost``: the host's work per Triton call against SDPA's (this module)."""
    try:
        import simattn.kernels.linear.launch  # noqa: F401 - the path measured
    except ImportError as e:
        raise ValueError(f"--host-cost times the Triton paths and needs the triton package ({e})") from None
    threads = set_threads(args.threads or 1)
    cpu = cpu_info()
    machine = (f"{cpu.get('cpu_name') or platform.processor() or 'CPU name unknown'}, {threads} thread(s), "
               f"torch {torch.__version__}, Triton {triton_version()}")
    print(f"simattn bench attention --host-cost: {', '.join(TRITON_KINDS)} (backend 'triton'; <kind>: "
          f"launches skipped, <kind>_launch: through Triton's launch path to a stubbed launcher) and SDPA on "
          f"{'x'.join(map(str, SHAPE))} fp32 CPU tensors; {machine}", flush=True)
    rows = measure(args.repeats, args.rounds)
    return finish(args.output, {**vars(args), "threads": threads, "torch": torch.__version__,
                                "triton": triton_version(), "shape": list(SHAPE), **cpu},
                  rows, format_rows(rows), [summary(rows, machine)], spread_rows(rows))
