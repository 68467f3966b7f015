"""Kernel launches without a GPU (``hopper_stand_in``: the kernels compiled for sm_90, Triton's CUDA launcher
replaced): after a signature's first launch through Triton, the compiled kernel is launched directly with the same
arguments Triton's path gives its launcher, and a call whose tensors Triton would specialize otherwise (16-byte
alignment) goes through Triton again; Agent attention's kernels launch the same way. Runs in a subprocess: the
suite's kernels are imported for the interpreter."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import json, torch, triton
from simattn.kernels import host as LT
from simattn.attention.sima import sima_attention

launched, through_triton = [], []
real_run = triton.runtime.jit.JITFunction.run
def counted(self, *args, **kwargs):
    through_triton.append(self.fn.__name__)
    return real_run(self, *args, **kwargs)
triton.runtime.jit.JITFunction.run = counted

def shown(a):  # a launcher argument, comparable across calls (tensors by what Triton reads of them)
    if isinstance(a, torch.Tensor):
        return ["tensor", str(a.dtype), list(a.shape), a.data_ptr() % 16 == 0]
    return a if isinstance(a, (int, float, str, bool, type(None))) else type(a).__name__

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 2, 16, 16, generator=g) for _ in range(3))
out = {}
try:
    with LT.hopper_stand_in(launch=lambda *args: launched.append([shown(a) for a in args])):
        for name in ("first", "again"):
            sima_attention(q, k, v, backend="triton")
            out[name] = {"launch": launched[-1], "triton_calls": len(through_triton)}
        odd = torch.randn(2 * 2 * 16 * 16 + 1, generator=g)[1:].view(2, 2, 16, 16)  # 4 bytes past an aligned start
        sima_attention(odd, k, v, backend="triton")
        out["misaligned"] = {"launch": launched[-1], "triton_calls": len(through_triton)}
        # Agent attention's kernels (the aggregation and the broadcast) take the same launches
        from simattn.attention.agent import agent_attention
        for name in ("agent_first", "agent_again"):
            agent_attention(q, k, v, grid_size=(4, 4), agent_num=4, backend="triton")
            out[name] = {"launch": launched[-2:], "triton_calls": len(through_triton)}
except RuntimeError as e:
    if "ptxas" not in str(e):
        raise
    out = {"skip": str(e).splitlines()[0]}
print(json.dumps(out))
"""


def test_direct_launch_hands_the_launcher_what_tritons_path_does():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SIMATTN_TRITON_AUTOTUNE"] = "0"
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(f"cannot compile for sm_90 here: {got['skip']}")
    first, again, odd = got["first"], got["again"], got["misaligned"]
    assert first["triton_calls"] == 1  # one launch (the one-tile forward), through Triton
    assert again["triton_calls"] == 1  # the repeat: launched directly
    assert again["launch"] == first["launch"]  # grid, stream, function, metadata, hooks, every kernel argument
    assert len(first["launch"]) > 40
    # a q Triton specializes otherwise (not 16-byte aligned): Triton's path again, its own specialization
    assert odd["triton_calls"] == 2 and odd["launch"][9][3] is False
    agent_first, agent_again = got["agent_first"], got["agent_again"]
    assert agent_first["triton_calls"] == 4 and agent_again["triton_calls"] == 4  # two kernels, once each
    assert agent_again["launch"] == agent_first["launch"] and agent_first["launch"][0] != agent_first["launch"][1]
