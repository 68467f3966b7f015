"""Swin family (models/swin.py): softmax is timm's Swin, SimA and the released hybrids in their stages, timm's model
contract (intermediates, features), released key names through the filter, attention swaps, a few training steps."""
import json
import logging
import sys
import types
from pathlib import Path
from urllib.parse import urlparse

import pytest
import timm
import torch
from timm.models.swin_transformer import SwinTransformer

from simattn.attention import AgentAttention, SimAAttention, list_attentions
from simattn.models import swin
from simattn.models.swin import GridSwinBlock, SoftmaxFreeSwin, checkpoint_filter_fn

from conftest import needs
from helpers import released_layout, released_state

pytestmark = pytest.mark.usefixtures("one_thread")  # small nets on a shared CPU: fastest on one thread

#: two stages of one block each (stride 8 at patch 4), 32 px: grids 8x8 and 4x4, windows of 4
TINY = dict(img_size=32, embed_dim=16, depths=(1, 2), num_heads=(2, 4), window_size=4, num_classes=5)
HYBRIDS = {  # model: (kind, stages that run it, at the released four-stage layout)
    "agent_swin_tiny_patch4_window7_224": ("agent", (True, True, True, False)),
    "flatten_swin_tiny_patch4_window7_224": ("flatten", (True, True, False, False)),
    "inline_swin_tiny_patch4_window7_224": ("inline", (True, True, True, False)),
    "slab_swin_tiny_patch4_window7_224": ("slab", (True, True, False, False)),
    "polaformer_swin_tiny_patch4_window7_224": ("polaformer", (True, True, False, False)),
}
MODELS = ["sima_swin_tiny_patch4_window7_224", *HYBRIDS]
#: each released Swin-T checkpoint's key names, shapes and dtypes, as its repository's model code saves them
LAYOUTS = Path(__file__).parent / "data" / "swin_released"


def _kinds(model):
    """Each stage's attention: the kind's name over the stage grid, 'window' for Swin's window softmax."""
    return [getattr(stage.blocks[0].attn, "attn_name", "window") for stage in model.layers]


def test_family_registered_with_names_apart_from_timms():
    names = timm.list_models(module="swin")
    sizes = ("tiny", "small", "base")
    assert set(names) == {f"{kind}_swin_{size}_patch4_window7_224" for kind in
                          ("sima", "agent", "flatten", "inline", "polaformer") for size in sizes} | {
        "slab_swin_tiny_patch4_window7_224", "slab_swin_small_patch4_window7_224"}
    assert not set(names) & set(timm.list_models(module="swin_transformer"))


@pytest.mark.parametrize("name", MODELS)
def test_stages_run_the_released_layout(name):
    kind, stages = HYBRIDS.get(name, ("sima", (True,) * 4))
    model = timm.create_model(name, img_size=64, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4),
                              window_size=2, num_classes=3).eval()
    assert _kinds(model) == [kind if s else "window" for s in stages]
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 3)


def test_grid_block_is_attention_then_mlp_over_the_row_major_grid():
    model = timm.create_model("agent_swin_tiny_patch4_window7_224", dynamic_img_size=True, **TINY).eval()
    block = model.layers[0].blocks[0]
    x = torch.randn(2, 6, 5, 16)  # a grid that is not square: (H, W) order matters
    tokens = x.reshape(2, 30, 16)
    y = tokens + block.attn(block.norm1(tokens), grid_size=(6, 5))
    expected = (y + block.mlp(block.norm2(y))).reshape(2, 6, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected)


@pytest.mark.parametrize("name, kind", [("agent_swin_base_patch4_window7_224", "agent"),
                                        ("inline_swin_base_patch4_window7_224", "inline")])
