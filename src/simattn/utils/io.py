"""Files that are never half-written, and checkpoints that load safely with clear errors.

Everything here writes to a temporary file in the destination folder and renames it into place, so an existing
file is either left intact or replaced whole. Every command that writes a user's file or folder follows one policy
(:func:`check_new_file`, :func:`check_new_folder`; a training run's folder, :mod:`simattn.utils.runs`): an existing
target is refused without ``--overwrite``, and ``--overwrite`` replaces only what the command writes.
"""
from __future__ import annotations

import io
import json
import math
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import torch
from torch import nn

PathLike = Union[str, os.PathLike]

__all__ = [
    "atomic_path", "atomic_write_bytes", "atomic_torch_save", "atomic_write_text", "atomic_write_json", "finite_json",
    "json_dumps", "stale_temp_files", "remove_stale_temp_files", "load_checkpoint",
    "extract_state_dict", "load_weights", "check_finite_weights", "save_safetensors", "read_safetensors_metadata",
    "CheckpointError", "check_outputs", "written_through", "save_figure", "check_new_file", "check_new_folder",
    "atomic_folder", "unreadable_checkpoint", "shape_mismatches", "is_safetensors", "Terminated",
    "terminate_as_interrupt", "signal_handler", "recorded_location",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


#: prefix/suffix of the temporary files :func:`atomic_path` creates (``.<name>.<random>.tmp``)
TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"


def written_through(path: PathLike) -> bool:
    """Whether ``path`` is written in place rather than replaced: a device, FIFO or socket, or anything under
    ``/dev`` and ``/proc`` (``/dev/stdout`` may point at the terminal, a pipe or the file the shell redirected to)."""
    path = Path(path)
    if path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",)):
        return True
    return path.exists() and not path.is_file() and not path.is_dir()


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``, on error removed.

    A process killed in between leaves ``.<name>.<random>.tmp`` behind (never a half-written ``path``):
    :func:`remove_stale_temp_files` clears those.

    A symbolic link is written through (its target is replaced, the link stays), and a path under ``/dev`` or
    ``/proc`` or one that is neither a regular file nor a folder (``/dev/null``, ``/dev/stdout``, a FIFO) is yielded
    itself: such a file cannot be replaced by a rename, and replacing it would destroy it.
    """
    path = Path(path)
    if written_through(path):
        yield path
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (:func:`terminate_as_interrupt`)."""


@contextmanager
def signal_handler(signum: int, handler: Any) -> Iterator[None]:
    """``handler`` for ``signum`` inside the block, where the signal has its default handler (SIGINT: Python's
    KeyboardInterrupt) and on the main thread only; that default is put back on leaving. Nothing changes
    elsewhere (the signal ignored, or the caller's own handler)."""
    import signal
    import threading

    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signum) is not default:
        yield
        return
    signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, default)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM inside the block raises :class:`Terminated`, a KeyboardInterrupt, so that every temporary file and
    folder (:func:`atomic_path`, downloads, exports) is removed as on Ctrl-C instead of being left by a killed
    process (:func:`signal_handler`: on the main thread, where SIGTERM has no handler yet)."""
    import signal

    def handler(signum, frame):
        raise Terminated

    with signal_handler(signal.SIGTERM, handler):
        yield


def _listed(names: List[str]) -> str:
    return ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def check_new_file(path: PathLike, overwrite: bool = False, flag: str = "--output") -> None:
    """Refuse (one-line ValueError) a file to write that exists, unless ``overwrite``: then it is replaced whole
    (:func:`atomic_path`), and nothing else. The one policy of every command that writes a user's file; a folder
    written whole is :func:`check_new_folder`'s."""
    path = Path(path)
    if written_through(path):
        return
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder, not a file: choose another {flag}")
    if path.exists() and not overwrite:
        raise ValueError(f"{flag} {path} exists: pass --overwrite to replace it, or choose another {flag}")


