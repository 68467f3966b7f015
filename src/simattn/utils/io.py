"""Files that are never half-written, and checkpoints that load safely with clear errors.

Everything here writes to a temporary file in the destination folder and renames it into place, so an existing
file is either left intact or replaced whole.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Union

import torch
from torch import nn

PathLike = Union[str, os.PathLike]

__all__ = [
    "atomic_path", "atomic_torch_save", "atomic_write_text", "atomic_write_json", "load_checkpoint",
    "extract_state_dict", "load_weights", "save_safetensors", "read_safetensors_metadata", "CheckpointError",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the mode open() would
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_torch_save(obj: Any, path: PathLike) -> None:
    """``torch.save`` that never leaves a truncated file at ``path``."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def atomic_write_text(text: str, path: PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(obj: Any, path: PathLike) -> None:
    atomic_write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", path)


def load_checkpoint(path: PathLike, map_location: Union[str, torch.device] = "cpu") -> Dict[str, Any]:
    """Load a ``.pth``/``.pt`` checkpoint (``weights_only=True``) or a ``.safetensors`` file, with one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device=str(map_location))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"cannot read safetensors file {path}: {e}") from None
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types for corrupt files (RuntimeError, EOFError, UnpicklingError)
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"checkpoint {path} holds a {type(obj).__name__}, not a dict of tensors")
    return dict(obj)


def extract_state_dict(checkpoint: Mapping[str, Any], use_ema: bool = False) -> Dict[str, torch.Tensor]:
    """The model state dict inside a checkpoint: ``model_ema``/``state_dict_ema`` if asked, else ``model``,
    ``state_dict``, or the mapping itself. A leading ``module.`` (DDP) is stripped."""
    keys = ("model_ema", "state_dict_ema") if use_ema else ("model", "state_dict")
    sd = next((checkpoint[k] for k in keys if k in checkpoint and isinstance(checkpoint[k], Mapping)), None)
    if sd is None:
        if use_ema:
            raise CheckpointError("checkpoint has no EMA weights (no 'model_ema' or 'state_dict_ema' entry)")
        sd = checkpoint
    if not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("checkpoint does not hold a state dict of tensors")
    return {k[7:] if k.startswith("module.") else k: v for k, v in sd.items()}


def load_weights(model: nn.Module, path: PathLike, use_ema: bool = False, strict: bool = True,
                 filter_fn=None) -> Dict[str, Any]:
    """Load weights from a checkpoint or safetensors file into ``model``.

    ``filter_fn(state_dict, model)`` (e.g. a timm ``checkpoint_filter_fn``) maps foreign layouts first. Missing,
    unexpected and mis-shaped keys are reported by name in a :class:`CheckpointError`; the model is only modified
    when everything fits.
    """
    sd = extract_state_dict(load_checkpoint(path), use_ema=use_ema)
    if filter_fn is not None:
        sd = filter_fn(sd, model)
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in sd and sd[k].shape != own[k].shape]
    if shapes or (strict and (missing or unexpected)):
        parts = []
        if missing:
            parts.append(f"missing keys: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_names(unexpected)}")
        if shapes:
            parts.append(f"shape mismatch: {_names(shapes)}")
        raise CheckpointError(f"checkpoint {path} does not fit {type(model).__name__}: " + "; ".join(parts))
    model.load_state_dict(sd, strict=strict)
    return {"missing": missing, "unexpected": unexpected}


def _names(items, limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def save_safetensors(model_or_sd: Union[nn.Module, Mapping[str, torch.Tensor]], path: PathLike,
                     metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Write weights as safetensors (atomically); ``metadata`` values are JSON-encoded (e.g. model name, config)."""
    from safetensors.torch import save_file
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, nn.Module) else model_or_sd
    sd = {k: v.detach().cpu().contiguous() for k, v in sd.items()}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    with atomic_path(path) as tmp:
        save_file(sd, str(tmp), metadata=meta)


def read_safetensors_metadata(path: PathLike) -> Dict[str, str]:
    """The metadata dict stored in a safetensors file (e.g. ``model`` and ``config``)."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def read_yaml_mapping(path: PathLike) -> Dict[str, Any]:
    """A YAML file whose top level is a mapping (a recipe), with one-line errors for a missing file, invalid YAML
    or another top level. An empty file is an empty mapping."""
    import yaml
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(loaded, Mapping):
        raise ValueError(f"recipe {path} must hold a mapping of option: value, got {type(loaded).__name__}")
    return dict(loaded)