def test_mixed_stage_runs_the_kind_in_its_first_two_blocks(name, kind):
    # the released B layouts' "M" stage (AAMB2, IIMS2): the kind in stage 3's first 2 blocks, windows after
    model = timm.create_model(name, img_size=64, embed_dim=16, depths=(1, 1, 4, 1), num_heads=(1, 2, 2, 4),
                              window_size=2)
    blocks = [getattr(b.attn, "attn_name", "window") for b in model.layers[2].blocks]
    assert blocks == [kind, kind, "window", "window"] and model.layers[2].blocks[3].shift_size == (1, 1)


def test_agent_options_per_stage():
    model = timm.create_model("agent_swin_tiny_patch4_window7_224", img_size=64, embed_dim=16, depths=(1, 1, 1, 1),
                              num_heads=(1, 2, 2, 4), window_size=2)
    attns = [stage.blocks[0].attn for stage in model.layers[:3]]
    assert all(isinstance(a, AgentAttention) for a in attns)
    # 9, 16, 49 agents; row and column biases on each stage's grid at img_size (16, 8, 4); no class-token bias
    assert [(a.agent_num, a.window, a.agent_prefix_bias) for a in attns] == [(9, 16, None), (16, 8, None),
                                                                            (49, 4, None)]
    assert attns[0].dwc.kernel_size == (3, 3)


def test_softmax_is_timms_swin_with_the_same_weights():
    kw = dict(TINY, depths=(2, 2))  # stage 1's second block shifts its windows (8x8 grid, window 4)
    theirs = SwinTransformer(**kw).eval()
    ours = timm.create_model("sima_swin_tiny_patch4_window7_224", attn_type="softmax", **kw).eval()
    assert all(not isinstance(b, GridSwinBlock) for s in ours.layers for b in s.blocks)
    assert ours.layers[0].blocks[1].shift_size == (2, 2)
    # a training script's file: the weights under 'model', DDP's 'module.' prefixes, timm's filter for the rest
    state = {f"module.{k}": v for k, v in theirs.state_dict().items()}
    ours.load_state_dict(checkpoint_filter_fn({"model": state}, ours))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_forward_intermediates_and_features_only():
    model = timm.create_model("flatten_swin_tiny_patch4_window7_224", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    final, inter = model.forward_intermediates(x)
    assert [t.shape for t in inter] == [(2, 16, 8, 8), (2, 32, 4, 4)] and final.shape == (2, 4, 4, 32)
    with torch.no_grad():
        torch.testing.assert_close(final, model.forward_features(x))
    feats = timm.create_model("flatten_swin_tiny_patch4_window7_224", features_only=True, **TINY)
    assert feats.feature_info.channels() == [16, 32] and feats.feature_info.reduction() == [4, 8]
    assert [t.shape for t in feats(x)] == [(2, 8, 8, 16), (2, 4, 4, 32)]  # NHWC, as timm's Swin


def test_input_checks_are_one_line():
    fixed = timm.create_model("sima_swin_tiny_patch4_window7_224", dynamic_img_size=False, **TINY)
    with pytest.raises(ValueError, match="expected an image batch"):
        fixed(torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match=r"differs from the model's \(32, 32\)"):
        fixed(torch.randn(2, 3, 48, 48))
    model = timm.create_model("agent_swin_tiny_patch4_window7_224", **TINY).eval()  # any size, as every family here
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 40)).shape == (1, 5)  # the kind's grid and Swin's padded windows
    with pytest.raises(ValueError, match="multiple of the patch size"):
        model(torch.randn(1, 3, 34, 32))


def test_swap_from_a_hybrid_to_softmax_and_sima(caplog):
    with caplog.at_level(logging.WARNING, logger="simattn.models"):
        soft = timm.create_model("agent_swin_tiny_patch4_window7_224", attn_type="softmax", **TINY)
        sima = timm.create_model("agent_swin_tiny_patch4_window7_224", attn_type="sima", **TINY)
    assert _kinds(soft) == ["window", "window"] and soft.attn_type == "softmax"
    assert isinstance(sima.layers[0].blocks[0].attn, SimAAttention) and _kinds(sima) == ["sima", "sima"]
    assert sum("agent_num" in r.getMessage() for r in caplog.records) == 1  # one note, not one per stage
    with pytest.raises(ValueError, match="takes no attn_kwargs"):
        timm.create_model("sima_swin_tiny_patch4_window7_224", attn_type="softmax", attn_kwargs={"eps": 1}, **TINY)


