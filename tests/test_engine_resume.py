"""Every task of the engine resumes bit-exactly: a DINO run and a detection run killed (SIGKILL) mid-epoch right after
a step checkpoint, then resumed, end with the weights and history of runs that were never interrupted (``simattn
train`` and ``convert`` have their own tests: test_train_resume, test_convert_resume). Also: a checkpoint of another
task or of an earlier version is refused in one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

import simattn  # noqa: F401
from simattn.cli import main as simattn_main
from simattn.utils.io import atomic_torch_save, load_checkpoint
from simattn.utils.recipe import recipe_to_save

from test_detect import _recipe as detect_recipe, shapes  # noqa: F401  (the shapes fixture)

TINY_SSL = ["model.kwargs={img_size: 16, patch_size: 4, embed_dim: 32, depth: 1, num_heads: 2}",
            "head.hidden_dim=32", "head.bottleneck_dim=16", "head.output_dim=64", "epochs=2",
            "batch_size=256", "checkpoint_every_steps=2", "checkpoint_every_epochs=1", "threads=1",
            "eval.compare_random_init=false", "eval.linear_epochs=2", "eval_every_epochs=0", "workers=0"]


def _kill_after_a_step_checkpoint(command, epoch: int):
    """Run ``simattn COMMAND`` in a subprocess and SIGKILL it as soon as it reports a step checkpoint in ``epoch``."""
    victim = subprocess.Popen([sys.executable, "-m", "simattn", *command],
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen = []
    for line in victim.stdout:
        seen.append(line)
        if line.startswith("checkpoint:") and f"(epoch {epoch}, update" in line:
            os.kill(victim.pid, signal.SIGKILL)
            break
    victim.wait(timeout=120)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)


def _same_tensors(a, b):
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_dino_killed_mid_epoch_and_resumed_equals_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    base = ["ssl", "train", "--config", "ssl_digits", "--set", *TINY_SSL]
    assert simattn_main([*base, "--output", str(straight)]) == 0
    _kill_after_a_step_checkpoint([*base, "--output", str(killed)], epoch=2)
    state = load_checkpoint(killed / "last.pth")
    assert state["epoch"] == 1 and state["step_in_epoch"] == 1 and not (killed / "backbone.safetensors").exists()
    assert simattn_main([*base, "--output", str(killed), "--resume"]) == 0
    a, b = load_checkpoint(straight / "last.pth"), load_checkpoint(killed / "last.pth")
    assert _same_tensors(a["model"], b["model"]) and _same_tensors(a["task_state"]["teacher"],
                                                                   b["task_state"]["teacher"])
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (straight, killed))
    assert sa["history"] == sb["history"] and sa["final"] == sb["final"]


@pytest.mark.slow
def test_detection_killed_mid_epoch_and_resumed_equals_an_uninterrupted_run(shapes, tmp_path):  # noqa: F811
    recipe = detect_recipe(shapes, tmp_path, epochs=2, checkpoint_every_epochs=1, batch_size=2,
                           checkpoint_every_steps=2, threads=1, eval_every_epochs=0)
    config = tmp_path / "detect.yaml"
    config.write_text(yaml.safe_dump(recipe_to_save(recipe)))
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    base = ["detect", "train", "--config", str(config)]
    assert simattn_main([*base, "--output", str(straight)]) == 0
    _kill_after_a_step_checkpoint([*base, "--output", str(killed)], epoch=2)
    assert load_checkpoint(killed / "last.pth")["epoch"] == 1
    assert simattn_main([*base, "--output", str(killed), "--resume"]) == 0
    a, b = load_checkpoint(straight / "last.pth"), load_checkpoint(killed / "last.pth")
    assert _same_tensors(a["model"], b["model"])
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (straight, killed))
    assert sa["history"] == sb["history"] and sa["eval"] == sb["eval"]


def test_a_checkpoint_of_another_task_or_an_earlier_version_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    atomic_torch_save({"format": "simattn-ssl-state-v2", "model": {}, "epoch": 1}, run / "last.pth")
    code = simattn_main(["ssl", "train", "--config", "ssl_digits", "--set", *TINY_SSL, "--output", str(run),
                         "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "written by an earlier simattn ssl" in err
    atomic_torch_save({"format": "simattn-train-state-v1", "task": "simattn train", "model": {}, "optimizer": {},
                       "epoch": 1, "step_in_epoch": 0, "global_step": 1}, run / "last.pth")
    code = simattn_main(["ssl", "train", "--config", "ssl_digits", "--set", *TINY_SSL, "--output", str(run),
                         "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "written by simattn train, not simattn ssl" in err
