"""The deploy layer: one module per format behind one registry, one exp-op table, one metadata record.

`export --format X`, `bench model --runtime X`, `validate --weights m.X` and `DeployedModel` reach a runtime only
through the registry entry of X (shown with a fake format registered here); each capability lives in one module;
deployed files carry the weights' record; a missing package is one line naming the extra."""
from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the models)
from simattn import deploy
from simattn.cli import main as simattn_main
from simattn.deploy.base import Exported, Format, Program
from simattn.deploy.ops import GraphAudit
from simattn.models.weights import WeightsRecord, read_deployed_record, save_weights, weights_metadata
from simattn.utils.extras import install_line
from simattn.utils.recipe import Opt

SRC = Path(simattn.__file__).resolve().parent
DEIT = "sima_deit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10)
TINY_ARGS = ["patch_size=4", "embed_dim=32", "depth=1", "num_heads=2"]
PREPROCESS = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.25] * 3, "crop_pct": 1.0,
              "interpolation": "bilinear"}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("registry") / "w.safetensors"
    save_weights(timm.create_model(DEIT, **TINY).eval(), path,
                 weights_metadata(DEIT, TINY, producer="test", data_config=PREPROCESS, classes=list("0123456789")))
    return path


@pytest.fixture(scope="module")
def onnx_file(weights, tmp_path_factory):
    """The weights through ``simattn export`` (TorchScript exporter) as an ONNX file."""
    pytest.importorskip("onnxruntime")
    out = tmp_path_factory.mktemp("registry_onnx") / "m.onnx"
    assert simattn_main(["export", "--weights", str(weights), "--exporter", "torchscript", "-o", str(out)]) == 0
    return out


# ---------------------------------------------------------------- each capability in exactly one module
def _definitions(names):
    """name → modules (relative to simattn) that define it at module level (def, class or assignment)."""
    found = {n: [] for n in names}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level: a method of the same name is another thing
            targets = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else \
                [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else []
            for name in targets:
                if name in found:
                    found[name].append(str(path.relative_to(SRC)))
    return found


def test_each_capability_lives_in_one_module():
    from simattn.deploy.executorch import lower_executorch, quantize_pt2e  # noqa: F401  ExecuTorch lowering, int8
    from simattn.deploy.onnx import export_onnx, quantize_static_int8  # noqa: F401  ONNX export, static int8
    from simattn.deploy.ops import EXP_LIKE, FUSED_ATTENTION, exp_like  # noqa: F401  the exp-op table
    from simattn.models.weights import WeightsRecord, export_record  # noqa: F401,F811  the metadata record

    where = _definitions(["EXP_LIKE", "EXP_LIKE_OPS", "EXP_LIKE_ATEN", "SDPA_OPS", "FUSED_ATTENTION", "exp_like",
                          "WeightsRecord", "METADATA_KEYS", "onnx_metadata", "export_record", "export_onnx",
                          "lower_executorch", "quantize_static_int8", "quantize_pt2e", "DeployedModel"])
    assert where == {
        "EXP_LIKE": ["deploy/ops.py"], "EXP_LIKE_OPS": [], "EXP_LIKE_ATEN": [], "SDPA_OPS": [],
        "FUSED_ATTENTION": ["deploy/ops.py"], "exp_like": ["deploy/ops.py"],
        "WeightsRecord": ["models/weights.py"], "METADATA_KEYS": [], "onnx_metadata": [],
        "export_record": ["models/weights.py"], "export_onnx": ["deploy/onnx.py"],
        "lower_executorch": ["deploy/executorch.py"], "quantize_static_int8": ["deploy/onnx.py"],
        "quantize_pt2e": ["deploy/executorch.py"], "DeployedModel": ["deploy/__init__.py"]}


RUNTIME_PACKAGES = ("onnx", "onnxruntime", "onnxscript", "executorch", "torchao", "coremltools", "openvino",
                    "litert_torch", "ai_edge_litert")


def test_runtime_packages_are_imported_in_deploy_only():
    outside = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] == "deploy":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            outside += [f"{path.relative_to(SRC)}: {m}" for m in modules if m.split(".")[0] in RUNTIME_PACKAGES]
    assert outside == []


