"""Compile every launch configuration of the fused linear-attention kernels that `simattn bench attention` will
autotune, ahead of the sweep and in parallel processes, without launching any kernel.

Triton compiles an autotuned kernel once per configuration, one after another in the process that first calls it.
A sweep over several token counts, batch sizes and both passes then spends most of its time compiling. This script
runs the sweep's own calls (``simattn.bench.attention.run_gpu``) with each autotuner compiling its configurations
instead of timing them, one process per (batch, token count), so the compiled kernels are in Triton's on-disk cache
when the sweep starts.

``--sm90-here`` does the same on a machine without a GPU: every kernel path (SimA forward with and without the
backward's state, the backward, ELU and XNorm, SLAB and FLatten forward and backward, split and one-tile plans;
sigmoid and relu attention's flash-style kernels, Agent attention's kernels, forward and backward) is
compiled for an H100/H200 (sm_90) with Triton's own compiler and ptxas, through the same launch code, so a kernel
that would not compile on the GPU fails here first. It prints the shared memory each kernel needs.

Usage:
    PYTHONPATH=src python3 scripts/triton_compile_ahead.py --batch 128 8 --tokens 197 577 1025 4097 16385
    PYTHONPATH=src python3 scripts/triton_compile_ahead.py --sm90-here --batch 8 --tokens 197 4097 --jobs 1
"""
import argparse
import itertools
import multiprocessing
import sys
import time

KINDS = ["sima_triton", "elu_triton", "xnorm_triton", "sigmoid_triton", "agent_triton"]


def _compile_only(shared):
    """Autotuned kernels compile every configuration and launch none; ``shared`` collects (kernel, config,
    shared memory bytes)."""
    from triton.runtime.autotuner import Autotuner

    def run(self, *args, **kwargs):
        kwargs.pop("grid", None)
        kwargs.pop("warmup", None)
        for config in self.configs:
            kernel = self.fn.run(*args, grid=None, warmup=True, **kwargs, **config.all_kwargs())
            shared.append((self.fn.__name__, str(config), kernel.metadata.shared))
        self.best_config = self.configs[0]  # what the launch plan reads after a tuned launch

    Autotuner.run = run


def _job(job):
    batch, n, dtype_name, sm90_here = job
    import contextlib

    from simattn.kernels import host

    shared = []
    _compile_only(shared)
    host.planned = lambda key, build: build()  # no launch plan kept: every call meets the autotuners
    # CPU tensors stand in for CUDA ones on an H100/H200 (its 132 multiprocessors decide the plans)
    with host.hopper_stand_in(tune=True) if sm90_here else contextlib.nullcontext():
        start = time.perf_counter()
        errors = _calls(batch, n, dtype_name, sm90_here)
    return batch, n, time.perf_counter() - start, len(shared), max((s for *_, s in shared), default=0), errors


def _calls(batch, n, dtype_name, sm90_here):
    """The sweep's calls, and on CPU tensors the kernels the CPU entry points would not reach; the errors."""
    import torch

    from simattn.bench.attention import run_gpu

    device = "cpu" if sm90_here else "cuda"
    fake_time = {"median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0, "min_ms": 1.0, "runs": 1}  # not timed
    from simattn.kernels.linear.launch import linear_triton

    rows = run_gpu([n], KINDS, batch, 6, 64, getattr(torch, dtype_name), device, 1.0,
                   timer=lambda call: (call(), fake_time)[1])
    if sm90_here:  # on CPU tensors the ELU and XNorm entry points take torch ops: call their kernels directly
        q, k, v = (torch.randn(batch, 6, n, 64, dtype=getattr(torch, dtype_name)) for _ in range(3))
        linear_triton("elu", q, k, v)
        linear_triton("xnorm", q, k, v, gamma=torch.ones(batch * 6))
        # the relu kind's kernels (h = relu, n^(-a) scale, a key mask), forward and backward
        from simattn.kernels.pointwise.launch import activation_triton
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = activation_triton(*leaves, activation="relu", bias=0.0, alpha=1.0,
                                mask=torch.ones(batch, n, dtype=torch.bool))
        out.backward(torch.ones_like(out))
    # SLAB's relu prologue and the feature kinds' backward, and FLatten's call: fp32 features made in torch, v as is
    x = [torch.randn(batch, 6, n, 64, dtype=getattr(torch, dtype_name), device=device) for _ in range(3)]
    for kind, inputs in (("slab", x), ("features", (x[0].float(), x[1].float(), x[2]))):
        leaves = [t.requires_grad_() for t in inputs]
        out = linear_triton(kind, *leaves)
        out.backward(torch.ones_like(out))
    return [f"{r['kind']} {r['pass']}: {r['error']}" for r in rows if "error" in r]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[128, 8])
    p.add_argument("--tokens", type=int, nargs="+", default=[197, 577, 1025, 4097, 16385])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--jobs", type=int, default=10, help="processes compiling at once")
    p.add_argument("--sm90-here", action="store_true", help="compile for sm_90 on a machine without a GPU")
    args = p.parse_args(argv)
    jobs = [(b, n, args.dtype, args.sm90_here) for b, n in itertools.product(args.batch, args.tokens)]
    start, failed = time.perf_counter(), False
    with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
        for batch, n, seconds, configs, shared, errors in pool.imap_unordered(_job, jobs):
            print(f"B={batch} N={n}: {configs} kernel configurations compiled in {seconds:.0f} s, "
                  f"largest shared memory {shared / 1024:.0f} KiB", flush=True)
            for error in errors:
                failed = True
                print(f"  failed: {error}", flush=True)
    print(f"compiled ahead in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
