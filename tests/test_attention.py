"""Attention kinds against their oracles (forward, input and parameter gradients, masks, causal), invariances,
attention dropout, errors and modules. Precision: test_attention_precision.py; SOFT specifics: test_soft.py."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

import simattn  # noqa: F401  (registers everything)
from simattn.attention import attention_class, create_attention, get_attention_class, list_attentions
from simattn.attention import reference as R
from simattn.attention.cosformer import cosformer_attention
from simattn.attention.efficient import efficient_attention
from simattn.attention.elu import elu_attention
from simattn.attention.linformer import linformer_attention
from simattn.attention.nystrom import nystrom_attention
from simattn.attention.performer import performer_attention
from simattn.attention.relu import relu_attention
from simattn.attention.sima import resolve_sima_order, sima_attention
from simattn.attention.soft import soft_attention
from simattn.attention.softmax import softmax_attention
from simattn.attention.xca import xca_attention
from simattn.attention.xnorm import xnorm_attention

from attention_cases import (CASES, GRID_CASES, POSITIONAL_CASES, H, LargestCopy, OpCalls, assert_grads_close,
                             assert_ratio, module_oracle, qkv)

# small tensors: one intra-op thread is fastest on a shared CPU
pytestmark = pytest.mark.usefixtures("one_thread")

# error-ratio bounds (rms(fast − oracle) / rms(oracle)) per dtype: a few hundred ulps of the working precision
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}
SOFT_TOL = {torch.float32: 2e-4, torch.float64: 1e-9}  # (M + 0.01 I)⁻¹ amplifies round-off by its condition number


def _tol(name, dtype):
    return (SOFT_TOL if name.startswith("soft") else TOL)[dtype]


def _check_against_oracle(fast, oracle, inputs, tol, what, grads=True, **kw):
    out_f = fast(*inputs, **kw)
    out_o = oracle(*inputs, **kw)
    assert out_f.shape == out_o.shape and out_f.dtype == out_o.dtype
    assert_ratio(out_f, out_o, tol, f"{what} forward")
    if not grads:
        return
    g = torch.randn_like(out_o)
    leaves = [t for t in inputs if t.requires_grad]
    g_f = torch.autograd.grad(out_f, leaves, g, allow_unused=True)
    g_o = torch.autograd.grad(out_o, leaves, g, allow_unused=True)
    assert_grads_close(g_f, g_o, tol * 10, range(len(leaves)), what)


# ---------------------------------------------------------------- functional ops vs oracles
FUNCTIONAL = [(name, n) for name in CASES for n in ((20,) if name in GRID_CASES else (1, 7, 40))]  # N = 1, < d, > d


@pytest.mark.parametrize("name,n", FUNCTIONAL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_functional_matches_oracle(name, n, dtype):
    fast, oracle, _, _ = CASES[name]
    q, k, v = qkv(n=n, dtype=dtype, requires_grad=True)
    # d(q/|q|₁)/dq = 0 at N = 1: SimA's fp32 gradients there are pure cancellation noise on both sides (fp64 checks them)
    grads = not (dtype == torch.float32 and n == 1 and name.startswith("sima"))
    _check_against_oracle(fast, oracle, (q, k, v), _tol(name, dtype), name, grads=grads)


@pytest.mark.parametrize("name", [c for c in CASES if c not in GRID_CASES])
@pytest.mark.parametrize("b,n", [(1, 40), (3, 7)])
def test_functional_on_fused_qkv_views(name, b, n):
    """q, k, v as every module produces them: strided views of one (B, N, 3, H, d) projection."""
    fast, oracle, _, _ = CASES[name]
    torch.manual_seed(b * 100 + n)
    fused = torch.randn(b, n, 3, H, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(b, H, n, 16, dtype=torch.float64)
    outs, grads = [], []
    for fn in (fast, oracle):
        out = fn(*fused.permute(2, 0, 3, 1, 4).unbind(0))
        outs.append(out)
        grads.append(torch.autograd.grad(out, fused, g)[0])
    assert_ratio(outs[0], outs[1], 1e-11, name)
    assert_ratio(grads[0], grads[1], 1e-10, name)


@pytest.mark.parametrize("name", [c for c, case in CASES.items() if case[2]])
@pytest.mark.parametrize("nq,nk", [(5, 30), (30, 5), (1, 12)])
def test_cross_attention_lengths(name, nq, nk):
    fast, oracle, _, _ = CASES[name]
    q, k, v = qkv(n=nq, nk=nk, dtype=torch.float64, requires_grad=True)
    _check_against_oracle(fast, oracle, (q, k, v), 1e-11, name)


def test_kinds_needing_equal_lengths_reject_others():
    q, k, v = qkv(n=5, nk=7)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        xca_attention(q, k, v)


# ---------------------------------------------------------------- masks
def _mask(b=2, n=12):
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, [1, 4, 5]] = False
    mask[1, [0, n - 1]] = False
    return mask


@pytest.mark.parametrize("name", [c for c, case in CASES.items() if case[3]])
def test_masked_matches_oracle_and_kept_subset(name):
    fast, oracle, _, _ = CASES[name]
    q, k, v = qkv(b=2, n=12, dtype=torch.float64, requires_grad=True)
    mask = _mask()
    _check_against_oracle(fast, oracle, (q, k, v), 1e-11, f"{name} masked", mask=mask)
    # masking = running on the kept tokens alone (the oracle on the subset: no fast path on either side)
    out = fast(q, k, v, mask=mask)
    for b in range(2):
        keep = mask[b]
        alone = oracle(q[b:b + 1, :, keep], k[b:b + 1, :, keep], v[b:b + 1, :, keep])
        assert_ratio(out[b:b + 1, :, keep], alone, 1e-11, f"{name} kept subset")


@pytest.mark.parametrize("order", ["kv_first", "qk_first"])
def test_sima_query_mask_in_cross_attention(order):
    q, k, v = qkv(b=2, n=9, nk=14, dtype=torch.float64, requires_grad=True)
    mask, q_mask = _mask(2, 14), _mask(2, 9)
    _check_against_oracle(lambda *t, **kw: sima_attention(*t, order=order, **kw),
                          lambda *t, **kw: R.sima_reference(*t, order=order, **kw), (q, k, v), 1e-11,
                          "sima q_mask", mask=mask, q_mask=q_mask)
    out = sima_attention(q, k, v, order=order, mask=mask, q_mask=q_mask)
    assert torch.all(out.transpose(1, 2)[~q_mask] == 0)  # removed query rows
    kept = sima_attention(q[:1, :, q_mask[0]], k[:1, :, mask[0]], v[:1, :, mask[0]], order=order)
    assert_ratio(out[:1, :, q_mask[0]], kept, 1e-11, "sima q_mask subset")


def test_softmax_sdpa_masks_and_causal():
    q, k, v = qkv(b=2, n=10, dtype=torch.float64, requires_grad=True)
    bool4 = torch.rand(2, H, 10, 10, generator=torch.Generator().manual_seed(0)) > 0.3
    bool4[..., 0] = True  # every query keeps a key
    additive = torch.randn(2, 1, 10, 10, dtype=torch.float64)
    for kw in (dict(mask=bool4), dict(mask=additive), dict(is_causal=True), dict(mask=_mask(2, 10))):
        _check_against_oracle(softmax_attention, R.softmax_reference, (q, k, v), 1e-11, f"softmax {list(kw)}", **kw)
    # causal: the first query sees only the first key
    out = softmax_attention(q, k, v, is_causal=True)
    assert_ratio(out[:, :, 0], v[:, :, 0], 1e-12, "causal first row")


# ---------------------------------------------------------------- modules vs oracles (forward, input and parameter grads)
MODULES = [
    ("sima", {}), ("sima", {"order": "qk_first"}), ("softmax", {}), ("softmax", {"fused": False}),
    ("xca", {}), ("elu", {}), ("relu", {"activation": "gelu", "alpha": 0.5}), ("relu", {"qk_norm": True}),
    ("xnorm", {}),
    ("soft", {"backward": "iterative", "num_prefix_tokens": 1}),
    ("soft", {"backward": "iterative", "landmarks": "conv", "v_conv_kernel": 3, "num_prefix_tokens": 0}),
    ("soft", {"backward": "iterative", "newton_init": "paper", "num_prefix_tokens": 0}),
    ("linformer", {"num_prefix_tokens": 1}), ("linformer", {"ratio": 3, "share_kv": True, "num_prefix_tokens": 0}),
    ("linformer", {"seq_len": 20, "proj_len": 7}),
    ("performer", {"num_features": 20}), ("nystrom", {"num_prefix_tokens": 1}), ("efficient", {}),
    ("cosformer", {}), ("cosformer", {"reweight": True, "num_prefix_tokens": 1}),
    # the row and column biases learned for a 3×3 grid, resized to the 4×5 one
    ("agent", {"agent_num": 9, "window": 3, "num_prefix_tokens": 1}),
    ("agent", {"agent_num": 4, "window": 5, "dwc_kernel": 0, "num_prefix_tokens": 0}),
    ("sigmoid", {}), ("sigmoid", {"qk_norm": True, "bias": -2.0}),
    # key encodings built for the 4×5 grid (zero as initialized here; tests/test_peer_kinds_linear.py moves them)
    ("flatten", {"num_prefix_tokens": 1, "pos_grid": (4, 5)}), ("inline", {"num_prefix_tokens": 1}),
    ("slab", {"num_prefix_tokens": 0, "pos_grid": (4, 5)}), ("polaformer", {"num_prefix_tokens": 1, "dwc_kernel": 3}),
]
#: kinds whose module test runs on the 4×5 grid (as ``grid_size``), after ``num_prefix_tokens`` tokens
_ON_GRID = ("soft", "linformer", "nystrom", "agent", "flatten", "inline", "slab", "polaformer")


def test_every_registered_kind_has_a_module_oracle_case():
    assert {kind for kind, _ in MODULES} == set(list_attentions())


@pytest.mark.parametrize("kind,options", MODULES, ids=[f"{k}-{'-'.join(map(str, o.values()))}" for k, o in MODULES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_module_matches_oracle(kind, options, dtype):
    torch.manual_seed(0)
    m = create_attention(kind, 24, num_heads=2, qkv_bias=True, **options).to(dtype)
    for p in m.parameters():  # move XCA's temperature, XNorm's γ, LayerNorms off their initial values
        if p.dim() <= 3 and p.numel() <= 48:
            p.data.add_(0.3 * torch.randn_like(p))
    n, calls = 20, [{}]
    if kind in _ON_GRID or getattr(m, "reweight", False):
        n = 20 + (getattr(m, "num_prefix_tokens", None) or 0)
        calls = [{"grid_size": (4, 5)}] + ([{"grid_size": (4, 5), "mask": _mask(2, n)}] if m.supports_mask else [])
    elif m.supports_mask:
        calls.append({"mask": _mask(2, n)})
    if m.supports_causal:
        calls.append({"is_causal": True})
    x = torch.randn(2, n, 24, dtype=dtype, requires_grad=True)
    params = [p for p in m.parameters()]
    tol = _tol(kind, dtype) * 10  # two extra projections
    for kw in calls:
        fwd_kw = dict(kw)
        if "mask" in fwd_kw:
            fwd_kw["attn_mask"] = fwd_kw.pop("mask")
        y = m(x, **fwd_kw)
        y_o = module_oracle(m, x, **kw)
        assert_ratio(y, y_o, tol, f"{kind} {kw} forward")
        g = torch.randn_like(y)
        assert_grads_close(torch.autograd.grad(y, [x] + params, g), torch.autograd.grad(y_o, [x] + params, g),
                           tol * 10, ["x"] + [n for n, _ in m.named_parameters()], f"{kind} {kw}")


@pytest.mark.parametrize("kind", sorted(set(list_attentions()) - {"softmax"}))
def test_kinds_without_causal_support_raise(kind):
    m = create_attention(kind, 16, num_heads=2)
    with pytest.raises(ValueError, match="does not support causal"):
        m(torch.randn(1, 16, 16), is_causal=True)


# ---------------------------------------------------------------- attention dropout
@pytest.mark.parametrize("kind", ["sima", "elu", "xnorm", "soft", "linformer", "performer", "nystrom", "efficient",
                                  "cosformer"])
def test_kinds_without_weight_matrix_reject_attn_drop(kind):
    cls = get_attention_class(kind)
    assert not cls.supports_attn_drop
    with pytest.raises(ValueError, match=r"attn_drop=0\.1 is not supported; allowed: only 0"):
        create_attention(kind, 16, num_heads=2, attn_drop=0.1)
    create_attention(kind, 16, num_heads=2, attn_drop=0.0)


@pytest.mark.parametrize("kind", ["softmax", "xca", "relu"])
def test_attn_drop_applied_in_training_only(kind):
    assert get_attention_class(kind).supports_attn_drop
    torch.manual_seed(0)
    m = create_attention(kind, 16, num_heads=2, attn_drop=0.5)
    x = torch.randn(2, 9, 16)
    m.train()
    assert not torch.allclose(m(x), m(x))
    m.eval()
    torch.testing.assert_close(m(x), m(x), rtol=0, atol=0)
    ref = create_attention(kind, 16, num_heads=2).eval()
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="allowed: 0 <= attn_drop < 1"):
        create_attention(kind, 16, num_heads=2, attn_drop=1.0)


def test_xca_attn_drop_drops_channel_weights():
    """Dropout acts on the d×d weights (as XCiT): with p → the kept weights scaled by 1/(1-p), zeros elsewhere."""
    torch.manual_seed(0)
    m = create_attention("xca", 16, num_heads=2, attn_drop=0.5).train()
    seen = []
    m.attn_weights.register_forward_hook(lambda mod, inp, out: seen.append(out))
    dropped = []
    m.attn_drop.register_forward_hook(lambda mod, inp, out: dropped.append((inp[0], out)))
    m(torch.randn(2, 9, 16))
    w_in, w_out = dropped[0]
    assert w_in.shape == (2, 2, 8, 8) and w_in is seen[0]
    zero = w_out == 0
    assert 0.2 < zero.float().mean() < 0.8
    torch.testing.assert_close(w_out[~zero], 2 * w_in[~zero])


# ---------------------------------------------------------------- SimA specifics
def official_sima(q, k, v):
    """The official code's formulation: ``normalize(p=1, dim=-2)`` on q and k, order by N / d < 1."""
    k = F.normalize(k, p=1.0, dim=-2)
    q = F.normalize(q, p=1.0, dim=-2)
    n, d = q.shape[-2], q.shape[-1]
    if (n / d) < 1:
        return (q @ k.transpose(-2, -1)) @ v
    return q @ (k.transpose(-2, -1) @ v)


