"""SimA's Triton backend against the plain reference (fp64), forward and every gradient; without CUDA the kernels
run in Triton's interpreter on CPU (``TRITON_INTERPRET=1``, which tests/conftest.py sets before they are imported),
with CUDA compiled on the GPU (the CPU cases skip there).

Bound (fp32): rms(triton − oracle) / rms(oracle) ≤ 1e-4 for the output and for each gradient, and each gradient's
rms error relative to the largest gradient's rms (:func:`attention_cases.assert_grads_close`) for those that vanish
identically (at N = 1, the q and k gradients). fp32 round-off gives ~1e-7; a wrong sign term or a missing norm gives order 1.
"""
import os
import subprocess
import sys

import pytest
import torch

from simattn.attention import SimAAttention, create_attention
from simattn.attention import reference as R
from simattn.attention.backends import Call, choose
from simattn.attention.sima import sima_attention

from attention_cases import LargestCopy, assert_grads_close, error_ratio, fp64_oracle, qkv_leaves, qkv_views, rms

pytest.importorskip("triton")
from simattn.kernels import host  # noqa: E402 - in the mode conftest set
from simattn.kernels.linear import kernels as K  # noqa: E402
from simattn.kernels.linear import launch as st  # noqa: E402

TOL = 1e-4
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture
def triton_mode(request):
    """CPU tensors need the interpreter, CUDA ones compiled kernels: the mode the kernels were imported in."""
    device = request.node.callspec.params.get("device", "cpu") if hasattr(request.node, "callspec") else "cpu"
    if (device == "cpu") != host.INTERPRETER:
        pytest.skip(f"the kernels run {'in the interpreter' if host.INTERPRETER else 'compiled'}, not on {device}")
    return device


@pytest.fixture
def forced_plan(monkeypatch):
    """Force a token-axis plan (programs per head, one tile) on calls planned from now on."""
    monkeypatch.setattr(host, "PLANS", {})
    return lambda plan: monkeypatch.setattr(st, "_plan", lambda *a: plan)


def _compare(qkv, leaves, **kw):
    """Triton output and gradients (fp32) against the oracle in fp64 on the same values, same upstream gradient."""
    out = sima_attention(*qkv, backend="triton", **kw)
    cpu = {key: value.cpu() if torch.is_tensor(value) else value for key, value in kw.items()}
    grads, ref, ref_grads = fp64_oracle(out, leaves, lambda hi: R.sima_reference(*qkv_views(hi), order="kv_first",
                                                                                   **cpu))
    assert out.dtype == torch.float32 and out.shape == ref.shape
    err = error_ratio(out.cpu(), ref)
    assert err <= TOL, f"forward: error ratio {err:.3g}"
    names = ["qkv"] if len(leaves) == 1 else ["q", "k", "v"]
    assert_grads_close(grads, ref_grads, TOL, names, "triton")
    scale = max(rms(b) for b in ref_grads)
    for a, b, name in zip(grads, ref_grads, names):
        if rms(b) > 1e-3 * scale:  # each gradient that does not vanish identically, to its own size as well
            assert error_ratio(a, b) <= TOL, f"d/d{name}: error ratio {error_ratio(a, b):.3g}"
    return out, ref


