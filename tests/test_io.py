"""Atomic writes (an exception, a full disk or SIGKILL mid-write leave the old file whole), stale temporary files,
one-line errors for empty and truncated checkpoints, JSON without NaN, and file-system faults at the CLI."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from simattn.cli import main as simattn_main
from simattn.utils import io as sio
from simattn.utils.io import (CheckpointError, atomic_path, atomic_torch_save, atomic_write_json, atomic_write_text,
                              json_dumps, load_checkpoint, remove_stale_temp_files, stale_temp_files)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_an_exception_mid_write_keeps_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "summary.json"
    atomic_write_json({"top1": 1.0}, target)
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_path(target) as tmp:
            tmp.write_text('{"top1": 2.0, "trunc')
            raise RuntimeError("crash")
    assert json.loads(target.read_text()) == {"top1": 1.0}
    assert _leftovers(tmp_path) == []


def test_a_full_disk_is_an_oserror_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "last.pth"
    atomic_torch_save({"step": torch.tensor(1)}, target)

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sio.os, "fsync", no_space)
    with pytest.raises(OSError) as info:
        atomic_torch_save({"step": torch.tensor(2)}, target)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    monkeypatch.undo()
    assert int(load_checkpoint(target)["step"]) == 1 and _leftovers(tmp_path) == []


WRITER = textwrap.dedent("""
    import sys, time
    from simattn.utils.io import atomic_path
    with atomic_path(sys.argv[1]) as tmp:
        with open(tmp, "w") as f:
            f.write("half of the new ")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
""")


def test_sigkill_mid_write_keeps_the_old_file_and_the_next_run_clears_the_temp_file(tmp_path):
    target = tmp_path / "metrics.jsonl"
    atomic_write_text("old\n", target)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert target.read_text() == "old\n"
    stale = stale_temp_files(tmp_path)
    assert [p.name for p in stale] == _leftovers(tmp_path) and len(stale) == 1
    assert stale[0].name.startswith(".metrics.jsonl.")
    (tmp_path / ".hidden").write_text("not ours")  # only atomic_path's names count as stale
    remove_stale_temp_files(tmp_path)
    assert _leftovers(tmp_path) == [] and (tmp_path / ".hidden").exists() and target.read_text() == "old\n"


def test_empty_and_truncated_checkpoints_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.pth"
    empty.touch()
    with pytest.raises(CheckpointError, match="is empty"):
        load_checkpoint(empty)
    whole = tmp_path / "whole.pth"
    atomic_torch_save({"model": {"w": torch.zeros(1000)}}, whole)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(whole.read_bytes()[:700])
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint") as info:
        load_checkpoint(cut)
    assert "\n" not in str(info.value)


def test_json_never_holds_nan(tmp_path):
    data = {"loss": float("nan"), "top": [1.0, float("inf")], "ok": 2.5}
    assert json.loads(json_dumps(data)) == {"loss": None, "top": [1.0, None], "ok": 2.5}
    atomic_write_json(data, tmp_path / "r.json")
    assert "NaN" not in (tmp_path / "r.json").read_text() and "Infinity" not in (tmp_path / "r.json").read_text()


def test_file_system_faults_are_one_line_errors_at_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SIMATTN_DEBUG", raising=False)

    def read_only(argv):
        raise PermissionError(errno.EROFS, "Read-only file system", "/mnt/ro/run")

    monkeypatch.setattr("simattn.validate.main", read_only)
    assert simattn_main(["validate"]) == 2
    err = capsys.readouterr().err
    assert err == ("simattn validate: error: Read-only file system: /mnt/ro/run (choose a writable --output) "
                   "(SIMATTN_DEBUG=1 for the traceback)\n")

    def full(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/last.pth")

    monkeypatch.setattr("simattn.validate.main", full)
    assert simattn_main(["validate"]) == 2
    assert "No space left on device: runs/x/last.pth (the disk is full" in capsys.readouterr().err

    def bug(argv):
        raise OSError(errno.EBADF, "Bad file descriptor")  # not a user fault: one line, exit 1; traceback on demand

    monkeypatch.setattr("simattn.validate.main", bug)
    assert simattn_main(["validate"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected error OSError" in err
    monkeypatch.setenv("SIMATTN_DEBUG", "1")
    with pytest.raises(OSError):
        simattn_main(["validate"])


def test_missing_optional_packages_name_the_extra(monkeypatch, capsys):
    monkeypatch.delenv("SIMATTN_DEBUG", raising=False)
    from simattn.utils.extras import MissingDependency, install_line, require

    def needs_lightly(argv):
        raise ModuleNotFoundError("No module named 'lightly'", name="lightly")

    monkeypatch.setattr("simattn.validate.main", needs_lightly)
    assert simattn_main(["validate"]) == 2
    assert install_line("ssl") in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pycocotools", None)  # as if not installed
    with pytest.raises(MissingDependency, match=r"simattn detect needs the optional package 'pycocotools'.*"
                                                + re.escape(install_line("detect"))):
        require("pycocotools", "simattn detect")
    assert require("json") is json


class _Runs:
    """An object whose unpickling would call os.system: a weights-only load must refuse it, and say why."""

    def __reduce__(self):
        return (os.system, ("true",))


def test_hostile_and_unusual_pickles_are_named_for_what_they_are(tmp_path, recwarn):
    """A readable file that holds a global a weights-only load refuses (next to a released file's yacs config,
    allowed) is named as such, not as truncated; a protocol-4 pickle is named by its protocol, with no warning of
    torch's before the one line."""
    from simattn.models.released import RELEASED_GLOBALS
    torch.save({"model": {"w": torch.zeros(2)}, "evil": _Runs()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match=r"it holds a Python object \((posix|nt)\.system\) beside its tensors"):
        sio.load_checkpoint(tmp_path / "evil.pth", mmap=True, safe_globals=RELEASED_GLOBALS)
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "p4.pth", pickle_protocol=4)
    with pytest.raises(CheckpointError, match=r"pickled with a protocol \(4 or 5\)"):
        sio.load_checkpoint(tmp_path / "p4.pth", mmap=True)
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]