def test_sima_orders_match_official_code():
    for n in (1, 5, 63, 64, 65, 300):  # around N = d = 64
        q, k, v = qkv(n=n, d=64, dtype=torch.float64)
        official = official_sima(q, k, v)
        for order in ("auto", "kv_first", "qk_first"):
            assert_ratio(sima_attention(q, k, v, order=order), official, 1e-12, f"sima {order} N={n}")


def test_sima_auto_order_follows_official_rule():
    assert resolve_sima_order("auto", 63, 63, 64) == "qk_first"
    assert resolve_sima_order("auto", 64, 64, 64) == "kv_first"
    assert resolve_sima_order("auto", 197, 197, 64) == "kv_first"
    # cross-attention: from both lengths (CvT: long queries, short keys)
    assert resolve_sima_order("auto", 3136, 784, 64) == "kv_first"
    assert resolve_sima_order("auto", 1, 4, 64) == "qk_first"


def test_sima_gradcheck_double():
    for order in ("kv_first", "qk_first"):
        q, k, v = qkv(b=1, n=5, d=4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda *t: sima_attention(*t, order=order), (q, k, v))


def test_sima_fast_path_does_not_materialize_normalized_qk(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "normalize", lambda *a, **k: calls.append(1))
    q, k, v = qkv()
    sima_attention(q, k, v)
    assert calls == []


