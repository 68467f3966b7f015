"""models.factory: one way to build models, parse --model-kwargs, and start a model from foreign weights."""
import re
from pathlib import Path

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed

import simattn  # noqa: F401
from simattn.models.factory import create_model, load_initial_weights, parse_model_kwargs
from simattn.utils.io import CheckpointError, atomic_torch_save, save_safetensors

DEIT = "sima_deit_tiny_patch16_224"
TINY_VIT = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)
TINY_XCIT = dict(img_size=16, embed_dim=32, depth=2, num_heads=2, cls_attn_layers=1)
SRC = Path(simattn.__file__).parent


def _write(sd, path: Path, wrap: bool):
    if path.suffix == ".safetensors":
        save_safetensors(sd, path)
    else:
        atomic_torch_save({"model": sd} if wrap else sd, path)
    return path


def _pre_logits(model, x):
    with torch.no_grad():
        return model.forward_head(model.forward_features(x), pre_logits=True)


def test_model_kwargs_are_the_option_mini_language():
    assert parse_model_kwargs(["img_size=32", "act_layer=relu", "depths=[1, 2]", "attn_kwargs.order=kv_first",
                               "attn_kwargs.eps=0.5", "drop_rate=0"]) == {
        "img_size": 32, "act_layer": "relu", "depths": [1, 2], "attn_kwargs": {"order": "kv_first", "eps": 0.5},
        "drop_rate": 0}
    assert parse_model_kwargs(None) == parse_model_kwargs([]) == {}
    with pytest.raises(ValueError, match="--model-kwargs item '=3' is not KEY=VALUE"):
        parse_model_kwargs(["=3"])
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_model_kwargs(['{"depth": 6}'])  # one syntax: no whole-mapping items


def test_create_model_errors_are_one_line():
    with pytest.raises(ValueError, match="unknown model 'no_such_model'"):
        create_model("no_such_model")
    with pytest.raises(ValueError, match="cannot build"):
        create_model(DEIT, no_such_kwarg=1)
    with pytest.raises(ValueError, match="pretrained=True for sima_deit_tiny_patch16_224: it has no released weights"):
        create_model(DEIT, pretrained=True)
    with pytest.raises(ValueError, match="its pretrained tags: agent_deit_tiny_patch16_224.in1k"):
        create_model("agent_deit_tiny_patch16_224", pretrained=True)


def test_task_packages_build_models_through_the_factory():
    """No task package (train, bench, export, viz, ssl, detect, demo, convert) calls timm.create_model itself."""
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.parent.name != "models"
                 and re.search(r"\btimm\.create_model\(|^\s*from timm import .*\bcreate_model\b", p.read_text(),
                               re.M)]
    assert offenders == []


@pytest.mark.parametrize("name,wrap", [("deit.pth", True), ("timm.safetensors", False), ("pytorch_model.bin", False)])
def test_deit_layouts_start_a_model_of_another_size_and_classifier(tmp_path, name, wrap):
    """timm/DeiT weights at 32 px with 5 classes start a SimA DeiT at 16 px with 10 classes: the position embedding
    is resampled, the classifier keeps its initialization, everything else loads as it is."""
    torch.manual_seed(0)
    source = timm.create_model("deit_tiny_patch16_224", img_size=32, num_classes=5, **TINY_VIT)
    sd = source.state_dict()
    path = _write(sd, tmp_path / name, wrap)
    model = create_model(DEIT, img_size=16, num_classes=10, **TINY_VIT).eval()
    head_init = {k: v.clone() for k, v in model.head.state_dict().items()}
    report = load_initial_weights(model, path)
    assert report.reset == ["head.weight", "head.bias"] and report.missing == [] and report.unexpected == []
    assert report.resized == ["pos_embed (1, 65, 32) -> (1, 17, 32)"]
    assert len(report.loaded) == len(sd) - 2 and "resized: pos_embed" in report.summary()
    # the oracle: a model given those weights by hand (bicubic without antialiasing, as DeiT's own fine-tuning code
    # resizes it; 1 prefix token; and the initial head)
    expected = create_model(DEIT, img_size=16, num_classes=10, **TINY_VIT).eval()
    expected.load_state_dict({**{k: v for k, v in sd.items() if not k.startswith("head.")},
                              "pos_embed": resample_abs_pos_embed(sd["pos_embed"], (4, 4), num_prefix_tokens=1,
                                                                  antialias=False),
                              **{f"head.{k}": v for k, v in head_init.items()}})
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(model(x), expected(x), atol=1e-6)
    assert not torch.allclose(model.pos_embed, create_model(DEIT, img_size=16, **TINY_VIT).pos_embed)


