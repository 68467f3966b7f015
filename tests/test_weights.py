"""models.weights: one record in every .safetensors file, read back by load_model; validate on such files."""
import json

import pytest
import torch

import simattn
from simattn.cli import main as simattn_main
from simattn.models.factory import create_model, load_model
from simattn.models.sources import read_weights_record
from simattn.models.weights import WEIGHTS_FORMAT, save_weights, weights_metadata
from simattn.utils.io import CheckpointError, read_safetensors_metadata, save_safetensors

DEIT = "sima_deit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)
DIGITS_CONFIG = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
                 "interpolation": "bilinear"}


def _classifier(tmp_path, name="w.safetensors", **extra):
    torch.manual_seed(0)
    model = create_model(DEIT, num_classes=10, **TINY)
    path = tmp_path / name
    save_weights(model, path, weights_metadata(DEIT, TINY, producer="test", data_config=DIGITS_CONFIG, **extra))
    return model, path


def test_record_round_trip_and_schema(tmp_path):
    model, path = _classifier(tmp_path, top1=12.5, teacher="deit_tiny_patch16_224")
    meta = read_safetensors_metadata(path)
    assert meta["format"] == WEIGHTS_FORMAT and meta["producer"] == "test"
    assert meta["simattn_version"] == simattn.__version__ and json.loads(meta["num_classes"]) == 10
    record = read_weights_record(path)
    assert record.model == DEIT and record.num_classes == 10 and record.data_config == DIGITS_CONFIG
    assert record.extra == {"top1": 12.5, "teacher": "deit_tiny_patch16_224"}
    assert record.create_kwargs() == {**TINY, "num_classes": 10}  # the model's num_classes was written in
    again, spec = load_model(weights=path)
    assert spec["num_classes"] == 10 and spec["producer"] == "test"
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(again(x), model.eval()(x))
    with pytest.raises(ValueError, match="shadow schema keys"):
        weights_metadata(DEIT, TINY, producer="test", format="mine")
    with pytest.raises(ValueError, match="num_classes=3 but the model has 10"):
        save_weights(model, tmp_path / "x.safetensors", weights_metadata(DEIT, TINY, producer="t", num_classes=3))
    with pytest.raises(ValueError, match="must come from weights_metadata"):
        save_weights(model, tmp_path / "x.safetensors", {"model": DEIT})


def test_records_without_format_still_open(tmp_path):
    """What simattn train (model, config, data_config) and simattn ssl (model, kwargs, source) wrote before."""
    model = create_model(DEIT, num_classes=10, **TINY)
    save_safetensors(model, tmp_path / "train.safetensors",
                     metadata={"model": DEIT, "config": {**TINY, "num_classes": 10}, "data_config": DIGITS_CONFIG})
    record = read_weights_record(tmp_path / "train.safetensors")
    assert (record.format, record.num_classes, record.data_config) == ("legacy", 10, DIGITS_CONFIG)
    backbone = create_model(DEIT, num_classes=0, **TINY)
    save_safetensors(backbone, tmp_path / "dino.safetensors",
                     metadata={"model": DEIT, "kwargs": TINY, "source": "DINO teacher"})
    opened, spec = load_model(weights=tmp_path / "dino.safetensors")
    assert spec["num_classes"] == 0 and spec["config"] == {**TINY, "num_classes": 0}
    assert opened(torch.randn(1, 3, 16, 16)).shape == (1, 32)
    save_safetensors(backbone, tmp_path / "other.safetensors", metadata={"model": DEIT, "format": "other-v9"})
    with pytest.raises(CheckpointError, match="metadata format 'other-v9'"):
        read_weights_record(tmp_path / "other.safetensors")


def test_export_opens_a_dino_backbone(tmp_path):
    """simattn export --weights S/backbone.safetensors -o b.onnx: the file alone names the backbone."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from simattn.ssl.dino import build_backbone, save_backbone
    recipe_model = {"name": DEIT, "kwargs": TINY}
    backbone = build_backbone(recipe_model).eval()
    weights = tmp_path / "backbone.safetensors"
    save_backbone(backbone, weights, recipe_model, {"img_size": 16, "crop_pct": 1.0}, source="DINO teacher")
    out = tmp_path / "b.onnx"
    assert simattn_main(["export", "--weights", str(weights), "-o", str(out), "--exporter", "torchscript"]) == 0
    x = torch.randn(1, 3, 16, 16)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (features,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(features), backbone(x), atol=1e-4)


# --- validate -----------------------------------------------------------------------------------------------------

def _validate(capsys, *args):
    code = simattn_main(["validate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_refuses_bad_weights_and_devices_in_one_line(tmp_path, capsys):
    model, _ = _classifier(tmp_path)
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    save_weights(model, tmp_path / "nan.safetensors", weights_metadata(DEIT, TINY, producer="test"))
    code, out, err = _validate(capsys, "--weights", tmp_path / "nan.safetensors")
    assert code == 2 and out == "" and "tensor 'blocks.0.mlp.fc1.weight' holds 1 non-finite value" in err
    backbone = create_model(DEIT, num_classes=0, **TINY)
    save_weights(backbone, tmp_path / "bb.safetensors", weights_metadata(DEIT, TINY, producer="test"))
    code, out, err = _validate(capsys, "--weights", tmp_path / "bb.safetensors")
    assert code == 2 and "without a classifier head (num_classes=0" in err
    if not torch.cuda.is_available():
        code, out, err = _validate(capsys, "--weights", tmp_path / "w.safetensors", "--device", "cuda")
        assert code == 2 and "--device cuda: CUDA is not available" in err and len(err.strip().splitlines()) == 1
    code, out, err = _validate(capsys, "--weights", tmp_path / "w.safetensors", "--device", "tpu9")
    assert code == 2 and "option '--device': got 'tpu9'; allowed: cpu, cuda" in err


def test_validate_prints_before_writing_and_never_writes_nan(tmp_path, capsys):
    model, path = _classifier(tmp_path)
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    code, out, err = _validate(capsys, "--weights", path, "--output", blocked / "metrics.json")
    assert code == 2 and "cannot write the results" in err and "printed above" in err
    printed = json.loads(out)  # the numbers came out before the write failed
    assert printed["samples"] == 359 and printed["model"] == DEIT and 0 < printed["top5"] <= 100
    # finite weights whose logits overflow: the loss is not a number, the JSON says null
    with torch.no_grad():
        model.head.weight.mul_(1e38)
    save_weights(model, tmp_path / "huge.safetensors",
                 weights_metadata(DEIT, TINY, producer="test", data_config=DIGITS_CONFIG))
    code, out, err = _validate(capsys, "--weights", tmp_path / "huge.safetensors", "--output", tmp_path / "m.json")
    assert code == 0 and "warning: non-finite loss" in err
    written = json.loads((tmp_path / "m.json").read_text())  # json.loads accepts NaN; check the text too
    assert "NaN" not in (tmp_path / "m.json").read_text() and "Infinity" not in out
    assert written["loss"] is None and written["non_finite"] == ["loss"] and json.loads(out) == written
