"""Measuring configurations: one in this process (:func:`measure`), or each in a fresh interpreter
(``python -m simattn.bench.model.workers SPEC``, one JSON line back on stdout) with rounds interleaved
(:func:`run_specs`). A configuration that fails is a row with its cause in ``error`` (the exception's first line,
and a CUDA kernel's device-side assertion where one printed), and the next starts in a fresh interpreter: a CUDA
error leaves the process that met it unusable, not the sweep."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import traceback
from typing import Any, Dict, List, Optional, Sequence

import torch

from ...utils.timing import keep_freed_memory, set_threads, sync
from ..report import progress
from .probes import attention_share, runtime_profile, time_floor
from .runner import Runner, largest_fitting_batch, token_count
from .spec import BenchSpec, runtime_name, size_text

_RESULT_TAG = "SIMATTN_BENCH_RESULT "
MB = 2 ** 20


def measure(spec: BenchSpec) -> Dict[str, Any]:
    """Measure one configuration in this process and return its result row (what a worker sends back)."""
    with tempfile.TemporaryDirectory(prefix="simattn_bench_") as work_dir:
        return _measure(spec, work_dir)


def _measure(spec: BenchSpec, work_dir: str) -> Dict[str, Any]:
    threads = set_threads(spec.threads)
    allocator = keep_freed_memory()
    torch.manual_seed(0)
    run = Runner(spec, work_dir)
    model = run.model
    row: Dict[str, Any] = {
        "model": spec.model, "label": spec.label, "attn": spec.attn, "runtime": runtime_name(spec),
        "attn_kwargs": json.dumps(spec.attn_kwargs) if spec.attn_kwargs else "",
        "attn_type": getattr(model, "attn_type", spec.attn), "sima_order": spec.sima_order or "",
        "head": spec.head or "", "img_size": size_text(spec.img_size), "tokens": token_count(model, spec.img_size),
        "precision": spec.precision,
        "device": spec.device, "threads": threads, "allocator": allocator, "batch_size": spec.batch_size,
        "latency_batch": spec.latency_batch, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }
    if run.runtime_max_abs_diff is not None:
        row["runtime_max_abs_diff"] = run.runtime_max_abs_diff
        row["runtime_threads"] = run.runtime_threads
    row.update(_counts_and_memory(run))
    for prefix, measure, make_fn in (("infer", "", run.infer_fn), ("train", "train-", run.train_fn)):
        if measure + "latency" in spec.measures:
            row.update(_latency(run, prefix, make_fn, work_dir))
        if measure + "throughput" in spec.measures:
            row.update(_throughput(run, prefix, make_fn))
    sync(run.device)
    return row


def _counts_and_memory(run: Runner) -> Dict[str, Any]:
    """Exp-like evaluations, op calls and FLOPs of one eager forward, and the peak memory of a forward and of a
    steady-state eager training step, at the latency batch (what ``spec.measures`` asks for)."""
    from ..counters import count_flops, peak_memory, trace_ops

    spec, b1, row = run.spec, run.spec.latency_batch, {}
    if "counts" in spec.measures:
        infer = run.infer_fn(b1, timed=False)
        row.update(trace_ops(infer).summary())
        flops = count_flops(infer, run.model)
        row["gflops"] = flops.total / 1e9 / b1
        row["attn_gflops"] = flops.attention / 1e9 / b1
    if "memory" in spec.measures:
        row["peak_fwd_mb"] = peak_memory(run.infer_fn(b1, timed=False), run.device) / MB
        timed, run.timed = run.timed, run.model  # memory of the eager step
        step = run.train_fn(b1)
        step()  # optimizer state exists from here on: measure a steady-state step
        row["peak_train_mb"] = peak_memory(step, run.device) / MB
        run.timed = timed
    return row


def _latency(run: Runner, prefix: str, make_fn, work_dir: str) -> Dict[str, Any]:
    """Latency at the latency batch (p50, p10, p90, min), and after the inference timing the probes that go with
    it: the attention share (eager torch), the linear floor and the runtime profile (where the spec asks)."""
    spec, b1 = run.spec, run.spec.latency_batch
    t = run.time(make_fn(b1))
    row = {f"{prefix}_p50_ms": t["median_ms"], f"{prefix}_p10_ms": t["p10_ms"], f"{prefix}_p90_ms": t["p90_ms"],
           f"{prefix}_min_ms": t["min_ms"], f"{prefix}_runs": t["runs"]}
    if prefix != "infer":
        return row
    if spec.runtime == "torch" and not spec.compile:
        # the eager forward just timed, again with the attention modules timed inside it
        row.update(attention_share(run.model, run.infer_fn(b1), run.device, spec.repeats, spec.max_time))
    if spec.floor:
        row.update(time_floor(run, work_dir))
        row["of_floor"] = row["infer_p50_ms"] / row["floor_ms"]
    if spec.profile and run.deployed_path is not None:
        row.update(runtime_profile(spec.runtime, run.deployed_path, run.inputs(b1), spec.threads, work_dir))
    return row


def _throughput(run: Runner, prefix: str, make_fn) -> Dict[str, Any]:
    """Images/s at the spec's batch (with ``fill_batch``: the largest of it, its half, ... that fits in CUDA
    memory), the batch used, and on CUDA the peak memory of those calls."""
    spec = run.spec
    batch = largest_fitting_batch(lambda b: make_fn(b)(), spec.batch_size) if spec.fill_batch else spec.batch_size
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    t = run.time(make_fn(batch))
    ips = batch * 1e3
    row = {f"{prefix}_ips": ips / t["median_ms"], f"{prefix}_ips_p10": ips / t["p90_ms"],
           f"{prefix}_ips_p90": ips / t["p10_ms"], f"{prefix}_batch": batch}
    if run.device.type == "cuda":
        row[f"{prefix}_ips_peak_mb"] = torch.cuda.max_memory_allocated(run.device) / MB
    return row


def worker_main(spec_json: str) -> int:
    """A worker: measure the spec given as JSON and print its row as one tagged line; when the measurement
    fails, its traceback goes to stderr and the row carries the exception's first line (exit code 1)."""
    spec = BenchSpec.from_json(spec_json)
    try:
        row, code = measure(spec), 0
    except Exception as e:  # noqa: BLE001 - whatever failed is this row's error, the sweep goes on
        traceback.print_exc()
        row, code = _error_row(spec, exception_line(e)), 1
    print(_RESULT_TAG + json.dumps(row), flush=True)
    return code


