"""Attention kinds: fast paths against their references, invariances, masks, precision, errors, modules."""
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import simattn  # noqa: F401  (registers everything)
from simattn.attention import (attention_class, create_attention, get_attention_class, list_attentions,
                               pinv_residual)
from simattn.attention.elu import elu_attention, elu_attention_reference
from simattn.attention.relu import ACTIVATIONS, relu_attention, relu_attention_reference
from simattn.attention.sima import sima_attention, sima_attention_reference, sima_normalize
from simattn.attention.soft import gaussian_kernel, pool_landmarks, soft_attention, soft_attention_reference
from simattn.attention.softmax import softmax_attention, softmax_attention_reference
from simattn.attention.xca import xca_attention, xca_attention_reference
from simattn.attention.xnorm import xnorm_attention, xnorm_attention_reference

H = 3
TEMPERATURE = torch.tensor([0.5, 1.0, 2.0]).reshape(H, 1, 1)
GAMMA_Q = torch.tensor([0.7, 1.0, 1.3]).reshape(H, 1, 1)
GAMMA_KV = torch.tensor([1.5, 0.8, 1.1]).reshape(H, 1, 1)

# name → (fast, reference, supports different q/k lengths)
CASES = {
    "sima_kv_first": (partial(sima_attention, order="kv_first"), partial(sima_attention_reference, order="kv_first"), True),
    "sima_qk_first": (partial(sima_attention, order="qk_first"), partial(sima_attention_reference, order="qk_first"), True),
    "sima_auto": (sima_attention, sima_attention_reference, True),
    "softmax": (softmax_attention, softmax_attention_reference, True),
    "xca": (partial(xca_attention, temperature=TEMPERATURE), partial(xca_attention_reference, temperature=TEMPERATURE), False),
    "elu": (elu_attention, elu_attention_reference, True),
    "xnorm": (partial(xnorm_attention, gamma_q=GAMMA_Q, gamma_kv=GAMMA_KV),
              partial(xnorm_attention_reference, gamma_q=GAMMA_Q, gamma_kv=GAMMA_KV), True),
    **{f"relu_{a}": (partial(relu_attention, activation=a, alpha=0.7), partial(relu_attention_reference, activation=a, alpha=0.7), True)
       for a in ACTIVATIONS},
}
MASKABLE = [c for c in CASES]  # every functional kind except SOFT takes a token mask


def qkv(b=2, n=20, d=16, nk=None, dtype=torch.float32, scale=1.0, requires_grad=False):
    nk = n if nk is None else nk
    torch.manual_seed(n * 1000 + nk)
    ts = [torch.randn(b, H, n, d, dtype=dtype) * scale] + [torch.randn(b, H, nk, d, dtype=dtype) * scale for _ in range(2)]
    return [t.requires_grad_(requires_grad) for t in ts]


def official_sima(q, k, v):
    """Verbatim the official code's formulation (Algorithm 1 of the supplement)."""
    k = F.normalize(k, p=1.0, dim=-2)
    q = F.normalize(q, p=1.0, dim=-2)
    n, d = q.shape[-2], q.shape[-1]
    if (n / d) < 1:
        return (q @ k.transpose(-2, -1)) @ v
    return q @ (k.transpose(-2, -1) @ v)


