"""Checkpoints: SIGKILL mid-epoch + --resume ends where an uninterrupted run ends; bad checkpoints fail cleanly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from simattn.cli import main as simattn_main
from simattn.train import cli as train_cli
from simattn.train import TrainConfig, load_config, train
from simattn.engine.state import load_train_state
from simattn.utils.io import CheckpointError
from simattn.utils.recipe import recipe_overrides

from killing import kill_on_line
from helpers import digests

TINY_FLAGS = [
    "--model", "sima_deit_tiny_patch16_224",
    "--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=32", "depth=2", "num_heads=2",
    "--dataset", "digits", "--img-size", "16", "--interpolation", "bilinear", "--crop-pct", "1.0",
    "--batch-size", "32", "--scale", "[0.6, 1.0]", "--hflip", "0.0", "--lr", "2e-3", "--warmup-epochs", "1",
    "--sched-on-updates", "--clip-grad", "1.0", "--threads", "1", "--device", "cpu", "--seed", "3",
    # exercise the stochastic parts that resuming must replay: augmentation, mixup/cutmix, drop-path, EMA
    "--mixup", "0.8", "--cutmix", "1.0", "--drop-path", "0.1", "--model-ema", "--model-ema-decay", "0.9",
    "--epochs", "2", "--steps-per-epoch", "8", "--eval-every-epochs", "2", "--log-interval", "1",
]


def _train_cmd(output: Path, *extra: str):
    return [sys.executable, "-m", "simattn", "train", *TINY_FLAGS, "--output", str(output), *extra]


def _config(output: Path, *extra: str):
    args = train_cli.build_parser().parse_args([*TINY_FLAGS, "--output", str(output), *extra])
    return load_config(None, recipe_overrides(TrainConfig, args))


def _records(path: Path):
    drop = ("time", "epoch_time_s")
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    victim = subprocess.Popen(_train_cmd(killed, "--checkpoint-every-steps", "3"),
                              env={**os.environ, "PYTHONUNBUFFERED": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    watcher, seen = kill_on_line(victim, lambda line: line.startswith("checkpoint:") and "epoch 2" in line)
    reference = train(_config(straight))  # the uninterrupted run, meanwhile, in this process
    watcher.join(timeout=300)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)
    state = load_train_state(killed / "last.pth")
    assert state["epoch"] == 1 and 0 < state["step_in_epoch"] < 8, "the kill must land mid-epoch"
    assert not (killed / "summary.json").exists()

    resumed = train(_config(killed, "--checkpoint-every-steps", "3", "--resume"))

    a, b = reference.summary, resumed.summary
    for key in ("top1", "top5", "loss"):
        assert b["final"][key] == pytest.approx(a["final"][key], rel=1e-6, abs=1e-9), key
        assert b["ema"][key] == pytest.approx(a["ema"][key], rel=1e-6, abs=1e-9), key
    assert [h["train_loss"] for h in b["history"]] == pytest.approx([h["train_loss"] for h in a["history"]], rel=1e-6)
    for name in ("final.safetensors", "final_ema.safetensors"):
        wa, wb = load_file(straight / name), load_file(killed / name)
        assert wa.keys() == wb.keys()
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-6, atol=1e-7, msg=f"{name}: {k}")
    # the metrics log holds the same records, none duplicated by the steps redone after the kill
    ra, rb = _records(straight / "metrics.jsonl"), _records(killed / "metrics.jsonl")
    assert [(r["type"], r["global_step"]) for r in rb] == [(r["type"], r["global_step"]) for r in ra]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        for k in x:
            assert y[k] == (pytest.approx(x[k], rel=1e-6) if isinstance(x[k], float) else x[k]), (x, k)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "run"
    args = train_cli.build_parser().parse_args(TINY_FLAGS + ["--epochs", "1", "--steps-per-epoch", "2",
                                                             "--output", str(out)])
    threads = torch.get_num_threads()
    train(load_config(None, recipe_overrides(TrainConfig, args)))
    torch.set_num_threads(threads)
    return out, args


def test_corrupt_checkpoint_fails_cleanly_and_keeps_files(short_run, capsys):
    out, _ = short_run
    last = out / "last.pth"
    original = last.read_bytes()
    try:
        last.write_bytes(original[: len(original) // 2])  # a truncated file, as a crash of a non-atomic writer leaves
        before = digests(out)
        code = simattn_main(["train", *TINY_FLAGS, "--output", str(out), "--resume"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith("simattn train: error: cannot read checkpoint") and err.count("\n") == 1
        assert digests(out) == before
        assert simattn_main(["validate", "--weights", str(last)]) == 2
        assert "cannot read checkpoint" in capsys.readouterr().err
    finally:
        last.write_bytes(original)


def test_checkpoint_of_another_model_fails_cleanly_and_keeps_files(short_run, capsys):
    out, _ = short_run
    before = digests(out)
    other = ["--model", "relu_vit_small_patch16_224"]
    code = simattn_main(["train", *TINY_FLAGS, *other, "--output", str(out), "--resume"])
    err = capsys.readouterr().err
    assert code == 2
    assert "differ in model 'sima_deit_tiny_patch16_224' vs 'relu_vit_small_patch16_224'" in err
    # same model name, other kwargs (a SimA run must not continue as softmax): named in the error
    softmax = ["--model-kwargs", "attn_type=softmax"]
    assert simattn_main(["train", *TINY_FLAGS, *softmax, "--output", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "differ in model_kwargs" in err and "'attn_type': 'softmax'" in err and err.count("\n") == 1
    wider = ["--model-kwargs", "embed_dim=48"]
    assert simattn_main(["train", *TINY_FLAGS, *wider, "--output", str(out), "--resume"]) == 2
    assert "differ in model_kwargs" in capsys.readouterr().err
    assert simattn_main(["train", *TINY_FLAGS, "--output", str(out), "--resume", str(out / "missing.pth")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    # plain weights are not a train state
    with pytest.raises(CheckpointError, match="not a simattn training checkpoint"):
        load_train_state(out / "final.safetensors")
    assert digests(out) == before


def test_resume_from_an_epoch_end_continues_to_more_epochs(short_run, tmp_path):
    out, args = short_run
    cfg = load_config(None, {**recipe_overrides(TrainConfig, args), "output": str(out), "epochs": 2,
                             "resume": "auto"})
    # a longer schedule than the checkpoint's is allowed: the run continues at epoch 2
    result = train(cfg)
    assert [h["epoch"] for h in result.summary["history"]] == [1, 2]
    assert result.summary["updates"] == 4
