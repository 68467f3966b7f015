"""Per-sample augmentation seeds: a random transform drawn under a seed of (run seed, epoch, rank, position) gives
the same result whatever the worker count or a resume, and leaves the global RNGs (drop-path, mixup) untouched."""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

__all__ = ["sample_seed", "seeded_rngs"]


def sample_seed(seed: int, epoch: int, rank: int, position: int) -> int:
    """The augmentation seed of the sample at ``position`` of ``rank``'s stream in ``epoch``."""
    return int(np.random.SeedSequence([seed, epoch, rank, position]).generate_state(1)[0])


@contextmanager
def seeded_rngs(seed: int) -> Iterator[None]:
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
