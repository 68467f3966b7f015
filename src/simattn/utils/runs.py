"""Run folders: where a run writes, and the rule that keeps runs from writing over each other.

Every command that trains (``train``, ``ssl train``, ``detect train``: the engine; ``convert``) follows these rules:

- no output given: ``runs/<recipe>/<date-time>`` (a new folder every time; resuming defaults to the checkpoint's
  folder);
- the folder may not hold files of another run, whichever they are, unless ``overwrite``: then the task's own output
  files are moved aside into a hidden ``.replaced-*`` folder and deleted only once the command has succeeded
  (:func:`settle_replaced`; a failed or interrupted run gets them back), and a folder holding anything else (a file
  the run does not write) is refused, naming it; resuming into the folder of the checkpoint being resumed is the one
  exception;
- an input of the run (a teacher, initial weights) may not be one of the files the run would replace;
- the output must be a writable folder (not a file, not under a file, not read-only): checked before any work;
- temporary files left by killed writers (:func:`simattn.utils.io.stale_temp_files`) are removed;
- one run at a time: the process that claims a folder holds an exclusive ``flock`` on ``<output>/.simattn.lock``
  (which records its pid) until the command ends; a second command on the same folder is refused in one line. The
  kernel drops the lock when the holder dies however it dies (even SIGKILL), so the folder of a killed run can be
  resumed. Under torchrun only rank 0 claims the folder.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .io import remove_stale_temp_files, stale_temp_files

__all__ = ["default_output", "resolve_output", "run_files", "check_run_folder", "claim_run_folder",
           "open_run_folder", "results_folder", "settle_replaced", "check_inputs_kept", "REPLACED_PREFIX",
           "LOCK_NAME", "lock_run_folder", "check_not_in_use", "release_run_folders", "release_run_folder",
           "held_run_folders"]

#: prefix of the hidden folder where ``--overwrite`` keeps the replaced files until the command has succeeded
REPLACED_PREFIX = ".replaced-"
#: (run folder, parking folder, file names) of every replacement not yet settled in this process
_parked: List[Tuple[Path, Path, List[str]]] = []
#: the file in a run folder whose flock says that a live process runs there (it holds the holder's pid)
LOCK_NAME = ".simattn.lock"
#: run folders this process holds (real path → the open lock file)
_held: Dict[str, int] = {}
#: how long a claim waits for a lock that another command only probes (check_not_in_use holds it for microseconds)
_LOCK_PATIENCE_S = 1.0


def _forget_held_in_child() -> None:
    """In a forked child: close the inherited lock descriptors (the parent keeps its locks; the child holds none)."""
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_held_in_child)


def default_output(name: Optional[str], task: str, root: str = "runs") -> Path:
    """``runs/<name or task>/<YYYYmmdd-HHMMSS>``, with ``-2``, ``-3`` ... appended if that folder exists."""
    base = Path(root) / (name or task) / time.strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def resolve_output(output: Optional[str], name: Optional[str], task: str,
                   resume_from: Optional[Path] = None) -> Path:
    """The run folder: ``output``, else the folder of the checkpoint being resumed, else :func:`default_output`.

    Under torchrun every process gets rank 0's answer (the default holds the time of day).
    """
    if output == "":
        raise ValueError("output '': an empty path is not a folder: give --output DIR, or leave --output out for "
                         "runs/<recipe>/<date-time>")
    if output:
        return Path(output)
    if resume_from is not None:
        return Path(resume_from).parent
    import torch.distributed as dist
    chosen = [str(default_output(name, task))]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0])


def _first_file_on_path(path: Path) -> Optional[Path]:
    for parent in [path, *path.parents]:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def run_files(out: Path) -> List[str]:
    """The names of what folder ``out`` holds, without the temporary files of killed writers (those never make a
    folder another run's)."""
    stale = set(stale_temp_files(out))
    return sorted(p.name for p in Path(out).iterdir() if p not in stale and not p.name.startswith(REPLACED_PREFIX)
                  and p.name != LOCK_NAME)


# ----- one run per folder --------------------------------------------------------------------------------------------

def _key(out: Path) -> str:
    return os.path.realpath(out)


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


def _in_use(out: Path, lock: Path) -> ValueError:
    return ValueError(f"output {out} is in use by a running simattn process ({_holder(lock)}): wait for it to end, "
                      f"or choose another --output (the lock it holds: {lock})")


def held_run_folders() -> List[str]:
    """The run folders (real paths) whose lock this process holds."""
    return list(_held)


def check_not_in_use(out: Path) -> None:
    """Refuse (one-line ValueError) when another live process holds ``out``'s lock; changes nothing. A check ahead of
    the work: :func:`lock_run_folder` is what keeps two runs apart."""
    out = Path(out)
    lock = out / LOCK_NAME
    if _key(out) in _held or not lock.is_file():
        return
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # unreadable: the claim tells
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(out, lock) from None
    finally:
        os.close(fd)  # closing drops the shared lock taken to look


def lock_run_folder(out: Path) -> bool:
    """Take ``out``'s lock for this process (an exclusive flock on ``out/.simattn.lock``, kept until
    :func:`release_run_folders` or the process ends) and write the pid into it; True if this call took it, False if
    this process held it already. A one-line ValueError when another live process holds it."""
    out = Path(out)
    key = _key(out)
    if key in _held:
        return False
    lock = out / LOCK_NAME
    deadline = time.monotonic() + _LOCK_PATIENCE_S
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise _in_use(out, lock) from None
        except OSError:
            os.close(fd)
            raise
        # the holder before may have removed the file between our open and our lock: then lock the new one
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[key] = fd
    return True


def release_run_folders(keep: Iterable[str] = ()) -> None:
    """Give up the folders this process holds (all but the real paths in ``keep``, and those with replaced files not
    yet settled, which :func:`settle_replaced` releases); the lock file is removed while still held."""
    busy = {_key(out) for out, _, _ in _parked}
    for key in [k for k in _held if k not in set(keep) and k not in busy]:
        fd = _held.pop(key)
        lock = Path(key) / LOCK_NAME
        try:
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                lock.unlink()
        except OSError:
            pass  # the folder is gone or read-only now: the lock still ends when the file is closed
        os.close(fd)


def release_run_folder(out: Path) -> None:
    """Give up ``out`` alone (as :func:`release_run_folders` does); the other folders this process holds stay."""
    release_run_folders(keep=[k for k in _held if k != _key(out)])


def check_run_folder(out: Path, resume_from: Optional[Path] = None, overwrite: bool = False,
                     flag: str = "--overwrite", writes: Optional[Iterable[str]] = None) -> None:
    """Raise a one-line ValueError if a run may not write to ``out`` (reads only; safe on every process). With
    ``overwrite``, a folder holding anything but the names the run writes (``writes``; None: not checked) is refused
    too, naming it: the run replaces its own files and keeps no other's beside its own."""
    blocker = _first_file_on_path(Path(out))
    if blocker is not None:
        where = "is a file" if blocker == Path(out) else f"is under {blocker}, which is a file"
        raise ValueError(f"output {out} {where}, not a folder: choose another --output")
    if not Path(out).is_dir():
        return
    present = run_files(out)
    if not present or (resume_from is not None and Path(resume_from).resolve().parent == Path(out).resolve()):
        return
    if overwrite:
        foreign = [] if writes is None else [name for name in present if name not in set(writes)]
        if foreign:
            raise ValueError(f"output {out} holds {_listed(foreign)}, which a run does not write (with {flag} it "
                             f"replaces only {', '.join(writes)}): move {'it' if len(foreign) == 1 else 'them'} "
                             "away or choose another --output")
        return
    shown = _listed(present)
    if resume_from is not None:
        what = (f"{out} holds another run's files ({shown}), and the checkpoint being resumed ({resume_from}) is "
                f"not in it: resume into the checkpoint's own folder (leave --output out), pick an empty --output, "
                f"or pass {flag} to replace them")
    else:
        hint = "pass --resume to continue it, " if "last.pth" in present else ""
        what = (f"{out} already holds files ({shown}) of another run: {hint}choose another --output, or pass {flag} "
                "to replace them")
    raise ValueError(what)


def _listed(names: List[str]) -> str:
    return ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def check_inputs_kept(out: Path, replaced: Iterable[str], inputs: Mapping[str, Any]) -> None:
    """Refuse (one-line ValueError) when an input file of the run (``inputs``: option name → path or None) is one of
    the files in ``out`` that the run writes (``replaced``): the run would destroy what it reads."""
    out = Path(out)
    if not out.is_dir():
        return
    for option, path in inputs.items():
        if not path or not Path(path).exists():
            continue
        for name in replaced:
            target = out / name
            if target.exists() and os.path.samefile(path, target):
                raise ValueError(f"{option} {path} is {target}, a file this run writes: copy it elsewhere or choose "
                                 "another --output")


def _park(out: Path, names: Iterable[str]) -> None:
    present = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
    if not present:
        return
    park = Path(tempfile.mkdtemp(prefix=REPLACED_PREFIX, dir=out))
    for name in present:
        os.replace(out / name, park / name)
    _parked.append((out, park, present))


def settle_replaced(success: bool) -> None:
    """End the command's run folders: delete the files ``--overwrite`` moved aside when the command succeeded, else
    put them back (over the failed run's files of the same names); then release every run folder this process holds
    (:func:`release_run_folders`). Called once the command has ended."""
    while _parked:
        out, park, names = _parked.pop()
        if not success:
            for name in names:
                os.replace(park / name, out / name)
        shutil.rmtree(park, ignore_errors=True)
    release_run_folders()


def claim_run_folder(out: Path, overwrite: bool = False, replaced: Iterable[str] = (), clean: bool = True,
                     resume_from: Optional[Path] = None, lock: bool = True,
                     writes: Optional[Iterable[str]] = None) -> bool:
    """Create ``out``, make sure it is writable, take its lock (``lock``: :func:`lock_run_folder`; refused in one
    line while another process runs there) and check it again under the lock (:func:`check_run_folder`: a run that
    ended meanwhile may have filled it; ``writes``: its file names), remove stale temporary files (``clean``) and, with ``overwrite``, move the
    files named in ``replaced`` (the task's outputs) aside until :func:`settle_replaced`. Main process only. Returns
    whether this call took the lock (False: not asked for, or this process held it already)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=out)  # read-only folders fail here, before any work
    os.close(fd)
    os.unlink(probe)
    took = lock_run_folder(out) if lock else False
    try:
        if lock:
            check_run_folder(out, resume_from, overwrite, writes=writes)
        if clean:
            remove_stale_temp_files(out)
        if overwrite:
            _park(out, replaced)
    except BaseException:
        if took:
            release_run_folder(out)
        raise
    return took


def open_run_folder(output: Optional[str], name: Optional[str], task: str, *, resume_from: Optional[Path] = None,
                    overwrite: bool = False, replaced: Iterable[str] = (), is_main: bool = True,
                    inputs: Optional[Mapping[str, Any]] = None, writes: Optional[Iterable[str]] = None) -> Path:
    """:func:`resolve_output`, :func:`check_run_folder`, :func:`check_inputs_kept` (``inputs``: option → path) and
    (main process) :func:`claim_run_folder` in one call; returns the run folder. ``writes``: every name the command
    writes at the folder's top (files and folders); with ``overwrite`` a folder holding anything else is refused."""
    import torch.distributed as dist
    out = resolve_output(output, name, task, resume_from)
    if is_main:
        check_not_in_use(out)
    writes = None if writes is None else tuple(writes)
    check_run_folder(out, resume_from, overwrite, writes=writes)
    replaced = tuple(replaced)
    check_inputs_kept(out, replaced, inputs or {})
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every process has checked before the main one changes anything
    if is_main:
        claim_run_folder(out, overwrite, replaced, resume_from=resume_from, writes=writes)
    return out


def results_folder(output: Optional[str], beside: Optional[str], name: Optional[str], task: str) -> Path:
    """Where an evaluation writes its one results file: ``output``, else the folder of the evaluated weights
    (``beside``), else :func:`default_output`; created and checked writable. Evaluations add a file to a run's
    folder rather than start a run, so :func:`check_run_folder` does not apply."""
    if output == "":
        raise ValueError("output '': an empty path is not a folder: give --output DIR, or leave --output out")
    if output:
        out = Path(output)
    elif beside:
        out = Path(beside).parent
    else:
        out = default_output(name, task)
    blocker = _first_file_on_path(out)
    if blocker is not None:
        raise ValueError(f"output {out} is {'a file' if blocker == out else f'under {blocker}, a file'}, not a folder")
    # a run may be writing there: its temporary files are not stale, and its lock is not this command's to take
    claim_run_folder(out, clean=False, lock=False)
    return out
