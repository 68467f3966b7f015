"""CvT-with-SimA (sima_cvt_*) and SOFT pyramid (soft_*) backbones: timm contract, sizes, attention plumbing."""
import re

import pytest
import timm
import torch
import torch.nn.functional as F

import simattn
from simattn.attention import SimAAttention, SoftAttention, SoftmaxAttention
from simattn.attention import soft as soft_module
from simattn.models import sima_cvt, soft_vit
from simattn.utils.io import atomic_torch_save, load_weights

CVT_MODELS = ["sima_cvt_13", "sima_cvt_21"]
SOFT_MODELS = ["soft_tiny", "soft_small", "soft_medium", "soft_large", "soft_huge"]
# Published parameter counts (num_classes=1000) and the tolerance the issue allows.
PARAMS = {
    "sima_cvt_13": (20.0e6, 0.02), "sima_cvt_21": (32.0e6, 0.05),
    "soft_tiny": (13e6, 0.05), "soft_small": (24e6, 0.05), "soft_medium": (45e6, 0.05),
    "soft_large": (64e6, 0.05), "soft_huge": (87e6, 0.05),
}
TINY = {"sima_cvt_13", "soft_tiny"}  # these also run backward at full size
OTHER_SIZE = (64, 96)  # non-square, a multiple of both total strides (16 and 32)

_built = {}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: SOFT's Newton iterations are many tiny (49×49) matmuls, which stall on a second OpenMP
    thread when the cores are shared (measured here: 23.6 ms vs 0.14 ms per batched 49×49 matmul)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def built(name):
    """Each registered model built once at its defaults (the big ones cost seconds to initialize)."""
    if name not in _built:
        torch.manual_seed(0)
        _built[name] = timm.create_model(name).eval()
    return _built[name]


def small(name, **kwargs):
    """A shallow model of the family (one block per stage) for the functional checks."""
    torch.manual_seed(0)
    depths = (1, 1, 1) if name.startswith("sima_cvt") else (1, 1, 1, 1)
    return timm.create_model(name, depths=depths, **kwargs)


def test_registered_with_timm():
    names = simattn.models.list_models()
    for name in CVT_MODELS + SOFT_MODELS:
        assert name in names and name in timm.list_models()
    assert timm.list_models(module="sima_cvt") == CVT_MODELS
    table1 = [f"soft_tiny_{kind}" for kind in ("softmax", "linformer", "performer", "nystrom")]
    assert sorted(timm.list_models(module="soft_vit")) == sorted(SOFT_MODELS + table1)


@pytest.mark.parametrize("name", CVT_MODELS + SOFT_MODELS)
def test_builds_with_published_size_and_real_cfg(name):
    model = built(name)
    n_params = sum(p.numel() for p in model.parameters())
    target, tol = PARAMS[name]
    assert abs(n_params - target) <= tol * target, f"{name}: {n_params / 1e6:.2f}M vs {target / 1e6:.0f}M"
    cfg = model.pretrained_cfg
    first_conv = model.get_submodule(cfg["first_conv"])
    assert isinstance(first_conv, torch.nn.Conv2d) and first_conv.in_channels == 3
    assert model.get_submodule(cfg["classifier"]) is model.get_classifier()
    assert model.get_classifier().out_features == 1000


