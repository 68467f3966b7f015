"""Beyond one machine: two torchrun "nodes" joined by c10d rendezvous on localhost train in lockstep on packed shards,
each reading its own samples; a rank that freezes ends the job within ``dist_timeout`` with one line instead of the
backend's 30-minute hang."""
from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import marked_processes
from shard_fixtures import png_bytes
from simattn.cli import main as simattn_main

MODEL = ["--model", "sima_deit_tiny_patch16_224", "--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=32",
         "depth=1", "num_heads=2", "--img-size", "16", "--epochs", "1", "--warmup-epochs", "0", "--threads", "1",
         "--device", "cpu", "--log-interval", "1"]
TINY = [*MODEL, "--batch-size", "32", "--steps-per-epoch", "3"]

# runs `simattn train` as the CLI does, then saves this rank's weights (only rank 0 writes the run's files); on
# shards of numbered images (pixel value = sample id) it also lists the ids of the training samples this rank read
WORKER = textwrap.dedent("""
    import os, sys, torch
    from simattn.data.shards import ShardDataset
    from simattn.engine import core
    from simattn.cli import main
    out = sys.argv[sys.argv.index("--output") + 1]
    transform = ShardDataset._transform
    def record_id(self, item):
        if self.split == "train":  # in the rank's DataLoader workers: one short append each
            with open(f"{out}.ids.rank{os.environ['RANK']}", "a") as f:
                f.write(f"{item[0].getpixel((0, 0))[0]}\\n")
        return transform(self, item)
    ShardDataset._transform = record_id
    finish = core.Engine._finish
    def keep_rank_weights(self, train_time):
        torch.save(self.model.state_dict(), f"{out}.rank{self.dist.rank}.pt")
        return finish(self, train_time)
    core.Engine._finish = keep_rank_weights
    if os.environ.get("FREEZE_RANK") == os.environ["RANK"]:
        after = core.Engine._after_update
        def freeze(self):
            after(self)
            os.kill(os.getpid(), 19)  # SIGSTOP: this rank stops answering, as a hung node would
        core.Engine._after_update = freeze
    sys.exit(main(sys.argv[1:]))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_processes(job: str) -> list:
    """The live processes of one launched job (launchers and workers: torchrun starts its workers in their own
    session, so killing a launcher's group does not reach them)."""
    return marked_processes("SIMATTN_TEST_JOB", job)


def _end_job(nodes, job: str) -> None:
    """SIGKILL every process of the job (a stopped one too) and reap the launchers."""
    for pid in _job_processes(job):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for n in nodes:
        n.kill()
        n.wait(timeout=30)
    deadline = time.monotonic() + 10  # a killed orphan is gone once init has reaped it
    while _job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.1)


def _two_nodes(script, argv, extra_env=None):
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
              "--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{port}", "--rdzv_id", "simattn-test",
              "--max_restarts", "0", str(script), *argv]
    nodes = [subprocess.Popen(launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for _ in range(2)]
    return nodes


def _numbered_shards(tmp_path):
    """Images whose pixels hold their sample id (train 0..63, val 64..79), packed by ``simattn data pack`` into 8
    train shards of 8: 2 nodes × 2 loader workers read 2 shards, one batch of 16, each."""
    source, shards = tmp_path / "images", tmp_path / "shards"
    for split, ids in (("train", range(64)), ("val", range(64, 80))):
        for i in ids:
            (source / split / str(i % 2)).mkdir(parents=True, exist_ok=True)
            (source / split / str(i % 2) / f"{i:03d}.png").write_bytes(png_bytes(np.full((4, 4), i, np.uint8)))
        assert simattn_main(["data", "pack", "--dataset", "folder", "--data-dir", str(source), "--split", split,
                             "--output", str(shards), "--shard-samples", "8"]) == 0
    return shards


@pytest.mark.slow
def test_two_nodes_with_c10d_rendezvous_read_distinct_shards_and_keep_ranks_identical(tmp_path):
    shards = _numbered_shards(tmp_path)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "run"
    nodes = _two_nodes(script, ["train", *MODEL, "--batch-size", "16", "--dataset", "wds", "--data-dir", str(shards),
                                "--workers", "2", "--output", str(out)])
    logs = [n.communicate(timeout=300)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(log[-2000:] for log in logs)
    assert not any("note: shards" in log for log in logs)  # every sample read: no left-out note
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["updates"] == 2
    a, b = (torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in (0, 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the epoch's samples: each rank read 32 (two shards per worker), none twice, none read by both, all 64 read
    seen = [collections.Counter(map(int, Path(f"{out}.ids.rank{r}").read_text().split())) for r in (0, 1)]
    assert [sum(s.values()) for s in seen] == [32, 32] and max((seen[0] + seen[1]).values()) == 1
    assert set(seen[0]) | set(seen[1]) == set(range(64))


@pytest.mark.slow
def test_a_frozen_rank_ends_the_job_within_the_collective_timeout(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    start = time.monotonic()
    job = uuid.uuid4().hex
    nodes = _two_nodes(script, ["train", *TINY, "--dist-timeout", "0.2", "--output", str(tmp_path / "run")],
                       {"FREEZE_RANK": "1", "SIMATTN_TEST_JOB": job})
    lines: list = []
    readers = [threading.Thread(target=lambda n=n: lines.extend(n.stdout), daemon=True) for n in nodes]
    for r in readers:
        r.start()
    said = "another process of the distributed job stopped answering"
    try:
        # the frozen node's launcher waits on its stopped worker for ever: only the live rank's answer matters
        while time.monotonic() - start < 150 and not any(said in line for line in lines):
            time.sleep(0.5)
    finally:
        _end_job(nodes, job)
    assert not _job_processes(job)
    took = time.monotonic() - start
    error = [line for line in lines if said in line]
    assert error, "".join(lines)[-3000:]
    assert error[0].startswith("simattn train: error: ") and "dist_timeout" in error[0]
    assert took < 120, took  # 12 s of timeout plus start-up, not the backend's 30 minutes
