"""DeiT/ViT family (sima_vit): timm contract, parameter counts, checkpoints, attention swapping."""
import pytest
import timm
import torch

import simattn  # noqa: F401
from simattn.attention import SimAAttention, SoftmaxAttention
from simattn.models.sima_vit import checkpoint_filter_fn
from simattn.utils.io import CheckpointError, atomic_torch_save, load_weights

VIT_MODELS = [m for m in simattn.list_models() if m.startswith(("sima_deit", "relu_vit"))]
SMALL = dict(embed_dim=64, depth=2, num_heads=2)


def test_family_registered():
    assert set(VIT_MODELS) == {
        "sima_deit_tiny_patch16_224", "sima_deit_small_patch16_224", "sima_deit_base_patch16_224",
        "relu_vit_small_patch32_224", "relu_vit_small_patch16_224", "relu_vit_small_patch8_224"}


@pytest.mark.parametrize("name", VIT_MODELS)
def test_builds_at_default_size_and_runs(name):
    model = timm.create_model(name, drop_path_rate=0.1).eval()
    cfg = model.pretrained_cfg
    assert model.get_submodule(cfg["first_conv"]) is not None and model.get_classifier() is model.head
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


@pytest.mark.parametrize("name", VIT_MODELS)
def test_train_step_two_sizes_and_contract(name):
    patch = model_patch = timm.create_model(name, **SMALL).patch_embed.patch_size[0]
    model = timm.create_model(name, num_classes=7, **SMALL)
    for size in (224, 224 + 2 * patch):
        out = model(torch.randn(1, 3, size, size))
        assert out.shape == (1, 7)
        out.sum().backward()
    feats = model.forward_features(torch.randn(1, 3, 224, 224))
    assert model.forward_head(feats, pre_logits=True).shape == (1, 64)
    final, inter = model.forward_intermediates(torch.randn(1, 3, 224, 224))
    assert len(inter) == 2 and inter[-1].shape == (1, 64, 224 // model_patch, 224 // model_patch)
    model.set_grad_checkpointing(True)
    model(torch.randn(1, 3, 224, 224)).sum().backward()
    assert "pos_embed" in model.no_weight_decay() or "cls_token" in model.no_weight_decay()
    assert set(model.group_matcher()) >= {"stem", "blocks"}
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 64)
    fmodel = timm.create_model(name, features_only=True, out_indices=(0, 1), **SMALL)
    assert [f.shape[1] for f in fmodel(torch.randn(1, 3, 224, 224))] == [64, 64]


def test_bad_input_size_fails_clearly():
    model = timm.create_model("sima_deit_tiny_patch16_224", **SMALL)
    with pytest.raises(ValueError, match="not divisible by patch size"):
        model(torch.randn(1, 3, 225, 224))
    with pytest.raises(ValueError, match="expected an image batch"):
        model(torch.randn(3, 224, 224))


def test_param_counts():
    n = sum(p.numel() for p in timm.create_model("sima_deit_small_patch16_224").parameters())
    assert abs(n / 1e6 - 22.05) < 0.01  # the paper's DeiT-S → SimA


def test_attention_swaps_and_variants():
    m = timm.create_model("sima_deit_small_patch16_224", **SMALL)
    assert isinstance(m.blocks[0].attn, SimAAttention)
    soft = timm.create_model("sima_deit_small_patch16_224", attn_type="softmax", **SMALL)
    assert isinstance(soft.blocks[0].attn, SoftmaxAttention)
    one_head = timm.create_model("sima_deit_small_patch16_224", num_heads=1, embed_dim=64, depth=1)
    assert one_head.blocks[0].attn.num_heads == 1
    relu_mlp = timm.create_model("sima_deit_small_patch16_224", act_layer="relu", **SMALL)
    assert isinstance(relu_mlp.blocks[0].mlp.act, torch.nn.ReLU)
    fixed = timm.create_model("sima_deit_small_patch16_224", attn_kwargs={"order": "qk_first"}, **SMALL)
    assert fixed.blocks[0].attn.order == "qk_first"
    relu = timm.create_model("relu_vit_small_patch32_224", **SMALL)
    assert relu.blocks[0].attn.activation == "relu" and not isinstance(relu.blocks[0].attn.q_norm, torch.nn.Identity)
    with pytest.raises(ValueError, match="unknown attention"):
        timm.create_model("sima_deit_small_patch16_224", attn_type="nope")


def test_save_reload_identical(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("sima_deit_tiny_patch16_224", num_classes=5, **SMALL).eval()
    atomic_torch_save({"model": model.state_dict()}, tmp_path / "ck.pth")
    again = timm.create_model("sima_deit_tiny_patch16_224", num_classes=5, **SMALL).eval()
    load_weights(again, tmp_path / "ck.pth", filter_fn=checkpoint_filter_fn)
    x = torch.randn(2, 3, 224, 224)
    assert torch.equal(model(x), again(x))


def test_timm_deit_weights_load_into_softmax_variant(tmp_path):
    """A timm DeiT checkpoint gives the same outputs in attn_type='softmax', and loads into SimA too."""
    torch.manual_seed(0)
    deit = timm.create_model("deit_tiny_patch16_224", depth=2).eval()
    atomic_torch_save(deit.state_dict(), tmp_path / "deit.pth")
    ours = timm.create_model("sima_deit_tiny_patch16_224", attn_type="softmax", depth=2).eval()
    load_weights(ours, tmp_path / "deit.pth", filter_fn=checkpoint_filter_fn)
    x = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(ours(x), deit(x), rtol=1e-4, atol=1e-5)
    sima = timm.create_model("sima_deit_tiny_patch16_224", depth=2)
    load_weights(sima, tmp_path / "deit.pth", filter_fn=checkpoint_filter_fn)


def test_checkpoint_for_other_model_is_reported_by_name(tmp_path):
    other = timm.create_model("sima_deit_tiny_patch16_224", depth=3, embed_dim=64, num_heads=2)
    atomic_torch_save(other.state_dict(), tmp_path / "other.pth")
    model = timm.create_model("sima_deit_tiny_patch16_224", **SMALL)
    with pytest.raises(CheckpointError, match=r"unexpected keys: blocks\.2\."):
        load_weights(model, tmp_path / "other.pth", filter_fn=checkpoint_filter_fn)
