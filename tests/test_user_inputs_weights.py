"""Weights a user names by hand: a hub folder without ``local-dir:``, ``local-dir:`` of a file, a run folder, a bare
state dict of another configuration, damaged files, a mistyped model name, and the data a classifier was trained
on. Each is taken as meant or refused in one true line (exit 2), through the one loader every command shares."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.models.factory import create_model
from simattn.models.weights import save_weights, weights_metadata

from cli_inputs import FLAGS, one_line_error

DEIT = "sima_deit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)
DATA_CONFIG = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
               "interpolation": "bilinear"}
#: the words of safetensors, torch and miniz that a user should not have to read
LIBRARY_WORDS = ("deserializ", "header", "miniz", "KeyError", "PytorchStreamReader", "central directory",
                 "UnpicklingError", "RuntimeError")


def _weights(path: Path, num_classes: int = 2, **extra) -> Path:
    """A tiny classifier's weights with the record training writes (``extra``: more record entries)."""
    model = create_model(DEIT, num_classes=num_classes, **TINY)
    save_weights(model, path, weights_metadata(DEIT, TINY, producer="test", num_classes=num_classes,
                                               data_config=DATA_CONFIG, **extra))
    return path


def _folder_data(root: Path, classes=("cat", "dog"), splits=("train", "val")) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in classes:
            for i in range(2):
                path = root / split / cls / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)
    return root


def _validate(capsys, *argv: str) -> dict:
    code = simattn_main(["validate", *argv, "--threads", "1", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    return json.loads(out.out)


# ---------------------------------------------------------------- weights paths
def test_a_hub_folder_is_taken_without_local_dir_and_a_run_folder_names_its_files(tmp_path, capsys, one_thread):
    weights = _weights(tmp_path / "w.safetensors")
    assert simattn_main(["hub", "save", "--weights", str(weights), "--output", str(tmp_path / "hub")]) == 0
    data = _folder_data(tmp_path / "data", splits=("val",))
    capsys.readouterr()
    result = _validate(capsys, "--weights", str(tmp_path / "hub"), "--dataset", "folder", "--data-dir", str(data))
    assert result["model"] == DEIT and result["samples"] == 4
    assert result["weights"] == str(tmp_path / "hub" / "model.safetensors")
    assert simattn_main(["hub", "save", "--weights", str(tmp_path / "hub"), "--output", str(tmp_path / "copy")]) == 0
    assert (tmp_path / "copy" / "model.safetensors").is_file()

    run = tmp_path / "run"
    run.mkdir()
    _weights(run / "final.safetensors")
    (run / "metrics.jsonl").write_text("{}\n")
    err = one_line_error(capsys, simattn_main(["validate", "--weights", str(run)]))
    assert f"{run / 'final.safetensors'}" in err and "not found" not in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(tmp_path / "empty"), "--output",
                                               str(tmp_path / "copy2")]))
    assert "is a folder without weights files" in err and "not found" not in err


def test_local_dir_of_a_file_says_it_is_a_file(tmp_path, capsys):
    weights = _weights(tmp_path / "w.safetensors")
    err = one_line_error(capsys, simattn_main(["validate", "--weights", f"local-dir:{weights}"]))
    assert "is a file, not a folder" in err and "no such folder" not in err


def test_a_bare_state_dict_of_another_size_names_the_files_shapes_in_one_short_line(tmp_path, capsys):
    bare = tmp_path / "bare.pth"
    torch.save(create_model(DEIT, num_classes=10, **dict(TINY, embed_dim=64)).state_dict(), bare)
    err = one_line_error(capsys, simattn_main(["validate", "--weights", str(bare), "--model", DEIT]))
    # the file holds a 4x4 grid + class token of 64 channels; the model 14x14 + 1 of 192
    assert "pos_embed (1, 17, 64) vs (1, 197, 192)" in err and "(1, 197, 64)" not in err
    assert "the file's vs the model's" in err and "--model-kwargs" in err and len(err.replace(str(bare), "")) < 360, err

    from simattn.models.factory import load_initial_weights
    from simattn.utils.io import CheckpointError
    initial = tmp_path / "initial.pth"
    torch.save(create_model(DEIT, num_classes=10, **TINY).state_dict(), initial)
    with pytest.raises(CheckpointError, match=r"shape mismatch: cls_token \(1, 1, 32\) vs \(1, 1, 64\), pos_embed "
                                              r"\(1, 17, 32\) vs \(1, 17, 64\) \(\+\d+ more\), the file's vs"):
        load_initial_weights(create_model(DEIT, **dict(TINY, embed_dim=64)), initial)


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("name, damage", [
    ("truncated.safetensors", _truncated),
    ("garbage.safetensors", lambda p: p.write_bytes(b"\xff" * 100)),
    ("truncated.pth", _truncated),
    ("garbage.pth", lambda p: p.write_bytes(b"not a checkpoint at all " * 8)),
])
def test_a_damaged_file_is_named_in_our_words(tmp_path, capsys, name, damage):
    path = tmp_path / name
    if path.suffix == ".safetensors":
        _weights(path)
    else:
        torch.save({"model": create_model(DEIT, **TINY).state_dict()}, path)
    damage(path)
    for argv in (["validate", "--weights", str(path)], ["hub", "save", "--weights", str(path), "--output",
                                                         str(tmp_path / "hub")]):
        err = one_line_error(capsys, simattn_main(argv))
        assert f"cannot read checkpoint {path}: truncated or not a checkpoint" in err, err
        assert not [w for w in LIBRARY_WORDS if w in err], err


