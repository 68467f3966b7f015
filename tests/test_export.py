"""simattn export: ONNX round trip and onnxruntime parity per model family, the exp-op audit, --require-exp-free,
weights/metadata loading, int8 quantization accuracy and the softmax latency comparison."""
import json
import sys

import numpy as np
import pytest
import timm
import torch

from conftest import needs
from fitted_heads import fit_head

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.deploy import read_metadata
from simattn.deploy.onnx import audit_onnx, export_and_verify, ort_session, run_onnx
from simattn.export.architecture import model_stride
from simattn.export.cli import main as export_main
from simattn.models.weights import export_record
from simattn.utils.io import save_safetensors

pytestmark = needs("onnx", "onnxruntime", "onnxscript")

DEIT = "sima_deit_tiny_patch16_224"
TINY_DEIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
ATOL = 1e-4
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}  # DeiT's preprocessing


def _meta(name, size, attention="sima"):
    return export_record(name, {}, {"input_size": (3, size, size), **IMAGENET}, attention=attention)

# family → (a registered model of it, kwargs that make it tiny); input size is the model's img_size
FAMILY_CASES = {
    "sima_vit": ("relu_vit_small_patch32_224",
                 dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10)),
    "sima_xcit": ("sima_nano_12_p8",
                  dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1, num_classes=10)),
    "ufo_vit": ("ufo_vit_tiny",
                dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1, num_classes=10)),
    # 64 px: at 32 px the last stage's strided keys are a 1x1 grid, which torch.export specializes
    "sima_cvt": ("sima_cvt_13",
                 dict(img_size=64, embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2), num_classes=10)),
    # 2 Newton-Raphson iterations instead of 20 keep the unrolled graph small
    "soft_vit": ("soft_tiny", dict(img_size=64, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                                   num_heads=(1, 2, 2, 4), stem_chans=8, num_classes=10,
                                   attn_kwargs={"num_iters": 2})),
}


def _kwargs_args(kwargs):
    return ["--model-kwargs", *(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in kwargs.items())]


@pytest.fixture(scope="module")
def sima_relu(tmp_path_factory):
    """Tiny SimA DeiT with ReLU MLP exported by the default (dynamo) path with dynamic batch and size."""
    torch.manual_seed(0)
    model = timm.create_model(DEIT, act_layer="relu", **TINY_DEIT).eval()
    path = tmp_path_factory.mktemp("sima") / "sima_relu.onnx"
    result, parity = export_and_verify(model, path, _meta(DEIT, 32), stride=model_stride(model), atol=ATOL)
    return model, result, parity


def test_sima_export_parity_with_dynamic_batch_and_resolution(sima_relu):
    model, result, parity = sima_relu
    assert result.exporter == "dynamo" and result.opset >= 18
    assert result.dynamic_batch and result.dynamic_spatial, result.input_shape
    # batch 2 and 3 at 32 px, and a second resolution (32 + patch 8)
    assert set(parity) == {"random_b2_32x32", "random_b3_32x32", "random_b1_40x40"}, parity
    assert all(r["ok"] and r["max_abs_diff"] <= ATOL for r in parity.values()), parity
    # and at a batch/size the verification did not use
    x = torch.randn(5, 3, 48, 48)
    with torch.no_grad():
        ref = model(x).numpy()
    out = run_onnx(ort_session(result.path), x)
    assert out.shape == (5, 10)
    assert np.abs(out - ref).max() <= ATOL


