"""Host cost per Triton call of this checkout against another one, side by side in one run, without a GPU.

Two worker processes, one per checkout (its ``src`` first on the path), each time the same public ops on the same
tiny fp32 CPU tensors (2x2x16x16, one thread): SimA, FLatten (the linear family's features), sigmoid and Agent with
``backend='triton'``, forward and forward+backward, with the launches skipped (``dry_run``) and through Triton's
launch path to a stubbed CUDA launcher (``hopper_stand_in``, kernels compiled for sm_90), and SDPA as the control
(its ratio says how even the two processes ran). The workers take batches in turn, the order swapped every batch, so
a drift in the machine's load hits both alike. Printed: each checkout's median µs per call, and the median of the
per-batch ratios this/other with its p10-p90.

Usage (the other checkout made with ``git worktree add /tmp/base REV``):
    .venv/bin/python scripts/host_cost_against.py /tmp/base [--batches 30] [--calls 100]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# Runs inside each checkout: public ops only, so that older code answers too. Older checkouts kept the host
# contexts beside the linear kernels, hence the second import.
WORKER = r'''
import gc, json, sys, time
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
try:
    from simattn.kernels.host import dry_run, hopper_stand_in
except ImportError:
    from simattn.attention.linear_triton import dry_run, hopper_stand_in
from simattn.attention.agent import agent_attention
from simattn.attention.flatten import flatten_attention
from simattn.attention.sigmoid import sigmoid_attention
from simattn.attention.sima import sima_attention
import contextlib

ops = {"sima": lambda *t: sima_attention(*t, backend="triton"),
       "flatten": lambda *t: flatten_attention(*t, backend="triton"),
       "sigmoid": lambda *t: sigmoid_attention(*t, backend="triton"),
       "agent": lambda *t: agent_attention(*t, agent_num=4, backend="triton")}
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 2, 16, 16, generator=gen) for _ in range(3))
leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
grad = torch.randn(2, 2, 16, 16, generator=gen)
fns, contexts = {}, {}
for name, op in list(ops.items()) + [("sdpa", F.scaled_dot_product_attention)]:
    for mode, context in ((("skipped", dry_run), ("launcher", hopper_stand_in)) if name != "sdpa"
                          else (("eager", contextlib.nullcontext),)):
        fns[f"{name} {mode} fwd"] = lambda op=op: op(q, k, v)
        fns[f"{name} {mode} fwd+bwd"] = lambda op=op: torch.autograd.grad(op(*leaves), leaves, grad)
        contexts[f"{name} {mode} fwd"] = contexts[f"{name} {mode} fwd+bwd"] = context
errors = {}
for key, fn in fns.items():
    try:
        with contexts[key]():
            for _ in range(20):
                fn()
    except Exception as e:
        errors[key] = f"{type(e).__name__}: {e}".splitlines()[0]
print(json.dumps({"keys": list(fns), "errors": errors}), flush=True)
gc.disable()
for line in sys.stdin:
    key, calls = line.split("\t")
    with contexts[key]():
        fns[key]()
        start = time.perf_counter_ns()
        for _ in range(int(calls)):
            fns[key]()
        took = time.perf_counter_ns() - start
    print(took / int(calls) / 1e3, flush=True)
'''


def start(tree: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), SIMATTN_TRITON_AUTOTUNE="0", OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    return subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=str(tree))


def rank(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout (its src/ holds simattn)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--output", type=Path, help="a JSON file for the rows")
    args = parser.parse_args()
    this = Path(__file__).resolve().parents[1]
    if not (args.other / "src" / "simattn").is_dir():
        print(f"host_cost_against: {args.other} has no src/simattn; pass a checkout of simattn", file=sys.stderr)
        return 2
    workers = {"this": start(this), "other": start(args.other)}
    heads = {name: json.loads(w.stdout.readline()) for name, w in workers.items()}
    keys = [key for key in heads["this"]["keys"] if key in heads["other"]["keys"]
            and key not in heads["this"]["errors"] and key not in heads["other"]["errors"]]
    for name, head in heads.items():
        for key, error in head["errors"].items():
            print(f"{name}: {key} not measured: {error}")
    samples = {(name, key): [] for name in workers for key in keys}
    for batch in range(args.batches):
        order = ("this", "other") if batch % 2 == 0 else ("other", "this")
        for key in keys:
            for name in order:
                workers[name].stdin.write(f"{key}\t{args.calls}\n")
                workers[name].stdin.flush()
                samples[(name, key)].append(float(workers[name].stdout.readline()))
    for w in workers.values():
        w.stdin.close()
        w.wait()
    rows = []
    print(f"{'call':<26} {'this µs':>9} {'other µs':>9} {'this/other':>10} {'p10':>6} {'p90':>6}")
    for key in keys:
        ratios = [a / b for a, b in zip(samples[("this", key)], samples[("other", key)])]
        row = {"call": key, "this_us": statistics.median(samples[("this", key)]),
               "other_us": statistics.median(samples[("other", key)]), "ratio": statistics.median(ratios),
               "ratio_p10": rank(ratios, 0.1), "ratio_p90": rank(ratios, 0.9)}
        rows.append(row)
        print(f"{key:<26} {row['this_us']:>9.1f} {row['other_us']:>9.1f} {row['ratio']:>10.3f} "
              f"{row['ratio_p10']:>6.2f} {row['ratio_p90']:>6.2f}")
    if args.output:
        args.output.write_text(json.dumps({"this": str(this), "other": str(args.other.resolve()),
                                           "batches": args.batches, "calls": args.calls, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
