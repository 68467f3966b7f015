"""What the deploy surface (export, validate on exported files, DeployedModel) and the benchmarks do with inputs and
events they did not plan for: exports of one model to several formats, the SOFT and CvT families in Core ML, broken
or mislabelled exported files, options that contradict each other or would be ignored, Ctrl-C and a full disk
during a Core ML export. Each is a one-line error (exit 2), a warning or a correct result, and nothing is lost."""
from __future__ import annotations

import errno
import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from conftest import needs

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.models.weights import save_weights, weights_metadata

pytestmark = needs("onnxruntime", "executorch", "coremltools")

DEIT = "sima_deit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=2)
TINY_ARGS = ["img_size=16", "patch_size=4", "embed_dim=32", "depth=1", "num_heads=2"]
PREPROCESS = {"input_size": [3, 16, 16], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "crop_pct": 1.0,
              "interpolation": "bilinear"}
#: the smallest SOFT and CvT configurations (as in test_graph_capture)
SMALL = {
    "sima_cvt_13": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), patch_sizes=(7, 3),
                        patch_strides=(4, 2), patch_paddings=(2, 1), num_classes=3),
    "soft_tiny": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), v_conv_kernels=(3,),
                      stem_chans=8, attn_kwargs={"num_iters": 3}, num_classes=3),
}


def _one_line_error(capsys, code: int, expected_code: int = 2) -> str:
    """The command's own stderr line (the ExecuTorch runtime's C++ log can reach pytest's capture in-process)."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    lines = [line for line in err.splitlines() if line.startswith("simattn")]
    assert len(lines) == 1 and "Traceback" not in err and "unexpected error" not in err, err
    return lines[0]


def _images(root: Path, classes, split: str = "val") -> Path:
    for i, cls in enumerate(classes):
        for j in range(2):
            path = root / split / cls / f"{j}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((20, 20, 3), 40 * i + 60 * j + 20, np.uint8)).save(path)
    return root


def _tree(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny 2-class model trained on classes ['a', 'b'], exported to m.onnx, m.pte and m.mlpackage in one
    folder, as the README's deploy sequence does (one real ExecuTorch and one real Core ML export, fp16)."""
    folder = tmp_path_factory.mktemp("deploy")
    torch.manual_seed(0)
    model = timm.create_model(DEIT, **TINY).eval()
    weights = folder / "w.safetensors"
    save_weights(model, weights, weights_metadata(DEIT, TINY, producer="test", data_config=PREPROCESS,
                                                  classes=["a", "b"]))
    for fmt, name, *args in (("onnx", "m.onnx"), ("executorch", "m.pte"),
                             ("coreml", "m.mlpackage", "--precision", "fp16")):
        assert simattn_main(["export", "--weights", str(weights), "--format", fmt, *args,
                             "-o", str(folder / name)]) == 0
    return folder


# ---------------------------------------------------------------- 1. one report per export
def test_each_export_keeps_its_own_report(exported):
    reports = {name: json.loads((exported / f"{name}.json").read_text())
               for name in ("m.onnx", "m.pte", "m.mlpackage")}
    assert {name: r["format"] for name, r in reports.items()} == {
        "m.onnx": "onnx", "m.pte": "executorch", "m.mlpackage": "coreml"}
    assert all(r["output"].endswith(name) for name, r in reports.items())
    # the ExecuTorch parity report survives the Core ML export that came after it
    assert all(r["ok"] for r in reports["m.pte"]["parity"].values())
    assert not (exported / "m.json").exists()
    # the class names of the weights travel in every file's metadata
    assert all(r["metadata"]["classes"] == ["a", "b"] for r in reports.values())


def test_coreml_package_carries_metadata_and_exp_free_gate(exported, tmp_path, capsys):
    from simattn.deploy import read_metadata

    record = read_metadata(exported / "m.mlpackage")
    assert record.model == DEIT and record.input_size == (3, 16, 16) and record.data_config["mean"] == [0.5] * 3
    assert record.extra["precision"] == "fp16"
    assert (exported / "m.mlpackage").is_dir() and not [p for p in exported.iterdir() if p.name.startswith(".")]
    # GELU evaluates erf: --require-exp-free fails (exit 1) before anything is written
    capsys.readouterr()
    gated = tmp_path / "gated.pte"
    assert simattn_main(["export", "--weights", str(exported / "w.safetensors"), "--format", "executorch",
                         "--require-exp-free", "-o", str(gated)]) == 1
    assert "gelu" in capsys.readouterr().err and not gated.exists()


