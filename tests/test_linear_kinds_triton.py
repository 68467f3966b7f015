"""SLAB, FLatten, InLine, PolaFormer and ELU on SimA's Triton skeleton (their prologue and epilogue, and the feature
kinds' backward) against the kinds' plain references in fp64, forward and every gradient; without CUDA the kernels run in Triton's
interpreter on CPU (``TRITON_INTERPRET=1``, set by tests/conftest.py), with CUDA the CPU cases skip.

Bound (fp32): rms(triton − oracle) / rms(oracle) ≤ 1e-4 for the output and each gradient (round-off gives ~1e-7; a
missing dz term, a wrong slope or a double-counted chunk gives order 1, measured 0.6).
"""
import pytest
import torch

from simattn.attention import reference as R
from simattn.attention.flatten import flatten_attention
from simattn.attention.inline import inline_attention
from simattn.attention.polaformer import polaformer_attention
from simattn.attention.slab import slab_attention

from attention_cases import error_ratio, fp64_oracle, qkv_leaves, qkv_views

pytest.importorskip("triton")
from simattn.kernels import host  # noqa: E402 - in the mode conftest set
from simattn.kernels.linear import launch as st  # noqa: E402

TOL = 1e-4
PLANS = {"one_tile": (1, True), "one_launch_loop": (1, False), "split3": (3, False)}
# bf16/fp16 inputs against fp64 on the same rounded values: the kernels compute in fp32 from them and round only the
# output and gradients (bf16: 8 significant bits, fp16: 11). Measured (interpreter, every kind, output and each
# gradient) ≤ 3.6e-3 for bf16, ≤ 2.4e-4 for fp16; a missing term gives order 1.
HALF_TOL = {torch.bfloat16: 1.5e-2, torch.float16: 1e-3}


@pytest.fixture(autouse=True)
def interpreted():
    if not host.INTERPRETER:
        pytest.skip("the kernels run compiled here, not on CPU tensors")


@pytest.fixture
def forced_plan(monkeypatch):
    """Force a token-axis plan (programs per head, one tile) on calls planned from now on."""
    monkeypatch.setattr(host, "PLANS", {})
    return lambda plan: monkeypatch.setattr(st, "_plan", lambda *a: plan)


FUNCTIONS = {"slab": (slab_attention, R.slab_reference), "flatten": (flatten_attention, R.flatten_reference),
             "inline": (inline_attention, R.inline_reference),
             "polaformer": (polaformer_attention, R.polaformer_reference)}


def _params(kind, H, d, seed=1):
    """The kind's tensor parameters, one value per channel (1, H, 1, d), as leaves that take a gradient: FLatten's
    divisor s, PolaFormer's power p (1 to 2) and divisor."""
    gen = torch.Generator().manual_seed(seed)
    names = {"flatten": ["scale"], "polaformer": ["power", "scale"]}.get(kind, [])
    return {name: (torch.rand(1, H, 1, d, generator=gen) + (1.0 if name == "power" else 0.5)).requires_grad_()
            for name in names}


def _run(kind, q, k, v, backend, **params):
    return FUNCTIONS[kind][0](q, k, v, backend=backend, **params)


def _reference(kind, q, k, v, **params):
    return FUNCTIONS[kind][1](q, k, v, **params)


# SLAB's relu prologue on every plan; the kinds whose features are made in torch (no prologue) in one or two plans
@pytest.mark.parametrize("kind, plan", [("slab", plan) for plan in PLANS] + [
    ("flatten", "one_tile"), ("flatten", "split3"), ("inline", "split3"), ("polaformer", "one_launch_loop")])
def test_forward_and_gradients_match_reference(kind, plan, forced_plan):
    """Token-axis plans, forced, on strided views of a fused qkv with N = 45 (not a multiple of the 32-token tile),
    against the fp64 reference: the output, d/d(qkv) and d/d(each tensor parameter)."""
    forced_plan(PLANS[plan])
    B, H, N, d = 1, 2, 45, 16
    (q, k, v), (fused,) = qkv_leaves(((B, H, N, d), (B, H, N, d)), fused=True)
    params = _params(kind, H, d)
    out = _run(kind, q, k, v, "triton", **params)
    leaves = [fused, *params.values()]
    grads, ref, ref_grads = fp64_oracle(out, leaves, lambda hi: _reference(kind, *qkv_views(hi),
                                                                           **dict(zip(params, hi[1:]))), seed=2)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert error_ratio(out, ref) <= TOL, f"forward: {error_ratio(out, ref):.3g}"
    for a, b, name in zip(grads, ref_grads, ["qkv", *params]):
        assert error_ratio(a, b) <= TOL, f"d/d{name}: {error_ratio(a, b):.3g}"