def _released_agent_state(model):
    """The model's agent biases in Agent-Swin's released names and shapes."""
    out = {}
    for k, v in model.state_dict().items():
        head, _, name = k.rpartition(".")
        if name == "agent_block_bias":
            out[f"{head}.an_bias"] = v
        elif name == "query_block_bias":
            out[f"{head}.na_bias"] = v
        elif name == "agent_row_bias":
            out[f"{head}.ah_bias"] = v[None, :, :, :, None]
        elif name == "agent_col_bias":
            out[f"{head}.aw_bias"] = v[None, :, :, None, :]
        elif name == "query_row_bias":
            out[f"{head}.ha_bias"] = v.transpose(-2, -1)[None, :, :, None, :]
        elif name == "query_col_bias":
            out[f"{head}.wa_bias"] = v.transpose(-2, -1)[None, :, None, :, :]
        else:
            out[k] = v
    return out


def test_released_key_names_map_onto_the_kinds():
    torch.manual_seed(0)
    agent = timm.create_model("agent_swin_tiny_patch4_window7_224", **TINY)
    released = _released_agent_state(agent)
    assert "layers.0.blocks.0.attn.ha_bias" in released
    mapped = checkpoint_filter_fn({"model": released}, agent)
    assert mapped.keys() == agent.state_dict().keys()
    for k, v in agent.state_dict().items():
        assert torch.equal(mapped[k], v), k
    pola = timm.create_model("polaformer_swin_tiny_patch4_window7_224", **TINY)
    state = pola.state_dict()
    attn = "layers.0.blocks.0.attn"
    released = {k: v for k, v in state.items() if not k.startswith((f"{attn}.qkv.", f"{attn}.g."))}
    released[f"{attn}.scale"] = released.pop(f"{attn}.feature_scale")
    for p in ("weight", "bias"):
        released[f"{attn}.qkvg.{p}"] = torch.cat([state[f"{attn}.qkv.{p}"], state[f"{attn}.g.{p}"]])
    mapped = checkpoint_filter_fn(released, pola)
    assert all(torch.equal(mapped[k], v) for k, v in state.items()) and mapped.keys() == state.keys()


def test_slab_prepbn_norms_and_their_counters():
    model = timm.create_model("slab_swin_tiny_patch4_window7_224", prepbn_steps=3, **TINY)
    assert isinstance(model.norm, swin.TokenPRepBN) and isinstance(model.layers[1].downsample.norm, swin.TokenPRepBN)
    state = model.state_dict()
    released = {k.replace("warmup_left", "warm").replace("steps_left", "iter"): v for k, v in state.items()}
    released.update({k.replace("steps_left", "total_step"): v for k, v in state.items() if k.endswith("steps_left")})
    assert checkpoint_filter_fn(released, model).keys() == state.keys()
    model.train()(torch.randn(2, 3, 32, 32))  # one training call: LayerNorm hands a third over to RepBN
    assert model.norm.steps_left.item() == 2
    plain = timm.create_model("slab_swin_tiny_patch4_window7_224", prepbn_steps=0, **TINY)
    assert isinstance(plain.norm, torch.nn.LayerNorm)


@pytest.mark.parametrize("name", ["sima_swin_tiny_patch4_window7_224", "agent_swin_tiny_patch4_window7_224",
                                  "slab_swin_tiny_patch4_window7_224"])
