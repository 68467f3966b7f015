"""Kernel launches without a GPU (``hopper_stand_in``: the kernels compiled for sm_90, Triton's CUDA launcher
replaced): after a signature's first launch through Triton, the compiled kernel is launched directly with the same
arguments Triton's path gives its launcher (the launch metadata only where a launch hook reads it), and a call whose
tensors Triton would specialize otherwise (16-byte alignment) goes through Triton again; Agent attention's kernels launch the same way. Runs in a subprocess: the
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
def launcher(*args):  # records its arguments, and calls the enter hook with the launch metadata, as Triton's does
    launched.append([shown(a) for a in args])
    if args[7] is not None:
        args[7](args[6])

try:
    with LT.hopper_stand_in(launch=launcher):
        for name in ("first", "again"):
            sima_attention(q, k, v, backend="triton")
            out[name] = {"launch": launched[-1], "triton_calls": len(through_triton)}
        odd = torch.randn(2 * 2 * 16 * 16 + 1, generator=g)[1:].view(2, 2, 16, 16)  # 4 bytes past an aligned start
        sima_attention(odd, k, v, backend="triton")
        out["misaligned"] = {"launch": launched[-1], "triton_calls": len(through_triton)}
        # a profiler's launch hook gets what Triton's path gives it (the launch metadata) on direct launches too
        hooked = []
        triton.knobs.runtime.launch_enter_hook.add(lambda metadata: hooked.append(metadata.get()["name"]))
        sima_attention(q, k, v, backend="triton")
        out["hooked"] = {"launch": launched[-1], "triton_calls": len(through_triton), "names": hooked}
        triton.knobs.runtime.launch_enter_hook.calls.clear()
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
    # grid, stream, function, kernel metadata, hooks, every kernel argument; the launch metadata, which only launch
    # hooks read, is left out while none is set
    assert first["launch"][6] == "LazyDict" and again["launch"][6] is None
    assert again["launch"][:6] + again["launch"][7:] == first["launch"][:6] + first["launch"][7:]
    assert len(first["launch"]) > 40
    hooked = got["hooked"]
    assert hooked["triton_calls"] == 2 and hooked["launch"] == first["launch"]  # the plan's, launched as Triton does
    assert hooked["names"] == ["fwd_one_tile_kernel"]
    # a q Triton specializes otherwise (not 16-byte aligned): Triton's path again, its own specialization
    assert odd["triton_calls"] == 2 and odd["launch"][9][3] is False
    agent_first, agent_again = got["agent_first"], got["agent_again"]
    assert agent_first["triton_calls"] == 4 and agent_again["triton_calls"] == 4  # two kernels, once each
    assert [a[:6] + a[7:] for a in agent_again["launch"]] == [a[:6] + a[7:] for a in agent_first["launch"]]
    assert agent_first["launch"][0] != agent_first["launch"][1]
