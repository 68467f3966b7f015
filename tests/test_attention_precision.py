"""Low-precision accuracy: every kind under fp16 / bf16 autocast against its fp64 oracle, forward and gradients.

Measure (flash-linear-attention's ``assert_close``): error ratio = rms(low − oracle) / rms(oracle). The inputs
are low-precision tensors (as a low-precision projection hands them over) and the oracle runs in fp64 on the same
rounded values, so the ratio measures the kernel, not the input rounding.

Bounds, per kind and dtype, in units of the dtype's machine epsilon ε (fp16 2⁻¹⁰, bf16 2⁻⁷): an output or a
gradient that is rounded once to the dtype carries an rms relative error near ε/(2√3) ≈ 0.3ε, and a few rounded
operands before it add to that; measured worst cases over several seeds are 0.3-0.6ε. The bound is 1ε, under
1 % for both dtypes, so an output off by 1 % fails it (checked in every test). Kinds that keep an fp32 island and
return fp32 under fp16 autocast (SimA, ReLU: their outputs can exceed fp16's range) are held to fp32 round-off
in the forward pass.
"""
from functools import partial
import importlib.util

import pytest
import torch

import simattn  # noqa: F401
from simattn.attention import create_attention, list_attentions
from simattn.attention import reference as R
from simattn.attention.relu import relu_attention
from simattn.attention.sima import sima_attention
from simattn.attention.soft import soft_attention

from attention_cases import CASES, error_ratio, qkv, rms

# small tensors: one intra-op thread is fastest on a shared CPU
pytestmark = pytest.mark.usefixtures("one_thread")

EPS = {torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps}
FP32_ISLAND = 1e-5  # forward bound where the op computes and returns fp32 under fp16 autocast
# kind → dtype → (forward bound, gradient bound)
BOUNDS = {
    kind: {torch.float16: (FP32_ISLAND if kind in ("sima", "relu") else EPS[torch.float16], EPS[torch.float16]),
           torch.bfloat16: (EPS[torch.bfloat16], EPS[torch.bfloat16])}
    for kind in ("sima", "softmax", "xca", "elu", "relu", "xnorm", "soft", "linformer", "performer", "nystrom",
                 "efficient", "cosformer")
}
# agent returns autocast's dtype, as softmax; sigmoid attention is unnormalized and keeps fp32 under fp16, as relu
BOUNDS.update({"agent": BOUNDS["softmax"], "sigmoid": BOUNDS["relu"]})
# the linear kinds on the grid compute in fp32 and return autocast's dtype, as ELU
BOUNDS.update({kind: BOUNDS["elu"] for kind in ("flatten", "inline", "slab", "polaformer")})
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
NO_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no triton")
SIMA_BACKENDS = ["torch", pytest.param("triton", marks=NO_TRITON)]


def _triton_mode(monkeypatch, backend, device):
    """SimA's Triton kernels run in Triton's interpreter on CPU tensors, compiled on CUDA ones."""
    if backend == "triton" and device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _kind(case):
    return case.split("_")[0]


def assert_bound(actual, expected, bound, what):
    assert bound < 0.01, f"{what}: a bound of {bound} would let a 1 % error through"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = error_ratio(actual, expected)
    assert err <= bound, f"{what}: error ratio {err:.3g} > {bound:.3g}"
    # the same comparison with the result off by 1 % (rms) fails the bound
    noise = torch.randn(actual.shape, dtype=torch.float64, device=actual.device)
    perturbed = actual.double() + 0.01 * rms(expected) / rms(noise) * noise
    assert error_ratio(perturbed, expected) > bound, f"{what}: bound {bound} passes a 1 % perturbation"