# (B, H, N, d): batch 1 and small items (the general path), and large items with B > 1 (one batch item at a time
# on the strided views)
INFERENCE_SHAPES = [(1, 4, 65, 16), (3, 4, 65, 16), (1, 2, 300, 32), (2, 2, 300, 32)]


@pytest.mark.parametrize("shape", INFERENCE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sima_inference_matches_oracle_on_fused_views(shape, dtype):
    """Without autograd SimA may run per batch item on the views; its values stay the oracle's, on the views of
    one fused projection (as modules call it) and on separate contiguous tensors, under no_grad and inference_mode,
    with cross lengths (CvT's strided keys) and with a channel whose norm is 0 (eps)."""
    b, h, n, d = shape
    gen = torch.Generator().manual_seed(n * 10 + b)
    fused = torch.randn(b, n, 3, h, d, generator=gen, dtype=dtype)
    fused[..., 0, :, 3] = 0  # q's channel 3
    views = fused.permute(2, 0, 3, 1, 4).unbind(0)
    for keys in (n, n // 2):
        q, k, v = views[0], views[1][:, :, :keys], views[2][:, :, :keys]
        expected = R.sima_reference(q.double(), k.double(), v.double(), order="kv_first").to(dtype)
        for inputs in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
            for context in (torch.inference_mode, torch.no_grad):
                with context():
                    out = sima_attention(*inputs)
                assert out.dtype == dtype and out.shape == (b, h, n, d) and torch.isfinite(out).all()
                assert_ratio(out, expected, TOL[dtype], f"sima inference {shape}, {keys} keys")


def test_sima_inference_per_item_copies_nothing():
    """Large items with B > 1 from one fused projection: without autograd no copy of q, k or v is made (the general
    path copies them into (B·H, N, d) blocks, as it does with autograd on), and the output needs none to merge its
    heads."""
    large = torch.randn(2, 300, 3, 2, 32).permute(2, 0, 3, 1, 4).unbind(0)
    with torch.inference_mode(), LargestCopy() as calls:
        out = sima_attention(*large)
    assert calls.largest < large[0].numel() // 2, calls.largest
    merged = out.transpose(1, 2).reshape(2, 300, 64)  # token-major output: merging the heads is a view
    assert merged.data_ptr() == out.data_ptr()
    leaves = [t.detach().requires_grad_() for t in large]
    with LargestCopy() as grad_calls:
        sima_attention(*leaves)
    assert grad_calls.largest >= large[0].numel()


def test_sima_captured_graph_keeps_the_general_path():
    """torch.export records the general path (two batched products, not one pair per batch item) even without
    autograd where eager runs per item, and the exported program computes what eager does."""
    m = create_attention("sima", 64, num_heads=2).eval()
    x = torch.randn(3, 300, 64)
    with torch.no_grad():
        ep = torch.export.export(m, (x,))
        eager_out = m(x)
    ops = [str(node.target) for node in ep.graph.nodes if node.op == "call_function"]
    assert sum("bmm" in op for op in ops) == 2, ops
    torch.testing.assert_close(ep.module()(x), eager_out)


# SimA's torch path against the fp64 oracle on the same (rounded) inputs, per branch: error ratios, forward and
# gradient. fp32: TOL, gradients 10×. bf16 / fp16: one machine epsilon of the dtype, as in
# test_attention_precision.py (one rounding of a result carries an rms error near 0.3ε); an fp32 result (the products
# under fp16 autocast) is held to fp32's bound.
_EPS16 = {dt: torch.finfo(dt).eps for dt in (torch.bfloat16, torch.float16)}
SIMA_BRANCH_TOL = {torch.float32: (TOL[torch.float32], 10 * TOL[torch.float32]),
                   torch.bfloat16: (_EPS16[torch.bfloat16], _EPS16[torch.bfloat16]),
                   torch.float16: (_EPS16[torch.float16], _EPS16[torch.float16])}


def _sima_views(dtype, requires_grad=False):
    """q, k, v (2, 2, 300, 32): the views of one fused projection, items large enough for the per-item branch."""
    fused = torch.randn(2, 300, 3, 2, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    fused.requires_grad_(requires_grad)
    return fused, fused.permute(2, 0, 3, 1, 4).unbind(0)


def _sima_oracle(fused, g=None):
    """The fp64 oracle on the values of ``fused`` and, given an upstream gradient g, its gradient for ``fused``."""
    hi = fused.detach().double().requires_grad_()
    ref = R.sima_reference(*hi.permute(2, 0, 3, 1, 4).unbind(0), order="kv_first")
    return ref, (None if g is None else torch.autograd.grad(ref, hi, g)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_sima_torch_batched_branch_matches_the_oracle(dtype):
    """With autograd the torch path runs its batched products (a contiguous output), in the inputs' dtype or under
    that dtype's autocast; forward and gradient stay within the dtype's bound of the oracle."""
    fused, (q, k, v) = _sima_views(dtype, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = sima_attention(q, k, v, order="kv_first", backend="torch")
    assert out.is_contiguous()
    fwd, grad = SIMA_BRANCH_TOL[torch.float32 if out.dtype == torch.float32 else dtype]
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ref, ref_grad = _sima_oracle(fused, g)
    assert_ratio(out, ref, fwd, f"batched {dtype} forward")
    assert_ratio(torch.autograd.grad(out, fused, g.to(out.dtype))[0], ref_grad, SIMA_BRANCH_TOL[dtype][1],
                 f"batched {dtype} gradient")


@pytest.mark.parametrize("autocast", [None, torch.float16, torch.bfloat16], ids=["off", "fp16", "bf16"])
def test_sima_torch_per_item_branch_matches_the_oracle(autocast):
    """Without autograd, fp32 views of a fused projection with B > 1 and large items run one batch item at a time
    (a token-major output), also under fp16 autocast, where the products stay fp32; under bf16 autocast the products
    are bf16 and the batched branch runs. Forward only: the per-item branch runs without autograd, whose gradients
    are the batched branch's."""
    fused, (q, k, v) = _sima_views(torch.float32)
    with torch.inference_mode(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = sima_attention(q, k, v, order="kv_first", backend="torch")
    per_item = out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    assert per_item == (autocast != torch.bfloat16)
    assert_ratio(out, _sima_oracle(fused)[0], SIMA_BRANCH_TOL[out.dtype][0], f"per-item, autocast {autocast}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_sima_torchscript_branch_matches_the_oracle(dtype):
    """Scripted, the module's attention runs the torch path's TorchScript branch (products in fp32, the output in
    the inputs' dtype): forward and gradient within the dtype's bound of the oracle, and a key mask masks the
    queries too."""
    m = create_attention("sima", 64, num_heads=2).to(dtype)
    fused, (q, k, v) = _sima_views(dtype, requires_grad=True)
    with torch.jit.optimized_execution(False):  # the plain interpreter: no profiling runs
        attend = torch.jit.script(m).attend
        out = attend(q, k, v, None)
        g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
        grad = torch.autograd.grad(out, fused, g.to(dtype))[0]
        mask = torch.rand(2, 300, generator=torch.Generator().manual_seed(5)) > 0.3
        masked = attend(q.detach(), k.detach(), v.detach(), mask)
    assert out.dtype == dtype
    ref, ref_grad = _sima_oracle(fused, g)
    assert_ratio(out, ref, SIMA_BRANCH_TOL[dtype][0], f"TorchScript {dtype} forward")
    assert_ratio(grad, ref_grad, SIMA_BRANCH_TOL[dtype][1], f"TorchScript {dtype} gradient")
    hi = [t.detach().double() for t in (q, k, v)]
    assert_ratio(masked, R.sima_reference(*hi, order="kv_first", mask=mask), SIMA_BRANCH_TOL[dtype][0],
                 f"TorchScript {dtype} masked")


def test_sima_output_bound():
    """|out[n, e]| ≤ d · max_j |v[j, e]| and Σ_n |out[n, e]| ≤ d · max_j |v[j, e]| (the docstring's bound),
    reached at N = 1 with q = k (every q̂, k̂ entry ±1, out = d · v)."""
    d = 16
    for n in (1, 3, 50):
        q, k, v = qkv(n=n, d=d, dtype=torch.float64, scale=1e4)
        for order in ("kv_first", "qk_first"):
            out = sima_attention(q, k, v, order=order)
            vmax = v.abs().amax(-2, keepdim=True)  # (B, H, 1, d)
            assert (out.abs() <= d * vmax * (1 + 1e-12)).all()
            assert (out.abs().sum(-2, keepdim=True) <= d * vmax * (1 + 1e-12)).all()
    q, _, v = qkv(n=1, d=d, dtype=torch.float64, scale=1e4)
    assert_ratio(sima_attention(q, q, v), d * v, 1e-14, "bound reached at N = 1")
    # what the bound means for fp16: under fp16 autocast the op returns fp32, so d·|v| > 65504 stays finite
    v = torch.full_like(v, 5000.0)
    with torch.autocast("cpu", dtype=torch.float16):
        out = sima_attention(q.half(), q.half(), v.half())
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert out.abs().max().item() == pytest.approx(d * 5000.0)


@pytest.mark.parametrize("b,n", [(1, 65), (3, 65), (2, 300)])
def test_sima_module_takes_both_norms_in_one_reduction(b, n):
    """Eager, the module takes the l1 norms of q and k in one reduction over its fused projection, with and
    without autograd (large items with B > 1 then run one batch item at a time), and stays the oracle's in values
    and gradients; with a mask or a hook it runs the functional op, one reduction per norm (the hook's q̂ and k̂
    take theirs again)."""
    torch.manual_seed(n + b)
    m = create_attention("sima", 64, num_heads=4, qkv_bias=True).double()
    x = torch.randn(b, n, 64, dtype=torch.float64, requires_grad=True)
    expected = module_oracle(m, x)
    for context in (torch.no_grad, torch.inference_mode, torch.enable_grad):
        with context(), OpCalls() as calls:
            out = m(x)
        assert calls.counts.get("aten.abs") == 1, calls.counts
        assert_ratio(out, expected, 1e-12, f"{context.__name__} B={b} N={n}")
    g = torch.randn_like(out)
    leaves = [x, m.qkv.weight]
    assert_grads_close(torch.autograd.grad(out, leaves, g), torch.autograd.grad(expected, leaves, g), 1e-10,
                       ["x", "qkv.weight"], "fused norms")
    with torch.no_grad(), OpCalls() as calls:
        m(x, attn_mask=torch.ones(b, n, dtype=torch.bool))
    assert calls.counts.get("aten.abs") == 2, calls.counts
    handle = m.qk_hook.register_forward_hook(lambda *a: None)
    with torch.no_grad(), OpCalls() as calls:
        out = m(x)
    handle.remove()
    assert calls.counts.get("aten.abs") == 4, calls.counts  # the op's two norms, and the two of q̂, k̂ for the hook
    assert_ratio(out, expected, 1e-12, "with a hook")


def test_sima_module_hook_point_sees_normalized_qk():
    m = create_attention("sima", 32, num_heads=4, qkv_bias=True)
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    m = m.double()
    seen = []
    handle = m.qk_hook.register_forward_hook(lambda mod, inp, out: seen.append(inp))
    m(x)
    handle.remove()
    q, k, _ = m.qkv(x).reshape(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
    q_hat, k_hat = seen[0]
    assert_ratio(q_hat, q / q.abs().sum(-2, keepdim=True), 1e-14, "q̂")
    assert_ratio(k_hat, k / k.abs().sum(-2, keepdim=True), 1e-14, "k̂")


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


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
def test_sima_call_checks_its_inputs_and_chooses_its_path_once(backend, monkeypatch):
    """The functional op and the module (its fused path eagerly in fp32, the op under autocast or with a mask)
    check q, k, v once and resolve backend and order once per call (the Triton path with its launches skipped)."""
    import contextlib

    import simattn.attention.sima as sima_mod
    dry_run = contextlib.nullcontext
    if backend == "triton":
        dry_run = pytest.importorskip("simattn.kernels.host").dry_run
    counts = {}
    for name in ("check_qkv", "choose", "resolve_sima_order"):
        real = getattr(sima_mod, name)
        monkeypatch.setattr(sima_mod, name, lambda *a, _real=real, _name=name, **kw: counts.update(
            {_name: counts.get(_name, 0) + 1}) or _real(*a, **kw))
    m = create_attention("sima", 32, num_heads=4, backend=backend)
    x = torch.randn(2, 10, 32)
    q, k, v = torch.randn(3, 2, 4, 10, 8).unbind(0)
    calls = {"op": lambda: sima_attention(q, k, v, backend=backend), "module": lambda: m(x),
             "module, mask": lambda: m(x, attn_mask=torch.ones(2, 10, dtype=torch.bool)),
             "module, autocast": lambda: m(x)}
    for what, call in calls.items():
        counts.clear()
        with dry_run(), torch.autocast("cpu", enabled=what.endswith("autocast"), dtype=torch.bfloat16):
            call()
        assert counts == {"check_qkv": 1, "choose": 1, "resolve_sima_order": 1}, what


# ---------------------------------------------------------------- invariances
@pytest.mark.parametrize("name", [c for c in CASES if c not in POSITIONAL_CASES])
def test_token_permutation_equivariance(name):
    fast, _, _, _ = CASES[name]
    q, k, v = qkv(n=24, dtype=torch.float64)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    out = fast(q, k, v)
    out_p = fast(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    assert_ratio(out_p, out[:, :, perm], 1e-12, name)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("fn", [sima_attention, softmax_attention, xca_attention, elu_attention, relu_attention,
                                xnorm_attention, soft_attention, efficient_attention, cosformer_attention,
                                nystrom_attention, partial(linformer_attention, proj_k=torch.ones(5, 20)),
                                partial(performer_attention, features=torch.ones(8, 16))])
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
    with pytest.raises(ValueError, match="unknown newton_init 'magic'; expected one of released, paper"):
        soft_attention(q, q, v[:, :, :20], grid_size=(4, 5), newton_init="magic")
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


# ---------------------------------------------------------------- modules in timm
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


def test_softmax_explicit_path_exposes_weights():
    explicit = create_attention("softmax", 32, num_heads=4, fused=False)
    seen = []
    explicit.attn_weights.register_forward_hook(lambda mod, inp, out: seen.append(out))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 3:] = False
    explicit(torch.randn(2, 9, 32), attn_mask=mask)
    assert seen[0].shape == (2, 4, 9, 9)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(2, 4, 9))
    assert torch.all(seen[0][1, :, :, 3:] == 0)


def _channel_major(t):
    """``t`` (…, N, d) stored with the tokens innermost, as a conv map's channels are."""
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_whatever_the_layouts(name):
    """Each fast path's gradients equal its oracle's (on contiguous copies) for q, k, v and incoming gradients
    stored token-major (views of one fused projection) or channel-major, in fp64."""
    fast, oracle, _, _ = CASES[name]
    torch.manual_seed(7)
    b, n, d = 2, 20, 16
    fused = torch.randn(b, n, 3, H, d, dtype=torch.float64)
    g0 = torch.randn(b, H, n, d, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in fused.permute(2, 0, 3, 1, 4).unbind(0)]
    expected = torch.autograd.grad(oracle(*leaves), leaves, g0, allow_unused=True)
    grad_token_major = g0.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, d) storage, as proj's grad
    for grad_name, g in (("token-major", grad_token_major), ("channel-major", _channel_major(g0))):
        base = fused.clone().requires_grad_(True)
        got = torch.autograd.grad(fast(*base.permute(2, 0, 3, 1, 4).unbind(0)), base, g)[0]
        assert_grads_close(got.permute(2, 0, 3, 1, 4).unbind(0), expected, 1e-10, "qkv",
                           f"{name} q/k/v token-major, gradient {grad_name}")
        inputs = [_channel_major(t).requires_grad_(True) for t in fused.permute(2, 0, 3, 1, 4).unbind(0)]
        got = torch.autograd.grad(fast(*inputs), inputs, g, allow_unused=True)
        assert_grads_close(got, expected, 1e-10, "qkv", f"{name} q/k/v channel-major, gradient {grad_name}")
