"""What the training commands do with run folders and recipes they did not make: a folder another live run holds,
an empty --output, a model size that contradicts the data size, image folders whose links lead back into the
dataset, YAML alias bombs, and a conversion resumed in a train run's folder. Each is a one-line error (exit 2), a
warning or a correct result, and nothing the user had is lost."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.data.folder import image_folder
from simattn.utils.recipe import Opt, check_value, quoted
from simattn.utils.runs import LOCK_NAME

from helpers import digests
from cli_inputs import FLAGS, TINY_KWARGS, one_line_error as _one_line_error  # noqa: F401


def _png(path: Path, value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)
    return path


class _Holder:
    """Another process that holds a run folder the way a live run does: an exclusive flock on its lock file, with
    its pid written in it."""

    CODE = textwrap.dedent("""
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\\n".encode())
        print("holding", flush=True)
        time.sleep(300)
    """)

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, str(folder / LOCK_NAME)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "holding"

    def kill(self) -> None:  # as a run killed with SIGKILL: the kernel drops its lock
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture
def holder():
    made = []

    def hold(folder: Path) -> _Holder:
        made.append(_Holder(folder))
        return made[-1]

    yield hold
    for h in made:
        h.kill()


# ---------------------------------------------------------------- one run per folder
@pytest.mark.timeout(300)
def test_a_folder_a_live_run_holds_is_refused_and_a_killed_runs_folder_resumes(tmp_path, holder, capsys):
    out = tmp_path / "run"
    assert simattn_main(["train", *FLAGS, "--output", str(out)]) == 0
    capsys.readouterr()
    assert not (out / LOCK_NAME).exists()  # released at the end of the command
    live = holder(out)
    before = digests(out)
    for extra in ([], ["--resume"], ["--overwrite"], ["--resume", "--epochs", "2"]):
        code = simattn_main(["train", *FLAGS, "--output", str(out), *extra])
        err = _one_line_error(capsys, code)
        assert f"is in use by a running simattn process (pid {live.proc.pid})" in err, err
        assert digests(out) == before
        assert not [p for p in out.iterdir() if p.name.startswith(".replaced-")]
    live.kill()
    # the holder died without cleaning up: its lock went with it, and the run resumes
    assert (out / LOCK_NAME).exists()
    assert simattn_main(["train", *FLAGS, "--output", str(out), "--resume", "--epochs", "2"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert not (out / LOCK_NAME).exists()


def test_ssl_and_convert_refuse_a_folder_a_live_run_holds(tmp_path, holder, capsys):
    pytest.importorskip("lightly")
    out = tmp_path / "taken"
    live = holder(out)
    code = simattn_main(["ssl", "train", "--config", "ssl_digits", "--output", str(out)])
    assert f"in use by a running simattn process (pid {live.proc.pid})" in _one_line_error(capsys, code)
    teacher = tmp_path / "teacher.pth"
    torch.save({}, teacher)  # never read: the folder is refused first
    code = simattn_main(["convert", "--weights", str(teacher), "--to", "sima", "--output", str(out), *FLAGS[:8]])
    assert f"in use by a running simattn process (pid {live.proc.pid})" in _one_line_error(capsys, code)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    live.kill()
    # what a killed run leaves behind (its lock file) does not make the folder another run's
    assert simattn_main(["train", *FLAGS, "--output", str(out)]) == 0
    assert (out / "final.safetensors").is_file() and not (out / LOCK_NAME).exists()


def test_the_lock_is_taken_under_the_check_and_given_back(tmp_path):
    from simattn.utils.runs import claim_run_folder, held_run_folders, lock_run_folder, release_run_folders
    out = tmp_path / "run"
    held = held_run_folders()
    assert claim_run_folder(out) is True and claim_run_folder(out) is False  # this process holds it already
    # a second open file description conflicts, as another process would
    with pytest.raises(BlockingIOError):
        import fcntl
        fd = os.open(out / LOCK_NAME, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
    release_run_folders(keep=held)
    assert not (out / LOCK_NAME).exists() and lock_run_folder(out) is True
    release_run_folders(keep=held)


def test_the_lock_dies_with_its_process_while_a_forked_child_lives_on(tmp_path):
    """A run killed with SIGKILL whose forked children (data-loader workers) outlive it: its folder is free at once."""
    from simattn.utils.runs import check_not_in_use, held_run_folders, lock_run_folder, release_run_folders
    out = tmp_path / "run"
    out.mkdir()
    code = textwrap.dedent("""
        import os, signal, sys, time
        from simattn.utils.runs import lock_run_folder
        lock_run_folder(sys.argv[1])
        ready_r, ready_w = os.pipe()
        child = os.fork()
        if child == 0:  # as a data-loader worker forked by the run: it lives on after the run is killed
            print(os.getpid(), flush=True)
            os.write(ready_w, b"1")  # running: fork's handlers have run in this process
            time.sleep(120)
            os._exit(0)
        os.read(ready_r, 1)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    # the child keeps the pipe open: read the one line, not to the end
    run = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    line = run.stdout.readline()
    run.stdout.close()
    assert run.wait(timeout=60) == -signal.SIGKILL and line.strip().isdigit(), line
    child = int(line)
    try:
        os.kill(child, 0)  # the child is still alive (else this test could not fail)
        held = held_run_folders()
        check_not_in_use(out)
        assert lock_run_folder(out) is True
        release_run_folders(keep=held)
    finally:
        os.kill(child, signal.SIGKILL)