def exception_line(e: BaseException) -> str:
    """``Type: first line of the message``: what went wrong, without the advice lines some errors append (a CUDA
    error ends with 'Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.')."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


_DEVICE_ASSERT = re.compile(r"(?:(?P<file>[^\s:]+):(?P<line>\d+): (?P<kernel>.+?): block: \[[\d, ]*\], "
                            r"thread: \[[\d, ]*\] )?Assertion `(?P<condition>.*?)` failed")


def device_assertion(output: str) -> Optional[str]:
    """The first device-side assertion a CUDA kernel printed in ``output``, as 'Assertion `COND` failed in KERNEL
    (FILE:LINE)', or None."""
    match = _DEVICE_ASSERT.search(output)
    if match is None:
        return None
    where = f" in {match['kernel']} ({os.path.basename(match['file'])}:{match['line']})" if match["kernel"] else ""
    return f"Assertion `{match['condition']}` failed{where}"


def failure_cause(stderr: str, returncode: int) -> str:
    """Why a worker that sent no row failed: the exception line of the last traceback in its ``stderr`` (its
    message's first line), else how it ended."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        # the frames are indented; the exception line is the first that is not
        raised = next((line.strip() for line in lines[starts[-1] + 1:] if line.strip() and not line[0].isspace()),
                      None)
        if raised:
            return raised
    if returncode < 0:
        return f"worker killed by {signal.Signals(-returncode).name}"
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1] if tail else f"worker exited with code {returncode} and no result"


def _worker_command(spec: BenchSpec) -> List[str]:
    return [sys.executable, "-m", "simattn.bench.model.workers", spec.to_json()]


def _run_worker(spec: BenchSpec, timeout: Optional[float]) -> Dict[str, Any]:
    """Measure ``spec`` in a fresh interpreter; a failed worker gives a row with ``error`` set to its cause."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.threads), MKL_NUM_THREADS=str(spec.threads))
    try:
        proc = subprocess.run(_worker_command(spec), capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _error_row(spec, f"worker timed out after {timeout:g} s")
    tagged = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_TAG)]
    row = json.loads(tagged[-1][len(_RESULT_TAG):]) if tagged else \
        _error_row(spec, failure_cause(proc.stderr, proc.returncode))
    # a kernel's assertion is printed by the device (on stdout), apart from the exception it leads to
    asserted = device_assertion(proc.stdout + "\n" + proc.stderr) if "error" in row else None
    if asserted:
        row["error"] += f"; {asserted}"
    return row