def check_new_folder(path: PathLike, overwrite: bool = False, flag: str = "--output",
                     writes: Optional[Iterable[str]] = None) -> None:
    """Refuse (one-line ValueError) a folder to write whole (:func:`atomic_folder`) that is a file or lies under
    one, or that already holds files, unless ``overwrite``. Even then a folder holding anything but the names the
    command writes (``writes``) is refused, naming what else it holds: ``--overwrite`` never deletes a file the
    command did not write."""
    path = Path(path)
    for above in (path, *path.parents):
        if above.exists() and not above.is_dir():
            where = "is a file" if above == path else f"is under {above}, which is a file"
            raise ValueError(f"{flag} {path} {where}, not a folder: choose another {flag}")
    if not path.is_dir():
        return
    present = sorted(p.name for p in path.iterdir())
    if present and not overwrite:
        raise ValueError(f"{flag} {path} already holds files ({_listed(present)}): choose another {flag}, or pass "
                         "--overwrite to replace them")
    foreign = [name for name in present if writes is not None and name not in set(writes)]
    if foreign:
        raise ValueError(f"{flag} {path} holds {_listed(foreign)}, which this command does not write "
                         f"(--overwrite replaces only {_listed(sorted(writes))}): move "
                         f"{'it' if len(foreign) == 1 else 'them'} away or choose another {flag}")


