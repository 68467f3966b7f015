"""SimA's host cost per Triton call three ways, side by side in one run (batches alternating, 2x2x16x16 fp32, one
thread), without a GPU: simattn's path alone (``dry_run``), with Triton's run path on every launch (binder,
specialization, cache lookup), and with the compiled kernel launched directly after a signature's first launch (what
simattn does). In the last two the kernels are compiled for sm_90 and Triton's CUDA launcher is a no-op
(``hopper_stand_in``); the launcher's C code and the driver call are what none of the three counts.

Usage: .venv/bin/python scripts/host_cost_launch_paths.py [--batches 20] [--calls 100]
"""
import argparse
import contextlib
import gc
import os
import statistics
import time

os.environ["SIMATTN_TRITON_AUTOTUNE"] = "0"  # the stand-in has no GPU to tune on

import torch  # noqa: E402

from simattn.kernels import host  # noqa: E402
from simattn.attention.sima import sima_attention  # noqa: E402

SETTINGS = ("simattn's path (dry run)", "Triton's run path every launch", "direct launch")


@contextlib.contextmanager
def setting(name: str):
    """The launch path of ``name``; plans are dropped on entering and leaving the stand-in."""
    if name == SETTINGS[0]:
        with host.dry_run():
            yield
        return
    keep = host.Launch._keep
    if name == SETTINGS[1]:
        host.Launch._keep = lambda self, compiled, args: None  # never launch directly
    try:
        with host.hopper_stand_in():
            yield
    finally:
        host.Launch._keep = keep


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--calls", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 16, generator=g) for _ in range(3))
    leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(2, 2, 16, 16, generator=g)
    fns = {"fwd": lambda: sima_attention(q, k, v, backend="triton"),
           "fwd+bwd": lambda: torch.autograd.grad(sima_attention(*leaves, backend="triton"), leaves, grad)}
    times = {(name, p): [] for name in SETTINGS for p in fns}
    gc.disable()
    for _ in range(args.batches):
        for name in SETTINGS:
            with setting(name):
                for pass_, fn in fns.items():
                    per_call_us(fn, 5)  # the plans, made again at each entry (and the first compile)
                    times[(name, pass_)].append(per_call_us(fn, args.calls))
    gc.enable()
    for (name, pass_), t in times.items():
        t = sorted(t)
        print(f"{name:32s} {pass_:8s} median {statistics.median(t):7.1f} µs  (p10 {t[len(t) // 10]:.1f}, "
              f"p90 {t[-1 - len(t) // 10]:.1f})")


if __name__ == "__main__":
    main()
