"""The process group: torchrun/DDP set-up, owned by the engine for every task (train, ssl, detect, convert) and
used by the evaluations of a distributed run.

``torchrun --nproc_per_node=N -m simattn <command> ...`` sets RANK/WORLD_SIZE/LOCAL_RANK; without them everything
runs as a single process. NCCL on CUDA, gloo on CPU.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "init_distributed", "cleanup_distributed", "barrier", "all_reduce_mean", "all_finite"]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | None = None, timeout_min: float = 10.0) -> DistInfo:
    """Join the process group torchrun describes (if any) and pick this process's device.

    ``device``: 'cpu', 'cuda' or None (CUDA when available). ``timeout_min``: how long a collective waits for the
    other processes before it fails (the backends' default is 30 minutes of a silent hang when a rank froze).
    """
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(minutes=float(timeout_min)))
    return DistInfo(rank, world_size, local_rank, dev)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every process rank 0's buffers (BatchNorm statistics). DDP copies them to the other ranks at the start
    of each forward, so after the last step each rank holds its own; evaluation and the saved weights need one set."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=0)


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over all processes (identity when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def all_finite(loss: torch.Tensor) -> bool:
    """Whether ``loss`` is finite on every process (one host sync; all processes get the same answer, so they skip
    the same steps and DDP's gradient all-reduce stays in step)."""
    finite = torch.isfinite(loss.detach()).to(torch.float32)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite)
