"""Run state on disk: the one resumable ``last.pth`` of every task the engine runs, and plain weights as safetensors.

``last.pth`` must load with ``torch.load(weights_only=True)``, so everything in it is a tensor or a plain Python
value: RNG states are stored as tensors and lists, not as the tuples/arrays Python and NumPy hand out.
Files are written atomically (simattn.utils.io), so a crash mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, Mapping

import numpy as np
import torch
from torch import nn

from ..models.weights import save_weights, weights_metadata as _weights_metadata
from ..utils.io import CheckpointError, atomic_torch_save, load_checkpoint

__all__ = ["TRAIN_STATE_FORMAT", "capture_rng_state", "restore_rng_state", "save_train_state", "load_train_state",
           "export_weights", "weights_metadata"]

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