def test_real_inputs_are_checked_too(sima_relu, tmp_path):
    from simattn.deploy.onnx import check_parity
    from simattn.export.checks import real_inputs
    model, result, _ = sima_relu
    real = real_inputs({"input_size": (3, 32, 32), "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)})
    assert real["digits_val_8"].shape == (8, 3, 32, 32) and real["photo_china"].shape == (1, 3, 32, 32)
    parity = check_parity(model, ort_session(result.path), real, ATOL)
    assert all(r["ok"] for r in parity.values()), parity


def test_relu_sima_graph_is_exp_free(sima_relu):
    audit = audit_onnx(sima_relu[1].path)
    assert audit.exp_count == 0 and audit.exp_like == {}
    assert audit.op_counts.get("MatMul", 0) >= 4 and audit.total_ops > 20  # the audit did see the graph
    audit.require_exp_free()  # no raise


def test_exported_file_carries_its_metadata(sima_relu):
    import onnx

    from simattn.models.weights import WEIGHTS_FORMAT, parse_weights_metadata
    # the weights' record, key for key, in metadata_props
    props = {p.key: p.value for p in onnx.load(sima_relu[1].path).metadata_props}
    assert props["format"] == WEIGHTS_FORMAT and parse_weights_metadata(props).model == DEIT
    record = read_metadata(sima_relu[1].path)
    assert record.model == DEIT and record.extra["attention"] == "sima" and record.input_size == (3, 32, 32)
    assert record.data_config["mean"] == [0.485, 0.456, 0.406] and record.data_config["std"] == [0.229, 0.224, 0.225]
    assert record.simattn_version == simattn.__version__ and record.model_kwargs == {}


def test_missing_or_wrong_metadata_is_refused_and_the_file_decides_the_input(sima_relu, tmp_path):
    import onnx
    from simattn.deploy.onnx import export_onnx
    from simattn.export.latency import file_latency

    def variant(name, **changes):
        """A copy of the exported file with preprocessing values of its record replaced (None: the key removed)."""
        proto = onnx.load(sima_relu[1].path)
        props = {p.key: p.value for p in proto.metadata_props}
        config = json.loads(props["data_config"])
        for key, value in changes.items():
            config.pop(key) if value is None else config.__setitem__(key, value)
        props["data_config"] = json.dumps(config)
        del proto.metadata_props[:]
        for key, value in props.items():
            proto.metadata_props.add(key=key, value=value)
        path = tmp_path / f"{name}.onnx"
        onnx.save(proto, str(path))
        return path

    with pytest.raises(ValueError, match=r"lacks simattn metadata \(mean, std\)"):
        read_metadata(variant("no_norm", mean=None, std=None))
    with pytest.raises(ValueError, match="lacks simattn metadata"):
        file_latency(variant("no_size", input_size=None), repeats=1, min_time=0)
    with pytest.raises(ValueError, match=r"input_size \[3, 40\] is not \[channels, height, width\]"):
        read_metadata(variant("short", input_size=[3, 40]))
    with pytest.raises(ValueError, match="mean \\[0.5\\] is not 3 finite numbers"):
        read_metadata(variant("mean", mean=[0.5]))
    with pytest.raises(ValueError, match="std .* <= 0"):
        read_metadata(variant("std", std=[0.2, 0.0, 0.2]))
    # the latency check feeds the size the file records, not one the caller passes
    resized = variant("resized", input_size=[3, 48, 48])
    assert file_latency(resized, warmup=0, repeats=1, min_time=0)["input_shape"] == [1, 3, 48, 48]
    with pytest.raises(ValueError, match=r"lacks simattn metadata \(mean, std\)"):
        export_onnx(sima_relu[0], tmp_path / "x.onnx", export_record(DEIT, {}, {"input_size": [3, 32, 32]}))


@pytest.mark.parametrize("attn_type, act_layer, expect_rc", [("sima", "relu", 0), ("softmax", "gelu", 1)])
def test_cli_require_exp_free(tmp_path, capsys, attn_type, act_layer, expect_rc):
    out = tmp_path / f"{attn_type}.onnx"
    kwargs = dict(TINY_DEIT, attn_type=attn_type, act_layer=act_layer)
    # TorchScript exporter: the audit is what is under test here, and it is ~10x faster than dynamo
    rc = export_main(["--model", DEIT, *_kwargs_args(kwargs), "--exporter", "torchscript", "--static-spatial",
                      "--require-exp-free", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == expect_rc, captured.err
    report = json.loads(out.with_name(out.name + ".json").read_text())
    audit = report["audit"]
    if expect_rc == 0:
        assert audit["exp_like_count"] == 0 and out.is_file()
        assert report["max_abs_diff"] <= ATOL
    else:
        assert audit["exp_like"]["Softmax"] == 2  # one per block
        assert audit["exp_like"].get("Erf", 0) + audit["exp_like"].get("Gelu", 0) >= 2  # GELU MLPs
        assert "not exp-free" in captured.err and "Softmax" in captured.err
        assert not out.exists()  # the failed export leaves no model behind


def test_audit_counts_inside_functions_and_subgraphs():
    from onnx import TensorProto, helper
    # main graph: Relu, a call to local function f (Exp + Add) twice, and an If whose branches hold Sigmoid / Tanh
    f = helper.make_function("local", "f", ["x"], ["y"],
                             [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])],
                             opset_imports=[helper.make_opsetid("", 18)])
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["a"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Tanh", ["a"], ["t2"])], "else", [],
                               [helper.make_tensor_value_info("t2", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("f", ["a"], ["b"], domain="local"),
             helper.make_node("f", ["b"], ["c"], domain="local"),
             helper.make_node("If", ["cond"], ["d"], then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[f], opset_imports=[helper.make_opsetid("", 18),
                                                                    helper.make_opsetid("local", 1)])
    audit = audit_onnx(model)
    assert audit.op_counts == {"Add": 2, "Exp": 2, "If": 1, "Relu": 1, "Sigmoid": 1, "Tanh": 1}
    assert audit.exp_like == {"Exp": 2, "Sigmoid": 1, "Tanh": 1}
    assert audit.functions == {"f": 2}
    with pytest.raises(RuntimeError, match="Exp×2"):
        audit.require_exp_free("toy")


# Every family round-trips through the TorchScript exporter; the dynamo exporter (the CLI's default) costs 10-50 s of
# CPU per family here, so it runs on the two SimA families that hold the official models (and on the dynamic-shape
# parity test above), which keeps the suite within its time budget.
DYNAMO_FAMILIES = ("sima_vit", "sima_xcit")
FAMILY_PARAMS = [pytest.param(f, "torchscript", id=f"{f}-torchscript") for f in sorted(FAMILY_CASES)] + [
    pytest.param(f, "dynamo", id=f"{f}-dynamo", marks=pytest.mark.slow) for f in DYNAMO_FAMILIES]


@pytest.mark.parametrize("family, exporter", FAMILY_PARAMS)
def test_family_round_trip(family, exporter, tmp_path):
    name, kwargs = FAMILY_CASES[family]
    assert name in simattn.list_models(), f"{name} ({family}) is not registered"
    torch.manual_seed(0)
    model = timm.create_model(name, **kwargs).eval()
    size = kwargs["img_size"]
    result, parity = export_and_verify(model, tmp_path / f"{name}.onnx", _meta(name, size), exporter=exporter,
                                       stride=model_stride(model), atol=ATOL)
    assert result.exporter == exporter and result.dynamic_batch
    assert all(r["ok"] and r["max_abs_diff"] <= ATOL for r in parity.values()), (result.notes, parity)
    assert f"random_b3_{size}x{size}" in parity  # a second batch size was checked
    assert audit_onnx(result.path).op_counts.get("MatMul", 0) > 0


#: the exp-like ops of each newer kind's one-block DeiT in a TorchScript-exported graph, GELU's Erf aside: only the
#: per-channel learned scales of FLatten (softplus) and PolaFormer (softplus, and the sigmoid of its power), whose
#: count does not grow with the tokens; sigmoid attention's sigmoid and Agent's two softmaxes grow with them
NEWER_KIND_EXP_OPS = {"flatten": {"Softplus": 1}, "inline": {}, "slab": {}, "polaformer": {"Softplus": 1, "Sigmoid": 1},
                      "sigmoid": {"Sigmoid": 1}, "agent": {"Softmax": 2}}


@pytest.mark.parametrize("kind", sorted(NEWER_KIND_EXP_OPS))
def test_newer_kinds_export_with_their_exp_audit(kind, tmp_path):
    """Each newer kind's DeiT exports to ONNX with a dynamic batch, equal to PyTorch in onnxruntime, and the audit
    counts its exp-like ops. Agent's adaptive pooling of a dynamic grid takes the dynamo exporter (TorchScript's
    cannot read the grid's size); the others the TorchScript one (seconds)."""
    name = f"{kind}_deit_tiny_patch16_224"
    torch.manual_seed(0)
    model = timm.create_model(name, **dict(TINY_DEIT, depth=1)).eval()
    exporter = "dynamo" if kind == "agent" else "torchscript"
    result, parity = export_and_verify(model, tmp_path / f"{kind}.onnx", _meta(name, 32, kind), exporter=exporter,
                                       stride=model_stride(model), atol=ATOL)
    assert result.exporter == exporter and result.dynamic_batch and f"random_b3_32x32" in parity
    assert all(r["ok"] and r["max_abs_diff"] <= ATOL for r in parity.values()), (result.notes, parity)
    exp_like = {op: n for op, n in audit_onnx(result.path).exp_like.items() if op not in ("Erf", "Gelu")}
    assert exp_like == NEWER_KIND_EXP_OPS[kind]


def _fit_head_on_digits(model):
    """The classifier fitted on the model's (random) features of the digits train split (:func:`fit_head`): weights
    that classify digits (~60% val top-1). (Random features are far less robust to int8 than trained ones: a
    300-step training run loses nothing, this model loses a few points.)"""
    from simattn.data.digits import digits_tensors
    return fit_head(model, *digits_tensors("train", img_size=32))


def test_cli_weights_metadata_quantize_and_compare_softmax(tmp_path, capsys):
    kwargs = dict(TINY_DEIT, act_layer="relu")
    torch.manual_seed(0)
    model = _fit_head_on_digits(timm.create_model(DEIT, **kwargs).eval())
    weights = tmp_path / "digits.safetensors"
    save_safetensors(model, weights, metadata={"model": DEIT, "config": kwargs})
    out = tmp_path / "out" / "m.onnx"
    rc = export_main(["--weights", str(weights), "--exporter", "torchscript", "--quantize", "--compare-softmax",
                      "--bench-time", "0.05", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads((out.parent / "m.onnx.json").read_text())
    assert report["model"] == DEIT and report["weights"] == str(weights)  # name came from the metadata
    assert report["model_kwargs"]["act_layer"] == "relu"
    # the torchscript tracer cannot keep a ViT's height/width dynamic: the verification notices and re-exports
    assert report["export"]["exporter"] == "torchscript" and not report["export"]["dynamic_spatial"]
    assert any("re-exported with a fixed resolution" in n for n in report["export"]["notes"])
    q = report["quantization"]
    from simattn.data.digits import digits_tensors
    xv, yv = digits_tensors("val", img_size=32)
    with torch.no_grad():
        torch_top1 = (model(xv).argmax(-1) == yv).float().mean().item() * 100
    assert q["images"] == len(yv) == 359
    assert q["fp32_top1"] == pytest.approx(torch_top1, abs=0.01) and q["fp32_top1"] > 50  # chance is 10%
    # the int8 file run here on digits normalized by hand with DeiT's mean/std gives the reported accuracy
    mean, std = (torch.tensor(IMAGENET[k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    xr, _ = digits_tensors("val", img_size=32, normalize=False)
    session, xn = ort_session(out), (xr - mean) / std  # with --quantize, -o is the int8 file
    # dynamic quantization scales activations per run: batches of 64, as the report runs them
    int8 = np.concatenate([run_onnx(session, xn[i:i + 64]).argmax(-1) for i in range(0, len(xn), 64)])
    assert q["int8_top1"] == pytest.approx((torch.from_numpy(int8) == yv).float().mean().item() * 100, abs=0.01)
    assert q["int8_top1"] > 30 and q["prediction_agreement"] > 50 and q["int8_mb"] < q["fp32_mb"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx", "m.onnx.json", "m.onnx.softmax.onnx"]
    lat = report["latency"]
    assert lat["input_shape"] == [1, 3, 32, 32]
    assert 0 < lat["model"]["p10_ms"] <= lat["model"]["median_ms"] <= lat["model"]["p90_ms"]
    assert "sima speed-up over softmax: ×" in captured.out
    # every file written carries the metadata: the int8 model and its softmax twin
    assert q["mode"] == "dynamic" and q["int8_path"] == str(out)
    for name, attention in (("m.onnx", "sima"), ("m.onnx.softmax.onnx", "softmax")):
        record = read_metadata(out.parent / name)
        assert record.model == DEIT and record.extra["attention"] == attention and record.input_size == (3, 32, 32)
    assert report["metadata"]["model_kwargs"]["act_layer"] == "relu"
    assert audit_onnx(out.parent / "m.onnx.softmax.onnx").exp_like.get("Softmax") == 2


def test_cli_errors(tmp_path, capsys):
    assert simattn_main(["export", "--model", "no_such_model"]) == 2
    assert "unknown model 'no_such_model'" in capsys.readouterr().err
    corrupt = tmp_path / "bad.pth"
    corrupt.write_bytes(b"not a checkpoint")
    assert simattn_main(["export", "--model", DEIT, "--weights", str(corrupt)]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err
    other = tmp_path / "other.safetensors"
    save_safetensors(timm.create_model(DEIT, **TINY_DEIT), other, metadata={"model": DEIT, "config": TINY_DEIT})
    assert simattn_main(["export", "--model", "sima_deit_small_patch16_224", "--weights", str(other)]) == 2
    assert "were saved for model" in capsys.readouterr().err
    assert simattn_main(["export", "--model", DEIT, "--model-kwargs", "depth"]) == 2
    assert "not KEY=VALUE" in capsys.readouterr().err
    assert simattn_main(["export", "--model", DEIT, *_kwargs_args(TINY_DEIT), "--opset", "17"]) == 2
    assert "option '--opset': got 17; allowed: an integer >= 18" in capsys.readouterr().err


def test_compare_latency_keeps_each_files_best_median(monkeypatch):
    from simattn.export import latency
    medians = iter([5.0, 10.0, 4.0, 12.0])  # model, baseline, model, baseline
    monkeypatch.setattr(latency, "file_latency",
                        lambda path, **kw: {"median_ms": next(medians), "input_shape": [1, 3, 32, 32]})
    lat = latency.compare_latency("a.onnx", "b.onnx")
    assert (lat["model"]["median_ms"], lat["baseline"]["median_ms"], lat["baseline_over_model"]) == (4.0, 10.0, 2.5)
    shapes = iter([[1, 3, 32, 32], [1, 3, 64, 64]] * 2)
    monkeypatch.setattr(latency, "file_latency", lambda path, **kw: {"median_ms": 1.0, "input_shape": next(shapes)})
    with pytest.raises(ValueError, match="record different input sizes"):
        latency.compare_latency("a.onnx", "b.onnx")


@pytest.mark.parametrize("tokens", ["N", 7])
def test_linear_layers_become_one_gemm_each(tmp_path, tokens):
    """MatMul(x, W) + b with constant W and b becomes one Gemm (x flattened to 2-D, the output reshaped back to x's
    leading dims: constants where only the batch is unknown, read from x where more is), whichever side of the Add
    the bias is on, at any batch and length; a product of two activations, a MatMul whose output has another reader
    and a bias that is not one value per output stay as written; the outputs do not change."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from simattn.deploy.onnx_passes import GraphIndex, linears_as_gemm

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("W", (6, 5)), ("b", (5,)), ("W2", (5, 4)), ("b2", (4,)), ("b_row", (1, 5)))]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="lin1"), helper.make_node("Add", ["h", "b"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W2"], ["h2"], name="lin2"), helper.make_node("Add", ["b2", "h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "t"], ["act"], name="activations"),
        helper.make_node("MatMul", ["x", "W"], ["m"], name="shared"), helper.make_node("Add", ["m", "b"], ["m1"]),
        helper.make_node("Mul", ["m", "m1"], ["m2"]),
        helper.make_node("MatMul", ["x", "W"], ["r"], name="row_bias"), helper.make_node("Add", ["r", "b_row"], ["r1"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", tokens, 6]),
                     helper.make_tensor_value_info("t", TensorProto.FLOAT, ["B", 4, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", tokens, c]) for n, c in (("act", 3), ("m2", 5),
                                                                                         ("r1", 5))], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(proto)
    before, after = str(tmp_path / "before.onnx"), str(tmp_path / "after.onnx")
    onnx.save(proto, before)
    assert linears_as_gemm(GraphIndex(proto)) == 2
    onnx.save(proto, after)
    onnx.checker.check_model(proto)
    gemm_inputs = sorted(n.input[1] for n in proto.graph.node if n.op_type == "Gemm")
    matmuls = sorted(n.name for n in proto.graph.node if n.op_type == "MatMul")
    assert gemm_inputs == ["W", "W2"] and matmuls == ["activations", "row_bias", "shared"]
    assert sum(n.op_type == "Shape" for n in proto.graph.node) == (2 if tokens == "N" else 0)
    for batch, n in ((1, 7), (3, 7 if tokens == 7 else 2)):
        feed = {"x": rng.standard_normal((batch, n, 6)).astype(np.float32),
                "t": rng.standard_normal((batch, 4, 3)).astype(np.float32)}
        expected = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, feed)
        got = ort.InferenceSession(after, providers=["CPUExecutionProvider"]).run(None, feed)
        for e, g in zip(expected, got):
            assert e.shape == g.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def _fused_projection_graph(unbind: str, shape: str, extra_reader: bool = False, perm=(2, 0, 3, 1, 4)):
    """x (B, N, 6) → Gemm to 3·4 columns → (B, N, 3, 2, 2) → permute → q, k, v as the exporters unbind them
    (``unbind``: Slice + Squeeze, or Gather), the shapes constants or read from x (``shape``); out = q·k + v."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    const = lambda value, name: numpy_helper.from_array(np.array(value, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal((6, 12)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b"), const([0], "zero")]
    nodes = [helper.make_node("Flatten", ["x"], ["x2"], axis=-1), helper.make_node("Gemm", ["x2", "W", "b"], ["g"])]
    if shape == "constant":
        inits += [const([-1, 5, 12], "shape3"), const([-1, 5, 3, 2, 2], "shape5")]
    else:
        inits += [const([12], "width"), const([3, 2, 2], "heads")]
        nodes += [helper.make_node("Shape", ["x"], ["lead"], end=2),
                  helper.make_node("Concat", ["lead", "width"], ["shape3"], axis=0),
                  helper.make_node("Concat", ["lead", "heads"], ["shape5"], axis=0)]
    nodes += [helper.make_node("Reshape", ["g", "shape3"], ["g3"]),
              helper.make_node("Reshape", ["g3", "shape5"], ["g5"]),
              helper.make_node("Transpose", ["g5"], ["p"], perm=list(perm))]
    for i, name in enumerate("qkv"):
        if unbind == "gather":
            inits.append(const(i, f"i{i}"))
            nodes.append(helper.make_node("Gather", ["p", f"i{i}"], [name], axis=0))
        else:
            inits += [const([i], f"s{i}"), const([i + 1], f"e{i}")]
            nodes += [helper.make_node("Slice", ["p", f"s{i}", f"e{i}", "zero"], [f"{name}1"]),
                      helper.make_node("Squeeze", [f"{name}1", "zero"], [name])]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["out"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "H", "N", "d"])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["p"], ["p_neg"]))
        outputs.append(helper.make_tensor_value_info("p_neg", TensorProto.FLOAT, [3, "B", "H", "N", "d"]))
    tokens = 5 if shape == "constant" else "N"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", tokens, 6])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("unbind, shape", [("slice", "constant"), ("gather", "constant"), ("slice", "read")])
def test_fused_projection_becomes_three_gemms(tmp_path, unbind, shape):
    """A fused q/k/v projection that is reshaped to (B, N, 3, H, d), permuted and unbound becomes three Gemms on W's
    and b's column thirds, each reshaped and transposed to (B, H, N, d): no Slice, Squeeze or Gather of the
    permuted tensor is left, the fused W and b leave the file, the shape is constant or read at run time as the
    export had it, and the outputs do not change at any batch (and length, where it is dynamic)."""
    import onnx
    import onnxruntime as ort

    from simattn.deploy.onnx_passes import GraphIndex, fused_projection_as_three_gemms

    proto = _fused_projection_graph(unbind, shape)
    onnx.checker.check_model(proto)
    before, after = str(tmp_path / "before.onnx"), str(tmp_path / "after.onnx")
    onnx.save(proto, before)
    assert fused_projection_as_three_gemms(GraphIndex(proto)) == 1
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, after)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Gemm") == 3 and ops.count("Transpose") == 3 and not {"Slice", "Squeeze"} & set(ops)
    # (B, N, H, d) from x's leading dims where the export read them at run time; the 5-D shape's nodes are gone
    assert ops.count("Shape") == (1 if shape == "read" else 0)
    assert ops.count("Concat") == (1 if shape == "read" else 0)
    assert not {"W", "b", "heads"} & {i.name for i in proto.graph.initializer}
    rng = np.random.default_rng(2)
    for batch, n in ((1, 5), (3, 5 if shape == "constant" else 7)):
        feed = {"x": rng.standard_normal((batch, n, 6)).astype(np.float32)}
        expected = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        got = ort.InferenceSession(after, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        assert got.shape == expected.shape == (batch, 2, n, 2)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["other_reader", "other_perm"])
def test_fused_projection_stays_when_not_only_unbound_heads(case):
    """The permuted projection read by anything besides the three pieces, or permuted another way, stays one Gemm."""
    from simattn.deploy.onnx_passes import GraphIndex, fused_projection_as_three_gemms

    proto = _fused_projection_graph("slice", "constant", extra_reader=case == "other_reader",
                                    perm=(2, 0, 3, 1, 4) if case == "other_reader" else (2, 0, 1, 3, 4))
    nodes = [n.op_type for n in proto.graph.node]
    assert fused_projection_as_three_gemms(GraphIndex(proto)) == 0
    assert [n.op_type for n in proto.graph.node] == nodes and {i.name for i in proto.graph.initializer} >= {"W", "b"}


@pytest.fixture(scope="module")
def gelu_deit(tmp_path_factory):
    """A GELU SimA DeiT written by the dynamo exporter: (model, file, the modules that ran an onnx shape inference
    during the export, the rewrites' counts)."""
    import onnx

    from simattn.deploy import onnx_passes
    from simattn.deploy.onnx import export_onnx

    calls, counts = [], {}
    real_infer, real_run = onnx.shape_inference.infer_shapes, onnx_passes.run_passes

    def infer(*args, **kwargs):
        calls.append(sys._getframe(1).f_globals.get("__name__", ""))
        return real_infer(*args, **kwargs)

    def run(proto, *args, **kwargs):
        counts.update(real_run(proto, *args, **kwargs))
        return counts

    torch.manual_seed(0)
    model = timm.create_model(DEIT, **TINY_DEIT).eval()  # GELU MLPs
    path = tmp_path_factory.mktemp("gelu") / "gelu.onnx"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx.shape_inference, "infer_shapes", infer)
        patch.setattr("simattn.deploy.onnx.run_passes", run)
        export_onnx(model, path, _meta(DEIT, 32), exporter="dynamo")
    return model, path, calls, counts


def test_exact_gelu_is_written_in_the_order_onnxruntime_fuses(gelu_deit, tmp_path):
    """The exporter writes exact GELU as x·(0.5·(1+erf(x/√2))), which onnxruntime leaves as five elementwise ops;
    reordered to (x·(1+erf(x/√2)))·0.5 its optimizer runs one (Bias)Gelu kernel per MLP: no Erf is left in the
    optimized graph, and the outputs stay the model's."""
    import onnx
    import onnxruntime as ort

    model, path, _, _ = gelu_deit
    written = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert written.count("Erf") == TINY_DEIT["depth"]  # standard ops in the file
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    optimized = [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]
    assert "Erf" not in optimized and sum(op in ("Gelu", "BiasGelu") for op in optimized) == TINY_DEIT["depth"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], ref, atol=ATOL)


def test_one_shape_inference_per_export_and_every_pass_rewrites(gelu_deit):
    """The rewrites run on one index with one onnx shape inference per export (ours; the exporter's own are not
    counted), and each finds its pattern in a GELU DeiT's dynamo export: every linear layer a Gemm, each q/k/v
    projection three."""
    import onnx

    _, path, calls, counts = gelu_deit
    assert [c for c in calls if c.startswith("simattn")] == ["simattn.deploy.onnx_passes"]
    depth = TINY_DEIT["depth"]
    assert counts == {"order_gelu_for_onnxruntime": depth, "linears_as_gemm": 4 * depth,
                      "fused_projection_as_three_gemms": depth}
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("Gemm") == 6 * depth + 1 and "MatMul" in ops  # the head was a Gemm; attention products stay


def test_help_names_the_listing_that_exists(capsys):
    """--help of the commands that take weights names `simattn list pretrained`, which runs."""
    for command in ("validate", "export", "viz"):
        with pytest.raises(SystemExit):
            simattn_main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "simattn list pretrained" in text and "list --pretrained" not in text, command
    assert simattn_main(["list", "pretrained", "--json"]) == 0


_EXPORT_SCRIPT = """
import sys
from simattn.cli import main
sys.exit(main(["export", "--weights", sys.argv[1], "--exporter", "torchscript", "-o", sys.argv[2]]))
"""


def test_sigterm_during_an_export_leaves_no_temporary_folder(tmp_path):
    """The export stages its files in a hidden folder beside the output: SIGTERM removes it as Ctrl-C does."""
    import subprocess
    import sys

    from killing import sigterm_when
    weights = tmp_path / "w.safetensors"
    save_safetensors(timm.create_model(DEIT, **TINY_DEIT), weights, metadata={"model": DEIT, "config": TINY_DEIT})
    out = tmp_path / "out" / "m.onnx"
    proc = subprocess.Popen([sys.executable, "-c", _EXPORT_SCRIPT, str(weights), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err = sigterm_when(proc, lambda: bool(list((tmp_path / "out").glob(".m.onnx.*"))))  # once it stages its files
    assert proc.returncode == 143 and "stopped (SIGTERM)" in err, err[-500:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
