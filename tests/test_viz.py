"""simattn viz: q̂/k̂ heatmaps through SimAAttention.qk_hook, CLS maps for softmax, PNG outputs, clear errors."""
import json

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

pytest.importorskip("skimage")

import simattn  # noqa: E402,F401
from simattn.viz import hooked_blocks, load_image, token_grid, token_maps  # noqa: E402
from simattn.cli import main as simattn_main  # noqa: E402
from simattn.viz.cli import main as viz_main  # noqa: E402

DEIT = "sima_deit_tiny_patch16_224"
TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)
KWARGS = ["--model-kwargs", "img_size=32", "patch_size=4", "embed_dim=32", "depth=2", "num_heads=2", "num_classes=10"]


def _model(**kw):
    torch.manual_seed(0)
    return timm.create_model(DEIT, **{**TINY, **kw}).eval()


def _input():
    from simattn.data.images import image_tensor
    return image_tensor(load_image("skimage:astronaut"),
                        {"input_size": (3, 32, 32), "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
                         "crop_pct": 1.0, "interpolation": "bicubic"})


def test_cli_writes_panels_and_overlays(tmp_path, capsys):
    photo = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)).save(photo)
    out = tmp_path / "viz"
    rc = viz_main(["--model", DEIT, *KWARGS, "--image", "skimage:astronaut", "sklearn:china.jpg", str(photo),
                   "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    summary = json.loads((out / "viz.json").read_text())
    # no --weights: said on stderr, in viz.json and in every figure title
    assert "warning: random weights" in err and summary["warning"].startswith("random weights")
    assert [r["image"] for r in summary["images"]] == ["skimage:astronaut", "sklearn:china.jpg", str(photo)]
    for record in summary["images"]:
        assert record["title"].endswith(f"warning: {summary['warning']}")
        assert record["block"] == 1 and record["num_blocks"] == 2
        assert record["grids"] == {"q_hat_norm": [8, 8], "k_hat_norm": [8, 8]}
        assert record["prefix_tokens"] == {"q_hat_norm": 1, "k_hat_norm": 1}  # the CLS token was dropped
        with Image.open(record["panel"]) as panel:  # image + q̂ + k̂, 3 in × 100 dpi each, 3.6 in high
            assert panel.size == (900, 360) == tuple(record["panel_size"])
        assert set(record["overlays"]) == {"q_hat_norm", "k_hat_norm"}
        for path in record["overlays"].values():
            with Image.open(path) as im:
                pixels = np.asarray(im.convert("RGB"), dtype=np.float32)
            assert pixels.shape == (32, 32, 3)  # the model's input resolution
            assert pixels.std() > 5  # not a constant picture
        lo, hi = record["raw_range"]["q_hat_norm"]
        assert 0 < lo < hi


def test_maps_are_normalized_norms_of_q_hat_and_k_hat():
    model = _model()
    x, shown = _input()
    # the oracle: q and k of the last block's attention, l1-normalized over tokens as the official code does
    seen = {}
    attn = model.blocks[-1].attn
    handle = attn.register_forward_hook(lambda m, args, out: seen.setdefault("x", args[0]))
    result = token_maps(model, x, shown, block=-1)
    handle.remove()
    q, k, _ = attn.project(seen["x"])
    q_hat, k_hat = F.normalize(q, p=1.0, dim=-2), F.normalize(k, p=1.0, dim=-2)
    for name, t in (("q_hat_norm", q_hat), ("k_hat_norm", k_hat)):
        norms = t[0, :, 1:].transpose(0, 1).flatten(1).norm(dim=-1)  # over all channels, CLS dropped
        assert result.raw_range[name] == pytest.approx((norms.min().item(), norms.max().item()), rel=1e-5)
        heat = result.maps[name]
        assert heat.shape == (32, 32)
        assert heat.min() == pytest.approx(0.0) and heat.max() == pytest.approx(1.0) and heat.std() > 0.05
    assert not np.allclose(result.maps["q_hat_norm"], result.maps["k_hat_norm"])
    first = token_maps(model, x, shown, block=0)
    assert first.block == 0 and first.module == "blocks.0.attn"
    assert not np.allclose(first.maps["q_hat_norm"], result.maps["q_hat_norm"])
    # observing leaves no hook behind
    assert not any(b.qk_hook.has_hooks for _, b in hooked_blocks(model)[1])


def test_softmax_model_gives_cls_attention_map(tmp_path):
    model = _model(attn_type="softmax")
    x, shown = _input()
    result = token_maps(model, x, shown)
    assert set(result.maps) == {"cls_attention"}
    assert result.maps["cls_attention"].std() > 0.05
    lo, hi = result.raw_range["cls_attention"]
    assert 0 <= lo < hi <= 1  # softmax weights of the CLS row
    rc = viz_main(["--model", DEIT, *KWARGS, "attn_type=softmax", "--image", "skimage:coffee", "--out", str(tmp_path)])
    assert rc == 0
    record = json.loads((tmp_path / "viz.json").read_text())["images"][0]
    assert set(record["overlays"]) == {"cls_attention"}
    with Image.open(record["panel"]) as panel:
        assert panel.size == (600, 360)


def test_corrupt_or_missing_image_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    with pytest.raises(ValueError, match="cannot read image"):
        load_image(bad)
    good = tmp_path / "good.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 7).save(good)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:60])
    with pytest.raises(ValueError, match="cannot read image"):
        load_image(truncated)
    with pytest.raises(FileNotFoundError, match="image not found"):
        load_image(tmp_path / "missing.jpg")
    with pytest.raises(ValueError, match="unknown scikit-image photo 'eagle'"):  # would need a download
        load_image("skimage:eagle")
    assert simattn_main(["viz", "--model", DEIT, *KWARGS, "--image", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read image" in capsys.readouterr().err
    assert not (tmp_path / "o" / "viz.json").exists()


def test_block_out_of_range_is_a_clear_error(tmp_path, capsys):
    model = _model()
    x, shown = _input()
    with pytest.raises(ValueError, match=r"block 2 is out of range: the model has 2 attention blocks"):
        token_maps(model, x, shown, block=2)
    with pytest.raises(ValueError, match="out of range"):
        token_maps(model, x, shown, block=-3)
    assert simattn_main(["viz", "--model", DEIT, *KWARGS, "--block", "7", "--out", str(tmp_path)]) == 2
    assert "block 7 is out of range" in capsys.readouterr().err


def test_model_without_hook_points_is_a_clear_error():
    model = _model(attn_type="elu")
    x, shown = _input()
    with pytest.raises(ValueError, match="no attention module with a q̂/k̂"):
        token_maps(model, x, shown)


def test_token_grid():
    assert token_grid(197, (224, 224), 1) == (1, (14, 14))
    assert token_grid(196, (224, 224)) == (0, (14, 14))
    assert token_grid(198, (224, 224)) == (2, (14, 14))  # CLS + distillation token
    assert token_grid(1 + 14 * 10, (224, 160), 1) == (1, (14, 10))
    with pytest.raises(ValueError, match="cannot lay 7 tokens"):
        token_grid(7, (224, 160), 0)


# every family: which hook point it exposes, and the grids its maps land on at 64 px
FAMILY_CASES = {
    "relu_vit_small_patch32_224": (dict(patch_size=8, embed_dim=32, depth=2, num_heads=2),
                                   {"cls_attention": (8, 8)}),  # big_vision vit_i1k: a class token
    "relu_vit_small_patch32_gap_224": (dict(patch_size=8, embed_dim=32, depth=2, num_heads=2),
                                       {"mean_attention_received": (8, 8)}),  # no CLS token: attention received
    "sima_nano_12_p8": (dict(embed_dim=32, depth=2, num_heads=2, cls_attn_layers=1),
                        {"q_hat_norm": (8, 8), "k_hat_norm": (8, 8)}),
    "ufo_vit_tiny": (dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, cls_attn_layers=1),
                     {"cls_attention": (8, 8)}),  # XNorm has no hook: the class-attention CLS row
    "sima_cvt_13": (dict(embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2)),
                    {"q_hat_norm": (4, 4), "k_hat_norm": (2, 2)}),  # strided keys get their own grid
    "soft_tiny": (dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), stem_chans=8),
                  {"cls_attention": (2, 2)}),  # the last (softmax) stage
}


