"""The one training engine: ``simattn train``, ``ssl``, ``detect`` and ``convert`` are tasks it runs.

:class:`Engine` owns the run: the process group (:mod:`simattn.engine.dist`), device, DDP, SyncBatchNorm, AMP
(:mod:`simattn.engine.amp`), accumulation, clipping, EMA, the non-finite guard, the run folder, the config check, the
checkpoint (``last.pth``) and resume (:mod:`simattn.engine.state`), the metrics log, summaries and progress; a
command of several runs (convert's stages) runs them through :class:`simattn.engine.stages.StagedRun`. A task
subclasses :class:`Engine` and supplies its model, data, loss, evaluation and exports (see
:mod:`simattn.engine.core`; its constructor only stores, :meth:`Engine.run` builds); its options extend
:class:`simattn.engine.config.EngineConfig`.
"""
from .amp import autocast
from .core import ENGINE_FILES, Engine, RunResult, build_optimizer, build_scheduler, run, session

__all__ = ["ENGINE_FILES", "Engine", "RunResult", "autocast", "build_optimizer", "build_scheduler", "run", "session"]