@pytest.mark.parametrize("name", CVT_MODELS + SOFT_MODELS)
def test_forward_every_model_224_and_other_size(name):
    model = built(name)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
        x = torch.randn(1, 3, *OTHER_SIZE)
        final, feats = model.forward_intermediates(x)
        h, w = OTHER_SIZE
        assert [f.shape[1:] for f in feats] == [
            (info["num_chs"], h // info["reduction"], w // info["reduction"]) for info in model.feature_info]
        torch.testing.assert_close(final, model.forward_features(x))
        assert model.forward_head(final).shape == (1, 1000)


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_models_train_forward_backward(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, img_size=224, drop_path_rate=0.1).train()
    assert max(m.drop_prob for m in model.modules() if isinstance(m, timm.layers.DropPath)) == pytest.approx(0.1)
    for size in ((224, 224), OTHER_SIZE):
        model.zero_grad()
        out = model(torch.randn(1, 3, *size))
        assert out.shape == (1, 7)
        out.sum().backward()
        first_conv = model.get_submodule(model.pretrained_cfg["first_conv"])
        assert torch.isfinite(first_conv.weight.grad).all() and first_conv.weight.grad.abs().sum() > 0
        assert model.head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["sima_cvt_13", "soft_tiny"])
def test_features_only_and_intermediates(name):
    torch.manual_seed(0)
    feats = timm.create_model(name, features_only=True, depths=(1,) * (3 if "cvt" in name else 4)).eval()
    expected_red = [4, 8, 16] if "cvt" in name else [4, 8, 16, 32]
    assert feats.feature_info.reduction() == expected_red
    out = feats(torch.randn(2, 3, 64, 64))
    assert [o.shape for o in out] == [(2, c, 64 // r, 64 // r)
                                      for c, r in zip(feats.feature_info.channels(), expected_red)]

    # out_indices prunes the stages after the last one asked for
    first = timm.create_model(name, features_only=True, out_indices=(0,), depths=(1,) * len(expected_red))
    assert len(first.model.stages) == 1 and first(torch.randn(1, 3, 64, 64))[0].shape[1] == 64

    model = small(name).eval()
    x = torch.randn(1, 3, 64, 96)
    nlc = model.forward_intermediates(x, indices=1, output_fmt="NLC", norm=True, intermediates_only=True)
    assert len(nlc) == 1
    final = model.forward_features(x)
    torch.testing.assert_close(nlc[0], final[:, model.num_prefix_tokens:])  # normed grid tokens of the last stage
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


@pytest.mark.parametrize("name", ["sima_cvt_13", "soft_tiny"])
def test_reset_classifier_and_pooling(name):
    model = small(name).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)
        torch.testing.assert_close(model(x), pre)
        assert pre.shape == (2, model.num_features)
        model.reset_classifier(5, global_pool="avg")
        assert model(x).shape == (2, 5)
    with pytest.raises(ValueError, match="global_pool"):
        model.reset_classifier(5, global_pool="max")


@pytest.mark.parametrize("name", ["sima_cvt_13", "soft_tiny"])
def test_optimizer_hooks(name):
    model = small(name)
    nwd = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert nwd and nwd <= set(params)
    assert any(n.endswith("cls_token") for n in nwd)
    if name.startswith("soft"):
        assert sum(n.endswith("pos_embed") for n in nwd) == 4
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sorted(n for g in groups.values() for n in g) == sorted(params)
    assert len(groups) > len(model.stages)  # finer than one group per stage
    assert len(timm.models.group_parameters(model, model.group_matcher(coarse=True))) >= len(model.stages)

    # gradient checkpointing gives the same gradients
    x = torch.randn(1, 3, 64, 64)
    model.train()
    model.stages.apply(lambda m: m.eval() if isinstance(m, torch.nn.BatchNorm2d) else None)
    model(x).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for n, p in model.named_parameters():
        if n in ref:
            torch.testing.assert_close(p.grad, ref[n], rtol=1e-4, atol=1e-6)


def _train_bn(model, x):
    """Move BatchNorm running statistics away from their init, so a reload really has to restore them."""
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


@pytest.mark.parametrize("name,filter_fn", [("sima_cvt_13", sima_cvt.checkpoint_filter_fn),
                                            ("soft_tiny", soft_vit.checkpoint_filter_fn)])
def test_save_and_reload_through_filter(tmp_path, name, filter_fn):
    x = torch.randn(1, 3, 64, 96)
    model = _train_bn(small(name), torch.randn(2, 3, 64, 96))
    path = tmp_path / "ckpt.pth"
    atomic_torch_save({"model": model.state_dict(), "epoch": 3}, path)
    torch.manual_seed(1)
    fresh = small(name).eval()
    with torch.no_grad():
        assert not torch.allclose(fresh(x), model(x))
        load_weights(fresh, path, filter_fn=filter_fn)
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def _to_official_cvt(state_dict):
    """Our CvT state dict in the official CvT layout (stage{i}.…, separate proj_q / proj_k / proj_v)."""
    out = {}
    for key, value in state_dict.items():
        key = re.sub(r"^stages\.(\d+)\.", r"stage\1.", key)
        if ".attn.qkv." in key:
            prefix, kind = key.split(".qkv.")
            for part_name, part in zip("qkv", value.chunk(3)):
                out[f"{prefix}.proj_{part_name}.{kind}"] = part
        else:
            out[key] = value
    return out


def test_cvt_filter_maps_official_layout(tmp_path):
    model = _train_bn(small("sima_cvt_13", attn_type="softmax"), torch.randn(2, 3, 64, 64))
    official = _to_official_cvt(model.state_dict())
    assert "stage0.blocks.0.attn.proj_k.weight" in official and "stage2.cls_token" in official
    path = tmp_path / "cvt_official.pth"
    atomic_torch_save({"model": official}, path)
    torch.manual_seed(1)
    fresh = small("sima_cvt_13", attn_type="softmax").eval()
    load_weights(fresh, path, filter_fn=sima_cvt.checkpoint_filter_fn)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_soft_filter_resamples_position_embeddings():
    source = small("soft_tiny")
    target = small("soft_tiny", img_size=256)
    sd = soft_vit.checkpoint_filter_fn({"state_dict": source.state_dict()}, target)
    target.load_state_dict(sd)
    assert target.stages[0].pos_embed.shape[1] == 64 * 64
    for stage, prefix, old, new in ((0, 0, 56, 64), (3, 1, 7, 8)):  # stage 4 has a CLS slot, kept as it is
        pos = source.stages[stage].pos_embed.detach()
        grid = pos[:, prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(new, new), mode="bicubic", align_corners=False, antialias=True)
        expected = torch.cat([pos[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, new * new, -1)], dim=1)
        torch.testing.assert_close(target.stages[stage].pos_embed.detach(), expected)


def test_cvt_sima_attends_from_queries_to_fewer_keys():
    model = built("sima_cvt_13")
    seen = {}
    first, last = model.stages[0].blocks[0].attn, model.stages[2].blocks[-1].attn
    assert isinstance(first, SimAAttention)
    hooks = [attn.qk_hook.register_forward_hook(lambda m, inp, out, key=key: seen.__setitem__(key, inp))
             for key, attn in (("first", first), ("last", last))]
    try:
        with torch.no_grad():
            model(torch.randn(1, 3, 64, 96))
    finally:
        for h in hooks:
            h.remove()
    q_hat, k_hat = seen["first"]
    assert q_hat.shape == (1, 1, 16 * 24, 64) and k_hat.shape == (1, 1, 8 * 12, 64)
    # SimA's normalization: every channel has unit l1 norm over its own token axis
    torch.testing.assert_close(k_hat.abs().sum(-2), torch.ones(1, 1, 64))
    torch.testing.assert_close(q_hat.abs().sum(-2), torch.ones(1, 1, 64))
    q_hat, k_hat = seen["last"]
    assert q_hat.shape == (1, 6, 1 + 4 * 6, 64) and k_hat.shape == (1, 6, 1 + 2 * 3, 64)  # CLS joins both


def test_cvt_softmax_variant():
    model = small("sima_cvt_13", attn_type="softmax").eval()
    attn = model.stages[1].blocks[0].attn
    assert isinstance(attn, SoftmaxAttention) and not isinstance(attn, SimAAttention)
    assert model.attn_type == "softmax"
    sima = small("sima_cvt_13")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in sima.parameters())
    weights = []
    handle = attn.attn_weights.register_forward_hook(lambda m, inp, out: weights.append(out))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    handle.remove()
    w = weights[0]
    assert w.shape == (1, 3, 8 * 8, 4 * 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 3, 64))