def test_registry_maps_names_runtimes_and_suffixes():
    assert list(deploy.formats()) == ["onnx", "executorch", "coreml", "openvino", "tflite"]
    assert deploy.get("onnxruntime") is deploy.get("onnx") and deploy.get("litert") is deploy.get("tflite")
    assert deploy.for_path("a/m.PTE").name == "executorch" and deploy.for_path("w.safetensors") is None
    assert "coreml" not in deploy.runtimes() and "coreml" in deploy.runtimes(runs_here=False)
    with pytest.raises(ValueError, match="unknown deployment format 'tensorrt'; known: onnx, executorch"):
        deploy.get("tensorrt")
    with pytest.raises(ValueError, match="already registered"):
        deploy.register(deploy.get("onnx"))


# ---------------------------------------------------------------- one record: weights files and deployed files
def test_deployed_files_carry_the_weights_record(weights, onnx_file):
    import onnx

    from simattn.models.sources import read_weights_record
    from simattn.models.weights import WEIGHTS_FORMAT

    out = onnx_file
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    stored = read_weights_record(weights)
    record = deploy.read_metadata(out)
    assert props["format"] == WEIGHTS_FORMAT and set(stored.to_metadata()) <= set(props)
    assert (record.model, record.create_kwargs(), record.extra["classes"]) == \
        (stored.model, stored.create_kwargs(), stored.extra["classes"])
    assert record.data_config == PREPROCESS and record.extra["attention"] == "sima"
    assert record.producer == "simattn export"


def test_files_written_with_the_earlier_metadata_layout_are_read(onnx_file, tmp_path):
    """ONNX files exported before the record was shared held one JSON value per key; they still validate."""
    import onnx

    proto = onnx.load(str(onnx_file))
    old = {"model": DEIT, "model_kwargs": TINY, "attention": "sima", "input_size": [3, 16, 16], "mean": [0.5] * 3,
           "std": [0.25] * 3, "simattn_version": "0.1.0", "interpolation": "bilinear", "crop_pct": 1.0}
    del proto.metadata_props[:]
    for key, value in old.items():
        proto.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(proto, str(tmp_path / "old.onnx"))
    record = deploy.read_metadata(tmp_path / "old.onnx")
    assert record.format == "export-v0" and record.model == DEIT and record.num_classes == 10
    assert record.data_config == PREPROCESS and record.extra == {"attention": "sima"}
    model = deploy.DeployedModel(tmp_path / "old.onnx", threads=1)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_record_values_are_checked_in_one_line():
    good = {"format": "simattn-weights-v1", "model": DEIT, "config": json.dumps(TINY),
            "data_config": json.dumps(PREPROCESS)}
    assert read_deployed_record(good, "m.x").input_size == (3, 16, 16)
    for change, message in ((dict(data_config=json.dumps({**PREPROCESS, "std": [0.25, 0, 1]})), "has a value <= 0"),
                            (dict(config="{nope"), "m.x: malformed simattn metadata"),
                            (dict(data_config=json.dumps({"input_size": [3, 16, 16]})),
                             r"lacks simattn metadata \(mean, std\)")):
        with pytest.raises(ValueError, match=message) as info:
            read_deployed_record({**good, **change}, "m.x")
        assert "\n" not in str(info.value)


# ---------------------------------------------------------------- one registry entry for export, bench, validate
class FakeFormat(Format):
    """A format of the test's own: the traced model saved with torch.jit, the record as an extra file. It counts
    the calls each command makes to it."""

    name, runtime, suffixes, extra, description = "fake", "fake", (".fake",), "fake", "torch.jit trace"

    def __init__(self):
        self.calls = {"export": 0, "open": 0, "read_metadata": 0}

    def export(self, model, path, record, *, on_ops=None, quantize=None, calibration=None, fixed_size=True, **_):
        self.calls["export"] += 1
        example = torch.randn(1, *record.input_size)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # torch.jit.trace is deprecated; it is the simplest file format here
            traced = torch.jit.trace(model.eval(), example)
            audit = self.ops(traced)
            if on_ops is not None:
                on_ops(audit)
            torch.jit.save(traced, str(path), _extra_files={"simattn": json.dumps(record.to_metadata())})
        return Exported(Path(path), audit)

    def open(self, path, threads=None):
        self.calls["open"] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = torch.jit.load(str(path))
        return Program(lambda x: module(x), list(self.read_metadata(path).input_size), threads)

    def read_metadata(self, path):
        self.calls["read_metadata"] += 1
        files = {"simattn": ""}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.jit.load(str(path), _extra_files=files)
        return read_deployed_record(json.loads(files["simattn"]), str(path))

    def ops(self, source):
        counts = {}
        for node in source.inlined_graph.nodes():
            kind = node.kind()
            if kind.startswith("aten::"):
                counts[kind[6:]] = counts.get(kind[6:], 0) + 1
        return GraphAudit(counts, kind="TorchScript")


