"""``simattn bench attention``: every attention kind's forward latency against softmax SDPA and the official SimA.

All kinds run in one process, interleaved per token count, on the same inputs and a fixed thread count, so the
printed ratios compare like with like. The attention alone is timed (no projections), which is exactly where the
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

The kinds timed are derived from the attention registry and the kernel policies (:func:`timed_kinds`), none kept by
hand: on CPU every registered kind that needs no token grid, through its module (``attend``, backend 'auto'), and
``<kind>_torch`` beside a kind with a CPU kernel (``sima_torch``); ``soft`` on its own landmark ratio per N.

``--device cuda`` runs the GPU sweep instead (:mod:`.gpu`, :func:`run_gpu`): every kind with GPU kernels in torch
(``<kind>``: ``sima``, ``agent``, ``elu``, ...) and on its Triton kernels (``<kind>_triton``), through its module with
its parameters at their initial values (the grid-linear kinds' kernel op without the grid's convolution, Agent's
``attend`` on the grid N fits, its prefix the rest), SimA under ``torch.compile`` (``sima_compile``), against softmax
SDPA with its flash and memory-efficient backends (``sdpa_flash``, ``sdpa_efficient``), forward and
forward+backward, B = 8, H = 16, d = 64, bf16 by default. Each time is a mean per call over back-to-back calls
between CUDA events (:func:`simattn.utils.timing.cuda_times`): eagerly (``median_ms``: what a user's loop sees, host
work included) and replayed from a CUDA graph (``graph_ms``: GPU time alone; ``host_ms`` is the difference).
Beside each time: the bandwidth achieved on the bytes the op must move at least (forward: read q, k, v, write the
output; backward: read q, k, v and the output gradient, write the three gradients) and the time those bytes take at
the GPU's peak HBM bandwidth (the op's roofline; ``--hbm-gbps``, default from :data:`HBM_GBPS` by device name), and
the share of that peak the row reaches (``% HBM``: bytes / time / peak). The JSON names the GPU, torch and Triton.
``--write-table PATH`` also writes SimA's backend table (:func:`simattn.attention.backends.gpu_table`) with this
sweep's points (:func:`table_points`): per pass and N, the GPU times of ``sima_triton`` and ``sima``, for ``auto``.
Without a CUDA device it stops at once with a one-line error (exit code 2).

``--host-cost`` measures the host's work per Triton call of one kind per kernel family instead, on CPU
(:mod:`.host_cost`).
"""
from __future__ import annotations

import argparse
from typing import List

import torch

from ..cli import check_bench_flags, check_out, refuse_unused, require_cuda
from .cpu import TOKENS as DEFAULT_TOKENS, add_ratios, floor_warning, format_table, main_cpu, table_notes
from .gpu import DEFAULT_HBM_GBPS, PASSES, TOKENS as GPU_TOKENS, add_roofline, format_gpu_table, hbm_gbps, main_gpu, \
    rounds_median, run_gpu, table_points, write_backend_table
from .host_cost import main_host_cost
from .kinds import LAYOUTS, REQUIRED, make_qkv, timed_kinds

__all__ = ["timed_kinds", "make_qkv", "LAYOUTS", "PASSES", "DEFAULT_HBM_GBPS", "add_ratios", "format_table",
           "floor_warning", "table_notes", "hbm_gbps", "run_gpu", "rounds_median", "add_roofline", "table_points",
           "write_backend_table", "format_gpu_table", "build_parser", "main"]


def _options():
    """Every option of ``bench attention`` (the shared ones from :mod:`simattn.bench.cli`) with its allowed values."""
    from ...utils.recipe import Opt, check_path, maybe
    from ..cli import shared, some_of
    counts = dict(type=maybe(int), low=1)
    return {
        "tokens": Opt(None, f"token counts N (default: {' '.join(map(str, DEFAULT_TOKENS))} on CPU, "
                            f"{' '.join(map(str, GPU_TOKENS))} with --device cuda)", type=maybe(List[int]), low=1),
        "kinds": Opt(None, "attention kinds (default: all; on CPU: the references and every registered kind that "
                           "needs no token grid, through its module; with --device cuda: SDPA's backends, "
                           "sima_compile and every kind with GPU kernels, in torch and on them)",
                     type=maybe(List[str]),
                     check=some_of(list(dict.fromkeys(timed_kinds("cpu") + timed_kinds("cuda"))))),
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
    from ...utils.recipe import command_parser
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
    args.kinds = args.kinds or timed_kinds(args.device)
    if args.write_table:
        missing = [kind for kind in ("sima", "sima_triton") if kind not in args.kinds]
        if missing:
            raise ValueError(f"--write-table compares sima with sima_triton: add {' '.join(missing)} to --kinds")
        check_out(args.write_table, True, flag="--write-table")  # an existing table is updated
    args.heads = args.heads or (16 if gpu else 6)
    args.repeats = args.repeats or (20 if gpu else 10)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    here = timed_kinds(args.device)
    bad = [kind for kind in args.kinds if kind not in here]
    if bad:
        raise ValueError(f"--kinds {' '.join(bad)}: GPU kinds, for --device cuda; on CPU choose from {', '.join(here)}"
                         if not gpu else f"--kinds {' '.join(bad)}: not GPU kinds; with --device cuda choose from "
                         f"{', '.join(here)}")
    if gpu:
        return main_gpu(args)
    for required in reversed(REQUIRED):
        if required not in args.kinds:
            args.kinds.insert(0, required)  # the ratios are against these
    return main_cpu(args)
