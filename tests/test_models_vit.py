"""DeiT/ViT family (sima_vit): timm contract, parameter counts, checkpoints, attention swapping."""
import pytest
import timm
import torch
import torch.nn.functional as F

import simattn  # noqa: F401
from simattn.attention import SimAAttention, SoftmaxAttention
from simattn.models.sima_vit import checkpoint_filter_fn
from simattn.utils.io import CheckpointError, atomic_torch_save, load_weights

pytestmark = pytest.mark.usefixtures("one_thread")  # small nets on a shared CPU: fastest on one thread

VIT_MODELS = [m for m in simattn.list_models() if m.startswith(("sima_deit", "relu_vit"))]
SMALL = dict(embed_dim=64, depth=2, num_heads=2)


def test_family_registered():
    assert set(VIT_MODELS) == {
        "sima_deit_tiny_patch16_224", "sima_deit_small_patch16_224", "sima_deit_base_patch16_224",
        "relu_vit_small_patch32_224", "relu_vit_small_patch16_224", "relu_vit_small_patch8_224",
        "relu_vit_small_patch32_gap_224", "relu_vit_small_patch16_gap_224", "relu_vit_small_patch8_gap_224"}


@pytest.mark.parametrize("name", VIT_MODELS)
def test_builds_at_default_size_and_runs(name):
    model = timm.create_model(name, drop_path_rate=0.1).eval()
    cfg = model.pretrained_cfg
    assert model.get_submodule(cfg["first_conv"]) is not None and model.get_classifier() is model.head
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, cfg["num_classes"])
    assert cfg["num_classes"] == (21843 if name.endswith("_gap_224") else 1000)  # big_vision's i21k head


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


@pytest.mark.parametrize("patch", [32, 16, 8])
def test_relu_vit_i1k_head_is_big_vision_vit_i1k(patch):
    """Class token (no position embedding on it), learned position embedding, token pooling of the final-norm
    tokens, Linear(dim, dim) + tanh pre-logits layer, then the classifier."""
    torch.manual_seed(0)
    model = timm.create_model(f"relu_vit_small_patch{patch}_224", num_classes=5, **SMALL).train()
    grid = 224 // patch
    assert model.cls_token is not None and model.cls_token.shape == (1, 1, 64)
    assert isinstance(model.pos_embed, torch.nn.Parameter) and model.pos_embed.requires_grad
    assert model.pos_embed.shape == (1, grid * grid, 64)  # patches only: the class token is appended after
    assert dict(model.named_parameters())["pos_embed"] is model.pos_embed
    fc = model.pre_logits.fc
    assert (fc.in_features, fc.out_features) == (64, 64) and isinstance(model.pre_logits.act, torch.nn.Tanh)
    x = torch.randn(2, 3, 2 * patch, 4 * patch)  # any multiple of the patch: the embedding is resampled
    tokens = model.forward_features(x)
    assert tokens.shape == (2, 1 + 2 * 4, 64)
    expected = F.linear(torch.tanh(F.linear(tokens[:, 0], fc.weight, fc.bias)), model.head.weight, model.head.bias)
    out = model(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    for name in ("pos_embed", "cls_token", "pre_logits.fc.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name  # trained, and on the path to the logits


@pytest.mark.parametrize("patch", [32, 16, 8])
def test_relu_vit_i21k_head_averages_without_class_token(patch):
    torch.manual_seed(0)
    model = timm.create_model(f"relu_vit_small_patch{patch}_gap_224", num_classes=5, **SMALL).train()
    grid = 224 // patch
    assert model.cls_token is None and model.num_prefix_tokens == 0
    assert isinstance(model.pre_logits, torch.nn.Identity) and not any("pre_logits" in n for n, _ in
                                                                        model.named_parameters())
    assert model.pos_embed.shape == (1, grid * grid, 64) and model.pos_embed.requires_grad
    x = torch.randn(2, 3, 2 * patch, 4 * patch)
    tokens = model.forward_features(x)
    assert tokens.shape == (2, 2 * 4, 64)
    out = model(x)
    torch.testing.assert_close(out, F.linear(tokens.mean(1), model.head.weight, model.head.bias))
    out.square().sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0


def test_representation_size_options():
    model = timm.create_model("relu_vit_small_patch16_224", num_classes=5, representation_size=32, **SMALL)
    assert model.head.in_features == 32 and model.head_hidden_size == 32
    model.reset_classifier(7)
    assert (model.head.in_features, model.head.out_features) == (32, 7)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 7)
    with pytest.raises(ValueError, match="representation_size must be"):
        timm.create_model("relu_vit_small_patch16_224", representation_size=-3, **SMALL)
    feats = timm.create_model("relu_vit_small_patch16_224", features_only=True, out_indices=(1,), **SMALL)
    assert [f.shape for f in feats(torch.randn(1, 3, 64, 64))] == [(1, 64, 4, 4)]


def test_relu_vit_i1k_checkpoint_keeps_pre_logits(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("relu_vit_small_patch16_224", num_classes=5, **SMALL).eval()
    atomic_torch_save({"model": model.state_dict()}, tmp_path / "i1k.pth")
    again = timm.create_model("relu_vit_small_patch16_224", num_classes=5, **SMALL).eval()
    load_weights(again, tmp_path / "i1k.pth", filter_fn=checkpoint_filter_fn)
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(again(x), model(x))
    gap = timm.create_model("relu_vit_small_patch16_gap_224", num_classes=5, **SMALL)
    with pytest.raises(CheckpointError, match=r"pre_logits\.fc"):  # a tanh layer is never dropped silently
        load_weights(gap, tmp_path / "i1k.pth", filter_fn=checkpoint_filter_fn)


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
