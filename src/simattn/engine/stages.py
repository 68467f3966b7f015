"""A command made of several engine runs (``simattn convert``'s stages): one output folder, each run (a stage) in a
sub-folder of its own, resumable like any run.

The command's folder holds the stage folders and the command's own files, nothing else. On ``resume`` a finished
stage (its ``summary.json`` and ``final.safetensors``) is not run again, a stage with a ``last.pth`` continues
exactly where it stopped, and a stage with neither (killed before its first checkpoint) starts over in its folder.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from ..utils.recipe import recipe_name
from ..utils.runs import check_not_in_use, lock_run_folder, open_run_folder, run_files
from .config import EngineConfig
from .dist import DistInfo, barrier

__all__ = ["StagedRun"]


class StagedRun:
    """The runs of one command in ``cfg.output`` (``stages``: stage name → sub-folder; ``files``: what the command
    writes at the top; ``what`` names the command's result in messages, e.g. "conversion").

    Create it before reading the command's inputs (it refuses a folder another process holds, or one that holds no
    such result to resume), :meth:`open` the folder once they are read, then :meth:`run` each stage."""

    def __init__(self, cfg: EngineConfig, dist: DistInfo, task_name: str, stages: Mapping[str, str],
                 files: Tuple[str, ...], what: str) -> None:
        self.cfg, self.dist, self.task_name = cfg, dist, task_name
        self.stages, self.files, self.what = dict(stages), tuple(files), what
        self.out: Optional[Path] = None
        if cfg.resume and not cfg.output:
            raise ValueError(f"option 'resume': give the folder of the {what} to continue (--output DIR)")
        if cfg.resume:
            self._check_folder(Path(cfg.output))
        if cfg.output and dist.is_main:  # another live run there: refused before any input is read
            check_not_in_use(Path(cfg.output))

    def _check_folder(self, out: Path) -> None:
        """Refuse (one line) to resume ``out`` unless it holds nothing but stage folders and the command's files (an
        empty folder is a command stopped before its first stage). A single run's folder holds ``last.pth`` and
        ``metrics.jsonl``, which a staged command never writes at its top."""
        if not out.is_dir():
            raise FileNotFoundError(f"no {self.what} to resume in {out}")
        tops = {name.split("/")[0] for name in self.stages.values()}
        foreign = [n for n in run_files(out) if not (n in self.files and (out / n).is_file())
                   and not (n in tops and (out / n).is_dir())]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else "")
            raise ValueError(f"--resume: {out} holds no {self.what} to resume: it holds {shown}, which simattn "
                             f"{self.task_name} never writes there (another task's run, e.g. simattn train); give the "
                             f"--output of a {self.what}, or start a new one in an empty folder (without --resume)")

    def open(self, inputs: Optional[Mapping[str, Any]] = None) -> Path:
        """The command's folder, checked (``inputs``: option → path it must not replace) and held by this process."""
        cfg = self.cfg
        if cfg.resume:  # the stage folders decide what is done; the command's own files are rewritten
            out = Path(cfg.output)
            barrier()  # every process has read the folder before the main one holds it
            if self.dist.is_main:
                lock_run_folder(out)
                self._check_folder(out)  # again, under the lock: another command may have written there meanwhile
        else:
            tops = {name.split("/")[0] for name in self.stages.values()}
            out = open_run_folder(cfg.output, recipe_name(cfg.recipe), self.task_name, overwrite=cfg.overwrite,
                                  replaced=self.files, is_main=self.dist.is_main, inputs=inputs,
                                  writes=(*self.files, *sorted(tops)))
        self.out = out
        return out

    def folder(self, stage: str) -> Path:
        return self.out / self.stages[stage]

    def done(self, stage: str) -> Optional[Dict[str, Any]]:
        """The summary of ``stage`` when a resumed command finished it earlier, else None."""
        folder = self.folder(stage)
        if self.cfg.resume and (folder / "summary.json").is_file() and (folder / "final.safetensors").is_file():
            return json.loads((folder / "summary.json").read_text())
        return None

    def run(self, stage: str, cfg: EngineConfig, task_cls: type, **kwargs: Any) -> Dict[str, Any]:
        """Run ``stage`` as task ``task_cls`` on ``cfg`` in its folder (resumed where it stopped when the command is
        resumed), ``cfg`` checked first; returns its summary (that of the earlier run when it is done)."""
        summary = self.done(stage)
        if summary is not None:
            return summary
        folder = self.folder(stage)
        has_state = (folder / "last.pth").is_file()
        resumed = bool(self.cfg.resume)
        cfg = dataclasses.replace(cfg, output=str(folder), resume="auto" if resumed and has_state else None,
                                  overwrite=self.cfg.overwrite or (resumed and not has_state)).validate()
        return task_cls(cfg, self.dist, **kwargs).run().summary