def test_training_steps_stay_finite(name):
    torch.manual_seed(0)
    model = timm.create_model(name, drop_path_rate=0.1, **TINY).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_model_class_and_param_counts_at_full_size():
    # parameter counts of the full Swin-T layouts, counted on the meta device (no weights made)
    with torch.device("meta"):
        counts = {n: sum(p.numel() for p in timm.create_model(n).parameters())
                  for n in ("sima_swin_tiny_patch4_window7_224", "agent_swin_tiny_patch4_window7_224")}
    assert counts == {"sima_swin_tiny_patch4_window7_224": 28_265_032, "agent_swin_tiny_patch4_window7_224": 28_902_964}
    assert isinstance(timm.create_model("sima_swin_tiny_patch4_window7_224", **TINY), SoftmaxFreeSwin)


def _layout(name):
    return released_layout("swin_released", name)


def _released_state(name, values="meta"):
    return released_state("swin_released", name, values)


RELEASED = sorted(n for n in timm.list_models(module="swin") if not n.startswith("sima_"))


#: the tags whose weights were fine-tuned at another size (their models' layouts at that size): <tag>.json
HIGH_RES = sorted(p.stem for p in LAYOUTS.glob("*.json") if "." in p.stem)


def test_every_released_hybrid_has_a_layout():
    assert sorted(p.stem for p in LAYOUTS.glob("*.json") if "." not in p.stem) == RELEASED and len(RELEASED) == 14
    assert [tag.split(".")[1] for tag in HIGH_RES] == ["in1k_384", "in1k_288", "in1k_384"]


@pytest.mark.parametrize("name", RELEASED + HIGH_RES)
def test_released_layout_maps_with_no_missing_or_unexpected_key(name):
    with torch.device("meta"):
        model = timm.create_model(name)  # a tag: the model at its weights' size
    ours = model.state_dict()
    mapped = checkpoint_filter_fn({"model": _released_state(name), "epoch": 300}, model)
    assert sorted(mapped) == sorted(ours), set(mapped) ^ set(ours)
    assert {k: v.shape for k, v in mapped.items()} == {k: v.shape for k, v in ours.items()}
    assert sum(p.numel() for p in model.parameters()) == _layout(name)["params"]  # the released code's count


TAGS = sorted(t for t in timm.list_pretrained() if t.split(".")[0] in RELEASED)


def test_released_weights_are_tags_with_their_evaluation():
    assert len(TAGS) == 17  # Agent, FLatten, InLine, PolaFormer T/S/B, SLAB T/S; Agent S 288, B 384, FLatten B 384
    assert set(HIGH_RES) <= set(TAGS)
    for tag in TAGS:
        cfg = timm.models.get_pretrained_cfg(tag).to_dict()
        if tag.startswith("polaformer"):  # on the Hugging Face Hub
            assert cfg["hf_hub_id"] == "ZachMeng/PolaFormer" and cfg["hf_hub_filename"].endswith(".pth")
            assert cfg["license"] == "mit"
        else:
            assert cfg["url"].startswith("https://") and Path(urlparse(cfg["url"]).path).name, tag  # a cache file
        size = int(tag.rpartition("_")[2]) if tag in HIGH_RES else 224
        assert cfg["num_classes"] == 1000 and cfg["input_size"] == (3, size, size) and cfg["paper_ids"], tag
        # their evaluation: resize 256/224 of the size and centre crop; fine-tuned sizes a plain resize (no crop)
        crop = 1.0 if tag in HIGH_RES else 0.875
        assert cfg["crop_pct"] == crop and cfg["crop_mode"] == ("center" if tag.startswith("slab") else "squash")
        assert timm.models.get_pretrained_cfg(tag.split(".")[0]).url == ""  # the untagged name asks for no weights
    with torch.device("meta"):  # a fine-tuned size's tag builds its model at that size; arguments given win
        at288 = timm.create_model("agent_swin_small_patch4_window7_224.in1k_288")
        given = timm.create_model("agent_swin_small_patch4_window7_224.in1k_288", img_size=224, window_size=7)
    assert at288.patch_embed.img_size == (288, 288) and at288.layers[2].blocks[0].window_size == (9, 9)
    assert given.patch_embed.img_size == (224, 224) and given.layers[2].blocks[0].window_size == (7, 7)