# ---------------------------------------------------------------- fast path vs reference
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("n", [1, 7, 40])  # N = 1, N < d, N > d (d = 16)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_matches_reference_forward_and_grad(name, n, dtype):
    fast, ref, _ = CASES[name]
    q, k, v = qkv(n=n, dtype=dtype, requires_grad=True)
    out_f = fast(q, k, v)
    g = torch.randn_like(out_f)
    grads_f = torch.autograd.grad(out_f, (q, k, v), g)
    out_r = ref(q, k, v)
    grads_r = torch.autograd.grad(out_r, (q, k, v), g, allow_unused=True)
    assert out_f.shape == (2, H, n, 16) and out_f.dtype == dtype
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(out_f, out_r, **tol)
    if dtype == torch.float32 and n == 1 and name.startswith("sima"):
        return  # d(q/|q|)/dq = 0 at N = 1: both fp32 sides are pure cancellation noise (checked in fp64)
    for gf, gr in zip(grads_f, grads_r):
        gr = torch.zeros_like(gf) if gr is None else gr
        torch.testing.assert_close(gf, gr, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("b,n", [(1, 40), (2, 7), (3, 40)])
def test_fast_matches_reference_on_fused_qkv_views(name, b, n):
    """q, k, v as every module produces them: strided views of one (B, N, 3, H, d) projection (for B > 1 they
    cannot be folded to (B·H, N, d) without a copy)."""
    fast, ref, _ = CASES[name]
    torch.manual_seed(b * 100 + n)
    fused = torch.randn(b, n, 3, H, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(b, H, n, 16, dtype=torch.float64)
    outs, grads = [], []
    for fn in (fast, ref):
        out = fn(*fused.permute(2, 0, 3, 1, 4).unbind(0))
        outs.append(out)
        grads.append(torch.autograd.grad(out, fused, g)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-9)
    assert outs[0].transpose(1, 2).reshape(b, n, H * 16).shape == (b, n, H * 16)


def test_sima_orders_agree_and_match_official_code():
    for n in (1, 5, 16, 63, 64, 65, 300):  # around N = d = 64
        q, k, v = qkv(n=n, d=64)
        official = official_sima(q, k, v)
        for order in ("auto", "kv_first", "qk_first"):
            # fp32 round-off: relative to the output's scale
            torch.testing.assert_close(sima_attention(q, k, v, order=order), official, rtol=1e-5,
                                       atol=1e-6 * official.abs().max().item())


def test_sima_auto_order_follows_official_rule(monkeypatch):
    from simattn.attention.sima import resolve_sima_order
    assert resolve_sima_order("auto", 63, 63, 64) == "qk_first"
    assert resolve_sima_order("auto", 64, 64, 64) == "kv_first"
    assert resolve_sima_order("auto", 197, 197, 64) == "kv_first"
    # cross-attention: from both lengths (CvT: long queries, short keys)
    assert resolve_sima_order("auto", 3136, 784, 64) == "kv_first"
    assert resolve_sima_order("auto", 1, 4, 64) == "qk_first"


def test_sima_gradcheck_double():
    for order in ("kv_first", "qk_first"):
        q, k, v = qkv(b=1, n=5, d=4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(partial(sima_attention, order=order), (q, k, v))


def test_sima_fast_path_does_not_materialize_normalized_qk(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "normalize", lambda *a, **k: calls.append(1))
    q, k, v = qkv()
    sima_attention(q, k, v)
    assert calls == []


# ---------------------------------------------------------------- invariances and shapes
@pytest.mark.parametrize("name", [c for c in CASES if c not in ("sima_qk_first",)] + ["sima_qk_first"])
def test_token_permutation_equivariance(name):
    fast, _, _ = CASES[name]
    q, k, v = qkv(n=24)
    perm = torch.randperm(24)
    out = fast(q, k, v)
    out_p = fast(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out_p, out[:, :, perm], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [c for c, (_, _, cross) in CASES.items() if cross])
@pytest.mark.parametrize("nq,nk", [(5, 30), (30, 5), (1, 12)])
def test_cross_attention_lengths(name, nq, nk):
    fast, ref, _ = CASES[name]
    q, k, v = qkv(n=nq, nk=nk)
    out = fast(q, k, v)
    assert out.shape == (2, H, nq, 16)
    torch.testing.assert_close(out, ref(q, k, v), rtol=1e-4, atol=1e-5)


def test_xca_rejects_different_lengths():
    q, k, v = qkv(n=5, nk=7)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        xca_attention(q, k, v)


# ---------------------------------------------------------------- masks
@pytest.mark.parametrize("name", MASKABLE)
def test_masked_equals_kept_subset(name):
    fast, ref, _ = CASES[name]
    q, k, v = qkv(b=2, n=12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, [1, 4, 5]] = False
    mask[1, [0, 11]] = False
    out = fast(q, k, v, mask=mask)
    out_ref = ref(q, k, v, mask=mask)
    for b in range(2):
        keep = mask[b]
        alone = fast(q[b:b + 1, :, keep], k[b:b + 1, :, keep], v[b:b + 1, :, keep])
        torch.testing.assert_close(out[b:b + 1, :, keep], alone, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out_ref[b:b + 1, :, keep], alone, rtol=1e-4, atol=1e-5)


def test_masked_sima_both_orders():
    q, k, v = qkv(b=1, n=10, d=16)
    mask = torch.tensor([[True] * 6 + [False] * 4])
    alone = sima_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6])
    for order in ("kv_first", "qk_first"):
        out = sima_attention(q, k, v, order=order, mask=mask)
        torch.testing.assert_close(out[:, :, :6], alone, rtol=1e-5, atol=1e-6)
        assert torch.all(out[:, :, 6:] == 0)  # removed query rows


# ---------------------------------------------------------------- precision
PRECISIONS = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("inputs", ["scaled_1e4", "all_zero", "some_zero_tokens"])
def test_autocast_stays_finite(name, dtype, inputs):
    fast, _, _ = CASES[name]
    q, k, v = qkv(n=50, d=16, scale=1e4 if inputs == "scaled_1e4" else 1.0)
    if inputs == "all_zero":
        q, k, v = (torch.zeros_like(t) for t in (q, k, v))
    elif inputs == "some_zero_tokens":
        for t in (q, k, v):
            t[:, :, 10:30] = 0
    with torch.autocast("cpu", dtype=dtype):
        out = fast(q.to(dtype), k.to(dtype), v.to(dtype))  # as if produced by a low-precision projection
        out2 = fast(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(out2).all()


@pytest.mark.parametrize("attn", sorted(set(list_attentions())))
@pytest.mark.parametrize("dtype", PRECISIONS)
def test_module_autocast_finite_large_inputs(attn, dtype):
    # ReLU attention's output grows with |q||k||v| (no normalization at all): finite only with its published
    # qk-LayerNorm, which the ReLU ViTs use.
    m = create_attention(attn, 32, num_heads=2, qkv_bias=True, qk_norm=attn == "relu")
    x = torch.randn(2, 17, 32) * 1e4
    with torch.autocast("cpu", dtype=dtype):
        y = m(x)
        y0 = m(torch.zeros(2, 17, 32))
    assert torch.isfinite(y).all() and torch.isfinite(y0).all()


# ---------------------------------------------------------------- SOFT
def _well_separated(b=1, n_side=8, d=16):
    return torch.randn(b, H, n_side * n_side, d) * 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_soft_matches_reference_when_converged(dtype):
    q = _well_separated().to(dtype).requires_grad_()
    v = torch.randn(1, H, 64, 16, dtype=dtype).requires_grad_()
    out = soft_attention(q, q, v, ratio=2, num_iters=60)
    ref = soft_attention_reference(q, q, v, ratio=2)
    # the landmark kernel's condition number is ~500 here: fp32 loses ~3 digits in either pseudo-inverse
    tol = dict(rtol=1e-3, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(out, ref, **tol)
    g = torch.randn_like(out)
    gr = torch.autograd.grad(ref, (q, v), g)
    for backward in ("exact", "iterative"):
        o = soft_attention(q, q, v, ratio=2, num_iters=60, backward=backward)
        gf = torch.autograd.grad(o, (q, v), g)
        for a, b in zip(gf, gr):
            scale = b.abs().max().item()
            torch.testing.assert_close(a, b, rtol=tol["rtol"] * 10, atol=tol["atol"] * 100 * scale)


def test_soft_residual_decreases_with_iterations():
    q = _well_separated(b=2)
    lm = pool_landmarks(q, (8, 8), 2)
    core = gaussian_kernel(lm, lm)
    res = [pinv_residual(core, it).max().item() for it in (1, 3, 6, 12, 25)]
    assert all(a > b for a, b in zip(res, res[1:])), res
    assert res[-1] < 1e-4


def test_soft_prefix_token_and_grid_inference():
    q = torch.randn(1, H, 1 + 36, 16) * 0.5
    v = torch.randn(1, H, 37, 16)
    out = soft_attention(q, q, v, ratio=2, num_iters=40)  # CLS + 6×6 grid inferred
    ref = soft_attention_reference(q, q, v, ratio=2)
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="square token grid"):
        soft_attention(q[:, :, :30], q[:, :, :30], v[:, :, :30])
    out_g = soft_attention(q[:, :, 1:31], q[:, :, 1:31], v[:, :, 1:31], grid_size=(5, 6), ratio=2)
    assert out_g.shape == (1, H, 30, 16)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("fn", [sima_attention, softmax_attention, xca_attention, elu_attention, relu_attention,
                                xnorm_attention, soft_attention])
def test_bad_ranks_and_shapes(fn):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="shape"):
        fn(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="head dims differ|batch and head"):
        fn(q, k[..., :8], v)
    with pytest.raises(ValueError, match="token counts differ"):
        fn(q, k, v[:, :, :5])


def test_bad_options():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="unknown order"):
        sima_attention(q, k, v, order="sideways")
    with pytest.raises(ValueError, match="unknown activation"):
        relu_attention(q, k, v, activation="swish")
    with pytest.raises(ValueError, match=r"mask must have shape \(B, N\)"):
        sima_attention(q, k, v, mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean"):
        sima_attention(q, k, v, mask=torch.ones(2, 20))
    with pytest.raises(ValueError, match="unknown backward"):
        soft_attention(q, q, v[:, :, :20], grid_size=(4, 5), backward="magic")
    with pytest.raises(ValueError, match="does not support attention masks"):
        create_attention("soft", 32, 2)(torch.randn(1, 16, 32), attn_mask=torch.ones(1, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 32\)"):
        create_attention("sima", 32, 2)(torch.randn(1, 16, 31))
    with pytest.raises(ValueError, match="multiple of num_heads"):
        create_attention("sima", 30, 4)


def test_registry():
    assert set(list_attentions()) >= {"sima", "softmax", "xca", "elu", "relu", "xnorm", "soft"}
    with pytest.raises(ValueError, match="unknown attention 'nope'; known: .*sima"):
        create_attention("nope", 32)
    assert get_attention_class("sima").__name__ == "SimAAttention"
    cls = attention_class("sima", order="qk_first")
    assert issubclass(cls, get_attention_class("sima")) and cls(32, 2).order == "qk_first"


# ---------------------------------------------------------------- modules
@pytest.mark.parametrize("attn", sorted(list_attentions()))
def test_module_in_timm_vit_trains(attn):
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3,
                              attn_layer=get_attention_class(attn))
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7, losses


def test_module_matches_timm_parameter_names():
    from timm.models.vision_transformer import Attention
    ours = create_attention("sima", 32, num_heads=4, qkv_bias=True)
    theirs = Attention(32, num_heads=4, qkv_bias=True)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())  # softmax-free module takes a softmax checkpoint


