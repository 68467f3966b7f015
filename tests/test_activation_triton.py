"""The flash-style Triton kernels of sigmoid and ReLU attention against the plain references (fp64), forward and
every gradient. Without CUDA they run in Triton's interpreter on CPU (``TRITON_INTERPRET=1``, set by conftest.py
before they are imported); with CUDA compiled on the GPU.

Bounds. fp32: rms(triton − oracle) / rms(oracle) ≤ 1e-4 for the output and each gradient (fp32 round-off gives
~1e-7; a wrong derivative, scale or bias gives order 1). Half inputs, against the oracle on the same rounded values:
with bf16 inputs the kernels round the weights (and dS) to bf16 before their products, and each result is rounded
once to the inputs' dtype, so two roundings of relative size up to u (the unit round-off) stand between kernel and
oracle; the interpreter converts fp32 to bf16 by truncation (up to 2u, all of one sign), so the bound is 4u: 2⁻⁶ for
bf16 (measured ~6e-3 there), 2⁻⁹ for fp16, whose weights stay fp32 and whose conversions round (measured ~3e-4).
"""
import pytest
import torch

from simattn.attention import ReLUAttention, create_attention
from simattn.attention import reference as R
from simattn.attention.backends import POLICIES, Call, choose
from simattn.attention.relu import relu_attention
from simattn.attention.sigmoid import sigmoid_attention

from attention_cases import error_ratio, fp64_oracle, qkv_leaves, qkv_views, rms

pytest.importorskip("triton")
from simattn.kernels import host  # noqa: E402 - in the mode conftest set
from simattn.kernels.pointwise import launch as at  # noqa: E402

TOL = 1e-4
HALF_TOL = {torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}


def _run(kind, qkv, **kw):
    if kind == "sigmoid":
        return sigmoid_attention(*qkv, backend="triton", **kw)
    return relu_attention(*qkv, backend="triton", **kw)


def _reference(kind, qkv, **kw):
    return (R.sigmoid_reference if kind == "sigmoid" else R.relu_reference)(*qkv, **kw)


def _compare(kind, leaves, tol, **kw):
    """Triton output and gradients against the oracle in fp64 on the same values, same upstream gradient."""
    out = _run(kind, qkv_views(leaves), **kw)
    mask = kw.pop("mask", None)
    grads, ref, ref_grads = fp64_oracle(out, leaves, lambda hi: _reference(
        kind, qkv_views(hi), mask=None if mask is None else mask.cpu(), **kw))
    assert out.shape == ref.shape and out.dtype == leaves[0].dtype
    assert error_ratio(out.cpu(), ref) <= tol, f"forward: error ratio {error_ratio(out.cpu(), ref):.3g}"
    for a, b, name in zip(grads, ref_grads, ["qkv"] if len(leaves) == 1 else ["q", "k", "v"]):
        assert a.dtype == leaves[0].dtype and torch.isfinite(a).all()
        assert error_ratio(a, b) <= tol, f"d/d{name}: error ratio {error_ratio(a, b):.3g}"
    return out, ref