@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_family_maps(name):
    assert name in simattn.list_models()
    kwargs, grids = FAMILY_CASES[name]
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=64, **kwargs).eval()
    from simattn.data.images import image_tensor
    x, shown = image_tensor(load_image("sklearn:flower"), {"input_size": (3, 64, 64), "mean": (0.5,) * 3,
                                                           "std": (0.5,) * 3, "crop_pct": 1.0})
    result = token_maps(model, x, shown)
    assert result.grids == grids
    for heat in result.maps.values():
        assert heat.shape == (64, 64) and heat.min() == 0.0 and heat.max() == pytest.approx(1.0)
        assert heat.std() > 0.05


def test_dino_backbone_weights_draw_maps_without_warning(tmp_path, capsys):
    """A backbone saved by simattn ssl (no classifier) opens by its file alone; trained weights: no warning."""
    from simattn.ssl.dino import build_backbone, save_backbone
    model = {"name": DEIT, "kwargs": {k: v for k, v in TINY.items() if k != "num_classes"}}
    weights = tmp_path / "backbone.safetensors"
    save_backbone(build_backbone(model), weights, model, {"img_size": 32, "crop_pct": 1.0})
    out = tmp_path / "viz"
    assert viz_main(["--weights", str(weights), "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    summary = json.loads((out / "viz.json").read_text())
    assert "warning" not in summary and summary["model_kwargs"]["num_classes"] == 0
    assert summary["input_size"] == [3, 32, 32] and "warning" not in summary["images"][0]["title"]