@contextmanager
def atomic_folder(path: PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it replaces ``path`` whole (a folder that held
    files is moved aside and deleted only once the new one is in place), on error it is removed. A folder that is
    not empty is refused (:func:`check_new_folder`) unless ``overwrite``, and even then when it holds anything the
    new folder does not (checked again before the swap)."""
    import shutil
    path = Path(path)
    check_new_folder(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent))
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700; give the folder the mode mkdir would
        check_new_folder(path, overwrite, writes=[p.name for p in tmp.iterdir()])
        if path.is_dir() and any(path.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{path.name}.replaced.", suffix=TEMP_SUFFIX,
                                        dir=path.parent))
            os.replace(path, old / path.name)
        os.replace(tmp, path)  # rename(2) replaces an empty folder
    except BaseException:
        if old is not None and not path.exists():  # the new folder did not land: the old one goes back
            os.replace(old / path.name, path)
        raise
    finally:
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def check_outputs(outputs: Mapping[str, Optional[PathLike]], inputs: Mapping[str, Optional[PathLike]]) -> None:
    """Refuse (one-line ValueError) an output that is one of the inputs, or two outputs that are one file, before
    anything is written. ``outputs`` and ``inputs`` map option names (``--output``) to paths (None: not given).
    Special files (``/dev/null``, ``/dev/stdout``) may be given for several outputs."""
    def same(a: PathLike, b: PathLike) -> bool:
        if Path(a).exists() and Path(b).exists():
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)

    given_out = [(k, v) for k, v in outputs.items() if v]
    for name, out in given_out:
        for in_name, src in inputs.items():
            if src and same(out, src):
                raise ValueError(f"{name} {out} is the {in_name} input: writing it would destroy the input; choose "
                                 "another path")
    for i, (name, out) in enumerate(given_out):
        for other, out2 in given_out[i + 1:]:
            if not written_through(out) and same(out, out2):
                raise ValueError(f"{name} and {other} are the same file ({out}): one would overwrite the other")


def save_figure(fig: Any, path: PathLike, dpi: int = 100, close: bool = True) -> Path:
    """Write a matplotlib figure as a PNG atomically (never a half-written plot), then close it (``close``)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    if close:
        import matplotlib.pyplot as plt
        plt.close(fig)
    return Path(path)


def stale_temp_files(folder: PathLike) -> list:
    """Temporary files :func:`atomic_path` left in ``folder`` when a writer was killed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.startswith(TEMP_PREFIX)
                  and p.name.endswith(TEMP_SUFFIX) and p.name.count(".") >= 3)


def remove_stale_temp_files(folder: PathLike) -> list:
    """Delete :func:`stale_temp_files` (only call this where no other process is writing); returns them."""
    stale = stale_temp_files(folder)
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def atomic_write_bytes(data: bytes, path: PathLike) -> None:
    """Write ``data`` to ``path`` atomically and durably (flushed to disk before the rename).

    Serializers are run into memory first and the bytes written here, so a full disk or a read-only folder is a
    plain :class:`OSError` (``ENOSPC``, ``EACCES``) rather than a library's internal error.
    """
    with atomic_path(path) as tmp:
        through = written_through(tmp)
        try:
            # appending: opening /dev/stdout for writing would truncate the file the shell redirected it to
            with open(tmp, "ab" if through else "wb") as f:
                f.write(data)
                f.flush()
                if not through:
                    os.fsync(f.fileno())
        except OSError as e:  # name the file being written, not the temporary one
            raise OSError(e.errno, e.strerror, str(path)) from None


def atomic_torch_save(obj: Any, path: PathLike) -> None:
    """``torch.save`` that never leaves a truncated file at ``path``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(buffer.getbuffer(), path)


def atomic_write_text(text: str, path: PathLike) -> None:
    atomic_write_bytes(text.encode("utf-8"), path)


def finite_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, ±inf) replaced by None: JSON has no NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def json_dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``obj`` (non-finite floats as null, other objects as their ``str``)."""
    return json.dumps(finite_json(obj), allow_nan=False, default=str, **kwargs)


def atomic_write_json(obj: Any, path: PathLike) -> None:
    atomic_write_text(json_dumps(obj, indent=2, sort_keys=False) + "\n", path)


def load_checkpoint(path: PathLike, map_location: Union[str, torch.device] = "cpu",
                    mmap: bool = False, safe_globals: Sequence[Any] = ()) -> Dict[str, Any]:
    """Load a ``.pth``/``.pt`` checkpoint (``weights_only=True``) or a ``.safetensors`` file, with one-line errors.
    ``mmap``: a ``.pth`` in torch's zip format is mapped, its tensors read from disk when used (a file in the legacy
    format is read whole). ``safe_globals``: what this load may unpickle besides torch's own (for this call only,
    as ``torch.serialization.safe_globals``)."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder without weights files: name a weights file, or a folder "
                              "simattn hub save wrote (config.json, model.safetensors)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"cannot read checkpoint {path}: the file is empty (0 bytes)")
    if is_safetensors(path):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device=str(map_location))
        except (SafetensorError, ValueError):
            raise unreadable_checkpoint(path) from None
    try:
        with torch.serialization.safe_globals(list(safe_globals)), warnings.catch_warnings():
            # the protocol a file was pickled with is named in our one line when it cannot be read
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            try:
                obj = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
            except RuntimeError:
                if not mmap:
                    raise
                obj = torch.load(path, map_location=map_location, weights_only=True)  # the legacy format
    except OSError:
        raise
    except Exception as e:  # torch raises many types for corrupt files (RuntimeError, EOFError, UnpicklingError)
        raise unreadable_checkpoint(path, e) from None
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"checkpoint {path} holds a {type(obj).__name__}, not a dict of tensors")
    shadowing = _shadowing_attribute(obj)
    if shadowing is not None:
        raise CheckpointError(f"cannot read checkpoint {path}: a mapping in it (such as a config beside the weights) "
                              f"sets the attribute {shadowing!r}, which is not plain data; save its state dict alone "
                              "where the file is trusted")
    return dict(obj)


#: the attributes a mapping in a checkpoint may carry: a state dict's ``_metadata`` and yacs' own flags, which a
#: released file's config (read as a plain ``OrderedDict``) brings along
_MAPPING_ATTRIBUTES = frozenset({"_metadata", "__immutable__", "__deprecated_keys__", "__renamed_keys__",
                                 "__new_allowed__"})


def _shadowing_attribute(obj: Any, depth: int = 0) -> Optional[str]:
    """The first attribute, other than :data:`_MAPPING_ATTRIBUTES`, that the unpickler set on a mapping inside
    ``obj`` (a weights-only load sets an ``OrderedDict``'s ``__dict__`` from the file, so a field can shadow
    ``items`` or ``keys`` for every reader after it); None when there is none."""
    if isinstance(obj, torch.Tensor) or depth > 32:
        return None
    if isinstance(obj, Mapping):
        extra = sorted(set(getattr(obj, "__dict__", {})) - _MAPPING_ATTRIBUTES)
        if extra:
            return extra[0]
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    else:
        return None
    for child in children:
        found = _shadowing_attribute(child, depth + 1)
        if found is not None:
            return found
    return None


