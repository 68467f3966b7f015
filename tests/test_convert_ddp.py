"""simattn convert under torchrun: two CPU processes (gloo) run both stages, keep the ranks' weights equal, and
evaluate every validation image once."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from test_convert import MODEL, TINY, make_timm_teacher
from torchrun import run_two_processes

WORKER = textwrap.dedent("""
    import os, sys, torch
    import simattn.convert.run as run
    from simattn.convert import convert, load_convert_recipe
    teacher, out, model, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
    trained = {}
    for cls in (run.TransferTrainer, run.DistillTrainer):  # keep each rank's own copy of the student
        def run_and_keep(self, _run=cls.run, _name=cls.__name__):
            result = _run(self)
            trained[_name] = {k: v.clone() for k, v in result.model.state_dict().items()}
            return result
        cls.run = run_and_keep
    cfg = load_convert_recipe("convert_digits", {
        "epochs": 2, "steps_per_epoch": 3, "batch_size": 32, "threads": 1, "device": "cpu", "log_interval": 1,
        "seed": 1, "output": out, "convert": {"transfer_batch_size": 32}})
    convert(cfg, teacher, model, kwargs)
    torch.save(trained, f"{out}/rank{os.environ['RANK']}.pt")
""")


@pytest.mark.slow
def test_two_process_conversion_keeps_ranks_identical(tmp_path):
    teacher = tmp_path / "teacher.pth"
    make_timm_teacher(teacher, seed=3)
    out = tmp_path / "conv"
    proc = run_two_processes(tmp_path, WORKER, [teacher, out, MODEL, repr(TINY)], timeout=600)
    assert proc.stdout.count("== distill") == 1  # only rank 0 talks
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2
    # evaluation sums both shards exactly: every validation image once
    assert results["teacher"]["samples"] == results["zero_shot"]["samples"] == results["final"]["samples"] == 359
    for stage in ("transfer", "distill"):
        summary = json.loads((out / stage / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["updates"] == 3
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for stage in ("TransferTrainer", "DistillTrainer"):
        for k in r0[stage]:
            assert torch.equal(r0[stage][k], r1[stage][k]), f"{stage}: {k} differs between ranks"
    final = load_file(out / "final.safetensors")
    for k, v in final.items():
        assert torch.equal(v, r0["DistillTrainer"][k]), k
    # stage 1 moved the attention blocks only (gradients averaged through DDP)
    start = torch.load(teacher, weights_only=True)
    assert not torch.equal(r0["TransferTrainer"]["blocks.0.attn.qkv.weight"], start["blocks.0.attn.qkv.weight"])
    assert torch.equal(r0["TransferTrainer"]["blocks.0.mlp.fc1.weight"], start["blocks.0.mlp.fc1.weight"])