# ---------------------------------------------------------------- paths and sizes
def test_an_empty_output_is_refused_not_replaced_by_the_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = simattn_main(["train", *FLAGS, "--output", ""])
    assert "option 'output': got ''" in _one_line_error(capsys, code)
    code = simattn_main(["ssl", "train", "--config", "ssl_digits", "--output", ""])
    assert "option 'output': got ''" in _one_line_error(capsys, code)
    assert list(tmp_path.iterdir()) == []


def test_a_model_size_that_contradicts_the_data_size_is_refused_naming_both(tmp_path, capsys):
    out = tmp_path / "run"
    code = simattn_main(["train", *FLAGS, "--model-kwargs", "img_size=32", "--output", str(out)])
    err = _one_line_error(capsys, code)
    assert "'img_size' (--img-size) 16" in err and "'model_kwargs.img_size' (--model-kwargs img_size=) 32" in err
    assert not out.exists()


# ---------------------------------------------------------------- image folders
def test_links_back_into_the_dataset_neither_repeat_images_nor_relabel_them(tmp_path, caplog):
    for cls in ("a", "b"):
        for i in range(10):
            _png(tmp_path / "train" / cls / f"{i}.png")
    (tmp_path / "train" / "a" / "loop").symlink_to("..", target_is_directory=True)
    (tmp_path / "train" / "a" / "peer").symlink_to("../b", target_is_directory=True)
    (tmp_path / "train" / "b" / "up").symlink_to("../../..", target_is_directory=True)
    _png(tmp_path / "extra" / "y.png")
    (tmp_path / "train" / "a" / "more").symlink_to(tmp_path / "extra", target_is_directory=True)
    (tmp_path / "train" / "b" / "more").symlink_to(tmp_path / "extra", target_is_directory=True)  # listed by a
    os.symlink("/dev/zero", tmp_path / "train" / "b" / "z.png")
    with caplog.at_level(logging.WARNING, logger="simattn.data.folder"):
        data = image_folder(tmp_path, "train")
    names = {(Path(p).relative_to(tmp_path / "train").as_posix(), t) for p, t in data.samples}
    assert len(data.samples) == len(names) == 22
    # the link to a device is a sample that reads as unreadable (None), so that the skipped counts include it
    assert names == {(f"{c}/{i}.png", k) for k, c in enumerate("ab") for i in range(10)} | {("a/more/y.png", 0),
                                                                                         ("b/z.png", 1)}
    assert data[[Path(p).name for p, _ in data.samples].index("z.png")] is None
    said = " ".join(r.getMessage() for r in caplog.records)
    for link in ("a/loop", "a/peer", "b/up", "b/more", "b/z.png"):
        assert str(tmp_path / "train" / link) in said, link


