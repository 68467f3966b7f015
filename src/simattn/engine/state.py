"""Run state on disk: the one resumable ``last.pth`` of every task the engine runs (what it holds, how a run writes
it and how a resumed run takes it back), and plain weights as safetensors.

``last.pth`` must load with ``torch.load(weights_only=True)``, so everything in it is a tensor or a plain Python
value: RNG states are stored as tensors and lists, not as the tuples/arrays Python and NumPy hand out.
Files are written atomically (simattn.utils.io), so a crash mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.distributed as torch_dist
from torch import nn

from ..models.weights import save_weights, weights_metadata as _weights_metadata
from ..utils.io import CheckpointError, atomic_torch_save, check_finite_weights, load_checkpoint
from ..utils.recipe import quoted

__all__ = ["TRAIN_STATE_FORMAT", "capture_rng_state", "restore_rng_state", "save_train_state", "load_train_state",
           "resume_path", "check_same_run", "save_run", "resume_run", "export_weights", "weights_metadata"]

TRAIN_STATE_FORMAT = "simattn-train-state-v1"


def capture_rng_state() -> Dict[str, Any]:
    """This process's torch (CPU and CUDA), NumPy and Python RNG states as tensors and plain values."""
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "python": {"version": int(py_version), "internal": torch.tensor(py_internal, dtype=torch.int64),
                   "gauss_next": py_gauss},
    }


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    npst = state["numpy"]
    np.random.set_state(("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss_next"]))


def save_train_state(path: str | Path, state: Dict[str, Any]) -> None:
    """Write a train state atomically. The trainer stores: ``model_name``, ``model_kwargs``, ``config``,
    ``data_config``, ``model`` (+ ``model_ema``), ``optimizer``, ``scheduler``, ``scaler``, the position
    (``epoch``, ``step_in_epoch`` = updates done in that epoch, ``global_step``, ``updates_per_epoch``,
    ``world_size``; the data sampler restarts the epoch at ``step_in_epoch`` × accumulation × batch samples),
    ``ranks`` (per rank: RNG states and the partial-epoch loss sums), ``best``, ``last_eval``, ``history``,
    ``train_skipped`` and ``metrics_records`` (lines of metrics.jsonl covered by this state)."""
    atomic_torch_save({"format": TRAIN_STATE_FORMAT, **state}, path)


#: state formats of earlier versions, and what wrote them (refused in one line rather than misread)
EARLIER_FORMATS = {"simattn-ssl-state-v1": "simattn ssl", "simattn-ssl-state-v2": "simattn ssl",
                   "simattn-detect-state-v1": "simattn detect", "simattn-detect-state-v2": "simattn detect"}


def load_train_state(path: str | Path, task: str = "simattn train") -> Dict[str, Any]:
    """Read a run state written by :func:`save_train_state` for ``task`` (the command that runs it, e.g.
    ``simattn ssl``; states without a ``task`` entry were written by ``simattn train``).

    Raises :class:`CheckpointError` (one line) for unreadable files, files that are not simattn run states (e.g.
    a bare state dict: use it as weights instead), states of earlier versions and states of another task.
    """
    state = load_checkpoint(path)
    fmt = state.get("format")
    if fmt in EARLIER_FORMATS:
        raise CheckpointError(f"{path} was written by an earlier {EARLIER_FORMATS[fmt]} (state format {fmt!r}), which "
                              "this version cannot resume; start a new run (its weights load as initial weights)")
    if fmt != TRAIN_STATE_FORMAT:
        raise CheckpointError(f"{path} is not a simattn training checkpoint (no '{TRAIN_STATE_FORMAT}' format tag); "
                              "it cannot be resumed")
    writer = state.get("task", "simattn train")
    if writer != task:
        raise CheckpointError(f"{path} was written by {writer}, not {task}: it cannot be resumed here")
    for key in ("model", "optimizer", "epoch", "step_in_epoch", "global_step"):
        if key not in state:
            raise CheckpointError(f"{path} is incomplete: no {key!r} entry")
    if "same_run" not in state and writer == "simattn train":
        # states of earlier versions of simattn train: the same facts from the entries they had
        saved = state.get("config") or {}
        state["same_run"] = {
            "model": state.get("model_name"), "model_kwargs": saved.get("model_kwargs", {}),
            "dataset": str(saved.get("dataset")).lower(), "data_dir": saved.get("data_dir"),
            "num_classes": (state.get("model_kwargs") or {}).get("num_classes"),
            "input size": list((state.get("data_config") or {}).get("input_size", [])),
            "model_ema": "model_ema" in state}
    return state


