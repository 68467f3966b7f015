"""The one output rule where it is easiest to forget: ``bench attention|model|data|paper --output``, ``validate
--output`` and a training run's folder. An existing target is refused without ``--overwrite``; with it, a folder
holding anything the command does not write is refused, naming it, and nothing is touched. Each case stops at the
command's checks (a stand-in target in tmp_path, no benchmark, validation or training)."""
import importlib

import pytest

from simattn.classify.task import Trainer
from simattn.cli import main as simattn_main
from simattn.engine import ENGINE_FILES
from simattn.utils.runs import check_run_folder, claim_run_folder, run_files, settle_replaced

from cli_inputs import one_line_error

#: bench subcommand → its module, and a file of its own results (None: --output is the file itself)
BENCHES = {
    "attention": ("simattn.bench.attention", None),
    "model": ("simattn.bench.model.cli", "bench_model.json"),
    "data": ("simattn.bench.data", "bench_data.csv"),
    "paper": ("simattn.bench.paper", "table3.json"),
}


class ChecksPassed(Exception):
    """Raised in place of the work that follows a command's output check."""


def _stop_after_check(monkeypatch, module_name: str) -> None:
    """Make the bench's ``check_out`` run, then stop the command before any measurement."""
    module = importlib.import_module(module_name)
    real = module.check_out

    def check_then_stop(path, overwrite, *args, **kwargs):
        real(path, overwrite, *args, **kwargs)
        if kwargs.get("flag", "--output") == "--output":
            raise ChecksPassed(path)

    monkeypatch.setattr(module, "check_out", check_then_stop)


def _raise_checks_passed(*args, **kwargs):
    raise ChecksPassed()


def _target(tmp_path, own_file):
    """An earlier run's results: the file itself, or a folder holding one of the bench's files."""
    if own_file is None:
        target = tmp_path / "earlier.json"
        target.write_text("earlier results")
        return target, target
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / own_file).write_text("earlier results")
    return tmp_path / "out", tmp_path / "out" / own_file


@pytest.mark.parametrize("bench", list(BENCHES))
def test_bench_refuses_earlier_results_without_overwrite(bench, tmp_path, monkeypatch):
    module_name, own_file = BENCHES[bench]
    target, earlier = _target(tmp_path, own_file)
    _stop_after_check(monkeypatch, module_name)
    main = importlib.import_module(module_name).main
    with pytest.raises(ValueError, match=f"--output {target} .*--overwrite"):
        main(["--output", str(target)])
    assert earlier.read_text() == "earlier results"
    with pytest.raises(ChecksPassed):  # with --overwrite the bench goes on to its work
        main(["--output", str(target), "--overwrite"])


@pytest.mark.parametrize("bench", [name for name, (_, own) in BENCHES.items() if own is not None])
def test_bench_overwrite_refuses_a_folder_holding_other_files(bench, tmp_path, capsys):
    target, earlier = _target(tmp_path, BENCHES[bench][1])
    (target / "notes.txt").write_text("mine")
    err = one_line_error(capsys, simattn_main(["bench", bench, "--output", str(target), "--overwrite"]))
    assert "notes.txt" in err and earlier.name not in err.split("replaces only")[0]
    assert (target / "notes.txt").read_text() == "mine" and earlier.read_text() == "earlier results"


def test_validate_refuses_an_existing_output_without_overwrite(tmp_path, capsys, monkeypatch):
    import simattn.validate as validate_mod

    out = tmp_path / "metrics.json"
    out.write_text("earlier results")
    monkeypatch.setattr(validate_mod, "validate_weights", lambda *args, **kwargs: {"top1": 50.0})
    argv = ["validate", "--weights", str(tmp_path / "w.safetensors"), "--output", str(out)]
    err = one_line_error(capsys, simattn_main(argv))
    assert f"--output {out} exists: pass --overwrite" in err and out.read_text() == "earlier results"
    assert simattn_main([*argv, "--overwrite"]) == 0
    assert '"top1": 50.0' in out.read_text()


def test_train_overwrite_refuses_a_run_folder_holding_other_files(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "final.safetensors").write_bytes(b"an earlier run's weights")
    (folder / "notes.txt").write_text("mine")
    monkeypatch.setattr(Trainer, "setup", _raise_checks_passed)  # what follows the folder's check: the data
    err = one_line_error(capsys, simattn_main(["train", "-c", "digits_cpu", "--output", str(folder), "--overwrite"]))
    assert "holds notes.txt, which a run does not write" in err and "final.safetensors" not in err.split("(")[0]
    assert run_files(folder) == ["final.safetensors", "notes.txt"]
    assert (folder / "final.safetensors").read_bytes() == b"an earlier run's weights"


def test_run_folder_claim_checks_the_run_files_again_under_the_lock(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "last.pth").write_bytes(b"old")
    (folder / "eval.json").write_text("{}")  # another command's result, added after the first check
    with pytest.raises(ValueError, match="holds eval.json, which a run does not write"):
        claim_run_folder(folder, overwrite=True, replaced=ENGINE_FILES, writes=ENGINE_FILES)
    assert run_files(folder) == ["eval.json", "last.pth"]  # nothing moved aside, the lock given up
    # resuming in the checkpoint's own folder stays allowed, whatever else it holds
    check_run_folder(folder, folder / "last.pth", overwrite=True, writes=ENGINE_FILES)
    (folder / "eval.json").unlink()
    claim_run_folder(folder, overwrite=True, replaced=ENGINE_FILES, writes=ENGINE_FILES)
    assert run_files(folder) == []  # the run's own files are kept aside until it ends
    settle_replaced(False)
    assert (folder / "last.pth").read_bytes() == b"old"


def test_convert_overwrite_refuses_a_folder_holding_other_files(tmp_path):
    from types import SimpleNamespace
    from simattn.convert.run import OUTPUTS, STAGES
    from simattn.engine.stages import StagedRun
    folder = tmp_path / "conversion"
    (folder / "distill").mkdir(parents=True)
    (folder / "results.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    cfg = SimpleNamespace(output=str(folder), recipe=None, overwrite=True, resume=False)
    stages = StagedRun(cfg, SimpleNamespace(is_main=True), "convert", STAGES, OUTPUTS, "conversion")
    with pytest.raises(ValueError, match="holds notes.txt, which a run does not write"):
        stages.open()
    assert run_files(folder) == ["distill", "notes.txt", "results.json"]  # nothing moved aside
    (folder / "notes.txt").unlink()
    assert stages.open() == folder  # the stage folders and the command's own files are its to replace
    settle_replaced(False)
    assert (folder / "results.json").read_text() == "{}"