CASES = {  # name → ((B, H, Nq, d), (B, H, Nk, dv)), layout
    "contiguous": (((2, 2, 20, 16), (2, 2, 20, 16)), "contiguous"),
    "fused_qkv": (((2, 2, 33, 32), (2, 2, 33, 32)), "qkv"),
    "n1": (((1, 2, 1, 32), (1, 2, 1, 32)), "contiguous"),
    "n7_d64": (((1, 2, 7, 64), (1, 2, 7, 64)), "contiguous"),
    "n197": (((2, 2, 197, 32), (2, 2, 197, 32)), "qkv"),
    "cross_lengths_dv": (((1, 3, 7, 32), (1, 3, 50, 16)), "contiguous"),
    "d128": (((1, 1, 70, 128), (1, 1, 70, 128)), "contiguous"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_reference(case, device, triton_mode):
    shapes, layout = CASES[case]
    _compare(*qkv_leaves(shapes, device, layout == "qkv"))


@pytest.mark.parametrize("device", DEVICES)
def test_long_axis_split_over_programs(device, triton_mode):
    """N = 513: one token past a power of two; on CPU the interpreter splits the token axis over 4 programs per
    head (two launches each way), on a GPU the plan depends on its size."""
    _compare(*qkv_leaves(((1, 1, 513, 32), (1, 1, 513, 32)), device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "qkv"])
def test_key_mask(device, layout, triton_mode):
    """A key keep-mask also masks the queries at equal lengths: masked rows are zero, gradients too."""
    qkv, leaves = qkv_leaves(((2, 2, 50, 16), (2, 2, 50, 16)), device, layout == "qkv")
    mask = torch.rand(2, 50, generator=torch.Generator().manual_seed(1)).to(device) > 0.3
    mask[1, :] = False  # a batch entry with every token removed: all norms clamp to eps, output 0
    out, _ = _compare(qkv, leaves, mask=mask)
    assert not out[~mask[:, None, :, None].expand_as(out)].any()


@pytest.mark.parametrize("device", DEVICES)
def test_query_and_key_masks_cross_lengths(device, triton_mode):
    qkv, leaves = qkv_leaves(((2, 2, 7, 16), (2, 2, 40, 16)), device)
    gen = torch.Generator().manual_seed(2)
    mask, q_mask = torch.rand(2, 40, generator=gen) > 0.3, torch.rand(2, 7, generator=gen) > 0.3
    _compare(qkv, leaves, mask=mask.to(device), q_mask=q_mask.to(device))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_channels_clamp_to_eps(device, triton_mode):
    """A channel that is zero over every token has its norm clamped to eps: no sign term, finite gradients."""
    qkv, leaves = qkv_leaves(((1, 2, 20, 16), (1, 2, 20, 16)), device)
    with torch.no_grad():
        for t in leaves[:2]:
            t[..., 3] = 0
    _compare(qkv, leaves)


def test_fused_qkv_views_are_not_copied(triton_mode):
    """The kernels read q, k, v through their strides: forward and backward copy nothing of their size."""
    (q, k, v), leaves = qkv_leaves(((2, 2, 40, 16), (2, 2, 40, 16)), "cpu", True)
    assert not q.is_contiguous()
    mask = torch.ones(2, 40, dtype=torch.bool)
    with LargestCopy() as rec:
        out = sima_attention(q, k, v, backend="triton", mask=mask)
        # gradients of the views themselves: stacking them into the fused tensor's gradient is autograd's copy
        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(g.shape == q.shape for g in grads)
    assert rec.largest < q.numel(), f"a copy of {rec.largest} elements (q has {q.numel()})"


def test_module_backend_triton_matches_torch(triton_mode):
    m = create_attention("sima", 32, num_heads=2, qkv_bias=True)
    x = torch.randn(2, 33, 32, requires_grad=True)
    mask = torch.rand(2, 33) > 0.2
    ref = m(x, attn_mask=mask)
    g_ref = torch.autograd.grad(ref.sum(), x)[0]
    m.backend = "triton"
    out = m(x, attn_mask=mask)
    assert error_ratio(out, ref) < TOL
    assert error_ratio(torch.autograd.grad(out.sum(), x)[0], g_ref) < TOL
    assert "backend='triton'" in repr(m)


PLANS = {"one_tile": (1, True), "one_launch_loop": (1, False), "split3": (3, False)}


@pytest.mark.parametrize("plan", list(PLANS))
def test_every_launch_plan_matches_reference(plan, triton_mode, forced_plan):
    """Each way the kernels cover the token axis, forced: a head in one tile (q, k, v read once), one program per
    head looping over tiles, the axis split over 3 programs per head (a partial-sum launch first, each way), on
    strided views of a fused qkv projection with a key mask, odd N, and a batch entry whose tokens are all masked."""
    forced_plan(PLANS[plan])
    qkv, leaves = qkv_leaves(((2, 2, 45, 16), (2, 2, 45, 16)), "cpu", True)
    mask = torch.rand(2, 45, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[1, :] = False
    _compare(qkv, leaves, mask=mask)


# bf16/fp16 inputs against the fp64 reference on the same (rounded) values: bf16 rounds W and the output to 8
# significant bits (the interpreter truncates, up to 2^-7 relative), fp16 rounds the output to 11 (and TF32 on a GPU
# rounds W to 11): rms error ratios ~7e-3 and ~4e-4 measured; a missing norm or sign term gives order 1.
HALF_TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("plan", ["natural", "split3"])
def test_half_precision_within_bound(dtype, plan, device, triton_mode, forced_plan):
    if plan != "natural":
        forced_plan(PLANS[plan])
    gen = torch.Generator().manual_seed(4)
    B, H, N, d, dv = 2, 2, 70, 16, 32
    hi = [torch.randn(B, H, N, c, generator=gen).to(dtype).double().requires_grad_() for c in (d, d, dv)]
    lo = [t.detach().to(device, dtype).requires_grad_() for t in hi]
    out = sima_attention(*lo, backend="triton")
    assert out.dtype == dtype
    g = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, lo, g.to(device))
    ref = R.sima_reference(*hi, order="kv_first")
    ref_grads = torch.autograd.grad(ref, hi, g.double())
    assert error_ratio(out.cpu(), ref) <= HALF_TOL[dtype], f"forward: {error_ratio(out.cpu(), ref):.3g}"
    for a, b, name in zip(grads, ref_grads, "qkv"):
        assert a.dtype == dtype and torch.isfinite(a).all()
        assert error_ratio(a.cpu(), b) <= HALF_TOL[dtype], f"d/d{name}: {error_ratio(a.cpu(), b):.3g}"


@pytest.mark.parametrize("kind", ["elu", "xnorm"])
@pytest.mark.parametrize("plan", ["one_tile", "one_launch_loop", "split3"])
def test_elu_and_xnorm_forward_match_reference(kind, plan, triton_mode, forced_plan):
    """ELU and XNorm on SimA's skeleton (their prologue and epilogue), forward, fp32, dv ≠ d, a key mask, cross
    lengths, per-head γ (XNorm) against their plain references in fp64."""
    forced_plan(PLANS[plan])
    gen = torch.Generator().manual_seed(5)
    B, H, n_q, n_k = 2, 3, 21, 40
    q, k = torch.randn(B, H, n_q, 16, generator=gen), torch.randn(B, H, n_k, 16, generator=gen)
    v = torch.randn(B, H, n_k, 32, generator=gen)
    mask = torch.rand(B, n_k, generator=gen) > 0.3
    if kind == "elu":
        out = st.linear_triton("elu", q, k, v, mask=mask, eps=1e-6)
        ref = R.elu_reference(q.double(), k.double(), v.double(), mask=mask, eps=1e-6)
    else:
        gamma_q, gamma_kv = torch.rand(H, generator=gen) + 0.5, torch.rand(H, generator=gen) + 0.5
        gamma = (gamma_q * gamma_kv).repeat(B)
        out = st.linear_triton("xnorm", q, k, v, mask=mask, gamma=gamma, eps=1e-6)
        ref = R.xnorm_reference(q.double(), k.double(), v.double(), gamma_q=gamma_q.double().view(1, H, 1, 1),
                                gamma_kv=gamma_kv.double().view(1, H, 1, 1), mask=mask, eps=1e-6)
    assert out.shape == ref.shape
    assert error_ratio(out, ref) <= TOL, f"{kind}: error ratio {error_ratio(out, ref):.3g}"


def test_custom_ops_pass_opcheck(triton_mode):
    """torch.library.opcheck on both ops (schema, fake implementation, autograd registration), with masks and
    strided views, in the interpreter."""
    (q, k, v), _ = qkv_leaves(((1, 2, 9, 16), (1, 2, 9, 16)), "cpu", True)
    mask = torch.tensor([[True] * 7 + [False] * 2])
    args = (q, k, v, mask, mask, None, 1e-12, "sima", False, torch.float32, True)
    # AOT dispatch is exercised by the torch.compile test below; here the schema, fake and autograd registrations
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.simattn.linear_attn_fwd.default, args, test_utils=checks)
    out, kvn, s_q, s_k = torch.ops.simattn.linear_attn_fwd(*args)
    g = torch.randn_like(out)
    torch.library.opcheck(torch.ops.simattn.linear_attn_bwd.default,
                          (g, q.detach(), k.detach(), v.detach(), mask, mask, None, kvn, s_q, s_k, 1e-12, "sima", False,
                           torch.float32, True),
                          test_utils=checks)


def test_compile_fullgraph_traces_through_the_op(triton_mode):
    """torch.compile(fullgraph=True) (a graph break would raise) of SimA's Triton path with its backward, AOT
    autograd on CPU in the interpreter: the compiled gradients equal eager's."""
    torch._dynamo.reset()
    (q, k, v), leaves = qkv_leaves(((1, 2, 20, 16), (1, 2, 20, 16)), "cpu", True)
    mask = torch.rand(1, 20, generator=torch.Generator().manual_seed(6)) > 0.2

    def step(q, k, v):
        return sima_attention(q, k, v, backend="triton", mask=mask).square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    g_eager = torch.autograd.grad(step(q, k, v), leaves)[0]
    g_compiled = torch.autograd.grad(compiled(q, k, v), leaves)[0]
    torch._dynamo.reset()
    assert error_ratio(g_compiled, g_eager) <= 1e-6


# ---------------------------------------------------------------- options and errors
def test_auto_is_the_cpu_kernel_where_built_and_torch_on_other_devices(monkeypatch):
    from simattn.kernels.cpu import sima as sima_cpu

    q = torch.zeros(1, 1, 4, 8)
    monkeypatch.setattr(sima_cpu, "available", lambda: False)
    assert choose("sima", "auto", Call(q, q, q)) == "torch"
    monkeypatch.setattr(sima_cpu, "available", lambda: True)
    assert choose("sima", "auto", Call(q, q, q)) == "cpp"
    meta = q.to("meta")
    assert choose("sima", "auto", Call(meta, meta, meta)) == "torch"  # other devices: torch, not Triton
    assert "backend='auto'" in repr(SimAAttention(16, num_heads=2))


def test_auto_falls_back_to_torch_where_triton_refuses():
    from simattn.attention.backends import POLICIES

    refusal = POLICIES["sima"].backends["triton"]
    q = torch.zeros(1, 1, 8, 16)
    assert refusal(Call(q, q, q)) is None
    assert "q̂(k̂ᵀv)" in refusal(Call(q, q, q, extra=("qk_first", "qk_first", False)))
    assert "float64" in refusal(Call(q.double(), q.double(), q.double()))
    wide = torch.zeros(1, 1, 8, 256)
    assert "head dims up to 128" in refusal(Call(wide, wide, wide))
    on_gpu = dict(device="cuda", grad=False, graph=None, autocast=None, capability=None)
    assert choose("sima", "auto", Call(q, q, q, **on_gpu)) == "triton"
    assert choose("sima", "auto", Call(q, q, q, extra=("auto", "qk_first", False), **on_gpu)) == "torch"
    assert choose("sima", "auto", Call(wide, wide, wide, **on_gpu)) == "torch"


def test_module_refuses_an_empty_token_axis_as_the_op_does():
    m = SimAAttention(32, num_heads=2).eval()
    with pytest.raises(ValueError, match="sima: empty token axis"):
        sima_attention(*torch.randn(3, 2, 2, 0, 16).unbind(0))
    with pytest.raises(ValueError, match="sima: empty token axis"):
        m(torch.randn(2, 0, 32))


def test_bad_backend_is_one_line_naming_the_choices():
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with pytest.raises(ValueError, match=r"unknown backend 'cuda'; expected one of auto, torch, triton, cpp") as info:
        sima_attention(q, k, v, backend="cuda")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        SimAAttention(16, num_heads=2, backend="fast")


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(host, "INTERPRETER", False)  # as if imported without TRITON_INTERPRET
    monkeypatch.setattr(host, "PLANS", {})
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with pytest.raises(ValueError, match="needs CUDA tensors \\(or TRITON_INTERPRET=1"):
        sima_attention(q, k, v, backend="triton")


def test_triton_refuses_what_the_kernels_do_not_take(triton_mode):
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with pytest.raises(ValueError, match="order 'qk_first'|order 'auto' or 'kv_first'"):
        sima_attention(q, k, v, backend="triton", order="qk_first")
    with pytest.raises(ValueError, match="float64"):
        sima_attention(q.double(), k.double(), v.double(), backend="triton")
    big = torch.randn(1, 1, 5, 256)
    with pytest.raises(ValueError, match="head dims up to 128"):
        sima_attention(big, big, big, backend="triton")


def test_import_simattn_does_not_load_the_kernels():
    """Every kind imports its kernel family's package; a CPU call loads no launch module (no kernel). The first
    lookup of an entry point loads it and binds the function in the package; other names are refused."""
    code = ("import sys, torch, simattn; from simattn.attention.sima import sima_attention; "
            "q = torch.randn(1, 1, 4, 8); sima_attention(q, q, q); "
            "print(sorted(m for m in sys.modules if m.startswith('simattn.kernels.') and m.endswith('.launch'))); "
            "from simattn.kernels import linear; entry = linear.linear_triton; "
            "from simattn.kernels.linear import launch; "
            "print(entry is launch.linear_triton and vars(linear)['linear_triton'] is entry); "
            "print(hasattr(linear, 'linear_triton_x'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split("\n")[:3] == ["[]", "True", "False"], out.stdout


# ---------------------------------------------------------------- CUDA: one AMP training step per model family
FAMILIES = [  # (model, create_model kwargs)
    ("sima_deit_tiny_patch16_224", {"depth": 2}),
    ("sima_deit_tiny_patch16_224", {"depth": 2, "attn_kwargs": {"backend": "triton"}}),
    ("sima_nano_12_p16", {"depth": 2}),
    ("sima_nano_12_p16", {"depth": 2, "attn_kwargs": {"backend": "triton"}}),
    ("sima_cvt_13", {"depths": (1, 1, 1)}),
    ("sima_cvt_13", {"depths": (1, 1, 1), "attn_kwargs": {"backend": "triton"}}),
    ("ufo_vit_tiny", {"depth": 2}),
    ("soft_tiny", {"depths": (1, 1, 1, 1)}),
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name, kwargs", FAMILIES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FAMILIES)])
def test_amp_training_step_cuda(name, kwargs, dtype):
    import timm

    model = timm.create_model(name, num_classes=10, **kwargs).cuda().train()
    x = torch.randn(4, 3, 224, 224, device="cuda")
    y = torch.randint(10, (4,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    # fp16: GradScaler starts at 2^16 and halves after a step whose scaled gradients overflow (the head's weight
    # gradient does at 2^16 here), so a few skipped steps are its design; the forward and the loss must be
    # finite at every step, and a step with finite gradients must come while the scale is still large. bf16 needs
    # no scaler: the first step's gradients are finite.
    for _ in range(6 if dtype == torch.float16 else 1):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        assert torch.isfinite(loss)
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)
        scaler.step(opt)
        scaler.update()
        if finite:
            break
    assert finite and (not scaler.is_enabled() or scale >= 2.0 ** 10), \
        f"no step with finite gradients down to loss scale {scale}"


# ---------------------------------------------------------------- compiled kernels, without a GPU
def _signature(fn, pointers, constexprs):
    return {name: "constexpr" if name in constexprs else pointers.get(name, "*fp32") if name.endswith("_ptr")
            else "fp32" if name == "eps" else "i32" for name in fn.arg_names}


def _compiled_kernels(monkeypatch):
    """The kernel module as imported without TRITON_INTERPRET (where this process interprets: a second copy, with
    a second copy of the tile helpers it calls, made while the host reads as not interpreting)."""
    if not host.INTERPRETER:
        return K
    import importlib.util

    from simattn.kernels import tiles

    def load(name: str, path: str):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    # Triton's compiler imports gluon, whose import checks that triton's standard functions are JIT functions
    # unless interpreting: they were made interpreted here, so gluon is imported while that still reads as true
    import triton.experimental.gluon  # noqa: F401

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(host, "INTERPRETER", False)
    monkeypatch.setitem(sys.modules, "simattn.kernels.tiles", load("simattn.kernels.tiles", tiles.__file__))
    module = load("simattn.kernels.linear._kernels_compiled", K.__file__)
    assert hasattr(module.fwd_kernel, "configs")  # autotuned: compiled, not interpreted
    return module


def test_kernels_compile_for_gpus_without_one(monkeypatch):
    """Triton compiles the kernels to Hopper machine code with no GPU present (its bundled ptxas): the code the
    interpreter runs on CPU also lowers for a GPU: bf16 and fp32 variants, masks, the split and one-tile paths,
    ELU's and XNorm's prologue and epilogue."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = _compiled_kernels(monkeypatch)
    bf16 = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "x_ptr", "y_ptr", "z_ptr", "o_ptr",
                                       "dq_ptr", "dk_ptr", "dv_ptr")}
    u8 = {name: "*u8" for name in ("qm_ptr", "km_ptr", "xm_ptr", "zm_ptr")}
    tiles = dict(BLOCK=64, BLOCK_D=64, BLOCK_E=64)
    common = dict(UPCAST=False, PREC="tf32")
    fwd = dict(HAS_QM=True, HAS_KM=True, SAVE=True, **st.KINDS["sima"].flags, KEY_SUMS=True, QUERY_SUMS=True,
               NATIVE=True, BF16_OUT=True, **common)
    variants = [  # each kernel once, each kind's prologue or epilogue once, both token-axis plans, bf16 and fp32
        # ELU's prologue on bf16 keys: its fp32 features and SimA's own keys come from one function
        (kernels.stats_kernel, {**bf16, **u8},
         dict(HAS_XM=True, HAS_ZM=False, NORMS=True, HAS_Z=False, FEATURE_ELU=True, FEATURE_RELU=False, NATIVE=False,
              **common)),
        (kernels.fwd_kernel, {**bf16, **u8}, dict(fwd, SPLIT=False)),
        (kernels.fwd_kernel, u8, dict(fwd, **st.KINDS["elu"].flags, KEY_SUMS=True, QUERY_SUMS=False, NATIVE=False,
                                       BF16_OUT=False, SAVE=False, SPLIT=True)),
        (kernels.fwd_one_tile_kernel, u8, dict(fwd, **st.KINDS["xnorm"].flags, KEY_SUMS=False, QUERY_SUMS=False,
                                                NATIVE=False, BF16_OUT=False, SAVE=False, PREC="ieee")),
        (kernels.bwd_kernel, {**bf16, **u8}, dict(HAS_QM=True, HAS_KM=True, SPLIT=True, NATIVE=True, BF16_DQ=True,
                                                   **common)),
    ]
    for tuned, pointers, flags in variants:
        fn = tuned.fn  # the autotuner's kernel
        constexprs = {**flags, **tiles}
        try:
            compiled = triton.compile(ASTSource(fn, _signature(fn, pointers, constexprs), constexprs),
                                      target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        except RuntimeError as e:  # a triton build without its ptxas
            if "Cannot find ptxas" not in str(e):
                raise
            pytest.skip(f"cannot compile for CUDA here: {e}")
        assert compiled.asm["cubin"], f"{fn.__name__} {flags}: no machine code"


# ---------------------------------------------------------------- the host path
def _counting_launches(monkeypatch):
    """Count the kernel launches (the interpreter's or the GPU's), whatever runs them."""
    from triton.runtime.autotuner import Autotuner

    launches = []
    for name in ("stats_kernel", "fwd_kernel", "fwd_one_tile_kernel", "bwd_kernel"):
        kernel = getattr(K, name)
        for runner in (kernel, kernel.fn) if isinstance(kernel, Autotuner) else (kernel,):
            real = runner.run
            monkeypatch.setattr(runner, "run", lambda *a, _real=real, _name=name, **kw: launches.append(_name)
                                or _real(*a, **kw))
    return launches


def test_a_repeat_call_reuses_its_plan(monkeypatch, triton_mode):
    """The first call at a signature plans its launches, a repeat call (new values, same shapes and strides) only
    looks the plan up and launches the same kernels; another stride pattern is another plan."""
    monkeypatch.setattr(host, "PLANS", {})
    planned = []
    real_plan = st._plan
    monkeypatch.setattr(st, "_plan", lambda *a: planned.append(a) or real_plan(*a))
    launches = _counting_launches(monkeypatch)
    mask = torch.ones(1, 20, dtype=torch.bool, device=triton_mode)
    for seed in range(2):
        (q, k, v), leaves = qkv_leaves(((1, 1, 20, 16), (1, 1, 20, 16)), triton_mode, True,
                                       gen=torch.Generator().manual_seed(seed))
        out = sima_attention(q, k, v, backend="triton", mask=mask)
        torch.autograd.grad(out.sum(), leaves)
        assert len(planned) == 2 and len(host.PLANS) == 2  # a forward and a backward, planned once
    assert launches and launches[:len(launches) // 2] == launches[len(launches) // 2:]
    with torch.no_grad():
        sima_attention(q.contiguous(), k, v, backend="triton", mask=mask)
    assert len(planned) == 3 and len(host.PLANS) == 3


def test_dry_run_launches_nothing_and_takes_cpu_tensors(monkeypatch):
    """Within dry_run() a forward and backward on CPU tensors run the host path without the interpreter, launch no
    kernel and return outputs of the right shapes and dtypes; outside it, kernels run again."""
    monkeypatch.setattr(host, "INTERPRETER", False)  # CPU tensors are refused outside dry_run
    monkeypatch.setattr(host, "PLANS", {})
    launches = _counting_launches(monkeypatch)
    q, k, v = (torch.randn(2, 3, 4097, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with host.dry_run():
        out = sima_attention(q, k, v, backend="triton")
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        elu = st.linear_triton("elu", q.detach(), k.detach(), v.detach())
    assert launches == []
    assert out.shape == elu.shape == (2, 3, 4097, 16) and out.dtype == torch.bfloat16
    assert [g.shape for g in grads] == [q.shape] * 3
    splits = [c.launch.grid for c in host.PLANS.values()]
    assert all(grid[0] == 6 for grid in splits) and max(len(g) for g in splits) == 2  # planned as on 132 SMs
    assert any(c.partials is not None for c in host.PLANS.values())  # B·H = 6 splits 4097 tokens
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        sima_attention(q, k, v, backend="triton")
