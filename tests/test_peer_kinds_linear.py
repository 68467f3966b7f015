"""FLatten, InLine, SLAB and PolaFormer beyond the shared attention cases (tests/attention_cases.py: functional ops
against their oracles forward and backward, fp16/bf16 bounds, modules with their initial parameters): fp32 modules
against the fp64 oracle with every parameter moved off its initialization, the grid and the class token, the key
encoding on other grids, fp16 at large activations, the exp audit of the exported graph, the DeiT models and bad
options."""
import copy
import io

import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the kinds and the models)
from simattn.attention import create_attention
from simattn.attention import reference as R
from simattn.attention.flatten import flatten_attention
from simattn.attention.inline import inline_attention
from simattn.attention.polaformer import polaformer_attention
from simattn.attention.slab import slab_attention

from attention_cases import assert_ratio, error_ratio, module_oracle, qkv

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ["flatten", "inline", "slab", "polaformer"]
GRID = (4, 5)


def _module(kind, prefix=1, **options):
    """A module on the 4×5 grid after ``prefix`` tokens, its key encoding built for that grid (InLine: none, as
    released), every parameter moved off its initialization (zero encodings, scales and powers among them)."""
    torch.manual_seed(0)
    if kind != "inline":
        options.setdefault("pos_grid", GRID)
    m = create_attention(kind, 24, num_heads=2, qkv_bias=True, num_prefix_tokens=prefix, **options)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_module_matches_the_fp64_oracle(kind):
    """Forward and the gradients of x and of every parameter: fp32 error ratio ≤ 1e-4 against the fp64 oracle."""
    m = _module(kind)
    m64 = copy.deepcopy(m).double()
    x = torch.randn(2, 21, 24, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, expected = m(x, grid_size=GRID), module_oracle(m64, x64, grid_size=GRID)
    assert_ratio(out, expected, 1e-4, f"{kind} forward")
    g = torch.randn_like(expected)
    names = ["x"] + [n for n, _ in m.named_parameters()]
    grads = torch.autograd.grad(out, [x] + list(m.parameters()), g.float())
    grads64 = torch.autograd.grad(expected, [x64] + list(m64.parameters()), g)
    for name, a, b in zip(names, grads, grads64):
        assert_ratio(a, b, 1e-4, f"{kind} d/d{name}")


@pytest.mark.parametrize("kind", KINDS)
def test_class_token_joins_the_attention_but_not_the_grid_ops(kind):
    """The conv on V (InLine: its local branch) changes the grid tokens' outputs only; the class token is a key of
    every grid token."""
    m = _module(kind).eval()
    x = torch.randn(1, 21, 24)
    with torch.no_grad():
        out = m(x, grid_size=GRID)
        local = m.residual[2] if kind == "inline" else m.dwc
        local.bias.add_(1.0)
        moved = m(x, grid_size=GRID)
        x2 = x.clone()
        x2[:, 0] += 1.0
        cls_moved = m(x2, grid_size=GRID)
    assert torch.equal(moved[:, 0], out[:, 0])
    assert (moved[:, 1:] - out[:, 1:]).abs().min() > 0
    assert (cls_moved[:, 1:] - moved[:, 1:]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("kind", ["flatten", "slab", "polaformer"])
def test_key_encoding_is_resampled_for_other_grids_as_a_checkpoint_is_at_load(kind):
    """On another grid the encoding is resampled as a checkpoint's is at load (the authors' bicubic, align_corners
    False, no antialiasing: simattn.models.resample), so a model built at one size and run at another agrees with
    one built at the other size from the same file."""
    import torch.nn.functional as F
    m = _module(kind, prefix=0).eval()
    for grid in ((2, 3), (6, 7)):
        other = _module(kind, prefix=0, pos_grid=grid).eval()
        other.load_state_dict({k: v for k, v in m.state_dict().items() if k != "positional_encoding"}, strict=False)
        with torch.no_grad():
            image = m.positional_encoding.reshape(1, *GRID, -1).permute(0, 3, 1, 2)
            resized = F.interpolate(image, size=grid, mode="bicubic", align_corners=False)
            other.positional_encoding.copy_(resized.flatten(2).transpose(1, 2))
            x = torch.randn(2, grid[0] * grid[1], 24)
            assert_ratio(m(x, grid_size=grid), other(x, grid_size=grid), 1e-6, f"{kind} on {grid}")


def test_non_square_grids_need_the_grid_and_models_refuse_to_guess():
    m = _module("slab", prefix=1)
    with pytest.raises(ValueError, match="slab: cannot infer a square token grid from N=21"):
        m(torch.randn(1, 21, 24))
    # 10×12 patches and a class token are 121 tokens: an 11×11 grid if the prefix were not known
    model = timm.create_model("inline_deit_tiny_patch16_224", img_size=64, depth=1, num_classes=3).eval()
    with pytest.raises(ValueError, match="cannot infer a square token grid from N=121"):
        model(torch.randn(1, 3, 160, 192))


# fp16 activations near the format's limit (q, k, v up to ~4e4): no overflow, the fp64 oracle's values. InLine's output
# grows as |q||k||v| there, past fp16 in exact arithmetic.
@pytest.mark.parametrize("fast, oracle, options", [
    (flatten_attention, R.flatten_reference, {}),
    (slab_attention, R.slab_reference, {}),
    (polaformer_attention, R.polaformer_reference, {"power": 5.0}),
], ids=["flatten", "slab", "polaformer"])
def test_fp16_large_activations_stay_accurate(fast, oracle, options):
    q, k, v = (t.half() for t in qkv(n=30, scale=1e4, seed=0))
    with torch.autocast("cpu", dtype=torch.float16):
        out = fast(q, k, v, **options)
    expected = oracle(q.double(), k.double(), v.double(), **options)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert error_ratio(out, expected) <= torch.finfo(torch.float16).eps


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_graph_exp_ops(kind):
    """TorchScript-based ONNX export runs in onnxruntime as the module does. Its exp-like ops are the class's
    N-independent ones, one node each: InLine's GELU on the channel means, FLatten's softplus of the scale,
    PolaFormer's softplus and sigmoid of the scale and the power; SLAB has none."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from simattn.deploy.onnx import audit_onnx
    m = _module(kind, **({} if kind == "inline" else {"pos_grid": (4, 4)})).eval()
    x = torch.randn(2, 17, 24)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=18)
    proto = onnx.load_from_string(buf.getvalue())
    expected = {"flatten": {"Softplus": 1}, "inline": {"Erf": 1}, "slab": {},
                "polaformer": {"Softplus": 1, "Sigmoid": 1}}
    assert audit_onnx(proto).exp_like == expected[kind]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), m(x), rtol=1e-4, atol=1e-5)


# parameters of DeiT-T (5,717,416) and DeiT-S (22,050,664) and what each kind adds per block, C wide with H heads:
# FLatten: scale C, key encoding 196·C, conv d·25 + d; PolaFormer: those, gate C² + C and power C; SLAB: encoding
# and conv, no class token nor its position (−2C); InLine: its kernel predictor, (C/H)·C + C + (C/H)·9C + 9C, at
# its own widths.
def _deit(dim):
    return 12 * (12 * dim * dim + 13 * dim) + 768 * dim + dim + 197 * dim + dim + 2 * dim + 1000 * dim + 1000


def _extra(kind, dim, heads):
    d = dim // heads
    conv, encoding = d * 25 + d, 196 * dim
    return {"flatten": 12 * (dim + encoding + conv), "slab": 12 * (encoding + conv) - 2 * dim,
            "polaformer": 12 * (dim + encoding + conv + dim * dim + dim + dim),
            "inline": 12 * (d * dim + dim + d * 9 * dim + 9 * dim)}[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_deit_models_have_the_released_parameter_counts(kind):
    assert _deit(192) == 5_717_416 and _deit(384) == 22_050_664
    sizes = {"tiny": (192, 6 if kind == "inline" else 3), "small": (320, 10) if kind == "inline" else (384, 6)}
    for size, (dim, heads) in sizes.items():
        with torch.device("meta"):
            model = timm.create_model(f"{kind}_deit_{size}_patch16_224")
        assert model.blocks[0].attn.num_heads == heads
        assert sum(p.numel() for p in model.parameters()) == _deit(dim) + _extra(kind, dim, heads), size
    if kind == "inline":  # the paper's InLine-DeiT-T row: 6.5M
        assert abs(_deit(192) + _extra("inline", 192, 6) - 6.5e6) / 6.5e6 < 0.05


def test_models_lay_out_their_prefix_tokens_and_key_encoding():
    with torch.device("meta"):
        slab = timm.create_model("slab_deit_tiny_patch16_224", img_size=256)
        flatten = timm.create_model("flatten_deit_small_patch16_224")
    assert slab.cls_token is None and slab.global_pool == "avg"
    assert slab.blocks[0].attn.num_prefix_tokens == 0 and slab.blocks[0].attn.pos_grid == (16, 16)
    assert flatten.blocks[0].attn.num_prefix_tokens == 1 and flatten.blocks[0].attn.pos_grid == (14, 14)
    assert flatten.blocks[0].attn.focusing_factor == 3.0 and flatten.blocks[0].attn.dwc.kernel_size == (5, 5)


@pytest.mark.parametrize("kind, options, says", [
    ("flatten", {"dwc_kernel": 4}, "dwc_kernel=4; allowed: 0 .none. or an odd kernel size"),
    ("flatten", {"focusing_factor": 0}, "focusing_factor=0; allowed: a finite number > 0"),
    ("slab", {"pos_grid": (14,)}, r"pos_grid=\(14,\); allowed: None or \(H, W\)"),
    ("slab", {"pos_grid": (14, 0)}, "pos_grid=0; allowed: an integer >= 1"),
    ("inline", {"local_kernel": 2}, "local_kernel=2; allowed: 0 .none. or an odd kernel size"),
    ("polaformer", {"alpha": -1.0}, "alpha=-1.0; allowed: a finite number >= 0"),
], ids=["even-conv", "focusing", "grid-rank", "grid-zero", "even-local", "alpha"])
def test_bad_module_options(kind, options, says):
    with pytest.raises(ValueError, match=says):
        create_attention(kind, 24, num_heads=2, **options)


def test_bad_functional_options():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="head dim 9 .dim 18 / 2 heads. must be even"):
        create_attention("polaformer", 18, num_heads=2)
    with pytest.raises(ValueError, match="polaformer: v's head dim must be even"):
        polaformer_attention(q, k, v[..., :15], power=2.0)
    with pytest.raises(ValueError, match=r"flatten: scale has shape \(3, 8\); expected one value per channel: 3 heads "
                                         r"x 16 = 48 values"):
        flatten_attention(q, k, v, scale=torch.ones(3, 8))
    with pytest.raises(ValueError, match="inline: scale=-1.0; allowed: a finite number > 0"):
        inline_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="slab: k and v token counts differ"):
        slab_attention(q, k, v[:, :, :5])


# ---------------------------------------------------------------- PRepBN (SLAB's norm)
def test_prepbn_hands_layernorm_over_to_repbn():
    """λ·LN(x) + (1 − λ)·(BN(x) + αx) with λ falling 1 → 0 over ``steps`` training calls after ``warmup`` calls of
    LayerNorm; RepBN with the running statistics in eval, also scripted."""
    from simattn.models.prepbn import PRepBN
    torch.manual_seed(0)
    norm = PRepBN(8, steps=2, warmup=1)
    with torch.no_grad():
        norm.norm2.alpha.fill_(0.7)
        norm.norm1.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 8) * 2 + 1

    def layer_norm(t):
        mu, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mu) / torch.sqrt(var + 1e-6) * norm.norm1.weight + norm.norm1.bias

    def rep_bn(t, mean, var):
        return (t - mean) / torch.sqrt(var + 1e-5) + 0.7 * t

    flat = x.reshape(-1, 8)
    batch = rep_bn(x, flat.mean(0), flat.var(0, unbiased=False))
    for lam in (1.0, 1.0, 0.5, 0.0, 0.0):  # warm-up, then 2/2, 1/2, 0 and 0 steps left
        torch.testing.assert_close(norm(x), lam * layer_norm(x) + (1 - lam) * batch)
    assert norm.steps_left.item() == 0 and norm.warmup_left.item() == 0
    norm.eval()
    expected = rep_bn(x, norm.norm2.bn.running_mean, norm.norm2.bn.running_var)
    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(torch.jit.script(norm)(x), expected)


def test_slab_models_take_prepbn_for_every_norm():
    with torch.device("meta"):
        model = timm.create_model("slab_deit_tiny_patch16_224", prepbn_steps=60000)
    norms = [m for m in model.modules() if type(m).__name__ == "PRepBN"]
    assert len(norms) == 25 and all(n.steps == 60000 for n in norms)  # two per block and the final one
    # each adds a BatchNorm (2C) and α to its LayerNorm
    assert sum(p.numel() for p in model.parameters()) == _deit(192) + _extra("slab", 192, 3) + 25 * (2 * 192 + 1)
    with pytest.raises(ValueError, match="slab_deit_tiny_patch16_224: prepbn_steps=-1; allowed: an integer >= 0"):
        timm.create_model("slab_deit_tiny_patch16_224", prepbn_steps=-1)


def _token_major(t):
    return t.contiguous()


def _channel_major(t):
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("grad_layout", [_token_major, _channel_major], ids=["grad-token-major", "grad-channel-major"])
@pytest.mark.parametrize("x_layout", [_token_major, _channel_major], ids=["x-token-major", "x-channel-major"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_prepbn_gradients_whatever_the_layouts(x_layout, grad_layout, train):
    """PRepBN's gradients (input, LayerNorm's and BatchNorm's parameters, α) equal those of the plain formula for
    tokens and incoming gradients stored token-major (a linear layer's) or channel-major (a conv map's flattened),
    in fp64. torch's CPU batch-norm backward on a (B, C, N, 1) view is wrong when the two layouts differ."""
    from simattn.models.prepbn import PRepBN
    torch.manual_seed(0)
    norm = PRepBN(8, steps=2).double().train(train)
    with torch.no_grad():
        norm.norm2.alpha.fill_(0.7)
        norm.norm2.bn.weight.uniform_(0.5, 1.5)
        norm.norm2.bn.bias.uniform_(-1, 1)
        norm.norm2.bn.running_mean.uniform_(-1, 1)
        norm.norm2.bn.running_var.uniform_(0.5, 2)
        norm.steps_left.fill_(1)  # λ = 1/2 in training: both norms carry gradient
    x0 = torch.randn(3, 10, 8, dtype=torch.float64) * 2 + 1
    g0 = torch.randn(3, 10, 8, dtype=torch.float64)
    params = [norm.norm1.weight, norm.norm1.bias, norm.norm2.bn.weight, norm.norm2.bn.bias, norm.norm2.alpha]
    bn, ln = norm.norm2.bn, norm.norm1

    def formula(t):
        if train:
            flat = t.reshape(-1, 8)
            mean, var = flat.mean(0), flat.var(0, unbiased=False)
        else:
            mean, var = bn.running_mean, bn.running_var
        rep = (t - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias + norm.norm2.alpha * t
        if not train:
            return rep
        mu, v = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return 0.5 * ((t - mu) / torch.sqrt(v + ln.eps) * ln.weight + ln.bias) + 0.5 * rep

    x = x_layout(x0).requires_grad_(True)
    got = torch.autograd.grad(norm(x), [x, *params], grad_layout(g0), allow_unused=True)
    x_ref = x0.clone().requires_grad_(True)
    expected = torch.autograd.grad(formula(x_ref), [x_ref, *params], g0, allow_unused=True)
    for name, a, b in zip(["x", "ln.weight", "ln.bias", "bn.weight", "bn.bias", "alpha"], got, expected):
        if b is None:
            assert a is None or not a.any(), name
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: f"{name}: {m}")
