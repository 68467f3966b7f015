"""``simattn segment`` end to end on tiny digit scenes: the run's files and record, bit-exact resume after SIGKILL,
two-process DDP whose mIoU equals one process's evaluation of the same weights, and one-line errors."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from simattn.cli import main as simattn_main

from killing import kill_on_line
from torchrun import run_two_processes

pytest.importorskip("segmentation_models_pytorch")

TINY = [
    "--model", "semantic_fpn",
    "--model-kwargs", "backbone=sima_deit_tiny_patch16_224", "img_size=64", "patch_size=16", "embed_dim=32",
    "depth=4", "num_heads=2", "decoder_channels=16", "segmentation_channels=32",
    "--dataset", "digits", "--set", "dataset_kwargs={canvas: 64, num_train: 64, num_val: 12}",
    "--crop-size", "[64, 64]", "--img-scale", "[64, 64]", "--ratio-range", "[0.75, 1.5]", "--cat-max-ratio", "1.0",
    "--batch-size", "8", "--lr", "2e-3", "--warmup-epochs", "0.5", "--drop-path", "0.1", "--workers", "0",
    "--threads", "1", "--device", "cpu", "--seed", "5", "--epochs", "2", "--steps-per-epoch", "4",
    "--log-interval", "1",
]


def _cmd(output: Path, *extra: str):
    return [sys.executable, "-m", "simattn", "segment", *TINY, "--output", str(output), *extra]


def _summary(folder: Path):
    return json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted run in this process: its folder and what it printed."""
    out = tmp_path_factory.mktemp("segment") / "straight"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert simattn_main(["segment", *TINY, "--output", str(out)]) == 0
    return out, printed.getvalue()


def test_run_writes_scores_report_and_a_record_that_rebuilds_the_model(straight):
    out, printed = straight
    printed = json.loads(printed.strip().splitlines()[-1])
    summary = _summary(out)
    final = summary["final"]
    assert printed["val_miou"] == final["val_miou"]
    ious = [v["iou"] for v in final["per_class"].values() if v["iou"] is not None]
    assert final["val_miou"] == pytest.approx(sum(ious) / len(ious), abs=1e-3)
    assert set(final["per_class"]) == {"background", *map(str, range(10))}
    rows = list(csv.reader((out / "per_class.csv").open()))
    assert rows[0] == ["class", "iou", "acc"] and len(rows) == 12
    assert (out / "per_class_iou.png").stat().st_size > 0
    from simattn.models.factory import load_model
    from simattn.models.sources import read_weights_record
    record = read_weights_record(out / "final.safetensors")
    assert record.model == "semantic_fpn" and record.model_kwargs["backbone"] == "sima_deit_tiny_patch16_224"
    assert record.extra["classes"][0] == "background" and len(record.extra["palette"]) == 11
    model, _ = load_model(weights=out / "final.safetensors")
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 11, 64, 64)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(straight, tmp_path, capsys):
    # the run is killed in its own process; the uninterrupted run and the resume run in this one
    reference, _ = straight
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    victim = subprocess.Popen(_cmd(killed, "--checkpoint-every-steps", "2"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
    watcher, seen = kill_on_line(victim, lambda line: line.startswith("checkpoint:") and "epoch 2" in line)
    watcher.join(timeout=600)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)
    assert not (killed / "summary.json").exists()
    code = simattn_main(["segment", *TINY, "--output", str(killed), "--checkpoint-every-steps", "2", "--resume"])
    assert code == 0, capsys.readouterr().err[-2000:]
    a, b = _summary(reference), _summary(killed)
    assert b["final"]["val_miou"] == a["final"]["val_miou"]
    assert [h["train_loss"] for h in b["history"]] == [h["train_loss"] for h in a["history"]]
    wa, wb = load_file(reference / "final.safetensors"), load_file(killed / "final.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


WORKER = textwrap.dedent("""
    import sys
    from simattn.cli import main
    sys.exit(main(["segment", *sys.argv[2:], "--output", sys.argv[1]]))
""")


@pytest.mark.slow
def test_two_process_ddp_scores_the_same_as_one_process(tmp_path):
    out = tmp_path / "ddp"
    proc = run_two_processes(tmp_path, WORKER, [out, *TINY, "--epochs", "1"], timeout=600)
    summary = _summary(out)
    assert summary["world_size"] == 2
    # one process scoring the same weights on the same images: the summed confusion matrix makes them equal
    from simattn.data.segmentation import create_segmentation_dataset
    from simattn.models.factory import load_model
    from simattn.segment.evaluate import evaluate_segmentation
    from simattn.segment.task import backbone_norm
    model, _ = load_model(weights=out / "final.safetensors")
    mean, std = backbone_norm("sima_deit_tiny_patch16_224")
    val = create_segmentation_dataset("digits", None, "val", train=False, crop_size=(64, 64), scale=(64, 64),
                                      mean=mean, std=std, canvas=64, num_train=64, num_val=12)
    torch.set_num_threads(1)  # as each rank ran (a float sum in another order may flip a tied pixel)
    single = evaluate_segmentation(model, val, device=torch.device("cpu"))
    assert single["miou"] == summary["final"]["val_miou"]
    assert single["per_class"] == summary["final"]["per_class"]


BACKBONE = ["--model-kwargs", "backbone=sima_deit_tiny_patch16_224"]


@pytest.mark.parametrize("flags, message", [
    (["--model-kwargs", "backbone=null"], "needs backbone="),
    ([*BACKBONE, "--dataset", "ade20k"], "--dataset ade20k needs --data-dir"),
    ([*BACKBONE, "--model", "deeplab"], "model"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert simattn_main(["segment", *flags, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_the_loss_is_taken_in_chunks_over_the_limit_and_refused_where_a_row_is_over(tmp_path, capsys, monkeypatch):
    import torch.nn.functional as F

    from simattn.engine import losses
    from simattn.segment.cli import build_parser
    from simattn.segment.config import SegmentConfig
    from simattn.segment.metrics import IGNORE_INDEX
    from simattn.segment.task import SegmentationTrainer
    from simattn.utils.recipe import recipe_from_args

    cfg = recipe_from_args(SegmentConfig, build_parser().parse_args([*TINY, "--output", str(tmp_path / "run")]))
    trainer = SegmentationTrainer(cfg)
    trainer.setup()  # opens the data, so the classes are known: 11 at a 64x64 crop
    logits = torch.randn(8, 11, 64, 64, dtype=torch.bfloat16, requires_grad=True)
    masks = torch.randint(11, (8, 64, 64))
    masks[0, :5] = IGNORE_INDEX
    expected = F.cross_entropy(logits.float(), masks, ignore_index=IGNORE_INDEX)
    trainer.forward_model = lambda images: logits
    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", 3 * 11 * 64 * 64)
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda x, *a, **k: calls.append(len(x)) or real(x, *a, **k))
    torch.testing.assert_close(trainer.batch_loss((None, masks)), expected, rtol=1e-6, atol=1e-6)
    assert calls == [3, 3, 2]  # images per call

    # a crop whose one row of logits is over the limit: refused before the run folder is made
    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", 11 * 64 - 1)
    out = tmp_path / "refused"
    assert simattn_main(["segment", *TINY, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"a row of 11 classes × 64 px holds 704 logits, over the 703" in err, err
    assert not out.exists()