def test_sima_module_matches_functional_and_hook_point():
    m = create_attention("sima", 32, num_heads=4, qkv_bias=True)
    x = torch.randn(2, 10, 32)
    seen = []
    handle = m.qk_hook.register_forward_hook(lambda mod, inp, out: seen.append(inp))
    y = m(x)
    handle.remove()
    q, k, v = m.qkv(x).reshape(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
    expected = m.proj(official_sima(q, k, v).transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    q_hat, k_hat = seen[0]
    torch.testing.assert_close(q_hat.abs().sum(-2), torch.ones(2, 4, 8))
    torch.testing.assert_close(k_hat, F.normalize(k, p=1.0, dim=-2))


def test_sima_hook_point_costs_nothing_when_unused(monkeypatch):
    import simattn.attention.sima as sima_mod
    calls = []
    real = sima_mod.sima_normalize
    monkeypatch.setattr(sima_mod, "sima_normalize", lambda *a, **k: calls.append(1) or real(*a, **k))
    m = create_attention("sima", 32, num_heads=4)
    m(torch.randn(1, 5, 32))
    assert calls == []
    h = m.qk_hook.register_forward_hook(lambda *a: None)
    m(torch.randn(1, 5, 32))
    h.remove()
    assert calls == [1]


def test_softmax_explicit_path_equals_fused_and_exposes_weights():
    fused = create_attention("softmax", 32, num_heads=4)
    explicit = create_attention("softmax", 32, num_heads=4, fused=False)
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, 9, 32)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 3:] = False
    torch.testing.assert_close(fused(x, attn_mask=mask), explicit(x, attn_mask=mask), rtol=1e-5, atol=1e-6)
    seen = []
    explicit.attn_weights.register_forward_hook(lambda mod, inp, out: seen.append(out))
    explicit(x)
    assert seen[0].shape == (2, 4, 9, 9)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(2, 4, 9))


def test_soft_module_conv_landmarks_and_value_conv():
    m = create_attention("soft", 32, num_heads=2, landmarks="conv", ratio=2, v_conv_kernel=3)
    y = m(torch.randn(2, 1 + 16, 32))
    assert y.shape == (2, 17, 32)
    y.sum().backward()
    assert m.landmark_conv.weight.grad is not None and m.v_conv.weight.grad is not None
    y2 = m(torch.randn(1, 20, 32), grid_size=(4, 5))
    assert y2.shape == (1, 20, 32)
