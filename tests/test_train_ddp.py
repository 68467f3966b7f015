"""Two CPU processes under torchrun (gloo): DDP finishes, shards the data, scales the lr, keeps the ranks equal, and
resumes (both ranks from the same checkpoint, into its folder) to a longer schedule."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from torchrun import run_two_processes

WORKER = textwrap.dedent("""
    import os, shutil, sys, torch
    import torch.distributed as dist
    from simattn.train import load_config, train
    dist.init_process_group("gloo")  # one group for both runs below
    out = sys.argv[1]
    cfg = load_config(None, {
        "model": "sima_deit_tiny_patch16_224",
        "model_kwargs": {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2},
        "dataset": "digits", "img_size": 16, "batch_size": 64, "lr_base": 1e-3, "lr_base_size": 64,
        "epochs": 1, "warmup_epochs": 0, "drop_path": 0.1, "model_ema": True,
        "device": "cpu", "threads": 1, "output": out, "log_interval": 2, "seed": 1,
    })
    result = train(cfg)
    rank = int(os.environ["RANK"])
    # every rank's own copy of the weights, to compare after the run
    torch.save({"model": result.model.state_dict(), "ema": result.ema.state_dict()}, f"{out}/rank{rank}.pt")
    if rank == 0:
        shutil.copy(f"{out}/summary.json", f"{out}/summary_epoch1.json")
    dist.barrier()
    # every rank resumes the same checkpoint; the output is the checkpoint's folder
    longer = load_config(None, {**cfg.to_dict(), "output": None, "epochs": 2, "resume": f"{out}/last.pth"})
    again = train(longer)
    torch.save({"model": again.model.state_dict()}, f"{out}/resumed{rank}.pt")
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_two_process_gloo_ddp_keeps_ranks_identical(tmp_path):
    out = tmp_path / "run"
    proc = run_two_processes(tmp_path, WORKER, [out], timeout=300)
    # only rank 0 logs (once per run: the first, then the resumed one)
    assert proc.stdout.count("1/1: train loss") == 1 and proc.stdout.count("2/2: train loss") == 1
    assert proc.stdout.count("model sima_deit_tiny") == 2
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for part in ("model", "ema"):
        for k in r0[part]:
            assert torch.equal(r0[part][k], r1[part][k]), f"{part} {k} differs between ranks"
    summary = json.loads((out / "summary_epoch1.json").read_text())
    assert summary["world_size"] == 2
    assert summary["lr"] == pytest.approx(2e-3)  # 1e-3 x (2 processes x 64) / 64
    # each rank trains on its half of the 1,437 training images: 719 // 64 = 11 updates (22 on one process)
    assert summary["updates"] == 11
    # evaluation sums both shards exactly: every validation image counted once
    assert summary["final"]["samples"] == 359
    # and they trained: the weights moved away from the initialisation both ranks started from
    from simattn.train import load_config
    from simattn.classify.task import build_model
    torch.manual_seed(1)
    cfg = load_config(None, {"model": "sima_deit_tiny_patch16_224", "model_kwargs": {
        "img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2}, "drop_path": 0.1})
    init = build_model(cfg, 10)[0].state_dict()
    assert set(init) == set(r0["model"])
    assert not torch.equal(init["head.weight"], r0["model"]["head.weight"])
    # the resumed DDP run: both ranks continue from the checkpoint and stay equal
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["updates"] == 22 and [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert resumed["train_time_s"] > summary["train_time_s"]
    a, b = (torch.load(out / f"resumed{r}.pt", weights_only=True)["model"] for r in (0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.weight"], r0["model"]["head.weight"])
