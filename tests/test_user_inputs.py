"""What a command does with inputs it did not make: image folders with hidden folders, FIFOs, link loops and 16-bit
images; outputs that are inputs, special files or links; --overwrite that fails; options that contradict each
other; Ctrl-C. Each is a one-line error (exit 2), a clean result or a warning, and nothing the user had is lost."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import simattn  # noqa: F401  (registers the models)
from simattn import cli
from simattn.cli import main as simattn_main
from simattn.data.folder import image_folder
from simattn.data.images import load_image
from simattn.utils.io import atomic_write_json, check_outputs
from simattn.utils.runs import claim_run_folder, run_files, settle_replaced

from cli_inputs import FLAGS, TINY_KWARGS, one_line_error as _one_line_error  # noqa: F401


def _png(path: Path, value: int = 128, size: int = 8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(path)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- image folders
def test_hidden_folders_and_non_image_files_are_not_classes_or_samples(tmp_path):
    for cls in ("cat", "dog"):
        _png(tmp_path / "train" / cls / "a.png")
    _png(tmp_path / "train" / ".ipynb_checkpoints" / "a.png")
    _png(tmp_path / "train" / "cat" / ".hidden.png")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / "README.md").write_text("a file beside the classes")
    data = image_folder(tmp_path, "train")
    assert data.classes == ["cat", "dog"]
    assert sorted(Path(p).name for p, _ in data.samples) == ["a.png", "a.png"]


@pytest.mark.timeout(60)
def test_a_fifo_named_like_an_image_is_skipped_with_a_warning_not_read(tmp_path, caplog):
    for cls in ("a", "b"):
        _png(tmp_path / "train" / cls / "x.png")
    os.mkfifo(tmp_path / "train" / "a" / "v.png")  # opening it for reading would block forever
    with caplog.at_level(logging.WARNING, logger="simattn.data.folder"):
        data = image_folder(tmp_path, "train")
        names = [Path(p).name for p, _ in data.samples]
        assert names == ["v.png", "x.png", "x.png"]  # an unreadable sample: counted where images are skipped
        assert data[0] is None and data[1] is not None
    assert any("v.png" in r.getMessage() and "not a regular file" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
def test_a_link_to_a_device_named_like_an_image_is_counted_as_skipped(tmp_path, capsys):
    from simattn.models.factory import create_model
    from simattn.models.weights import save_weights, weights_metadata
    kwargs = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)
    save_weights(create_model("sima_deit_tiny_patch16_224", num_classes=2, **kwargs), tmp_path / "w.safetensors",
                 weights_metadata("sima_deit_tiny_patch16_224", kwargs, producer="test", num_classes=2,
                                  data_config={"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3,
                                               "crop_pct": 1.0, "interpolation": "bilinear"}))
    for cls in ("a", "b"):
        _png(tmp_path / "data" / "val" / cls / "x.png", size=16)
    (tmp_path / "data" / "val" / "a" / "z.png").symlink_to("/dev/zero")  # reading it would never end
    code = simattn_main(["validate", "--weights", str(tmp_path / "w.safetensors"), "--dataset", "folder",
                         "--data-dir", str(tmp_path / "data"), "--threads", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    result = json.loads(out.out)
    assert (result["samples"], result["skipped"]) == (2, 1)


def test_a_symlink_loop_is_not_followed_but_a_link_to_another_folder_is(tmp_path, caplog):
    for cls in ("a", "b"):
        _png(tmp_path / "train" / cls / "x.png")
    (tmp_path / "train" / "a" / "loop").symlink_to(tmp_path / "train" / "a", target_is_directory=True)
    _png(tmp_path / "extra" / "y.png")
    (tmp_path / "train" / "b" / "more").symlink_to(tmp_path / "extra", target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="simattn.data.folder"):
        data = image_folder(tmp_path, "train")
    assert sorted(Path(p).name for p, _ in data.samples) == ["x.png", "x.png", "y.png"]
    assert any("loop" in r.getMessage() for r in caplog.records)


def test_16_bit_images_keep_their_range(tmp_path):
    grey = np.full((8, 8), 32768, np.uint16)  # mid-grey at 16 bits
    Image.fromarray(grey).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I;16")
    rgb = np.asarray(load_image(str(tmp_path / "g16.png")))
    assert rgb.shape == (8, 8, 3) and np.all(rgb == 128)  # PIL's own convert("RGB") gives 255 (solid white)


def test_float_images_have_no_fixed_range_and_are_refused(tmp_path):
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "f.tiff")
    with pytest.raises(ValueError, match="no fixed range"):
        load_image(str(tmp_path / "f.tiff"))


def test_one_class_cannot_train_a_classifier(tmp_path, capsys):
    for split in ("train", "val"):
        _png(tmp_path / split / "only" / "a.png")
    code = simattn_main(["train", *FLAGS, "--dataset", "folder", "--data-dir", str(tmp_path),
                         "--output", str(tmp_path / "run")])
    err = _one_line_error(capsys, code)
    assert "a classifier needs at least 2" in err and not (tmp_path / "run").exists()


def test_model_kwarg_num_classes_that_disagrees_with_the_data_is_refused(tmp_path, capsys):
    code = simattn_main(["train", *FLAGS, "--model-kwargs", *TINY_KWARGS, "num_classes=5",
                         "--output", str(tmp_path / "run")])
    err = _one_line_error(capsys, code)
    assert "model kwarg num_classes=5" in err and "10 classes" in err


# ---------------------------------------------------------------- outputs and inputs
@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("inputs") / "run"
    assert simattn_main(["train", *FLAGS, "--output", str(out)]) == 0
    return out


def test_weights_record_the_class_names_and_validate_checks_them(digits_run, tmp_path, capsys):
    from simattn.models.sources import read_weights_record
    record = read_weights_record(digits_run / "final.safetensors")
    assert record.extra["classes"] == [str(i) for i in range(10)]
    # a folder with 10 classes under other names: same count, other meaning
    for split in ("val",):
        for name in "abcdefghij":
            _png(tmp_path / split / name / "x.png", size=16)
    code = simattn_main(["validate", "--weights", str(digits_run / "final.safetensors"), "--dataset", "folder",
                         "--data-dir", str(tmp_path)])
    err = _one_line_error(capsys, code)
    assert "trained on other classes" in err and "0: '0' vs 'a'" in err


def test_validate_output_equal_to_the_weights_is_refused(digits_run, capsys):
    weights = digits_run / "final.safetensors"
    before = _digest(weights)
    code = simattn_main(["validate", "--weights", str(weights), "--output", str(weights)])
    err = _one_line_error(capsys, code)
    assert "--output" in err and "--weights" in err
    assert _digest(weights) == before


def test_validate_refuses_a_device_it_cannot_evaluate_on(digits_run, capsys):
    code = simattn_main(["validate", "--weights", str(digits_run / "final.safetensors"), "--device", "meta"])
    assert "option '--device': got 'meta'; allowed: cpu, cuda" in _one_line_error(capsys, code)


def test_two_outputs_that_are_one_file_are_refused_but_special_files_are_shared(tmp_path):
    with pytest.raises(ValueError, match="same file"):
        check_outputs({"-o": tmp_path / "x.onnx", "--report": tmp_path / "x.onnx"}, {})
    check_outputs({"-o": "/dev/null", "--report": "/dev/null"}, {})


def test_writing_to_a_special_file_or_through_a_link_keeps_them_what_they_are(tmp_path):
    atomic_write_json({"a": 1}, "/dev/null")
    assert Path("/dev/null").is_char_device()
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_json({"b": 2}, link)
    assert link.is_symlink() and json.loads(target.read_text()) == {"b": 2}


def test_validate_output_to_dev_stdout_prints_the_json(digits_run, capfd):
    code = simattn_main(["validate", "--weights", str(digits_run / "final.safetensors"), "--output", "/dev/stdout"])
    out = capfd.readouterr().out
    assert code == 0 and out.count('"top1"') == 2  # printed, then written through /dev/stdout


# ---------------------------------------------------------------- --overwrite keeps the old run until the new one succeeds
def test_overwrite_parks_the_old_files_and_restores_them_when_the_run_fails(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "final.safetensors").write_bytes(b"old weights")
    claim_run_folder(out, overwrite=True, replaced=("final.safetensors", "summary.json"))
    assert not (out / "final.safetensors").exists() and run_files(out) == []
    (out / "final.safetensors").write_bytes(b"new, failed run")
    settle_replaced(False)
    assert (out / "final.safetensors").read_bytes() == b"old weights" and run_files(out) == ["final.safetensors"]
    claim_run_folder(out, overwrite=True, replaced=("final.safetensors",))
    (out / "final.safetensors").write_bytes(b"new run")
    settle_replaced(True)
    assert sorted(p.name for p in out.iterdir()) == ["final.safetensors"]
    assert (out / "final.safetensors").read_bytes() == b"new run"


def test_an_overwriting_run_that_diverges_leaves_the_old_runs_weights(digits_run, tmp_path, capsys):
    out = tmp_path / "copy"
    out.mkdir()
    for name in ("final.safetensors", "best.safetensors", "summary.json"):
        (out / name).write_bytes((digits_run / name).read_bytes())
    before = {p.name: _digest(p) for p in out.iterdir()}
    code = simattn_main(["train", *FLAGS, "--lr", "1e30", "--steps-per-epoch", "4", "--output", str(out),
                         "--overwrite"])
    assert "training diverged" in _one_line_error(capsys, code, 1)
    after = {p.name: _digest(p) for p in out.iterdir() if p.name in before}
    assert after == before
    assert not [p for p in out.iterdir() if p.name.startswith(".replaced-")]


def test_initial_checkpoint_inside_the_folder_it_would_overwrite_is_refused(digits_run, tmp_path, capsys):
    out = tmp_path / "again"
    out.mkdir()
    (out / "final.safetensors").write_bytes((digits_run / "final.safetensors").read_bytes())
    before = _digest(out / "final.safetensors")
    code = simattn_main(["train", *FLAGS, "--initial-checkpoint", str(out / "final.safetensors"),
                         "--output", str(out), "--overwrite"])
    assert "a file this run writes" in _one_line_error(capsys, code)
    assert _digest(out / "final.safetensors") == before


# ---------------------------------------------------------------- options that contradict each other
def test_initial_checkpoint_beside_resume_is_refused(digits_run, capsys):
    code = simattn_main(["train", *FLAGS, "--epochs", "2", "--resume", str(digits_run / "last.pth"),
                         "--initial-checkpoint", str(digits_run / "final.safetensors")])
    assert "exclude each other" in _one_line_error(capsys, code)


def test_resuming_with_fewer_epochs_than_the_checkpoint_trained_is_refused(tmp_path, capsys):
    out = tmp_path / "two"
    assert simattn_main(["train", *FLAGS, "--epochs", "2", "--output", str(out)]) == 0
    capsys.readouterr()
    code = simattn_main(["train", *FLAGS, "--epochs", "1", "--resume", str(out / "last.pth")])
    assert "has trained 2 epoch(s)" in _one_line_error(capsys, code)


def test_convert_to_softmax_or_from_a_teacher_of_the_same_kind_is_refused(digits_run, capsys):
    weights = str(digits_run / "final.safetensors")  # a SimA network
    code = simattn_main(["convert", "--weights", weights, "--to", "softmax", "--output", "/nonexistent/x"])
    assert "softmax-free student" in _one_line_error(capsys, code)
    code = simattn_main(["convert", "--weights", weights, "--to", "sima", "--epochs", "2",
                         "--output", str(digits_run.parent / "conv")])
    assert "already uses sima attention" in _one_line_error(capsys, code)
    assert not (digits_run.parent / "conv").exists()


def test_convert_overwrite_never_destroys_its_teacher(tmp_path, capsys):
    teacher = tmp_path / "T"
    assert simattn_main(["train", *FLAGS, "--model-kwargs", *TINY_KWARGS, "attn_type=softmax",
                         "--output", str(teacher)]) == 0
    capsys.readouterr()
    before = _digest(teacher / "final.safetensors")
    code = simattn_main(["convert", "--weights", str(teacher / "final.safetensors"), "--to", "sima", "--epochs", "2",
                         "--output", str(teacher), "--overwrite"])
    assert "which a run does not write" in _one_line_error(capsys, code)  # a training run's folder: not convert's
    assert _digest(teacher / "final.safetensors") == before
    # an earlier conversion's result as the teacher of the next, in the same folder: the input is named
    converted = tmp_path / "C"
    converted.mkdir()
    shutil.copy(teacher / "final.safetensors", converted / "final.safetensors")
    code = simattn_main(["convert", "--weights", str(converted / "final.safetensors"), "--to", "sima", "--epochs", "2",
                         "--output", str(converted), "--overwrite"])
    assert "a file this run writes" in _one_line_error(capsys, code)
    assert _digest(converted / "final.safetensors") == before


# ---------------------------------------------------------------- viz, Ctrl-C
def test_viz_gives_each_input_its_own_panel(tmp_path):
    a = _png(tmp_path / "one" / "x.png", 30, 32)
    b = _png(tmp_path / "two" / "x.png", 200, 32)
    out = tmp_path / "viz"
    assert simattn_main(["viz", "--model", "sima_deit_tiny_patch16_224", "--model-kwargs", "img_size=32",
                         "patch_size=8", "depth=1", "--image", str(a), str(b), "--out", str(out)]) == 0
    panels = [r["panel"] for r in json.loads((out / "viz.json").read_text())["images"]]
    assert len(set(panels)) == 2 and all(Path(p).is_file() for p in panels)


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import simattn.demo as demo

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "main", interrupted)
    code = cli.run("demo", [])
    err = capsys.readouterr().err
    assert code == 130 and err.strip().count("\n") == 0 and "interrupted" in err


# ---------------------------------------------------------------- every option checked before work starts
@pytest.mark.parametrize("argv, says", [
    (["ssl", "train", "--config", "ssl_digits", "--set", "data.augment.bogus=1"], "unknown DINOTransform argument"),
    (["ssl", "train", "--config", "ssl_digits", "--set", "data.augment.hf_prob=2"], "not a probability"),
    (["convert", "--weights", "w.safetensors", "--set", "convert.bogus=1"], "unknown key 'convert.bogus'"),
    (["convert", "--weights", "w.safetensors", "--set", "convert.transfer_lr=-1"], "convert.transfer_lr"),
    (["viz", "--alpha", "2"], "option '--alpha': got 2; allowed: a number in [0, 1]"),
    (["viz", "--cmap", "jett"], "did you mean 'jet'"),
    (["demo", "--latency-batch", "0"], "option '--latency-batch': got 0"),
    (["demo", "--latency-sizes", "32"], "(2 values)"),
    (["train", "-c", "digits_cpu", "--dist-timeout", "0"], "option 'dist_timeout'"),
    (["validate", "--weights", "w.safetensors", "--interpolation", "bogus"], "option '--interpolation': got 'bogus'"),
    (["validate", "--weights", "w.safetensors", "--img-size", "0"], "option '--img-size': got 0"),
    (["export", "--weights", "w.safetensors", "--opset", "1000"], "option '--opset': got 1000; allowed: 18 to"),
    (["export", "--weights", "w.safetensors", "--threads", "0"], "option '--threads': got 0"),
    (["export", "--weights", "w.safetensors", "--bench-time", "-1"], "option '--bench-time': got -1"),
    (["bench", "attention", "--max-seconds", "nan"], "option '--max-seconds': got 'nan'"),
    (["bench", "paper", "--device", "bogus"], "option '--device': got 'bogus'"),
    (["bench", "paper", "--quick", "--sizes", "-64"], "option '--sizes': got [-64]"),
    (["bench", "model", "--threads", "0"], "option '--threads': got 0"),
])
def test_bad_options_are_one_line_errors_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, simattn_main(argv))
    assert says in err
    assert list(tmp_path.iterdir()) == []  # nothing written


# ---------------------------------------------------------------- inputs that need more memory than there is
@pytest.mark.parametrize("argv", [
    ["train", *[f for f in FLAGS if f != "img_size=16"], "--img-size", "100000"],  # the model at its own size
    ["train", *FLAGS, "--aug-repeats", "100000000"],
    ["detect", "shapes", "--size", "100000"],
    ["viz", "--model", "sima_deit_tiny_patch16_224", "--img-size", "100000"],
])
def test_inputs_that_need_more_memory_than_the_machine_has_are_refused(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, simattn_main([*argv, "--output", str(tmp_path / "out")]))
    assert "would need at least" in err and "GiB available" in err
    assert not (tmp_path / "out").exists()


def test_a_weights_record_claiming_a_huge_input_is_refused(digits_run, tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    from simattn.utils.io import read_safetensors_metadata
    meta = read_safetensors_metadata(digits_run / "final.safetensors")
    config = json.loads(meta["data_config"])
    config["input_size"] = [3, 100000, 100000]
    forged = tmp_path / "huge.safetensors"
    save_file(load_file(digits_run / "final.safetensors"), forged, metadata={**meta, "data_config": json.dumps(config)})
    err = _one_line_error(capsys, simattn_main(["validate", "--weights", str(forged)]))
    assert "100000x100000" in err and "would need at least" in err


def test_an_onnx_file_whose_record_claims_a_huge_input_is_refused_before_any_work(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from simattn.models.weights import export_record
    # a graph that takes any size (as a dynamic-axes export does), so only the record bounds it
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["logits"], axes=[2, 3], keepdims=0)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    record = export_record("sima_deit_tiny_patch16_224", {"num_classes": 10},
                           {"input_size": [3, 100000, 100000], "mean": [0.5] * 3, "std": [0.5] * 3})
    for key, value in record.to_metadata().items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, tmp_path / "huge.onnx")
    err = _one_line_error(capsys, simattn_main(["validate", "--weights", str(tmp_path / "huge.onnx")]))
    assert "100000x100000" in err and "would need at least" in err


def test_an_unexpected_error_is_one_line_and_the_traceback_waits_for_simattn_debug(monkeypatch, capsys):
    import simattn.demo as demo

    def broken(argv=None):
        raise KeyError("some internal key")

    monkeypatch.setattr(demo, "main", broken)
    code = cli.run("demo", [])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "unexpected error KeyError" in err and "SIMATTN_DEBUG" in err
    monkeypatch.setenv("SIMATTN_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.run("demo", [])


# ---------------------------------------------------------------- the Python API names the bad argument
@pytest.mark.parametrize("name, kwargs, says", [
    ("sima_deit_tiny_patch16_224", {"num_classes": -3}, "option 'num_classes': got -3"),
    ("sima_deit_tiny_patch16_224", {"drop_path_rate": 1.5}, "option 'drop_path_rate': got 1.5; allowed: a number in [0, 1)"),
    ("sima_deit_tiny_patch16_224", {"depth": -1}, "option 'depth': got -1"),
    ("sima_deit_tiny_patch16_224", {"img_size": 30, "patch_size": 16}, "patch_size=16 does not divide img_size=30"),
    ("sima_nano_12_p16", {"mlp_ratio": -1}, "option 'mlp_ratio'"),
    ("sima_cvt_13", {"num_classes": True}, "option 'num_classes': got True"),
    ("soft_tiny", {"drop_rate": 2}, "option 'drop_rate'"),
    ("ufo_vit_tiny", {"patch_size": 0}, "option 'patch_size'"),
])
def test_timm_create_model_refuses_kwargs_outside_their_declared_range(name, kwargs, says):
    import timm
    with pytest.raises(ValueError) as caught:
        timm.create_model(name, **kwargs)
    assert str(caught.value).startswith(f"{name}: ") and says in str(caught.value)


@pytest.mark.parametrize("kind, kwargs, says", [
    ("sima", {"eps": float("nan")}, "eps=nan; allowed: a finite number > 0"),
    ("sima", {"eps": -1}, "eps=-1"),
    ("sima", {"num_heads": True}, "num_heads=True; allowed: an integer >= 1"),
    ("elu", {"eps": 0}, "eps=0"),
    ("xca", {"eps": float("inf")}, "eps=inf"),
    ("xnorm", {"eps": -1e-6}, "eps=-1e-06"),
    ("relu", {"alpha": float("nan")}, "alpha=nan; allowed: a finite number"),
])
def test_create_attention_refuses_bad_options(kind, kwargs, says):
    from simattn.attention import create_attention
    with pytest.raises(ValueError, match=re.escape(says)):
        create_attention(kind, **{"dim": 64, "num_heads": 2, **kwargs})


def test_the_functional_op_checks_its_options():
    from simattn.attention.sima import sima_attention
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"sima: eps=0.0; allowed: a finite number > 0"):
        sima_attention(q, q, q, eps=0.0)


def test_viz_refuses_weights_with_nan(digits_run, tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    from simattn.utils.io import read_safetensors_metadata
    tensors = load_file(digits_run / "final.safetensors")
    name = next(k for k in tensors if k.endswith("qkv.weight"))
    tensors[name][0, 0] = float("nan")
    broken = tmp_path / "nan.safetensors"
    save_file(tensors, broken, metadata=read_safetensors_metadata(digits_run / "final.safetensors"))
    err = _one_line_error(capsys, simattn_main(["viz", "--weights", str(broken), "--out", str(tmp_path / "viz")]))
    assert f"tensor {name!r} holds 1 non-finite value" in err and not (tmp_path / "viz").exists()


@pytest.mark.parametrize("name", ["pvt_tiny", "agent_swin_tiny_patch4_window7_224", "soft_tiny", "sima_cvt_13",
                                  "sima_deit_tiny_patch16_224", "sima_small_12_p16"])
@pytest.mark.parametrize("out_indices,says", [((0, 99), "names a feature level the model does not have"),
                                              ((-99,), "names a feature level the model does not have"),
                                              ("1", "allowed: a tuple of feature levels"),
                                              (0, "allowed: a tuple of feature levels")])
def test_feature_levels_it_does_not_have_are_a_value_error_naming_out_indices(name, out_indices, says):
    import timm
    with pytest.raises(ValueError, match=rf"^{name}: out_indices={re.escape(repr(out_indices))}[; ].*{says}"):
        timm.create_model(name, features_only=True, out_indices=out_indices, img_size=64,
                          **({"window_size": 2} if "swin" in name else {}))


@pytest.mark.parametrize("flag", ["initial_checkpoint_partial", "initial_checkpoint_ema"])
@pytest.mark.parametrize("argv", [["train", "-c", "digits_cpu"], ["segment", "-c", "seg_digits_cpu"]])
def test_initial_checkpoint_options_alone_are_refused(argv, flag, tmp_path, capsys):
    from simattn.cli import main as simattn_main
    option = "--" + flag.replace("_", "-")
    assert simattn_main([*argv, option, "--output", str(tmp_path / "run")]) == 2
    assert f"{option} ({flag}) says how to load --initial-checkpoint, which is not given" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