def test_a_checkpoint_holding_python_objects_names_them(tmp_path, capsys):
    path = tmp_path / "official.pth"
    torch.save({"model": create_model(DEIT, **TINY).state_dict(), "args": argparse.Namespace(lr=1e-3)}, path)
    err = one_line_error(capsys, simattn_main(["validate", "--weights", str(path), "--model", DEIT]))
    assert "argparse.Namespace" in err and "weights_only" in err, err


# ---------------------------------------------------------------- model names
def test_a_mistyped_model_gets_at_most_three_names(capsys):
    from simattn.models.factory import check_model_name
    with pytest.raises(ValueError) as info:
        check_model_name("sima_deit_tiny")
    text = str(info.value)
    assert DEIT in text and "soft_huge" not in text and "ufo_vit_xlarge" not in text
    shown = set(simattn.list_models()) & set(text.replace(",", " ").replace("?", " ").split())
    assert 1 <= len(shown) <= 3 and "\n" not in text
    err = one_line_error(capsys, simattn_main(["viz", "--model", "sima_deit_tiny", "--image", "x.png"]))
    assert "did you mean" in err and DEIT in err and "soft_huge" not in err


def test_load_model_is_importable_from_the_models_package():
    from simattn.models import load_model
    from simattn.models.factory import load_model as factory_load_model
    assert load_model is factory_load_model


# ---------------------------------------------------------------- the data a classifier was trained on
def test_validate_scores_a_classifier_on_the_data_its_record_names(tmp_path, capsys, one_thread):
    data = _folder_data(tmp_path / "data")
    out = tmp_path / "run"
    assert simattn_main(["train", *FLAGS, "--dataset", "folder", "--data-dir", str(data), "--batch-size", "4",
                         "--steps-per-epoch", "1", "--output", str(out)]) == 0
    capsys.readouterr()
    for name in ("final.safetensors", "last.pth"):
        result = _validate(capsys, "--weights", str(out / name))
        assert (result["dataset"], result["split"], result["samples"]) == ("folder", "val", 4)
    err = one_line_error(capsys, simattn_main(["validate", "--weights", str(out / "final.safetensors"),
                                               "--dataset", "digits"]))
    assert "2 classes" in err and "--dataset" in err and "--data-dir" in err


def test_a_record_without_data_is_scored_on_digits_and_the_mismatch_says_what_to_pass(tmp_path, capsys):
    weights = _weights(tmp_path / "old.safetensors")  # written before records named their data
    err = one_line_error(capsys, simattn_main(["validate", "--weights", str(weights)]))
    assert "dataset 'digits' has 10" in err and "--dataset" in err and "--data-dir" in err


def test_static_int8_calibrates_on_the_data_the_weights_record(tmp_path, capsys):
    """``export --quantize static`` of a classifier trained on a folder calibrates on that folder's train split,
    as validate scores on its val split; the flags still choose; a recorded folder that is gone is one line that
    names it and the flags. (The options are checked as the command checks them, before any export.)"""
    from simattn.export.cli import build_parser, check_options

    data = _folder_data(tmp_path / "data", splits=("train",))
    weights = _weights(tmp_path / "w.safetensors", dataset="folder", data_dir=str(data))

    def options(*argv):
        return check_options(build_parser().parse_args(["--weights", str(weights), "-o", str(tmp_path / "m.onnx"),
                                                        "--quantize", "static", *argv]))

    opts = options()
    assert (opts["calibration_name"], len(opts["calibration"])) == ("folder", 4)
    opts = options("--calib-data", "digits")
    assert opts["calibration_name"] == "digits" and len(opts["calibration"]) > 1000
    other = _folder_data(tmp_path / "other", classes=("a", "b", "c"), splits=("train",))
    assert len(options("--calib-dir", str(other))["calibration"]) == 6
    plain = _weights(tmp_path / "plain.safetensors")  # a record naming no data: digits, as before
    assert check_options(build_parser().parse_args(["--weights", str(plain), "-o", str(tmp_path / "p.onnx"),
                                                    "--quantize", "static"]))["calibration_name"] == "digits"
    moved = _weights(tmp_path / "moved.safetensors", dataset="folder", data_dir=str(tmp_path / "gone"))
    err = one_line_error(capsys, simattn_main(["export", "--weights", str(moved), "-o", str(tmp_path / "x.onnx"),
                                               "--quantize", "static"]))
    assert str(tmp_path / "gone") in err and "--calib-data" in err and "the data the weights record" in err
    assert not (tmp_path / "x.onnx").exists()
