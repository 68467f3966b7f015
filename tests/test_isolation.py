"""Commands and library calls leave process-wide state as they found it, and the suite finds the processes it
started, stopped or orphaned ones included."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import simattn  # noqa: F401  (registers the models)
from conftest import _end_leftovers, _started_by_suite
from simattn.cli import main as simattn_main
from simattn.utils.global_state import preserved_global_state

TINY = ["--model", "sima_deit_tiny_patch16_224", "--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=32",
        "depth=1", "num_heads=2", "--img-size", "16", "--batch-size", "8", "--warmup-epochs", "0",
        "--steps-per-epoch", "2", "--epochs", "1", "--device", "cpu", "--log-interval", "100"]


def _fingerprint():
    return torch.get_num_threads(), torch.random.get_rng_state().clone()


@pytest.mark.parametrize("threads", [1, 3])
def test_train_and_validate_in_process_leave_threads_and_random_streams_as_they_were(tmp_path, threads):
    torch.set_num_threads(2)
    torch.manual_seed(123)
    threads_before, rng_before = _fingerprint()
    assert simattn_main(["train", *TINY, "--threads", str(threads), "--seed", "7",
                         "--output", str(tmp_path / "run")]) == 0
    threads_after, rng_after = _fingerprint()
    assert threads_after == threads_before and torch.equal(rng_after, rng_before)

    from simattn.validate import validate_weights
    validate_weights(tmp_path / "run" / "final.safetensors", threads=threads)
    assert torch.get_num_threads() == 2 and torch.equal(torch.random.get_rng_state(), rng_before)


def test_the_training_api_leaves_threads_and_random_streams_as_they_were(tmp_path):
    from simattn.train import load_config, train

    torch.set_num_threads(2)
    torch.manual_seed(123)
    threads_before, rng_before = _fingerprint()
    train(load_config(None, {"model": "sima_deit_tiny_patch16_224", "img_size": 16, "batch_size": 8,
                             "model_kwargs": {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 1,
                                              "num_heads": 2},
                             "warmup_epochs": 0, "steps_per_epoch": 2, "epochs": 1, "threads": 1, "seed": 7,
                             "device": "cpu", "output": str(tmp_path / "run")}))
    threads_after, rng_after = _fingerprint()
    assert threads_after == threads_before and torch.equal(rng_after, rng_before)


def test_preserved_global_state_restores_what_the_body_changed():
    torch.set_num_threads(2)
    rng = torch.random.get_rng_state()
    with preserved_global_state():
        torch.set_num_threads(1)
        torch.manual_seed(5)
        torch.set_float32_matmul_precision("medium")
        torch.set_default_dtype(torch.float64)
    assert torch.get_num_threads() == 2 and torch.get_default_dtype() == torch.float32
    assert torch.get_float32_matmul_precision() == "highest" and torch.equal(torch.random.get_rng_state(), rng)


def test_the_suite_finds_and_ends_a_stopped_orphan_it_started():
    # the child forks a grandchild that stops itself, then exits: the grandchild is an orphan nobody waits for
    code = ("import os, signal, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.close(1); os.close(2)\n"  # the parent's reader waits for these pipes to close
            "    os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60); os._exit(0)\n"
            "print(pid, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    orphan = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while orphan not in _started_by_suite() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan in _started_by_suite()
    killed = _end_leftovers(grace=0.5)
    assert any(line.startswith(f"{orphan}:") for line in killed)
    deadline = time.monotonic() + 10
    while orphan in _started_by_suite() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan not in _started_by_suite()
