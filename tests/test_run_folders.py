"""Run folders and loud failure: no run writes over another, resumes must match their checkpoint, true train time,
summary.csv, reusable config.yaml, non-finite losses and weights, the engine's extension points."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.train import Trainer, load_config, train
from simattn.utils.io import atomic_torch_save, check_finite_weights, read_safetensors_metadata
from simattn.utils.runs import check_run_folder, default_output
from helpers import digests

TINY = dict(model="sima_deit_tiny_patch16_224",
            model_kwargs={"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2},
            dataset="digits", img_size=16, batch_size=64, lr=2e-3, warmup_epochs=0, steps_per_epoch=2, epochs=1,
            threads=1, device="cpu", log_interval=100, seed=0)
FLAGS = ["--model", "sima_deit_tiny_patch16_224", "--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=32",
         "depth=1", "num_heads=2", "--img-size", "16", "--batch-size", "64", "--lr", "2e-3", "--warmup-epochs", "0",
         "--steps-per-epoch", "2", "--epochs", "1", "--threads", "1", "--device", "cpu", "--log-interval", "100"]


def _cfg(out: Path, **over):
    return load_config(None, {**TINY, "output": str(out), **over})


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    out = tmp_path_factory.mktemp("folders") / "A"
    threads = torch.get_num_threads()
    result = train(load_config(None, {**TINY, "output": str(out)}))
    torch.set_num_threads(threads)
    return result


@pytest.fixture
def own_run(run_a, tmp_path) -> Path:
    """A copy of run A's folder for a test that trains on in it (run A stays as trained, whatever ran before)."""
    folder = tmp_path / "A"
    shutil.copytree(run_a.output, folder)
    return folder