def _run(fast, oracle, inputs, dtype, device):
    """fast under autocast on low-precision leaves; the fp64 oracle on the same values; same upstream gradient."""
    lo = [t.to(device=device, dtype=dtype).requires_grad_() for t in inputs]
    with torch.autocast(device, dtype=dtype):
        out = fast(*lo)
    g = torch.randn(out.shape, dtype=torch.float64, device=device)
    g_lo = torch.autograd.grad(out, lo, g.to(out.dtype), allow_unused=True)
    hi = [t.detach().double().requires_grad_() for t in lo]
    ref = oracle(*hi)
    g_hi = torch.autograd.grad(ref, hi, g, allow_unused=True)
    return out, ref, [(a, b) for a, b in zip(g_lo, g_hi) if b is not None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_low_precision_accuracy(name, dtype, device):
    fast, oracle, _, _ = CASES[name]
    fwd_bound, grad_bound = BOUNDS[_kind(name)][dtype]
    for seed in (0, 1):
        out, ref, grads = _run(fast, oracle, qkv(n=20, seed=seed), dtype, device)
        assert_bound(out, ref, fwd_bound, f"{name} forward")
        for i, (a, b) in enumerate(grads):
            assert_bound(a, b, grad_bound, f"{name} gradient {i}")


@NO_TRITON
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision_accuracy_sima_triton(dtype, device, monkeypatch):
    """SimA's Triton kernels keep the torch path's bounds: fp32 accuracy out of fp16 work, 1ε in bf16; also with
    zero (padding) tokens."""
    _triton_mode(monkeypatch, "triton", device)
    fast = partial(sima_attention, backend="triton")
    oracle = partial(R.sima_reference, order="kv_first")
    fwd_bound, grad_bound = BOUNDS["sima"][dtype]
    for seed in (0, 1, 2):
        q, k, v = qkv(n=20, seed=seed)
        if seed == 2:
            for t in (q, k, v):
                t[:, :, 5:12] = 0
        out, ref, grads = _run(fast, oracle, (q, k, v), dtype, device)
        assert out.dtype == (torch.float32 if dtype == torch.float16 else dtype)
        assert_bound(out, ref, fwd_bound, f"sima triton forward (seed {seed})")
        for i, (a, b) in enumerate(grads):
            assert_bound(a, b, grad_bound, f"sima triton gradient {i} (seed {seed})")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_low_precision_zero_tokens(name, dtype):
    """Tokens that are exactly zero (padding) keep the bounds; all-zero inputs give the oracle's zeros."""
    fast, oracle, _, _ = CASES[name]
    fwd_bound, grad_bound = BOUNDS[_kind(name)][dtype]
    q, k, v = qkv(n=20, seed=2)
    for t in (q, k, v):
        t[:, :, 5:12] = 0
    out, ref, grads = _run(fast, oracle, (q, k, v), dtype, "cpu")
    assert_bound(out, ref, fwd_bound, f"{name} forward")
    for i, (a, b) in enumerate(grads):
        if name == "xnorm" and i == 0 and dtype == torch.float16:
            # XN(q) = γq / (‖q‖ + eps) has gradient γ/eps = 1e6 at a zero query: beyond fp16 in exact arithmetic
            assert b.abs().max() > torch.finfo(torch.float16).max
            continue
        assert_bound(a, b, grad_bound, f"{name} gradient {i}")
    zeros = [torch.zeros_like(t).to(dtype) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=dtype):
        out = fast(*zeros)
    ref = oracle(*(t.double() for t in zeros))
    assert not ref.any() and not out.any()


# ---------------------------------------------------------------- large activations (inputs × 1e4)
@pytest.mark.parametrize("n", [17, 197])
@pytest.mark.parametrize("activation", ["relu", "gelu", "relu2"])
def test_relu_fp16_large_inputs_accurate_in_fp32_island(n, activation):
    """Scores, h and the L^(-a) scale run in fp32 under fp16 autocast: finite outputs at fp32 accuracy (the output
    reaches ~1e12, far beyond fp16, so it is returned in fp32)."""
    q, k, v = qkv(b=1, n=n, scale=1e4)
    fast = lambda *t: relu_attention(*t, activation=activation)  # noqa: E731
    oracle = lambda *t: R.relu_reference(*t, activation=activation)  # noqa: E731
    out, ref, _ = _run(fast, oracle, (q, k, v), torch.float16, "cpu")
    assert out.dtype == torch.float32 and rms(ref) > torch.finfo(torch.float16).max
    assert_bound(out, ref, FP32_ISLAND, "relu ×1e4 forward")
    # fp32 leaves under fp16 autocast (activations kept in fp32): the gradients are fp32-accurate too
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.float16):
        out = fast(*leaves)
    g = torch.randn(out.shape, dtype=torch.float64)
    hi = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_grads = torch.autograd.grad(oracle(*hi), hi, g)
    for i, (a, b) in enumerate(zip(torch.autograd.grad(out, leaves, g.float()), ref_grads)):
        assert_bound(a, b, FP32_ISLAND, f"relu ×1e4 gradient {i}")
    # what cannot be fixed: gradients with respect to fp16 tensors exceed fp16's range in exact arithmetic
    assert min(b.abs().max().item() for b in ref_grads) > torch.finfo(torch.float16).max


@pytest.mark.parametrize("n", [17, 197])
def test_relu_bf16_large_inputs_backward(n):
    """bf16 has the range; the fp32 island keeps the sign tests of h exact, so the gradients (order 1e7-1e8) stay
    within the bf16 bound."""
    out, ref, grads = _run(relu_attention, R.relu_reference, qkv(b=1, n=n, scale=1e4), torch.bfloat16, "cpu")
    assert_bound(out, ref, EPS[torch.bfloat16], "relu bf16 ×1e4 forward")
    for i, (a, b) in enumerate(grads):
        assert b.abs().max() > 1e6
        assert_bound(a, b, EPS[torch.bfloat16], f"relu bf16 ×1e4 gradient {i}")