@pytest.mark.parametrize("kind", ["xca", "soft"])
def test_cvt_kinds_needing_equal_lengths(kind):
    with pytest.raises(ValueError, match="kv_stride=1"):
        small("sima_cvt_13", attn_type=kind)
    model = small("sima_cvt_13", attn_type=kind, kv_stride=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize("kind", ["elu", "relu", "xnorm"])
def test_cvt_other_kinds_cross_length(kind):
    model = small("sima_cvt_13", attn_type=kind).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()


def test_soft_attention_layout_and_swaps(monkeypatch):
    model = small("soft_tiny").eval()
    assert model.sr_ratios == (8, 4, 2)
    attn = [stage.blocks[0].attn for stage in model.stages]
    assert all(isinstance(a, SoftAttention) for a in attn[:3]) and isinstance(attn[3], SoftmaxAttention)
    assert [a.ratio for a in attn[:3]] == [8, 4, 2]
    assert [a.v_conv.kernel_size[0] for a in attn[:3]] == [9, 5, 3]

    # The blocks hand SOFT its (non-square) grid, and at 224 every SOFT layer has m = 49 landmarks.
    grids, landmark_sizes = [], []
    attend, newton_pinv = SoftAttention.attend, soft_module.newton_pinv

    def spy_attend(self, q, k, v, mask, grid_size=None):
        grids.append(grid_size)
        return attend(self, q, k, v, mask, grid_size=grid_size)

    def spy_pinv(m, *args, **kwargs):
        landmark_sizes.append(tuple(m.shape[-2:]))
        return newton_pinv(m, *args, **kwargs)

    monkeypatch.setattr(SoftAttention, "attend", spy_attend)
    monkeypatch.setattr(soft_module, "newton_pinv", spy_pinv)
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 96))
        assert grids == [(16, 24), (8, 12), (4, 6)]
        landmark_sizes.clear()
        for attn_i, side in zip(attn[:3], (56, 28, 14)):  # the grids at 224
            attn_i(torch.randn(1, side * side, attn_i.dim), grid_size=(side, side))
    assert landmark_sizes == [(49, 49)] * 3

    no_vconv = small("soft_tiny", v_conv_kernels=(0, 0, 0))
    assert all(stage.blocks[0].attn.v_conv is None for stage in no_vconv.stages[:3])
    sima = small("soft_tiny", attn_type="sima").eval()
    assert isinstance(sima.stages[0].blocks[0].attn, SimAAttention)
    assert isinstance(sima.stages[3].blocks[0].attn, SoftmaxAttention)
    with torch.no_grad():
        assert sima(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize("name,bad", [("sima_cvt_13", (1, 3, 100, 64)), ("sima_cvt_13", (1, 1, 64, 64)),
                                      ("soft_tiny", (1, 3, 64, 48)), ("soft_tiny", (3, 64, 64))])
def test_bad_input_raises_value_error(name, bad):
    model = small(name).eval()
    with pytest.raises(ValueError, match="input"):
        model(torch.randn(*bad))
    with pytest.raises(ValueError, match="input"):
        model.forward_intermediates(torch.randn(*bad))


def test_bad_build_arguments_raise_value_error():
    with pytest.raises(ValueError, match="multiples of 32"):
        timm.create_model("soft_tiny", img_size=200)
    with pytest.raises(ValueError, match="multiples of 16"):
        timm.create_model("sima_cvt_13", img_size=100, depths=(1, 1, 1))
    with pytest.raises(ValueError, match="perfect square"):
        timm.create_model("soft_tiny", num_landmarks=50, depths=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="unknown attention"):
        timm.create_model("sima_cvt_13", attn_type="nope")