def weights_metadata(model_name: str, model_kwargs: Mapping[str, Any], data_config: Mapping[str, Any],
                     producer: str = "simattn train", **extra: Any) -> Dict[str, str]:
    """The ``simattn-weights-v1`` record (:func:`simattn.models.weights.weights_metadata`) of weights written by the
    trainer: model name, ``create_model`` kwargs (``num_classes`` included), preprocessing, the producing command
    (a command built on the trainer, e.g. ``simattn convert``, names itself) and ``extra`` (metrics, recipe)."""
    return _weights_metadata(model_name, model_kwargs, producer=producer, data_config=data_config, **extra)


def export_weights(model: nn.Module, path: str | Path, metadata: Mapping[str, str]) -> None:
    """Save ``model``'s weights as safetensors (atomically) with :func:`weights_metadata`'s record."""
    save_weights(model, path, metadata)


# ----- a run of the engine: what it writes and takes back (``engine`` is an :class:`~simattn.engine.core.Engine`)

def resume_path(cfg: Any) -> Optional[Path]:
    """The checkpoint option ``resume`` names: None, ``<output>/last.pth`` for 'auto', else the path given."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        if not cfg.output:
            raise ValueError("--resume without a path continues <output>/last.pth, so it needs --output (or give the "
                             "checkpoint: --resume RUN/last.pth)")
        return Path(cfg.output) / "last.pth"
    return Path(cfg.resume)


def check_same_run(path: Path, state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse to resume a checkpoint of another network or data (a one-line CheckpointError naming them)."""
    saved = state.get("same_run") or {}
    diffs = [f"{key} {quoted(saved.get(key))} vs {quoted(value)}" for key, value in mine.items()
             if saved.get(key) != value]
    if diffs:
        raise CheckpointError(f"cannot resume {path}: the checkpoint and this run differ in {'; '.join(diffs)} "
                              "(checkpoint vs this run); resume with the run's own options (its config.yaml), "
                              "or start a new run from its weights")


def save_run(engine: Any) -> None:
    """Write ``last.pth`` (rank 0) from every rank's RNG state and partial-epoch sums (a collective call)."""
    mine = {"rng": capture_rng_state(), "loss_sum": float(engine.loss_sum), "samples": int(engine.samples),
            "part_sums": dict(engine.part_sums)}
    dist = engine.dist
    if dist.distributed:
        ranks: List[Any] = [None] * dist.world_size
        torch_dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if not dist.is_main:
        return
    state = {
        "task": engine.producer, "model_name": engine.model_name, "model_kwargs": engine.model_kwargs,
        "config": engine.cfg.to_dict(), "same_run": engine.same_run(),
        "data_config": getattr(engine, "data_config", None),
        "model": engine.model.state_dict(),
        "optimizer": engine.optimizer.state_dict(),
        "scheduler": engine.scheduler.state_dict() if engine.scheduler is not None else None,
        "scaler": engine.precision.state_dict(),
        "epoch": engine.epoch, "step_in_epoch": engine.step_in_epoch, "global_step": engine.global_step,
        "updates_per_epoch": engine.updates_per_epoch, "world_size": dist.world_size, "ranks": ranks,
        "last_eval": engine.last_eval, "history": engine.history,
        "nonfinite_skipped": engine.nonfinite_skipped,
        "metrics_records": engine.log.records, "train_time_s": engine.train_time(),
        "task_state": engine.task_state(),
    }
    check_finite_weights(engine.model, "the model")
    if engine.ema is not None:
        check_finite_weights(engine.ema.module, "the EMA model")
        state["model_ema"] = engine.ema.module.state_dict()
    save_train_state(engine.out / "last.pth", state)