@pytest.mark.parametrize("backend", SIMA_BACKENDS)
@pytest.mark.parametrize("n", [1, 197])
def test_sima_fp16_large_inputs(n, backend, monkeypatch):
    """SimA returns fp32 under fp16 autocast: at N = 1 its output is up to d·|v| (here ~1e5, past fp16's range)."""
    _triton_mode(monkeypatch, backend, "cpu")
    q, k, v = qkv(b=1, n=n, scale=1e4)
    if n == 1:
        k = q  # every q̂_c k̂_c = 1: out = d · v, the bound
    out, ref, _ = _run(partial(sima_attention, backend=backend), R.sima_reference, (q, k, v), torch.float16, "cpu")
    assert out.dtype == torch.float32
    assert_bound(out, ref, FP32_ISLAND, "sima ×1e4 forward")
    if n == 1:
        assert ref.abs().max() > torch.finfo(torch.float16).max


def test_soft_bf16_large_inputs_kernel_underflows_in_every_precision():
    """At activations ×1e4 the Gaussian kernel of distinct tokens is exp(-1e8): 0 in every float format, fp64
    included, so SOFT's output and gradient are exactly 0 — the method's range, not a precision loss."""
    q, _, v = qkv(b=1, n=64, scale=1e4)
    fast = lambda q, v: soft_attention(q, q, v, ratio=2)  # noqa: E731
    oracle = lambda q, v: R.soft_reference(q, v, (8, 8), ratio=2)  # noqa: E731
    out, ref, grads = _run(fast, oracle, (q, v), torch.bfloat16, "cpu")
    assert not ref.any() and not out.any()
    for a, b in grads:
        assert not b.any() and not a.any()


# ---------------------------------------------------------------- modules: finite at extreme inputs
@pytest.mark.parametrize("attn", sorted(list_attentions()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_module_autocast_finite_large_and_zero_inputs(attn, dtype):
    # ReLU attention is unnormalized (output ~|q||k||v|/√d): its fp16 projection overflows at such inputs unless
    # the published qk-LayerNorm bounds the scores, as the ReLU ViTs use.
    m = create_attention(attn, 32, num_heads=2, qkv_bias=True, qk_norm=attn == "relu")
    # InLine's local branch (kernels predicted from x, applied to v) and PolaFormer's gate (xW_g, no activation)
    # make the output quadratic in x: at 1e4 it is past fp16's range in exact arithmetic (~1e11 and ~5e7), at 30
    # within it
    x = torch.randn(2, 17, 32) * (30 if attn in ("inline", "polaformer") and dtype == torch.float16 else 1e4)
    with torch.autocast("cpu", dtype=dtype):
        y = m(x)
        y0 = m(torch.zeros(2, 17, 32))
    assert torch.isfinite(y).all() and torch.isfinite(y0).all()


# ---------------------------------------------------------------- fp16 range of the graph's intermediates
class _MaxAbs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest |value| among the floating outputs of every op run under it."""

    def __init__(self):
        super().__init__()
        self.peak = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if torch.is_tensor(t) and t.is_floating_point() and t.numel():
                name = str(func.overloadpacket)
                self.peak[name] = max(self.peak.get(name, 0.0), t.detach().abs().max().item())
        return out


@pytest.mark.parametrize("scale", [3.0, 5e-8], ids=["large_norms", "small_norms"])
@pytest.mark.parametrize("order, n_q, n_k", [("kv_first", 100, 100), ("qk_first", 100, 200), ("qk_first", 200, 100)])
def test_sima_graph_stays_in_fp16_range_where_the_norm_product_does_not(order, n_q, n_k, scale):
    """Backends that run the graph in fp16 (Core ML) overflow on any intermediate past 65504: every value the op
    computes stays in range when s_q, s_k do but s_q·s_k does not (large norms: dividing by the product would
    overflow), or 1/s_q, 1/s_k do not (small norms: multiplying by reciprocals would)."""
    torch.manual_seed(0)
    q = scale * torch.randn(1, 2, n_q, 16).sign()  # every channel's l1 norm is scale·N
    k = scale * torch.randn(1, 2, n_k, 16).sign()
    v = 0.01 * torch.randn(1, 2, n_k, 16)
    s_q, s_k = q.abs().sum(-2), k.abs().sum(-2)
    fp16_max = torch.finfo(torch.float16).max
    assert s_q.max() < fp16_max and s_k.max() < fp16_max
    assert (s_q * s_k).min() > fp16_max if scale > 1 else 1 / max(s_q.max(), s_k.max()) > fp16_max
    with _MaxAbs() as rec:
        out = sima_attention(q, k, v, order=order)
    assert rec.peak and max(rec.peak.values()) < fp16_max, {op: v for op, v in rec.peak.items() if v >= fp16_max}
    assert error_ratio(out, R.sima_reference(q.double(), k.double(), v.double(), order=order)) < 1e-5
