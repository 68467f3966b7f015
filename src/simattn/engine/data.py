"""The engine's data stream: a reproducible, resumable order for every task.

Resuming mid-epoch must replay exactly the batches an uninterrupted run would see, whatever the worker count.
So the data order is a function of (seed, epoch) only (``DistributedSampler``/``RepeatAugSampler`` with
``set_epoch``), a resumed epoch starts at a sample position, and every sample's augmentation runs under RNGs seeded
from (seed, epoch, rank, position) and restored afterwards, leaving the global RNGs (drop-path, mixup) untouched.
timm's ``create_loader`` builds its own sampler (and for one process shuffles with the global RNG), so the loader is
assembled here.

An iterable dataset (webdataset shards, :class:`~simattn.data.shards.ShardDataset`) is read shard by shard: every
rank and every DataLoader worker reads distinct shards, in an order shuffled per epoch from (seed, epoch), and every
sample's augmentation runs under a seed of (seed, epoch, its index). All ranks run the same number of steps, the
fewest any rank's shards give in any epoch of the run (counted from the recorded shard lengths, see
:func:`shard_steps`). A run resumed at an epoch's start sees the order of an uninterrupted run; one resumed
mid-epoch restarts that epoch's shard stream for its remaining steps (the samples already seen that epoch are seen
again, those after them not), and from the next epoch on is exact again.
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler, Subset

from ..data.folder import collate_skipping_unreadable
from ..data.seeding import sample_seed, seeded_rngs
from .dist import DistInfo
from .config import EngineConfig

__all__ = ["SeededSamples", "ResumableSampler", "ShardEpochs", "SizedLoader", "build_train_loader",
           "build_eval_loader", "sample_seed", "shard_steps"]


class SeededSamples(Dataset):
    """Wraps a dataset whose transform is random: ``ds[(index, seed)]`` is ``dataset[index]`` drawn under ``seed``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, int]):
        index, seed = key
        with seeded_rngs(seed):
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
    each epoch). ``collate_fn`` defaults to :func:`collate_skipping_unreadable`. An iterable dataset gives a
    :class:`SizedLoader` and :class:`ShardEpochs` instead (see the module docstring)."""
    if isinstance(dataset, IterableDataset):
        return _shard_train_loader(dataset, cfg, dist, pin_memory, collate_fn)
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
    if isinstance(dataset, IterableDataset):  # shards: each read by one rank and worker
        rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
        dataset.configure(rank, world)
        workers = _usable_workers(len(dataset.urls), world, workers)
        sizes = _slot_samples(dataset, world, max(workers, 1))[rank]
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                            collate_fn=collate_skipping_unreadable, pin_memory=pin_memory)
        return SizedLoader(loader, sum(-(-n // batch_size) for n in sizes))
    if dist is not None and dist.distributed:
        dataset = Subset(dataset, range(dist.rank, len(dataset), dist.world_size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                      collate_fn=collate_skipping_unreadable, pin_memory=pin_memory)


class SizedLoader:
    """A DataLoader over shards with the number of batches it gives (``len``), for progress and the step count."""

    def __init__(self, loader: DataLoader, batches: int) -> None:
        self.loader, self.batches = loader, batches
        self.dataset = loader.dataset

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return self.batches


class ShardEpochs:
    """What the engine calls ``set_epoch(epoch, start)`` on for shards: selects the epoch's shard order (``start``
    is not skipped: a mid-epoch resume restarts the epoch's stream, see the module docstring)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.dataset.set_epoch(epoch)