# ---------------------------------------------------------------- recipes
def _alias_bomb(path: Path, levels: int, width: int) -> Path:
    """A billion-laughs recipe: the anchors sit in model_kwargs (free-form keys), the bomb goes off in 'model'."""
    lines = ["model_kwargs:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    path.write_text("\n".join(lines) + f"\nmodel: *l{levels - 1}\n")
    return path


def test_a_yaml_alias_bomb_is_refused_in_one_short_line(tmp_path, capsys):
    # 8^6 = 262,144 strings once expanded (a real bomb has billions): more than any recipe holds
    recipe = _alias_bomb(tmp_path / "bomb.yaml", levels=6, width=8)
    code = simattn_main(["train", "-c", str(recipe), "--output", str(tmp_path / "run")])
    err = _one_line_error(capsys, code)
    assert len(err) < 600 and "aliases" in err, err[:600]
    (tmp_path / "self.yaml").write_text("model: &a [*a]\n")
    code = simattn_main(["train", "-c", str(tmp_path / "self.yaml"), "--output", str(tmp_path / "run")])
    assert "refers to itself" in _one_line_error(capsys, code)
    assert not (tmp_path / "run").exists()
    # a recipe that shares values through aliases is still read
    (tmp_path / "ok.yaml").write_text("base: digits_cpu\nscale: &s [1.0, 1.0]\nratio: *s\n")
    from simattn.classify.config import load_config
    assert load_config(str(tmp_path / "ok.yaml")).ratio == [1.0, 1.0]


def test_an_alias_bomb_in_a_set_item_is_refused_in_one_short_line(tmp_path, capsys):
    levels = ", ".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 8)}]" for i in range(1, 6))
    bomb = f"model_kwargs.x={{l0: &l0 [{', '.join(['lol'] * 8)}], {levels}}}"  # 8^6 strings once expanded
    code = simattn_main(["train", "--set", bomb, "--output", str(tmp_path / "run")])
    err = _one_line_error(capsys, code)
    assert len(err) < 600 and "aliases" in err, err[:600]
    assert not (tmp_path / "run").exists()


def test_errors_quote_at_most_a_few_hundred_characters_of_a_value():
    for value in ("x" * 10_000_000, [["lol"] * 1000] * 1000, {f"k{i}": i for i in range(100_000)}):
        with pytest.raises(ValueError) as e:
            check_value("model", Opt("m", type=int), value)
        assert len(str(e.value)) < 400, str(e.value)[:400]
    assert quoted([1, "a", {"b": (2,)}, None]) == repr([1, "a", {"b": (2,)}, None])  # short values as they are
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert len(quoted(cyclic)) < 20


# ---------------------------------------------------------------- convert --resume
def test_convert_resume_in_a_train_runs_folder_is_refused_and_changes_nothing(tmp_path, capsys):
    from timm.models.vision_transformer import VisionTransformer
    out = tmp_path / "run"
    assert simattn_main(["train", *FLAGS, "--output", str(out)]) == 0
    capsys.readouterr()
    teacher = tmp_path / "teacher.pth"
    torch.save(VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2,
                                 num_classes=10).state_dict(), teacher)
    before = digests(out)
    listing = sorted(p.name for p in out.iterdir())
    code = simattn_main(["convert", "--weights", str(teacher), "--to", "sima", "--output", str(out), "--resume",
                         *FLAGS, "--model-kwargs", "num_classes=10", "--epochs", "2"])
    err = _one_line_error(capsys, code)
    assert "holds no conversion to resume" in err and "last.pth" in err, err
    assert digests(out) == before and sorted(p.name for p in out.iterdir()) == listing