# ---------------------------------------------------------------- no run writes over another
def test_resume_into_another_runs_folder_is_refused_and_leaves_it_intact(run_a, tmp_path, capsys):
    other = tmp_path / "B"
    train(_cfg(other))
    before = digests(other)
    code = simattn_main(["train", *FLAGS, "--epochs", "2", "--resume", str(run_a.output / "last.pth"),
                         "--output", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "holds another run's files" in err
    assert digests(other) == before  # final.safetensors, summary.json, metrics.jsonl ... untouched


def test_a_fresh_run_never_writes_into_a_folder_with_files(tmp_path, capsys):
    folder = tmp_path / "C"
    folder.mkdir()
    (folder / "final.safetensors").write_bytes(b"someone's weights")  # no last.pth
    assert simattn_main(["train", *FLAGS, "--output", str(folder)]) == 2
    assert "already holds files (final.safetensors)" in capsys.readouterr().err
    assert (folder / "final.safetensors").read_bytes() == b"someone's weights"
    # --overwrite replaces the run's files
    assert simattn_main(["train", *FLAGS, "--output", str(folder), "--overwrite"]) == 0
    assert read_safetensors_metadata(folder / "final.safetensors")["model"] == TINY["model"]


def test_resume_continues_in_its_own_folder_and_accumulates_train_time(own_run):
    # the checkpoint claims 1000 s of training so far: the summary must add this session to it
    last = own_run / "last.pth"
    state = torch.load(last, weights_only=True)
    state["train_time_s"] = 1000.0
    atomic_torch_save(state, last)
    resumed = train(load_config(None, {**TINY, "epochs": 2, "resume": str(last)}))  # output: the checkpoint's folder
    assert resumed.output == own_run
    assert 1000.0 < resumed.summary["train_time_s"] < 1000.0 + 600
    assert json.loads((own_run / "summary.json").read_text())["train_time_s"] == resumed.summary["train_time_s"]


def test_resume_refuses_other_model_kwargs_or_data(run_a, capsys):
    last = str(run_a.output / "last.pth")
    before = digests(run_a.output)
    assert simattn_main(["train", *FLAGS, "--resume", last, "--model-kwargs", "attn_type=softmax"]) == 2
    assert "differ in model_kwargs" in capsys.readouterr().err
    assert simattn_main(["train", *FLAGS, "--resume", last, "--img-size", "24", "--model-kwargs", "img_size=24"]) == 2
    assert "differ in" in capsys.readouterr().err
    assert digests(run_a.output) == before


def test_default_outputs_never_collide(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = default_output("digits_cpu", "train")
    first.mkdir(parents=True)
    second = default_output("digits_cpu", "train")
    assert first.parent == Path("runs/digits_cpu") and second != first and not second.exists()


def test_output_that_is_a_file_or_under_one_is_a_one_line_error(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for out in (a_file, a_file / "run"):
        assert simattn_main(["train", *FLAGS, "--output", str(out)]) == 2
        assert "a file, not a folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="under .*which is a file"):
        check_run_folder(a_file / "run")


def test_stale_temporary_files_are_removed_on_start(own_run):
    stale = own_run / ".last.pth.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    train(load_config(None, {**TINY, "epochs": 3, "resume": str(own_run / "last.pth")}))
    assert not stale.exists()


def test_config_yaml_is_a_recipe_for_a_new_run_and_summary_csv_has_timms_columns(run_a, tmp_path):
    saved = yaml.safe_load((run_a.output / "config.yaml").read_text())
    assert not {"output", "resume", "overwrite"} & set(saved)
    again = load_config(str(run_a.output / "config.yaml"), {"output": str(tmp_path / "again")})
    assert again.model_kwargs == TINY["model_kwargs"] and again.lr == TINY["lr"] and again.resume is None
    rows = list(csv.DictReader((run_a.output / "summary.csv").open()))
    assert list(rows[0]) == ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "lr"]
    history = json.loads((run_a.output / "summary.json").read_text())["history"]
    assert [int(r["epoch"]) for r in rows] == [h["epoch"] for h in history]
    assert float(rows[-1]["eval_top1"]) == pytest.approx(history[-1]["val_top1"])


# ---------------------------------------------------------------- loud failure
def test_a_diverging_run_stops_with_one_line_and_writes_no_weights(tmp_path, capsys):
    out = tmp_path / "nan"
    # lr 1e30: the first update sends the weights to ~1e30, the next forward pass overflows
    assert simattn_main(["train", *FLAGS, "--lr", "1e30", "--steps-per-epoch", "4", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training diverged" in err
    assert not (out / "final.safetensors").exists() and not (out / "best.safetensors").exists()
    assert "NaN" not in (out / "metrics.jsonl").read_text()


class _NanOnce(Trainer):
    """A non-finite loss on the first micro-batch only (as an overflow would give), through the loss hook."""

    calls = 0

    def compute_loss(self, images, target):
        loss = super().compute_loss(images, target)
        type(self).calls += 1
        return loss * float("nan") if type(self).calls == 1 else loss


def test_nonfinite_steps_are_skipped_up_to_the_limit_then_the_run_stops(tmp_path):
    _NanOnce.calls = 0
    result = train(_cfg(tmp_path / "skip", max_nonfinite_steps=1), trainer_cls=_NanOnce)
    assert result.summary["nonfinite_skipped"] == 1
    check_finite_weights(result.model, "the model")
    records = [json.loads(x) for x in (result.output / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records if r["type"] == "nonfinite"] == [1]
    _NanOnce.calls = 0
    with pytest.raises(FloatingPointError, match="max_nonfinite_steps=0"):
        train(_cfg(tmp_path / "stop"), trainer_cls=_NanOnce)


def test_nonfinite_weights_are_never_written():
    model = torch.nn.Linear(2, 2)
    check_finite_weights(model, "fine")
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="weight"):
        check_finite_weights(model, "the model")


# ---------------------------------------------------------------- the engine's extension points
class _Distill(Trainer):
    """What a distillation run needs: its own loss, extra checkpoint state and extra weights metadata."""

    def __init__(self, *args, **kwargs):
        self.loaded_extra = None
        self.seen = 0
        super().__init__(*args, **kwargs)

    def compute_loss(self, images, target):
        self.seen += len(images)
        return super().compute_loss(images, target) * 0.5

    def task_state(self):
        return {**super().task_state(), "seen": self.seen}

    def load_task_state(self, state):
        super().load_task_state(state)
        self.loaded_extra = {"seen": state["seen"]}

    def export_metadata(self):
        return {"teacher": "sima_deit_tiny_patch16_224"}


def test_trainer_hooks_reach_checkpoints_and_metadata(tmp_path):
    built = []

    def factory(cfg, num_classes):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, num_classes))
        model.pretrained_cfg = {"input_size": (3, 16, 16), "interpolation": "bilinear", "mean": (0.5,) * 3,
                                "std": (0.5,) * 3, "crop_pct": 1.0}
        built.append(num_classes)
        return model, {"num_classes": num_classes}

    out = tmp_path / "hooks"
    first = train(_cfg(out), trainer_cls=_Distill, model_factory=factory)
    assert built == [10] and isinstance(first.model, torch.nn.Sequential)
    assert torch.load(out / "last.pth", weights_only=True)["task_state"]["seen"] == 2 * 64
    assert read_safetensors_metadata(out / "final.safetensors")["teacher"] == "sima_deit_tiny_patch16_224"
    trainer = _Distill(_cfg(out, epochs=2, resume="auto"), model_factory=factory)
    assert trainer.loaded_extra is None  # the constructor only stores
    assert trainer.build().loaded_extra == {"seen": 2 * 64}


def test_a_task_constructor_only_stores_and_run_builds_in_order(tmp_path):
    calls = []

    class Late(Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.note = "set after the engine's constructor"  # nothing was built or resumed yet

        def setup(self):
            calls.append(("setup", self.note))
            super().setup()

        def create_model(self):
            calls.append(("model", hasattr(self, "num_classes")))
            return super().create_model()

        def train_dataset(self):
            calls.append(("data", hasattr(self, "model")))
            return super().train_dataset()

        def started(self):
            calls.append(("started", hasattr(self, "optimizer") and (self.out / "config.yaml").is_file()))

    out = tmp_path / "late"
    Late(_cfg(out))
    assert not out.exists() and calls == []
    result = train(_cfg(out), trainer_cls=Late)
    assert calls == [("setup", "set after the engine's constructor"), ("model", True), ("data", True),
                     ("started", True)]
    assert (out / "final.safetensors").is_file() and result.summary["updates"] == 2


def test_ssl_and_detect_follow_the_same_folder_rules(tmp_path, capsys):
    pytest.importorskip("lightly")
    pytest.importorskip("pycocotools")
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    for argv in (["ssl", "train", "--config", "ssl_digits"], ["detect", "train", "--config", "detect_shapes_cpu"]):
        assert simattn_main([*argv, "--output", str(folder)]) == 2
        assert "already holds files (results.json)" in capsys.readouterr().err
        assert simattn_main([*argv, "--output", str(folder), "--resume"]) == 2  # nothing of its own to resume
        assert "checkpoint not found" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["results.json"]


# ---------------------------------------------------------------- starting from weights
def test_initial_checkpoint_starts_the_model_from_other_weights(run_a, tmp_path):
    from safetensors.torch import load_file
    weights = run_a.output / "final.safetensors"
    trainer = Trainer(_cfg(tmp_path / "init", initial_checkpoint=str(weights), num_classes=None)).build()
    saved = load_file(str(weights))
    own = trainer.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in saved.items())
    assert trainer.initial_weights["loaded"] == len(saved)
    records = [json.loads(x) for x in (tmp_path / "init" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["type"] == "initial_weights" and records[0]["path"] == str(weights)
    with pytest.raises(FileNotFoundError, match="initial weights not found"):
        Trainer(_cfg(tmp_path / "init2", initial_checkpoint=str(tmp_path / "nope.safetensors"))).build()