CASES = {  # name → kind, ((B, H, Nq, d), (B, H, Nk, dv)), fused qkv, options
    # N past the tiles (32 tokens in the interpreter), cross lengths, dv ≠ d, b = −log n
    "sigmoid_cross_dv": ("sigmoid", ((1, 2, 21, 16), (1, 2, 37, 24)), False, {}),
    "sigmoid_fused_qkv": ("sigmoid", ((2, 1, 20, 16), (2, 1, 20, 16)), True, {}),
    "sigmoid_given_bias_d128": ("sigmoid", ((1, 1, 5, 128), (1, 1, 5, 128)), False, {"bias": -1.5}),
    "relu_alpha": ("relu", ((1, 2, 33, 16), (1, 2, 33, 16)), True, {"alpha": 0.7}),
    "relu_h_sigmoid_n1": ("relu", ((1, 2, 1, 16), (1, 2, 1, 16)), False, {"activation": "sigmoid"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_reference(case, kernel_device):
    kind, shapes, fused, kw = CASES[case]
    leaves = qkv_leaves(shapes, kernel_device, fused)[1]
    if kind == "relu" and shapes[0][2] > 1:  # relu's gradient lives on the positive scores: keep both signs
        assert 0.2 < (qkv_views(leaves)[0] @ qkv_views(leaves)[1].transpose(-2, -1) > 0).float().mean() < 0.8
    _compare(kind, leaves, TOL, **kw)


@pytest.mark.parametrize("kind", ["sigmoid", "relu"])
def test_key_mask_counts_the_kept_keys(kind, kernel_device):
    """n in b = −log n and in L^(-a) counts each example's kept keys; removed keys get no weight and no gradient,
    and an example with every key removed gives 0."""
    leaves = qkv_leaves(((3, 1, 9, 16), (3, 1, 40, 16)), kernel_device)[1]
    mask = torch.rand(3, 40, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[2] = False
    out, _ = _compare(kind, leaves, TOL, mask=mask.to(kernel_device), **({"alpha": 0.5} if kind == "relu" else {}))
    assert not out[2].any()


@pytest.mark.parametrize("kind, dtype", [("sigmoid", torch.bfloat16), ("relu", torch.float16)])
def test_half_precision_within_bound(kind, dtype, kernel_device):
    leaves = qkv_leaves(((1, 1, 40, 16), (1, 1, 40, 32)), kernel_device, dtype=dtype,
                        gen=torch.Generator().manual_seed(4))[1]
    _compare(kind, leaves, HALF_TOL[dtype])


def test_module_backend_triton_equals_torch(kernel_device):
    """The kinds' modules pass ``backend`` through: one qkv projection, both backends, same output."""
    torch.manual_seed(0)
    for name, kw in (("sigmoid", {}), ("relu", {"activation": "sigmoid", "alpha": 0.5})):
        mods = [create_attention(name, 32, num_heads=2, backend=b, **kw).to(kernel_device) for b in ("torch", "triton")]
        mods[1].load_state_dict(mods[0].state_dict())
        x = torch.randn(1, 23, 32, device=kernel_device)
        assert error_ratio(mods[1](x), mods[0](x)) <= TOL


def test_custom_ops_pass_opcheck(kernel_device):
    """Schema, fake implementations and the autograd registration of both ops, on strided views with a mask."""
    (q, k, v), _ = qkv_leaves(((1, 1, 4, 16), (1, 1, 4, 16)), kernel_device, fused=True)
    mask = torch.tensor([[True, True, True, False]], device=kernel_device)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    args = (q, k, v, mask, "sigmoid", None, None, torch.float32)
    torch.library.opcheck(torch.ops.simattn.activation_attn_fwd.default, args, test_utils=checks)
    g = torch.randn(1, 1, 4, 16, device=kernel_device)
    torch.library.opcheck(torch.ops.simattn.activation_attn_bwd.default,
                          (g, q.detach(), k.detach(), v.detach(), mask, "relu", 0.0, 1.0, torch.float32),
                          test_utils=checks)


def test_auto_runs_torch_on_cpu_and_where_the_kernels_refuse():
    q = torch.randn(1, 2, 5, 16)
    assert choose("relu", "auto", Call(q, q, q, extra="relu")) == "torch"
    refusal = POLICIES["relu"].backends["triton"]
    assert refusal(Call(q, q, q, extra="relu")) is None and refusal(Call(q, q, q, extra="sigmoid")) is None
    assert "relu or sigmoid" in refusal(Call(q, q, q, extra="gelu"))
    assert "float64" in refusal(Call(q.double(), q.double(), q.double(), extra="sigmoid"))


def test_triton_refusals_are_one_line():
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=r"^relu: backend 'triton' computes h = relu or sigmoid, got "
                                         r"activation='gelu'; backend 'auto' runs torch there$"):
        relu_attention(q, q, q, activation="gelu", backend="triton")
    with pytest.raises(ValueError, match=r"^sigmoid: unknown backend 'cuda'; expected one of auto, torch, triton$"):
        sigmoid_attention(q, q, q, backend="cuda")
    with pytest.raises(ValueError, match="ReLUAttention: unknown backend"):
        ReLUAttention(32, 2, backend="fast")


def test_a_repeat_call_reuses_its_plan(kernel_device, monkeypatch):
    """The first call at a signature plans its launch; a repeat with new values only looks it up."""
    monkeypatch.setattr(host, "PLANS", {})
    (q, k, v), _ = qkv_leaves(((1, 1, 3, 16), (1, 1, 3, 16)), kernel_device)
    with torch.no_grad():
        first = at.activation_triton(q, k, v, activation="sigmoid")
        plans = dict(host.PLANS)
        second = at.activation_triton(2 * q, k, v, activation="sigmoid")
    assert len(plans) == 1 and host.PLANS == plans
    assert rms(first - second) > 0


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(host, "PLANS", {})
    monkeypatch.setattr(host, "INTERPRETER", False)
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=r"^attention with h=sigmoid: backend 'triton' needs CUDA tensors"):
        sigmoid_attention(q, q, q, backend="triton")
