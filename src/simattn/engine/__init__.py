"""The one training engine: ``simattn train``, ``ssl``, ``detect`` and ``convert`` are tasks it runs.

:class:`Engine` owns the run: the process group (:mod:`simattn.engine.dist`), device, DDP, SyncBatchNorm, AMP,
accumulation, clipping, EMA, the non-finite guard, the run folder, the config check, the checkpoint (``last.pth``)
and resume, the metrics log, summaries and progress; a command of several runs (convert's stages) runs them through
:class:`simattn.engine.stages.StagedRun`. A task subclasses :class:`Engine` and supplies its model, data, loss,
evaluation and exports (see :mod:`simattn.engine.core`); its options extend
:class:`simattn.engine.config.EngineConfig`.
"""
from .core import ENGINE_FILES, Engine, RunResult, autocast, build_optimizer, build_scheduler, run, session

__all__ = ["ENGINE_FILES", "Engine", "RunResult", "autocast", "build_optimizer", "build_scheduler", "run", "session"]