# ---------------------------------------------------------------- 2. every family in Core ML
@pytest.mark.parametrize("name", sorted(SMALL))
def test_soft_and_cvt_convert_to_coreml(name):
    from simattn.deploy.base import capture
    from simattn.deploy.coreml import convert_coreml
    from simattn.models import prepare_for_export
    from simattn.models.weights import export_record

    torch.manual_seed(0)
    model = prepare_for_export(timm.create_model(name, **SMALL[name]).eval(), (32, 32))
    program = capture(model, (3, 32, 32))
    record = export_record(name, {}, {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3})
    mlmodel = convert_coreml(program, record)
    assert mlmodel.user_defined_metadata["simattn.model"] == name
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------- 3. deployed files validate refuses
def _edit_onnx_metadata(src: Path, dst: Path, **values) -> Path:
    """A copy of the ONNX file with preprocessing values of its record replaced."""
    import onnx

    proto = onnx.load(str(src))
    for entry in proto.metadata_props:
        if entry.key == "data_config":
            entry.value = json.dumps({**json.loads(entry.value), **values})
    onnx.save(proto, str(dst))
    return dst


def _make_truncated(exported, tmp_path):
    data = (exported / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[:len(data) // 2])
    return tmp_path / "cut.onnx"


def _make_pte_as_onnx(exported, tmp_path):
    shutil.copy(exported / "m.pte", tmp_path / "program.onnx")
    return tmp_path / "program.onnx"


def _make_sinc(exported, tmp_path):
    return _edit_onnx_metadata(exported / "m.onnx", tmp_path / "sinc.onnx", interpolation="sinc")


def _make_nan_mean(exported, tmp_path):
    return _edit_onnx_metadata(exported / "m.onnx", tmp_path / "nan.onnx", mean=[float("nan")] * 3)


def _make_size_lie(exported, tmp_path):
    """A .pte whose program takes 16 px images while its metadata says 32 px."""
    from simattn.deploy.executorch import lower_executorch
    from simattn.models.weights import export_record

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2)).eval()
    program = torch.export.export(model, (torch.randn(1, 3, 16, 16),))
    record = export_record("linear", {}, {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3},
                           attention="none")
    path = tmp_path / "lie.pte"
    path.write_bytes(lower_executorch(program, record).to_executorch().buffer)
    return path


@pytest.mark.parametrize("make, message", [
    (_make_truncated, "cut.onnx is not a readable ONNX model (truncated, or another format"),
    (_make_pte_as_onnx, "program.onnx is an ExecuTorch program, not an ONNX model"),
    (_make_sinc, "sinc.onnx: metadata interpolation 'sinc' is not one of bicubic, bilinear"),
    (_make_nan_mean, "nan.onnx: metadata mean [nan, nan, nan] is not 3 finite numbers"),
    (_make_size_lie, "lie.pte: its program takes 3x16x16 inputs but its metadata says input_size 3x32x32"),
])
def test_broken_or_lying_exported_files_are_one_line(exported, tmp_path, capsys, make, message):
    path = make(exported, tmp_path)
    data = _images(tmp_path / "data", ["a", "b"])
    code = simattn_main(["validate", "--weights", str(path), "--dataset", "folder", "--data-dir", str(data)])
    assert message in _one_line_error(capsys, code)


