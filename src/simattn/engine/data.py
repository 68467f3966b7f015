"""The engine's data stream: a reproducible, resumable order for every task.

Resuming mid-epoch must replay exactly the batches an uninterrupted run would see, whatever the worker count.
So the data order is a function of (seed, epoch) only (``DistributedSampler``/``RepeatAugSampler`` with
``set_epoch``), a resumed epoch starts at a sample position, and every sample's augmentation runs under RNGs seeded
from (seed, epoch, rank, position) and restored afterwards, leaving the global RNGs (drop-path, mixup) untouched.
timm's ``create_loader`` builds its own sampler (and for one process shuffles with the global RNG), so the loader is
assembled here.
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler, Subset

from ..data.folder import collate_skipping_unreadable
from .dist import DistInfo
from .config import EngineConfig

__all__ = ["SeededSamples", "ResumableSampler", "build_train_loader", "build_eval_loader", "sample_seed"]




def sample_seed(seed: int, epoch: int, rank: int, position: int) -> int:
    """The augmentation seed of the sample at ``position`` of ``rank``'s stream in ``epoch``."""
    return int(np.random.SeedSequence([seed, epoch, rank, position]).generate_state(1)[0])


@contextmanager
def _seeded_rngs(seed: int) -> Iterator[None]:
    # torchvision draws from torch's CPU generator, timm's RandAugment/RandomErasing from `random` (and torch)
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class SeededSamples(Dataset):
    """Wraps a dataset whose transform is random: ``ds[(index, seed)]`` is ``dataset[index]`` drawn under ``seed``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, int]):
        index, seed = key
        with _seeded_rngs(seed):
            return self.dataset[index]


class ResumableSampler(Sampler):
    """This rank's share of an epoch (from a sampler with ``set_epoch``), starting at any position, each index
    tagged with its augmentation seed (for :class:`SeededSamples`)."""

    def __init__(self, order: Sampler, seed: int, rank: int, epoch_offset: int = 0) -> None:
        self.order, self.seed, self.rank, self.epoch_offset = order, seed, rank, epoch_offset
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select ``epoch`` and skip its first ``start`` samples (already consumed before a resume)."""
        self.epoch, self.start = epoch, start
        self.order.set_epoch(epoch + self.epoch_offset)

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        for position, index in enumerate(self.order):
            if position >= self.start:
                yield index, sample_seed(self.seed, self.epoch, self.rank, position)

    def __len__(self) -> int:
        return max(0, len(self.order) - self.start)


def build_train_loader(dataset: Dataset, cfg: EngineConfig, dist: DistInfo, pin_memory: bool = False,
                       collate_fn: Optional[Callable] = None) -> Tuple[DataLoader, ResumableSampler]:
    """Shuffled, sharded (one shard per rank), optionally repeated-augmentation batches of ``cfg.batch_size`` that
    drop the last partial batch; returns the loader and its sampler (call ``sampler.set_epoch(epoch, start)`` before
    each epoch). ``collate_fn`` defaults to :func:`collate_skipping_unreadable`."""
    if cfg.aug_repeats:
        from timm.data.distributed_sampler import RepeatAugSampler

        from ..utils.memory import check_memory
        # the sampler lists every repeated index (int64), then shuffles a copy
        check_memory(3 * 8.0 * len(dataset) * cfg.aug_repeats, f"aug_repeats={cfg.aug_repeats} over {len(dataset)} "
                     "images")
        order = RepeatAugSampler(dataset, num_replicas=dist.world_size, rank=dist.rank, num_repeats=cfg.aug_repeats)
        # RepeatAugSampler shuffles with the epoch as its only seed: offset it so the run seed changes the order
        epoch_offset = 1_000_003 * cfg.seed
    else:
        order = DistributedSampler(dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=cfg.seed)
        epoch_offset = 0
    sampler = ResumableSampler(order, cfg.seed, dist.rank, epoch_offset)
    if len(order) < cfg.batch_size:
        raise ValueError(f"training set too small: {len(order)} samples per rank for batch size {cfg.batch_size}")
    loader = DataLoader(
        SeededSamples(dataset), batch_sampler=BatchSampler(sampler, cfg.batch_size, drop_last=True),
        num_workers=cfg.workers, collate_fn=collate_fn or collate_skipping_unreadable, pin_memory=pin_memory,
        persistent_workers=cfg.workers > 0,
        # a private generator: creating the iterator (worker base seed) must not consume the global RNG
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    return loader, sampler


def build_eval_loader(dataset: Dataset, batch_size: int, workers: int = 0, dist: Optional[DistInfo] = None,
                      pin_memory: bool = False) -> DataLoader:
    """In-order batches of this rank's interleaved shard, without the padding ``DistributedSampler`` adds, so
    summed counts over ranks are exact."""
    if dist is not None and dist.distributed:
        dataset = Subset(dataset, range(dist.rank, len(dataset), dist.world_size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                      collate_fn=collate_skipping_unreadable, pin_memory=pin_memory)