@pytest.fixture
def fake():
    fmt = deploy.register(FakeFormat())
    try:
        yield fmt
    finally:
        deploy.unregister("fake")


def test_export_bench_and_validate_go_through_the_same_registry_entry(fake, weights, tmp_path, capsys):
    from simattn.bench.model import cli as bench_model

    out = tmp_path / "m.fake"
    assert simattn_main(["export", "--weights", str(weights), "--format", "fake", "-o", str(out)]) == 0
    report = json.loads((tmp_path / "m.fake.json").read_text())
    assert report["format"] == "fake" and all(r["ok"] for r in report["parity"].values())
    assert report["audit"]["ops"] == "TorchScript" and report["audit"]["exp_like"] == {"gelu": 1}
    assert fake.calls["export"] == 1 and fake.calls["open"] == 1  # exported, then checked in its runtime

    capsys.readouterr()
    assert simattn_main(["validate", "--weights", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runtime"] == "fake" and result["samples"] == 359 and fake.calls["open"] == 2

    argv = ["--models", DEIT, "--img-size", "16", "--model-kwargs", *TINY_ARGS, "--attn", "sima", "--threads", "1",
            "--in-process", "--measure", "latency", "--repeats", "1", "--warmup", "0", "--runtime", "torch", "fake",
            "--out", str(tmp_path / "bench")]
    assert bench_model.main(argv) == 0
    rows = {r["runtime"]: r for r in json.loads((tmp_path / "bench" / "bench_model.json").read_text())["rows"]}
    assert set(rows) == {"eager", "fake"} and rows["fake"]["runtime_max_abs_diff"] < 1e-4
    # bench exported and opened the model and its linear floor through it too
    assert rows["fake"]["floor_ms"] > 0 and fake.calls["export"] == 3 and fake.calls["open"] == 4


def test_a_missing_package_is_one_line_naming_the_extra(tmp_path, weights, capsys):
    class Absent(FakeFormat):
        name, runtime, suffixes, extra, packages = "absent", "absent", (".absent",), "absent-extra", \
            ("simattn_test_no_such_package",)

    deploy.register(Absent())
    try:
        for argv in (["export", "--weights", str(weights), "--format", "absent", "-o", str(tmp_path / "m.absent")],
                     ["bench", "model", "--models", DEIT, "--runtime", "absent", "--out", str(tmp_path / "b")]):
            assert simattn_main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and install_line("absent-extra") in err, err
            assert "simattn_test_no_such_package" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        deploy.unregister("absent")


# ---------------------------------------------------------------- the exp-free gate sees fused attention
def test_executorch_exp_free_gate_catches_fused_softmax_attention(tmp_path, capsys):
    """A softmax model with a ReLU MLP: its only exp is the fused scaled_dot_product_attention the captured graph
    keeps whole; the gate must not pass it."""
    pytest.importorskip("executorch")
    out = tmp_path / "soft.pte"
    code = simattn_main(["export", "--model", DEIT, "--model-kwargs", *TINY_ARGS, "img_size=16", "attn_type=softmax",
                         "act_layer=relu", "--format", "executorch", "--require-exp-free", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "not exp-free" in err and "scaled_dot_product_attention" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- formats beyond the first three
def test_openvino_export_validate_and_audit(weights, tmp_path, capsys):
    pytest.importorskip("openvino")
    out = tmp_path / "m.xml"
    assert simattn_main(["export", "--weights", str(weights), "--format", "openvino", "-o", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "m.xml", "m.xml.json"]
    report = json.loads((tmp_path / "m.xml.json").read_text())
    assert report["audit"]["exp_like"] == {"Gelu": 1} and report["max_abs_diff"] < 1e-4
    capsys.readouterr()
    assert simattn_main(["validate", "--weights", str(out), "--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "openvino"


def test_tflite_export_validate_and_bench(weights, tmp_path, capsys):
    """TFLite through litert_torch (the ``tflite`` extra; it does not install beside this environment's packages
    without changing some of them, so the test runs where it is installed)."""
    pytest.importorskip("litert_torch")
    from simattn.bench.model import cli as bench_model

    out = tmp_path / "m.tflite"
    assert simattn_main(["export", "--weights", str(weights), "--format", "tflite", "-o", str(out)]) == 0
    report = json.loads((tmp_path / "m.tflite.json").read_text())
    assert report["audit"]["ops"] == "TFLite" and report["audit"]["exp_like"] == {"GELU": 1}
    assert report["metadata"]["classes"] == list("0123456789") and report["max_abs_diff"] < 1e-4
    capsys.readouterr()
    assert simattn_main(["validate", "--weights", str(out), "--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "litert"
    argv = ["--models", DEIT, "--img-size", "16", "--model-kwargs", *TINY_ARGS, "--attn", "sima", "--threads", "1",
            "--in-process", "--measure", "latency", "--repeats", "1", "--warmup", "0", "--runtime", "litert",
            "--out", str(tmp_path / "bench")]
    assert bench_model.main(argv) == 0
    rows = json.loads((tmp_path / "bench" / "bench_model.json").read_text())["rows"]
    assert [r["runtime"] for r in rows] == ["litert"] and rows[0]["runtime_max_abs_diff"] < 1e-4


def test_weights_record_round_trips_through_its_mapping():
    record = WeightsRecord(model=DEIT, model_kwargs=dict(TINY), num_classes=10, data_config=dict(PREPROCESS),
                           producer="test", extra={"attention": "sima", "classes": ["a"]})
    again = read_deployed_record(record.to_metadata(), "mapping")
    assert again.to_dict() == {**record.to_dict(), "simattn_version": simattn.__version__}


# ---------------------------------------------------------------- each format declares its own options
class LevelFormat(FakeFormat):
    """A fake format with an export option of its own, which bench takes too; it records what export got."""

    name, runtime, suffixes, extra = "levels", "levels", (".levels",), "levels"
    options = {"level": Opt(3, "how hard to try", low=1)}
    bench_options = ("level",)

    def export(self, model, path, record, *, level=None, **kwargs):
        self.level = level
        return super().export(model, path, record, **kwargs)


def test_format_options_are_declared_by_the_formats_and_gathered_by_the_registry(weights, tmp_path, capsys):
    from simattn.export import cli as export_cli

    groups = export_cli._options()
    assert groups["format options"] == deploy.format_options()
    others = {name for group, specs in groups.items() if group != "format options" for name in specs}
    assert {"opset", "exporter", "batch", "precision"} <= set(deploy.format_options()) and \
        not others & set(deploy.format_options())
    assert deploy.format_options()["precision"].help.startswith("--format coreml: ")
    fmt = deploy.register(LevelFormat())
    try:
        assert deploy.option_takers("level") == ["levels"]
        assert deploy.format_options()["level"].help == "--format levels: how hard to try"
        bench = deploy.bench_options()
        assert bench["levels_level"].default is None and "--runtime levels; default 3" in bench["levels_level"].help
        assert set(bench) == {"onnx_exporter", "levels_level"}
        assert fmt.bench_flags() == {"levels_level": "level"} and deploy.get("onnx").bench_flags() == \
            {"onnx_exporter": "exporter"}
        assert fmt.bench_values({"levels_level": None}) == {"level": 3}
        assert fmt.bench_values({"levels_level": 7, "onnx_exporter": "dynamo"}) == {"level": 7}
        out = tmp_path / "m.levels"
        assert simattn_main(["export", "--weights", str(weights), "--format", "levels", "--level", "5",
                             "-o", str(out)]) == 0
        assert fmt.level == 5 and out.exists()
        for argv, message in ((["--level", "0"], "option '--level': got 0; allowed: an integer >= 1"),
                              (["--format", "onnx", "--level", "5"], "--level applies to --format levels, not onnx"),
                              (["--format", "levels", "--opset", "19"], "--opset applies to --format onnx, not levels"),
                              (["--format", "levels", "--static-spatial"], "--static-spatial applies to --format onnx")):
            capsys.readouterr()
            assert simattn_main(["export", "--weights", str(weights), *argv, "-o", str(tmp_path / "x.levels")]) == 2
            assert message in capsys.readouterr().err
    finally:
        deploy.unregister("levels")
    assert not (tmp_path / "x.levels").exists()


# ---------------------------------------------------------------- one pipeline: export, int8, parity, open
class FileInt8Format(FakeFormat):
    """A fake format that makes int8 from the written file (a copy whose program adds 0.5: an error that parity
    must report for the int8 file and not for the float one); it records the order of the steps."""

    name, runtime, suffixes, extra = "fileint8", "fileint8", (".fi8",), "fileint8"
    quantize_modes, quantizes = ("static",), "file"

    def __init__(self):
        super().__init__()
        self.steps, self.int8 = [], set()

    def export(self, model, path, record, **kwargs):
        self.steps.append(("export", Path(path).relative_to(Path(path).parents[1]).as_posix()))
        return super().export(model, path, record, **kwargs)

    def quantize(self, source, calibration, mode, *, dst=None, **unused):
        self.steps.append(("quantize", mode, len(calibration)))
        Path(dst).write_bytes(Path(source).read_bytes())
        self.int8.add(Path(dst))
        return Path(dst)

    def open(self, path, threads=None):
        program = super().open(path, threads)
        shift = 0.5 if Path(path) in self.int8 else 0.0
        return Program(lambda x: program(x) + shift, program.takes, threads)


def _tiny_model_and_record():
    torch.manual_seed(0)
    model = timm.create_model(DEIT, **TINY).eval()
    return model, WeightsRecord(model=DEIT, model_kwargs=dict(TINY), num_classes=10, data_config=dict(PREPROCESS),
                                producer="test")


def test_pipeline_makes_int8_from_the_checked_file_and_reports_the_int8_file(tmp_path):
    from simattn.deploy.pipeline import deploy_model

    model, record = _tiny_model_and_record()
    fmt, lines = FileInt8Format(), []
    inputs = {"random": torch.randn(2, 3, 16, 16)}
    done = deploy_model(fmt, model, record, tmp_path / "work" / "m.fi8", quantize="static",
                        calibration=torch.randn(4, 3, 16, 16), parity_inputs=inputs, open_program=True,
                        on_checked=lambda d: fmt.steps.append(("checked", d.parity["random"]["ok"])),
                        progress=lines.append)
    assert fmt.steps == [("export", "fp32/m.fi8"), ("checked", True), ("quantize", "static", 4)]
    assert done.float_path == tmp_path / "work" / "fp32" / "m.fi8" and done.path.exists()
    assert done.parity["random"]["max_abs_diff"] < 1e-5
    assert done.int8_parity["random"]["ok"] and 0.49 < done.max_abs_diff < 0.51  # the deployed (int8) file's
    with torch.no_grad():
        assert torch.allclose(done.program(inputs["random"]), model(inputs["random"]) + 0.5, atol=1e-5)
    assert lines[0].startswith("exporting to a temporary fp32 file") and lines[1].startswith("int8 static")


def test_pipeline_parity_beyond_atol_stops_before_int8_unless_only_measured(tmp_path):
    from simattn.deploy import ExportError
    from simattn.deploy.pipeline import deploy_model

    class Off(FileInt8Format):
        def open(self, path, threads=None):
            program = super().open(path, threads)
            return Program(lambda x: program(x) + 1e-2, program.takes, threads)

    model, record = _tiny_model_and_record()
    fmt = Off()
    inputs = {"random": torch.randn(1, 3, 16, 16)}
    with pytest.raises(ExportError, match="fileint8 output differs from PyTorch beyond 0.0001; m.fi8 not written") \
            as info:
        deploy_model(fmt, model, record, tmp_path / "a" / "m.fi8", quantize="static", shown="m.fi8",
                     calibration=torch.randn(2, 3, 16, 16), parity_inputs=inputs)
    assert not info.value.parity["random"]["ok"] and [s[0] for s in fmt.steps] == ["export"]
    done = deploy_model(fmt, model, record, tmp_path / "b" / "m.fi8", atol=None, parity_inputs=inputs)
    assert done.parity["random"]["ok"] and 0.009 < done.max_abs_diff < 0.011 and done.float_path is None
    with pytest.raises(ValueError, match="int8 'dynamic' is not available for fileint8; it has static"):
        deploy_model(fmt, model, record, tmp_path / "c" / "m.fi8", quantize="dynamic")

    class Refuses(FileInt8Format):
        def open(self, path, threads=None):
            def run(x):
                raise RuntimeError("takes no batch of that size")
            return Program(run, (3, 16, 16), threads)

    with pytest.raises(ExportError, match="fileint8 could not run m.fi8 on random: RuntimeError: takes no batch"):
        deploy_model(Refuses(), model, record, tmp_path / "d" / "m.fi8", atol=None, parity_inputs=inputs,
                     shown="m.fi8")