def recorded_location(text: str) -> str:
    """``text`` (a data folder or file as the user gave it) as a record keeps it: an existing local path made
    absolute, so that a file's record finds its data from any working folder; anything else (a URL, ``pipe:``, a
    brace pattern of shards) as given."""
    return os.path.abspath(text) if Path(text).exists() else text


def is_safetensors(path: PathLike) -> bool:
    """Whether ``path`` holds a safetensors file, read from its first bytes (an 8-byte little-endian header length,
    then the JSON header's ``{``), whatever its name."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return Path(path).suffix == ".safetensors"
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8


def _pickle_protocol(path: PathLike) -> Optional[int]:
    """The pickle protocol of a checkpoint's object stream (torch's zip format: its ``data.pkl``), from its PROTO
    opcode; None where there is none or the file cannot be read."""
    import zipfile
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                head = archive.open(name).read(2) if name else b""
        else:
            with open(path, "rb") as f:
                head = f.read(2)
    except (OSError, zipfile.BadZipFile):
        return None
    return head[1] if len(head) == 2 and head[0] == 0x80 else None


def unreadable_checkpoint(path: PathLike, error: Optional[BaseException] = None) -> CheckpointError:
    """The one-line error for a file that is not a checkpoint we can read (truncated, damaged or another kind of
    file), in our words rather than the reading library's; ``error`` is what it raised. A checkpoint that holds
    Python objects ``weights_only=True`` refuses is named as such, with the object."""
    import re
    text = str(error or "")
    found = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", text, re.IGNORECASE)
    if found:
        return CheckpointError(f"cannot read checkpoint {path}: it holds a Python object ({found.group(1)}) beside "
                               "its tensors, which loading with weights_only=True refuses; save its state dict "
                               "alone where the file is trusted")
    if re.search(r"Unsupported operand \d+", text) and (_pickle_protocol(path) or 0) >= 4:
        return CheckpointError(f"cannot read checkpoint {path}: it was pickled with a protocol (4 or 5) that "
                               "torch's weights-only reader does not take; save it again with torch.save's default "
                               "protocol where the file is trusted")
    kind = "safetensors" if is_safetensors(path) else "PyTorch"
    return CheckpointError(f"cannot read checkpoint {path}: truncated or not a checkpoint (not a readable {kind} "
                           "file); copy it again or name another file")


#: where a training script keeps the weights it evaluates, and their EMA beside them
MODEL_ENTRIES = ("model", "state_dict")
EMA_ENTRIES = ("model_ema", "state_dict_ema")


def state_dict_entry(checkpoint: Mapping[str, Any], ema: bool = False) -> Optional[str]:
    """The entry of ``checkpoint`` that holds its model's (``ema``: its EMA's) tensors; None for none."""
    return next((k for k in (EMA_ENTRIES if ema else MODEL_ENTRIES)
                 if k in checkpoint and isinstance(checkpoint[k], Mapping)), None)


def extract_state_dict(checkpoint: Mapping[str, Any], use_ema: bool = False) -> Dict[str, torch.Tensor]:
    """The model state dict inside a checkpoint: ``model_ema``/``state_dict_ema`` if asked, else ``model``,
    ``state_dict``, or the mapping itself (the authors evaluate ``model``, so an EMA beside it is taken only when
    asked). A leading ``module.`` (DDP) is stripped."""
    entry = state_dict_entry(checkpoint, ema=use_ema)
    if entry is None and use_ema:
        raise CheckpointError("checkpoint has no EMA weights (no 'model_ema' or 'state_dict_ema' entry)")
    sd = checkpoint if entry is None else checkpoint[entry]
    if not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("checkpoint does not hold a state dict of tensors")
    return {k[7:] if k.startswith("module.") else k: v for k, v in sd.items()}


def load_weights(model: nn.Module, path: PathLike, use_ema: bool = False, strict: bool = True,
                 filter_fn=None, checkpoint: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Load weights from a checkpoint or safetensors file into ``model`` (``checkpoint``: the file's contents when
    they were read already; ``path`` then only names them).

    ``filter_fn(state_dict, model)`` (e.g. a timm ``checkpoint_filter_fn``) maps foreign layouts first. Missing,
    unexpected and mis-shaped keys are reported by name in a :class:`CheckpointError`; the model is only modified
    when everything fits.
    """
    raw = extract_state_dict(load_checkpoint(path) if checkpoint is None else checkpoint, use_ema=use_ema)
    sd = filter_fn(dict(raw), model) if filter_fn is not None else raw
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [k for k in own if k in sd and sd[k].shape != own[k].shape]
    if shapes or (strict and (missing or unexpected)):
        parts = [f"shape mismatch: {shape_mismatches(shapes, raw, sd, own)}"] if shapes else []
        # the keys a load would drop are named more fully than the missing ones: a dropped layer (a tanh
        # pre-logits, say) must be visible in the message
        parts += [f"{what}: {_names(names, limit)}" for what, names, limit in (("missing keys", missing, 1),
                                                                           ("unexpected keys", unexpected, 3)) if names]
        raise CheckpointError(f"checkpoint {path} does not fit {type(model).__name__}: " + "; ".join(parts))
    model.load_state_dict(sd, strict=strict)
    return {"missing": missing, "unexpected": unexpected}