def _error_row(spec: BenchSpec, message: str) -> Dict[str, Any]:
    return {"model": spec.model, "label": spec.label, "attn": spec.attn, "runtime": runtime_name(spec),
            "sima_order": spec.sima_order or "", "head": spec.head or "",
            "img_size": size_text(spec.img_size), "precision": spec.precision, "device": spec.device,
            "threads": spec.threads, "batch_size": spec.batch_size, "error": message}


_TIMING_KEYS = tuple(f"{prefix}_{key}" for prefix in ("infer", "train")
                     for key in ("p50_ms", "p10_ms", "p90_ms", "min_ms", "ips", "ips_p10", "ips_p90")) + \
    ("attn_share", "attn_core_share", "floor_ms", "floor_p10_ms", "floor_p90_ms")


def run_specs(specs: Sequence[BenchSpec], *, rounds: int = 1, in_process: bool = False,
              timeout: Optional[float] = None, desc: str = "bench model") -> List[Dict[str, Any]]:
    """Measure every spec (each in its own subprocess unless ``in_process``) and return one row per spec.

    With ``rounds`` > 1 the whole list is timed again (interleaved, so slow phases of a shared machine hit all
    configurations alike) and each timing is the median over rounds (``<key>_rounds`` keeps every round's value;
    ``*_min_ms`` is the minimum over rounds); counts and memory are measured once.
    """
    jobs = [(r, i) for r in range(rounds) for i in range(len(specs))]
    results: List[List[Dict[str, Any]]] = [[] for _ in specs]

    def describe(job):
        s = specs[job[1]]
        head = f" {s.head}" if s.head else ""
        return f"{s.model}{head} {s.label} {size_text(s.img_size)}px {s.precision}" + \
            (f" (round {job[0] + 1})" if rounds > 1 else "")

    for r, i in progress(jobs, desc, describe):
        spec = specs[i]
        if r > 0:  # timings again; counts, memory and profiles once
            timed = tuple(m for m in spec.measures if m not in ("counts", "memory"))
            spec = dataclasses.replace(spec, measures=timed, profile=False)
        row = measure(spec) if in_process else _run_worker(spec, timeout)
        if "error" in row:
            print(f"  failed: {describe((r, i))}: {row['error']}", file=sys.stderr, flush=True)
        results[i].append(row)
    rows = []
    for per_round in results:
        row = dict(per_round[0])
        for key in _TIMING_KEYS:
            values = [r[key] for r in per_round if r.get(key) is not None]
            if values:
                row[key] = min(values) if key.endswith("_min_ms") else statistics.median(values)
                if len(values) > 1:
                    row[f"{key}_rounds"] = values
        if row.get("floor_ms") and row.get("infer_p50_ms"):  # of the medians over rounds
            row["of_floor"] = row["infer_p50_ms"] / row["floor_ms"]
        row["rounds"] = len(per_round)
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