def resume_run(engine: Any, path: Path, state: Mapping[str, Any]) -> int:
    """Put the run where checkpoint ``path`` (its ``state``) stopped: weights, EMA, optimizer, loss scale, schedule,
    position, history, the task's own state and this rank's random streams and partial sums. Returns the number of
    metrics.jsonl lines the checkpoint covers."""
    check_same_run(path, state, engine.same_run())
    _restore_weights(engine, path, state)
    engine.epoch, engine.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
    if engine.epoch > engine.num_epochs or (engine.epoch == engine.num_epochs and engine.step_in_epoch):
        raise CheckpointError(f"{path} has trained {engine.epoch} epoch(s) (+{engine.step_in_epoch} steps) but this "
                              f"run has {engine.num_epochs}: resume with at least {engine.epoch + 1} epochs, or start "
                              "a new run from its weights")
    engine.global_step = int(state["global_step"])
    engine.last_eval = state.get("last_eval")
    engine.history = list(state.get("history", []))
    engine.nonfinite_skipped = int(state.get("nonfinite_skipped", 0))
    engine.train_time_base = float(state.get("train_time_s", 0.0))
    engine.load_task_state(dict(state.get("task_state") or {}))
    _restore_rank(engine, path, state)
    _continue_schedule(engine, path, state)
    if engine.dist.is_main:
        print(f"resumed from {path}: epoch {engine.epoch + 1}, update {engine.step_in_epoch}/"
              f"{engine.updates_per_epoch} (global update {engine.global_step})", flush=True)
    return int(state.get("metrics_records", 0))


def _continue_schedule(engine: Any, path: Path, state: Mapping[str, Any]) -> None:
    """The learning rate of this run at the position resumed. timm schedulers are a pure function of the step: the
    saved state only differs from the one just built when the recipe changed (e.g. more epochs), and then this run's
    schedule is followed, the schedule of a run as long as this one, which a note says with the lr it moves to."""
    if engine.scheduler is None:
        return
    saved, ignore = state.get("scheduler"), ("metric",)
    current = {k: v for k, v in engine.scheduler.state_dict().items() if k not in ignore}
    changed = bool(saved) and {k: v for k, v in saved.items() if k not in ignore} != current
    saved_lr = engine.optimizer.param_groups[0]["lr"]  # the stopped run's, restored with the optimizer
    engine.scheduler.step(engine.epoch)
    engine.scheduler.step_update(engine.global_step)
    if changed and engine.dist.is_main:
        print(f"note: the learning-rate schedule differs from the one in {path}; following this run's recipe (a "
              f"{engine.cfg.epochs}-epoch schedule): the lr moves from {saved_lr:.3g} to "
              f"{engine.optimizer.param_groups[0]['lr']:.3g} at update {engine.global_step}", flush=True)


def _restore_weights(engine: Any, path: Path, state: Mapping[str, Any]) -> None:
    """The model, EMA, optimizer and loss-scale states (each a one-line CheckpointError when it does not fit)."""
    try:
        engine.model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the weights do not fit this run's model: {str(e).splitlines()[0]}") from None
    if engine.ema is not None:
        if "model_ema" not in state:
            raise CheckpointError(f"{path} has no EMA weights but this run keeps an EMA (model_ema)")
        engine.ema.module.load_state_dict(state["model_ema"])
    try:
        engine.optimizer.load_state_dict(state["optimizer"])
        engine.precision.load_state_dict(state.get("scaler"))
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{path}: optimizer state does not fit this run: {e}") from None


def _restore_rank(engine: Any, path: Path, state: Mapping[str, Any]) -> None:
    """This rank's random streams and partial-epoch sums (a warning when the data order cannot continue exactly)."""
    dist, cfg = engine.dist, engine.cfg
    ranks = state.get("ranks", [])
    saved_world = int(state.get("world_size", 1))
    saved_batch = (state.get("config") or {}).get("batch_size")
    if (saved_world != dist.world_size or saved_batch != cfg.batch_size) and dist.is_main:
        print(f"warning: {path} was written with {saved_world} process(es) × batch {saved_batch}; this run uses "
              f"{dist.world_size} × {cfg.batch_size}: the data order cannot continue exactly", flush=True)
    if dist.rank < len(ranks):
        mine = ranks[dist.rank]
        restore_rng_state(mine["rng"])
        engine.loss_sum, engine.samples = float(mine["loss_sum"]), int(mine["samples"])
        engine.part_sums = dict(mine.get("part_sums") or {})