# each dtype on two kinds: the relu prologue (SLAB) and the plain kind (InLine) in one, torch-made features in both
@pytest.mark.parametrize("kind, dtype", [("slab", torch.bfloat16), ("polaformer", torch.bfloat16),
                                         ("flatten", torch.float16), ("inline", torch.float16)],
                         ids=["slab-bf16", "polaformer-bf16", "flatten-fp16", "inline-fp16"])
def test_half_precision_within_bound(kind, dtype, forced_plan):
    forced_plan(PLANS["one_launch_loop"])
    B, H, N, d = 1, 2, 24, 16
    gen = torch.Generator().manual_seed(4)
    hi = [torch.randn(B, H, N, d, generator=gen).to(dtype).double().requires_grad_() for _ in range(3)]
    lo = [t.detach().to(dtype).requires_grad_() for t in hi]
    params = {name: t.detach() for name, t in _params(kind, H, d).items()}
    out = _run(kind, *lo, "triton", **params)
    assert out.dtype == dtype
    g = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, lo, g)
    ref = _reference(kind, *hi, **{name: t.double() for name, t in params.items()})
    ref_grads = torch.autograd.grad(ref, hi, g.double())
    assert error_ratio(out, ref) <= HALF_TOL[dtype], f"forward: {error_ratio(out, ref):.3g}"
    for a, b, name in zip(grads, ref_grads, "qkv"):
        assert a.dtype == dtype and torch.isfinite(a).all()
        assert error_ratio(a, b) <= HALF_TOL[dtype], f"d/d{name}: {error_ratio(a, b):.3g}"


def test_elu_gradients_with_a_key_mask_on_a_split_axis(forced_plan):
    """ELU's prologue derivative (elu' = exp below 0) through the feature backward, cross lengths, dv ≠ d, removed
    keys (their gradients 0), the token axis split over 3 programs (two backward launches)."""
    forced_plan(PLANS["split3"])
    gen = torch.Generator().manual_seed(5)
    B, H, n_q, n_k = 1, 2, 21, 40
    leaves = [torch.randn(B, H, n, c, generator=gen).requires_grad_() for n, c in ((n_q, 16), (n_k, 16), (n_k, 32))]
    mask = torch.rand(B, n_k, generator=gen) > 0.3
    out = st.linear_triton("elu", *leaves, mask=mask, eps=1e-6)
    grads, ref, ref_grads = fp64_oracle(out, leaves, lambda hi: R.elu_reference(*hi, mask=mask, eps=1e-6), seed=5)
    assert error_ratio(out, ref) <= TOL
    for a, b, name in zip(grads, ref_grads, "qkv"):
        assert error_ratio(a, b) <= TOL, f"d/d{name}: {error_ratio(a, b):.3g}"
    assert not grads[1].transpose(1, 2)[~mask].any() and not grads[2].transpose(1, 2)[~mask].any()


def test_backend_choice_and_refusals(monkeypatch):
    """'torch' and 'auto' on CPU tensors take torch (no kernel planned), 'triton' the kernels; 'triton' refuses what
    the kernels cannot take with a one-line error, and an unknown backend is named."""
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    monkeypatch.setattr(host, "PLANS", {})
    for backend in ("torch", "auto"):
        slab_attention(q, k, v, backend=backend)
        flatten_attention(q, k, v, backend=backend)
    assert not host.PLANS
    slab_attention(q, k, v, backend="triton")
    assert [key[0][0] for key in host.PLANS] == ["slab"]
    with pytest.raises(ValueError, match="slab: unknown backend 'cuda'"):
        slab_attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match="flatten: backend 'triton' takes float32, float16 or bfloat16"):
        flatten_attention(q.double(), k.double(), v.double(), backend="triton")


def test_registered_op_carries_the_feature_backward():
    """The path compile and export take (the custom op with registered autograd) runs the feature kinds' backward,
    not SimA's: SLAB's gradients through ``simattn::linear_attn_fwd`` equal the reference's."""
    gen = torch.Generator().manual_seed(6)
    leaves = [torch.randn(1, 2, 9, 16, generator=gen).requires_grad_() for _ in range(3)]
    out = torch.ops.simattn.linear_attn_fwd(*leaves, None, None, None, 1e-6, "slab", False, torch.float32, True)[0]
    grads, _, ref_grads = fp64_oracle(out, leaves, lambda hi: R.slab_reference(*hi, eps=1e-6), seed=6)
    for a, b, name in zip(grads, ref_grads, "qkv"):
        assert error_ratio(a, b) <= TOL, f"d/d{name}: {error_ratio(a, b):.3g}"