def test_official_sima_xcit_layout_and_dino_teacher(tmp_path):
    torch.manual_seed(0)
    source = create_model("sima_nano_12_p8", num_classes=7, **TINY_XCIT).eval()
    official = {}
    for key, value in source.state_dict().items():  # our names -> the official layout (REFERENCE.md)
        key = key.replace("pos_embed.", "pos_embeder.")
        if ".attn.q." in key and key.startswith("cls_attn_blocks."):
            parts = [source.state_dict()[key.replace(".q.", f".{n}.")] for n in "qkv"]
            official[key.replace(".q.", ".qkv.")] = torch.cat(parts)
        elif not (key.startswith("cls_attn_blocks.") and (".attn.k." in key or ".attn.v." in key)):
            official[key] = value
    assert any(k.startswith("pos_embeder.") for k in official)
    atomic_torch_save({"model": official, "epoch": 3}, tmp_path / "official.pth")
    model = create_model("sima_nano_12_p8", num_classes=3, **TINY_XCIT).eval()
    report = load_initial_weights(model, tmp_path / "official.pth", model_name="sima_nano_12_p8")
    assert report.reset == ["head.weight", "head.bias"] and not (report.missing or report.unexpected)
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(_pre_logits(model, x), _pre_logits(source, x), atol=1e-5)

    # official DINO: the teacher's backbone under 'backbone.', its projection head under 'head.'
    teacher = {f"backbone.{k}": v for k, v in source.state_dict().items() if not k.startswith("head.")}
    teacher["head.mlp.0.weight"] = torch.zeros(8, 32)
    atomic_torch_save({"teacher": teacher, "student": {f"module.{k}": v for k, v in teacher.items()}},
                      tmp_path / "dino.pth")
    fresh = create_model("sima_nano_12_p8", num_classes=3, **TINY_XCIT).eval()
    report = load_initial_weights(fresh, tmp_path / "dino.pth")
    assert report.reset == ["head.weight", "head.bias"] and not (report.missing or report.unexpected)
    assert torch.allclose(_pre_logits(fresh, x), _pre_logits(source, x), atol=1e-5)


def test_a_classifier_starts_a_backbone_and_bad_fits_are_one_line(tmp_path):
    classifier = create_model(DEIT, img_size=16, num_classes=5, **TINY_VIT)
    path = _write(classifier.state_dict(), tmp_path / "cls.pth", True)
    backbone = create_model(DEIT, img_size=16, num_classes=0, **TINY_VIT)
    report = load_initial_weights(backbone, path)
    assert report.dropped == ["head.weight", "head.bias"] and report.reset == [] and not report.missing
    assert torch.equal(backbone.blocks[1].mlp.fc2.weight, classifier.blocks[1].mlp.fc2.weight)

    wider = create_model(DEIT, img_size=16, **dict(TINY_VIT, embed_dim=64))
    before = wider.blocks[0].attn.qkv.weight.clone()
    with pytest.raises(CheckpointError, match=r"do not fit .*shape mismatch: .*cls_token") as err:
        load_initial_weights(wider, path)
    assert "\n" not in str(err.value) and torch.equal(wider.blocks[0].attn.qkv.weight, before)  # untouched
    with pytest.raises(CheckpointError, match=r"would leave \d+ of the \d+ tensors of XCiTBackbone at their "
                                              r"initialization \(first missing: .*; first unexpected: "):
        load_initial_weights(create_model("sima_nano_12_p8", **TINY_XCIT), path)
    deeper = create_model(DEIT, img_size=16, num_classes=5, **dict(TINY_VIT, depth=3))
    before = deeper.blocks[0].attn.qkv.weight.clone()
    with pytest.raises(CheckpointError, match=r"would leave 12 of the 44 tensors of SoftmaxFreeViT at their "
                                              r"initialization \(first missing: blocks\.2\.norm1\.weight\): "
                                              r".* or --flag to start") as err:
        load_initial_weights(deeper, path, partial_option="--flag")  # a block more: refused unless asked for
    assert "\n" not in str(err.value) and torch.equal(deeper.blocks[0].attn.qkv.weight, before)
    report = load_initial_weights(deeper, path, partial=True)
    assert report.missing and all(k.startswith("blocks.2.") for k in report.missing)
    assert report.summary().startswith(f"loaded 32/44 tensors from {path}")
    with pytest.raises(CheckpointError, match="do not fit .* exactly: missing: blocks.2"):
        load_initial_weights(deeper, path, strict=True, partial=True)
    with pytest.raises(FileNotFoundError, match="initial weights not found"):
        load_initial_weights(deeper, tmp_path / "none.pth")