def test_a_released_file_loads_through_timms_pretrained_path(tmp_path, monkeypatch):
    # the training script's file: a yacs config beside the weights (read as an inert stand-in), DDP's prefix
    yacs, config = types.ModuleType("yacs"), types.ModuleType("yacs.config")
    node = type("CfgNode", (dict,), {"__module__": "yacs.config"})
    config.CfgNode, yacs.config = node, config
    monkeypatch.setitem(sys.modules, "yacs", yacs)
    monkeypatch.setitem(sys.modules, "yacs.config", config)
    name = "polaformer_swin_tiny_patch4_window7_224"
    state = {f"module.{k}": v for k, v in _released_state(name, "seeded").items()}
    path = tmp_path / "pola_swin_t.pth"
    torch.save({"model": state, "epoch": 300, "max_accuracy": 82.6, "config": node(MODEL=node(TYPE="pola_swin"))},
               path)
    monkeypatch.delitem(sys.modules, "yacs.config")
    monkeypatch.delitem(sys.modules, "yacs")
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), weight_init="skip")
    released = _released_state(name, "seeded")
    qkvg = released["layers.0.blocks.0.attn.qkvg.weight"]
    torch.testing.assert_close(model.layers[0].blocks[0].attn.g.weight, qkvg[-96:], rtol=0, atol=0)


def test_every_kind_runs_in_the_kind_stages():
    x = torch.randn(1, 3, 32, 32)
    for kind in list_attentions():
        model = timm.create_model("flatten_swin_tiny_patch4_window7_224", attn_type=kind, **TINY).eval()
        with torch.no_grad():
            assert torch.isfinite(model(x)).all(), kind
        assert _kinds(model) == (["window", "window"] if kind == "softmax" else [kind, kind])


def test_semantic_fpn_on_swin():
    seg = timm.create_model("semantic_fpn", backbone="agent_swin_tiny_patch4_window7_224", num_classes=4, img_size=64,
                            embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), window_size=2).eval()
    assert [f["reduction"] for f in seg.backbone.feature_info] == [4, 8, 16, 32]
    with torch.no_grad():
        assert seg(torch.randn(1, 3, 64, 64)).shape == (1, 4, 64, 64)


@needs("onnx", "onnxruntime")
def test_onnx_export_equals_pytorch(tmp_path):
    import onnxruntime as ort
    torch.manual_seed(0)
    model = timm.create_model("sima_swin_tiny_patch4_window7_224", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / "sima_swin.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=18, input_names=["x"])
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-5)


@needs("onnx", "onnxruntime")
def test_export_fixes_the_input_size_from_the_start_and_says_why(tmp_path, capsys):
    """Swin's traced windows hold the export size: `simattn export` fixes height and width at once, with one note,
    instead of exporting with dynamic ones, failing onnxruntime at another size and exporting again."""
    from simattn.cli import main as simattn_main
    from simattn.utils.io import save_safetensors
    name = "sima_swin_tiny_patch4_window7_224"
    kwargs = dict(TINY, depths=(1, 1), window_size=2)
    torch.manual_seed(0)
    save_safetensors(timm.create_model(name, **kwargs), tmp_path / "w.safetensors",
                     metadata={"model": name, "config": kwargs})
    out = tmp_path / "swin.onnx"
    assert simattn_main(["export", "--weights", str(tmp_path / "w.safetensors"), "--exporter", "torchscript",
                         "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: Swin's shifted-window masks and stage grids are traced at the export size: exported at 32x32" \
           in printed
    report = json.loads((tmp_path / "swin.onnx.json").read_text())
    assert report["fixed_size_reason"] and not report["export"]["dynamic_spatial"]
    assert not any("re-exported" in note for note in report["export"]["notes"])
    assert report["seconds"] >= report["export"]["seconds"] > 0 and f"in {report['seconds']:.0f} s" in printed
