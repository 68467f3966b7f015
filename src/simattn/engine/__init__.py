"""The one training engine: ``simattn train``, ``ssl``, ``detect`` and ``convert`` are tasks it runs.

:class:`Engine` owns distributed set-up, DDP, AMP, accumulation, clipping, EMA, the non-finite guard, the run
folder, the checkpoint (``last.pth``) and resume, the metrics log, summaries and progress; a task subclasses it and
supplies its model, data, loss, evaluation and exports (see :mod:`simattn.engine.core`).
"""
from .core import ENGINE_FILES, Engine, RunResult, autocast, build_optimizer, build_scheduler, run

__all__ = ["ENGINE_FILES", "Engine", "RunResult", "autocast", "build_optimizer", "build_scheduler", "run"]