@pytest.mark.parametrize("name", ["m.onnx", "m.pte"])
def test_deployed_file_of_other_classes_is_refused_as_weights_are(exported, tmp_path, capsys, name):
    other = _images(tmp_path / "other", ["dog", "zebra"])
    code = simattn_main(["validate", "--weights", str(exported / name), "--dataset", "folder",
                         "--data-dir", str(other)])
    err = _one_line_error(capsys, code)
    assert f"{name}'s weights were trained on other classes" in err and "0: 'a' vs 'dog'" in err
    # the same classes are scored
    same = _images(tmp_path / "same", ["a", "b"])
    assert simattn_main(["validate", "--weights", str(exported / name), "--dataset", "folder",
                         "--data-dir", str(same)]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 4


def test_deployed_model_at_a_size_it_does_not_take(exported):
    from simattn.deploy import DeployedModel

    model = DeployedModel(exported / "m.pte")
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 2)
    with pytest.raises(ValueError, match=r"m\.pte takes batches of 3x16x16 images .*; got 3x32x32$"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="threads -1: expected an integer >= 1"):
        DeployedModel(exported / "m.pte", threads=-1)


# ---------------------------------------------------------------- 4. options taken and ignored
@pytest.mark.parametrize("args, output, message", [
    (["--quantize", "static", "--calib-dir", "{tmp}"], "x.onnx", "--calib-dir {tmp}: the calibration data is digits"),
    (["--quantize", "static", "--calib-data", "digits", "--calib-dir", "{tmp}"], "x.onnx", "which reads no folder"),
    (["--format", "executorch", "--batch", "4"], "x.pte", "--batch 4 applies to --format onnx"),
    (["--format", "coreml", "--atol", "0.01"], "x.mlpackage", "--atol applies to the parity check, which --format"),
    (["--bench-time", "0.5"], "x.onnx", "--bench-time applies to --compare-softmax only"),
])
def test_export_options_that_would_be_ignored_are_refused(exported, tmp_path, capsys, args, output, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = tmp_path / "out" / output
    code = simattn_main(["export", "--weights", str(exported / "w.safetensors"), *args, "-o", str(out)])
    assert message.replace("{tmp}", str(tmp_path)) in _one_line_error(capsys, code)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 5. Ctrl-C and a full disk in a Core ML export
@pytest.fixture
def coreml_target(exported, tmp_path):
    """An existing m.mlpackage (with a file of the user's in it) that a new Core ML export would replace; the
    conversion itself is the module's one, reused (coremltools.convert returns it)."""
    import coremltools as ct

    target = tmp_path / "m.mlpackage"
    shutil.copytree(exported / "m.mlpackage", target)
    (target / "mine.txt").write_text("the user's")
    converted = ct.models.MLModel(str(exported / "m.mlpackage"), skip_model_load=True)
    return target, converted


def test_ctrl_c_during_coreml_conversion_stops_the_export_and_keeps_the_package(exported, coreml_target,
                                                                                monkeypatch, capsys):
    import coremltools as ct

    target, converted = coreml_target
    before = _tree(target.parent)

    def convert_swallowing_ctrl_c(*args, **kwargs):
        try:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while coremltools imports an optional dependency ...
        except:  # noqa: E722 - ... under one of its bare except clauses
            pass
        return converted

    monkeypatch.setattr(ct, "convert", convert_swallowing_ctrl_c)
    code = simattn_main(["export", "--weights", str(exported / "w.safetensors"), "--format", "coreml",
                         "--overwrite", "-o", str(target)])
    assert code == 130, capsys.readouterr().err
    assert "interrupted" in capsys.readouterr().err
    assert _tree(target.parent) == before and (target / "mine.txt").read_text() == "the user's"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_full_disk_while_saving_a_coreml_package_is_one_line_and_keeps_the_package(exported, coreml_target,
                                                                                   monkeypatch, capsys):
    import coremltools as ct

    target, converted = coreml_target
    before = _tree(target.parent)
    monkeypatch.setattr(ct, "convert", lambda *args, **kwargs: converted)
    real_copyfile = shutil.copyfile

    def copyfile(src, dst, *args, **kwargs):
        if str(dst).startswith(str(target.parent)):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", copyfile)  # what coremltools' copytree of the package calls
    code = simattn_main(["export", "--weights", str(exported / "w.safetensors"), "--format", "coreml",
                         "--overwrite", "-o", str(target)])
    assert "No space left on device" in _one_line_error(capsys, code)
    assert _tree(target.parent) == before and (target / "mine.txt").read_text() == "the user's"


# ---------------------------------------------------------------- 6. API
@pytest.mark.parametrize("size", [0, -16, (16, 0), 3])
def test_prepare_for_export_refuses_sizes_in_one_line(size):
    from simattn.models import prepare_for_export

    model = timm.create_model(DEIT, **TINY)
    with pytest.raises(ValueError, match="prepare_for_export img_size") as info:
        prepare_for_export(model, size)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("threads", [-1, 0])
def test_set_executorch_threads_refuses_counts_below_one(threads):
    from simattn.deploy.executorch import set_executorch_threads

    with pytest.raises(ValueError, match=f"ExecuTorch threads {threads}: expected an integer >= 1"):
        set_executorch_threads(threads)


# ---------------------------------------------------------------- 7. bench options checked before any work
MODEL = ["model", "--models", DEIT, "--model-kwargs", *TINY_ARGS, "--img-size", "16", "--attn", "sima",
         "--measure", "latency", "--repeats", "1", "--in-process"]
FIGURE = ["paper", "--quick", "--only", "figure_a1", "--sizes", "32", "--dims", "16", "--deit-depth", "1",
          "--repeats-models", "1", "--warmup-models", "0", "--rounds-models", "1"]
TABLE3 = ["paper", "--quick", "--only", "table3", "--table3-batch", "1", "--repeats", "1", "--rounds", "1"]
ATTENTION = ["attention", "--tokens", "16", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--rounds", "1"]


@pytest.mark.parametrize("argv, message", [
    (MODEL + ["--warmup", "-1"], "option '--warmup': got -1; allowed: an integer >= 0"),
    (MODEL + ["--baseline", "nosuch"], "--baseline 'nosuch' is not one of the runs' labels (sima)"),
    (MODEL + ["--measure", "nosuch"], "option '--measure': got ['nosuch']; 'nosuch' not allowed"),
    (MODEL + ["--compile-backend", "eager"], "--compile-backend applies to --compile"),
    (MODEL + ["--onnx-exporter", "dynamo"], "--onnx-exporter applies to --runtime onnxruntime"),
    (MODEL + ["--timeout", "5"], "--timeout applies to workers, not --in-process"),
    # in workers (not --in-process), each configuration would fail on its own after the sweep
    ([a for a in MODEL if a != "--in-process"] + ["--model-kwargs", "depth=-1"], "option 'depth': got -1"),
    (FIGURE + ["--xcit-model", "nosuch"], "option '--xcit-model': got 'nosuch'; allowed: one of "),
    (TABLE3 + ["--xcit-depth", "2"], "--xcit-depth applies to figure_a1, which --only table3 leaves out"),
    (FIGURE + ["--readings", "total"], "--readings applies to table3, which --only figure_a1 leaves out"),
    (FIGURE + ["--sizes", "40"], "patch_size=16 does not divide img_size=40"),
    (ATTENTION + ["--passes", "fwd"], "--passes applies to --device cuda"),
    (ATTENTION + ["--layout", "rows"], "option '--layout': got 'rows'; allowed: one of qkv, contiguous"),
])
def test_bench_options_are_checked_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / ("out.json" if argv[0] == "attention" else "out")
    code = simattn_main(["bench", *argv, "--out", str(out)])
    assert message in _one_line_error(capsys, code)
    assert not out.exists()


@pytest.mark.parametrize("what, folder", [("model", True), ("paper", True), ("attention", False)])
def test_bench_out_of_the_wrong_kind_is_refused_before_any_work(tmp_path, capsys, what, folder):
    argv = {"model": MODEL, "paper": TABLE3, "attention": ATTENTION}[what]
    out = tmp_path / "taken"
    if folder:
        out.write_text("a file of the user's")
    else:
        out.mkdir()
    code = simattn_main(["bench", *argv, "--out", str(out)])
    assert f"--output {out} is a {'file' if folder else 'folder'}" in _one_line_error(capsys, code)
    assert (out.read_text() == "a file of the user's") if folder else not any(out.iterdir())