def _usable_workers(num_shards: int, world_size: int, workers: int) -> int:
    """Workers beyond this rank's shard count would read nothing: at most ``num_shards // world_size``."""
    return min(workers, max(1, num_shards // world_size)) if workers > 0 else 0


def _slot_samples(dataset, world_size: int, workers: int) -> List[List[int]]:
    """Samples per (rank, worker) in the packed order."""
    from ..data.shards import shard_slots
    lengths = list(dataset.lengths)
    return [[sum(lengths[i] for i in slot) for slot in rank]
            for rank in shard_slots(len(lengths), world_size, workers, 0, 0, False)]


def _epoch_rank_batches(lengths: np.ndarray, world_size: int, workers: int, batch_size: int, seed: int,
                        epoch: int) -> List[int]:
    """Batches each rank's loader gives in ``epoch``: every worker batches its own shards and drops its last
    partial batch."""
    from ..data.shards import shard_slots
    slots = shard_slots(len(lengths), world_size, workers, seed, epoch, True)
    return [sum(int(lengths[slot].sum()) // batch_size for slot in rank) for rank in slots]


def shard_steps(lengths: Sequence[int], world_size: int, workers: int, batch_size: int, seed: int, epochs: int,
                requested_workers: Optional[int] = None) -> Tuple[int, int, Optional[str]]:
    """(steps every rank runs per epoch, samples each epoch uses, the one-line note or None) for shards of
    ``lengths`` read by ``world_size`` ranks × ``workers`` loader workers (0 counts as 1) in batches of
    ``batch_size``, over epochs ``0 .. epochs - 1`` of the shard order drawn from ``seed``.

    Why this count: the step count is fixed for the run (the LR schedule, the global step and resuming count
    updates per epoch), all ranks must run the same number of steps (DDP) and no rank may run out of samples, and
    no sample is read twice. The shard order of every epoch is a function of (seed, epoch) known to every rank, so
    each rank computes the batches every rank's loader gives in every epoch of the run, the same on all ranks, and
    takes the minimum: the largest fixed count no epoch falls short of, reached by some rank in some epoch. A bound
    over every possible order (a rank gets the shortest shards) would be safe for any epoch count but throws away
    what the actual orders give: with shards of unequal lengths it assumes one rank gets all the short ones. The
    price is that a run resumed with more epochs recomputes the count over its own epochs (it can only shrink).

    Each epoch uses ``steps × batch_size × world_size`` samples; the others are left out (other ones each epoch,
    as the shards are shuffled) because the ranks' shards hold unequal counts (a shard count that does not split
    evenly, a short last shard, shards of different lengths) and each worker drops its last partial batch. The note
    says how many and why whenever any are left out, else it is None."""
    lengths_np = np.asarray(list(lengths), dtype=np.int64)
    num_shards, slots = len(lengths_np), max(workers, 1)
    steps = min(min(_epoch_rank_batches(lengths_np, world_size, slots, batch_size, seed, epoch))
                for epoch in range(max(epochs, 1)))
    total = int(lengths_np.sum())
    used = steps * batch_size * world_size
    if used >= total:
        return steps, used, None
    from ..data.shards import slot_sizes
    why = []
    per_rank = [sum(r) for r in slot_sizes(num_shards, world_size, slots)]
    if requested_workers is not None and workers < requested_workers:
        why.append(f"{workers} loader workers (not {requested_workers}: {num_shards} shards)")
    if num_shards % (world_size * slots):
        more = [r for r, n in enumerate(per_rank) if n == max(per_rank)]
        why.append(f"{num_shards} shards do not split evenly over {world_size} process(es) × {slots} worker(s): "
                   f"rank(s) {','.join(map(str, more))} read {max(per_rank)} shards and the others {min(per_rank)}")
    head = lengths_np[:-1]
    if num_shards > 1 and (head == head[0]).all() and lengths_np[-1] < head[0]:
        why.append(f"the last shard is short ({lengths_np[-1]:,} samples, the others {head[0]:,})")
    elif lengths_np.min() != lengths_np.max():
        why.append(f"shards hold {lengths_np.min():,} to {lengths_np.max():,} samples")
    if len(why) > (requested_workers is not None and workers < requested_workers):
        why.append("every rank runs the steps of the rank whose shards give the fewest batches")
    why.append("each worker drops its last partial batch")
    return steps, used, (f"note: shards: {total:,} samples in {num_shards} shards over {world_size} process(es) × "
                         f"{slots} worker(s), batch {batch_size}: every rank runs {steps} steps, so each epoch uses "
                         f"{used:,} and leaves {total - used:,} out (other ones each epoch, as the shards are "
                         f"shuffled): " + "; ".join(why))


def _shard_train_loader(dataset, cfg: EngineConfig, dist: DistInfo, pin_memory: bool,
                        collate_fn: Optional[Callable]) -> Tuple["SizedLoader", ShardEpochs]:
    if cfg.aug_repeats:
        raise ValueError(f"aug_repeats={cfg.aug_repeats} needs a dataset read by index; shards (--dataset wds) are "
                         "streamed: set aug_repeats=0")
    num_shards, world = len(dataset.urls), dist.world_size
    if num_shards < world:
        raise ValueError(f"the training split has {num_shards} shard(s) for {world} processes: every process needs "
                         "at least one; pack it into more, smaller shards (--shard-samples)")
    workers = _usable_workers(num_shards, world, cfg.workers)
    # the epochs the scheduler runs (timm adds the cooldown epochs)
    steps, _, note = shard_steps(dataset.lengths, world, workers, cfg.batch_size, cfg.seed,
                                 cfg.epochs + cfg.cooldown_epochs, requested_workers=cfg.workers)
    if steps < 1:
        raise ValueError(f"training set too small: {len(dataset)} samples in {num_shards} shard(s) give a rank no "
                         f"whole batch of {cfg.batch_size} (in {max(workers, 1)} worker stream(s)) in some epoch")
    if dist.is_main and note:
        print(note, flush=True)
    dataset.configure(dist.rank, world, cfg.seed, shuffle=True, seeded=True)
    loader = DataLoader(
        dataset, batch_size=cfg.batch_size, drop_last=True, num_workers=workers,
        collate_fn=collate_fn or collate_skipping_unreadable, pin_memory=pin_memory,
        persistent_workers=workers > 0, generator=torch.Generator().manual_seed(cfg.seed))
    return SizedLoader(loader, steps), ShardEpochs(dataset)
