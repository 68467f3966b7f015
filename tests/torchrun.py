"""Two processes on this machine through torchrun (gloo on CPU), as the DDP tests launch them."""
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def run_two_processes(tmp_path: Path, worker: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    """Write ``worker`` (a script's source) to ``tmp_path/worker.py`` and run it as 2 processes with ``args``; the
    run must succeed (its output's tail is the failure message). One thread each: two ranks share the cores."""
    script = tmp_path / "worker.py"
    script.write_text(worker)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