def shape_mismatches(keys: List[str], raw: Mapping[str, torch.Tensor], filtered: Mapping[str, torch.Tensor],
                     own: Mapping[str, torch.Tensor], limit: int = 2) -> str:
    """``'pos_embed (1, 17, 64) vs (1, 197, 192) (+3 more), the file's vs the model's'`` for ``keys``, the first
    ``limit`` named. The shape is the file's (``raw``), before a checkpoint filter resampled it (``filtered``): the
    one the user can check against the file."""
    shapes = [f"{k} {tuple((raw[k] if k in raw else filtered[k]).shape)} vs {tuple(own[k].shape)}" for k in keys]
    return f"{_names(shapes, limit)}, the file's vs the model's"


def _names(items, limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def non_finite_tensors(module_or_sd: Union[nn.Module, Mapping[str, torch.Tensor]]) -> List[str]:
    """Names of the floating-point tensors (parameters and buffers) that hold NaN or ±inf."""
    sd = module_or_sd.state_dict() if isinstance(module_or_sd, nn.Module) else module_or_sd
    return [name for name, t in sd.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_weights(module_or_sd: Union[nn.Module, Mapping[str, torch.Tensor]], what: str) -> None:
    """Raise :class:`FloatingPointError` (one line) if any floating-point tensor holds NaN or ±inf: a diverged
    run's weights must never be written as if they were good ones."""
    bad = non_finite_tensors(module_or_sd)
    if bad:
        raise FloatingPointError(f"training diverged: {what} has non-finite values in {len(bad)} tensor(s) "
                                 f"({_names(bad, 3)}); not writing them. Lower the learning rate, clip gradients, "
                                 "or resume from the last checkpoint")


def save_safetensors(model_or_sd: Union[nn.Module, Mapping[str, torch.Tensor]], path: PathLike,
                     metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Write weights as safetensors (atomically); ``metadata`` values are JSON-encoded (e.g. model name, config)."""
    from safetensors.torch import save
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, nn.Module) else model_or_sd
    sd = {k: v.detach().cpu().contiguous() for k, v in sd.items()}
    meta = {k: v if isinstance(v, str) else json_dumps(v) for k, v in (metadata or {}).items()}
    atomic_write_bytes(save(sd, metadata=meta), path)


def open_safetensors(path: PathLike) -> Any:
    """A safetensors file opened (``safetensors.safe_open``: its header read, its tensors mapped and read when
    asked), or an :func:`unreadable_checkpoint` error for a damaged file."""
    from safetensors import SafetensorError, safe_open
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, ValueError):
        raise unreadable_checkpoint(path) from None


def read_safetensors_metadata(path: PathLike) -> Dict[str, str]:
    """The metadata dict stored in a safetensors file (e.g. ``model`` and ``config``); a
    :func:`unreadable_checkpoint` error for a damaged file."""
    with open_safetensors(path) as f:
        return dict(f.metadata() or {})
