"""Where the process-group helpers were: they live in :mod:`simattn.engine.dist` (the engine owns the run)."""
from ..engine.dist import DistInfo, all_finite, all_reduce_mean, barrier, cleanup_distributed, init_distributed

__all__ = ["DistInfo", "init_distributed", "cleanup_distributed", "barrier", "all_reduce_mean", "all_finite"]
