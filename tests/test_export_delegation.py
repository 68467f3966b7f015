"""What runs outside the fast kernels of an exported file: the XNNPACK delegate of the SimA XCiT and CvT .pte (the
DeiT's, fp32 and int8, in test_export_edge.py), and ``simattn export --require-delegated`` refusing files with ops
outside (its passing cases, and onnxruntime's int8 kernels for a static int8 ONNX file, in test_export_edge.py)."""
import json

import pytest
import timm
import torch

from conftest import needs

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main

pytestmark = needs("onnxruntime", "executorch")

DEIT = "sima_deit_tiny_patch16_224"
DEIT_ARGS = ["--model", DEIT, "--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=32", "depth=1", "num_heads=2",
             "num_classes=2"]
#: the smallest SimA XCiT and CvT (a class token in each)
FAMILIES = {
    "xcit": ("sima_nano_12_p8", dict(img_size=16, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1,
                                     num_classes=2)),
    "cvt": ("sima_cvt_13", dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), patch_sizes=(7, 3),
                                patch_strides=(4, 2), patch_paddings=(2, 1), num_classes=2)),
}


def _lower(family):
    """(delegation summary, max |ExecuTorch - PyTorch| relative to the logits' scale) of the family's tiny model."""
    from executorch.runtime import Runtime

    from simattn.deploy.base import capture_fixed
    from simattn.deploy.executorch import delegation_summary, lower_executorch
    from simattn.models.weights import export_record

    name, kwargs = FAMILIES[family]
    size = (3, kwargs["img_size"], kwargs["img_size"])
    torch.manual_seed(0)
    model, program = capture_fixed(timm.create_model(name, **kwargs).eval(), size)
    record = export_record(name, kwargs, {"input_size": size, "mean": (0.5,) * 3, "std": (0.25,) * 3},
                           attention="sima")
    edge = lower_executorch(program, record)
    summary = delegation_summary(edge)  # before to_executorch, which plans memory in the same graph
    x = torch.randn(1, *size, generator=torch.Generator().manual_seed(1))
    buffer = edge.to_executorch().buffer
    program = Runtime.get().load_program(buffer)  # held: a method runs on its program's memory
    out = program.load_method("forward").execute([x])[0]
    with torch.no_grad():
        ref = model(x)
    return summary, float((out - ref).abs().max()) / max(1.0, float(ref.abs().max()))


# (the DeiT .pte, fp32 and int8, is checked where test_export_edge.py exports it through the CLI)
@pytest.mark.parametrize("family", ["xcit", "cvt"])
@pytest.mark.slow
def test_pte_runs_every_op_in_one_xnnpack_call(family):
    summary, diff = _lower(family)
    # LayerNorm, sums, unbind, the class token's select and expand, XCiT's position encoding (folded: it depends on
    # the input size only), CvT's q/k/v slices of qkv: all inside XNNPACK
    assert summary["not_delegated"] == {} and summary["subgraphs"] == 1, summary
    assert summary["beyond_allowance"] == {} and summary["line"].startswith("not delegated: nothing"), summary
    assert diff < 1e-4


def _export(capsys, tmp_path, *args):
    code = simattn_main(["export", *DEIT_ARGS, *args])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("simattn")]


@pytest.mark.parametrize("fmt, suffix", [("coreml", ".mlpackage"), ("openvino", ".xml"), ("tflite", ".tflite")])
def test_require_delegated_is_refused_where_delegation_is_unknown(fmt, suffix, tmp_path, capsys):
    out = tmp_path / f"m{suffix}"
    code, _, err = _export(capsys, tmp_path, "--format", fmt, "--require-delegated", "-o", str(out))
    assert code == 2 and len(err) == 1, err
    assert "--require-delegated applies to --format onnx or executorch" in err[0] and f"--format {fmt}" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_require_delegated_executorch_fails_with_ops_outside(tmp_path, capsys, monkeypatch):
    from simattn.deploy import executorch

    # (an export where every op is delegated passes: test_export_edge.py's fp32 .pte)
    # without the rewrites, LayerNorm and the token sums run in portable kernels: refused, nothing written
    monkeypatch.setattr(executorch, "XNNPACK_DECOMPOSITIONS", {})
    gated = tmp_path / "gated.pte"
    code, printed, err = _export(capsys, tmp_path, "--format", "executorch", "--require-delegated", "-o", str(gated))
    assert code == 1 and len(err) == 1 and "--require-delegated:" in err[0] and "native_layer_norm" in err[0]
    assert "not written" in err[0] and not gated.exists() and "not delegated: " in printed
    report = json.loads((tmp_path / "gated.pte.json").read_text())
    assert report["delegated_check"] == "failed" and report["delegation"]["beyond_allowance"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gated.pte.json"]


def test_onnx_int8_conv_left_in_float_is_refused(tmp_path, capsys, monkeypatch):
    from simattn.deploy import onnx as onnx_format

    # (a float file and a static int8 file whose linear ops all fuse pass: test_export_edge.py)
    # a Conv whose output stays float keeps its Q/DQ: onnxruntime runs it in float, and the export is refused
    monkeypatch.setattr(onnx_format, "FLOAT_OUTPUT_OP_TYPES", onnx_format.QDQ_OP_TYPES)
    args = ["--static-spatial", "--quantize", "static", "--calib-images", "8", "--require-delegated"]
    code, printed, err = _export(capsys, tmp_path, *args, "-o", str(tmp_path / "gated.onnx"))
    assert code == 1 and len(err) == 1 and "Conv ×1 outside" in err[0] and "not written" in err[0]
    assert "1 int8 linear op left in float by onnxruntime" in printed and not (tmp_path / "gated.onnx").exists()
