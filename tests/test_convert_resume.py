"""simattn convert: a conversion killed (SIGKILL) in its distillation stage and resumed ends with the weights of an
uninterrupted one; finished stages are not run again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch
from safetensors.torch import load_file

from simattn.convert import convert, load_convert_recipe

from test_convert import MODEL, TINY, make_timm_teacher

SETTINGS = ["epochs=2", "steps_per_epoch=4", "batch_size=32", "threads=1", "device=cpu", "log_interval=1",
            "checkpoint_every_steps=1", "seed=5", "convert.transfer_batch_size=32", "drop_path=0.1"]


def _overrides(out, *extra):
    from simattn.utils.values import parse_assignments
    return {**parse_assignments([*SETTINGS, *extra]), "output": str(out)}


@pytest.mark.slow
def test_sigkill_during_distillation_then_resume_matches_an_uninterrupted_run(tmp_path):
    teacher = tmp_path / "teacher.pth"
    make_timm_teacher(teacher, seed=2)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    cmd = [sys.executable, "-m", "simattn", "convert", "--weights", str(teacher), "--model", MODEL,
           "--model-kwargs", *[f"{k}={v}" for k, v in TINY.items()], "--output", str(killed), "--set", *SETTINGS]
    victim = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen = []

    def kill_mid_distillation():
        in_distill = False
        for line in victim.stdout:
            seen.append(line)
            in_distill = in_distill or line.startswith("== distill")
            if in_distill and line.startswith("checkpoint:") and "(epoch 1, update 2/" in line:
                os.kill(victim.pid, signal.SIGKILL)
                return

    watcher = threading.Thread(target=kill_mid_distillation)
    watcher.start()
    reference = convert(load_convert_recipe("convert_digits", _overrides(straight)), str(teacher), MODEL,
                        TINY)  # meanwhile, in this process
    watcher.join(timeout=300)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)
    assert (killed / "transfer" / "summary.json").is_file() and not (killed / "distill" / "summary.json").exists()
    transfer_before = (killed / "transfer" / "final.safetensors").read_bytes()

    resumed = convert(load_convert_recipe("convert_digits", {**_overrides(killed), "resume": "auto"}), str(teacher),
                      MODEL, TINY)

    assert (killed / "transfer" / "final.safetensors").read_bytes() == transfer_before  # stage 1 was not redone
    assert resumed["final"]["top1"] == pytest.approx(reference["final"]["top1"])
    assert resumed["final"]["loss"] == pytest.approx(reference["final"]["loss"], rel=1e-6)
    wa, wb = load_file(straight / "final.safetensors"), load_file(killed / "final.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-6, atol=1e-7, msg=k)
    assert json.loads((killed / "results.json").read_text())["final"]["top1"] == pytest.approx(
        reference["final"]["top1"])
