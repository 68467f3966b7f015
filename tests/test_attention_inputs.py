"""Bad arguments to the attention ops, modules and models are a one-line ValueError naming the argument, its value
and what is allowed; and the ops stay finite and accurate at large activations in fp32 and under autocast."""
import math
import re
from functools import partial

import pytest
import timm
import torch

import simattn.models  # noqa: F401  (registers the models with timm)
from simattn.attention import create_attention, list_attentions
from simattn.attention import reference as R
from simattn.attention.elu import elu_attention
from simattn.attention.relu import relu_attention, relu_weights
from simattn.attention.sima import sima_attention
from simattn.attention.soft import soft_attention
from simattn.attention.softmax import SoftmaxAttention, softmax_attention, softmax_weights
from simattn.attention.xca import xca_attention
from simattn.attention.xnorm import xnorm_attention

from attention_cases import error_ratio, qkv

pytestmark = pytest.mark.usefixtures("one_thread")


def _raises_one_line(fn, *says):
    """fn() raises a one-line ValueError that contains every string in ``says``."""
    with pytest.raises(ValueError) as caught:
        fn()
    msg = str(caught.value)
    assert "\n" not in msg, msg
    for s in says:
        assert s in msg, f"{s!r} not in {msg!r}"
    return msg


def _q(b=1, h=2, n=4, d=8, device="cpu"):
    return torch.randn(b, h, n, d, device=device)


# ---------------------------------------------------------------- devices
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("kind", list_attentions())
def test_create_attention_on_cuda_without_cuda(kind):
    _raises_one_line(lambda: create_attention(kind, dim=32, num_heads=2, device="cuda"),
                     "device='cuda'", "CUDA is not available")


def test_create_attention_refuses_a_device_name_torch_does_not_know():
    _raises_one_line(lambda: create_attention("sima", dim=32, num_heads=2, device="gpu0"), "device='gpu0'",
                     "is not a device")


OPS = {
    "sima": sima_attention,
    "softmax": softmax_attention,
    "relu": relu_attention,
    "xca": xca_attention,
    "elu": elu_attention,
    "xnorm": xnorm_attention,
    "soft": partial(soft_attention, grid_size=(2, 2)),
}


@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("op", list(OPS))
def test_qkv_on_different_devices(op, which):
    q = _q()
    k = _q(device="meta") if which == "k" else q
    v = _q(device="meta") if which == "v" else q
    _raises_one_line(lambda: OPS[op](q, k, v), f"{op}: q, k and v must be on one device", "cpu", "meta")


@pytest.mark.parametrize("op", ["sima", "relu", "xca", "elu", "xnorm"])
def test_token_mask_on_another_device(op):
    q = _q()
    mask = torch.ones(1, 4, dtype=torch.bool, device="meta")
    _raises_one_line(lambda: OPS[op](q, q, q, mask=mask), f"{op}: token mask is on meta", "cpu")


# ---------------------------------------------------------------- per-head parameters
@pytest.mark.parametrize("op, name", [("xnorm", "gamma_q"), ("xnorm", "gamma_kv"), ("xca", "temperature")])
@pytest.mark.parametrize("shape", [(3, 1, 1), (3,), (1, 2, 2, 1)])
def test_per_head_parameter_with_the_wrong_number_of_heads(op, name, shape):
    q = _q(h=2)
    _raises_one_line(lambda: OPS[op](q, q, q, **{name: torch.ones(shape)}),
                     f"{op}: {name} has shape {shape}", "(2, 1, 1)", "2 heads")


@pytest.mark.parametrize("op, name", [("xnorm", "gamma_q"), ("xnorm", "gamma_kv"), ("xca", "temperature")])
def test_per_head_parameter_on_another_device(op, name):
    q = _q(h=2)
    _raises_one_line(lambda: OPS[op](q, q, q, **{name: torch.ones(2, 1, 1, device="meta")}),
                     f"{op}: {name} is on meta but q is on cpu")


@pytest.mark.parametrize("op, name", [("xnorm", "gamma_q"), ("xnorm", "gamma_kv")])
def test_per_head_parameter_of_shape_heads_is_one_value_per_head(op, name):
    """γ of shape (H,) scales each head (as XCA's temperature of shape (H,) does), not the last axis."""
    q, k, v = (t.double() for t in qkv(b=2, n=6, d=8))  # H = 3 heads, head dim 8
    per_head = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    out = OPS[op](q, k, v, **{name: per_head})
    ref = getattr(R, f"{op}_reference")(q, k, v, **{name: per_head.reshape(3, 1, 1)})
    assert error_ratio(out, ref) < 1e-12


# ---------------------------------------------------------------- scalar options
BAD_SCALARS = [
    (softmax_attention, {"dropout_p": 1.5}, "softmax: dropout_p=1.5; allowed: a number in [0, 1)"),
    (softmax_attention, {"dropout_p": -0.1}, "softmax: dropout_p=-0.1; allowed: a number in [0, 1)"),
    (softmax_attention, {"dropout_p": math.nan}, "softmax: dropout_p=nan; allowed: a number in [0, 1)"),
    (softmax_attention, {"dropout_p": 1.0}, "softmax: dropout_p=1.0; allowed: a number in [0, 1)"),
    (softmax_attention, {"scale": math.nan}, "softmax: scale=nan; allowed: a finite number"),
    (softmax_attention, {"scale": math.inf}, "softmax: scale=inf; allowed: a finite number"),
    (lambda q, k, v, **kw: softmax_weights(q, k, **kw), {"scale": math.nan}, "softmax: scale=nan"),
    (relu_attention, {"alpha": math.inf}, "relu: alpha=inf; allowed: a finite number"),
    (relu_attention, {"alpha": math.nan}, "relu: alpha=nan; allowed: a finite number"),
    (partial(relu_attention, activation="gelu"), {"alpha": -math.inf}, "relu: alpha=-inf"),
    (lambda q, k, v, **kw: relu_weights(q, k, **kw), {"alpha": math.inf}, "relu: alpha=inf"),
    (xca_attention, {"temperature": math.nan}, "xca: temperature=nan; allowed: a finite number"),
    (xca_attention, {"eps": math.nan}, "xca: eps=nan; allowed: a finite number > 0"),
    (xca_attention, {"eps": 0.0}, "xca: eps=0.0; allowed: a finite number > 0"),
    (elu_attention, {"eps": math.nan}, "elu: eps=nan; allowed: a finite number > 0"),
    (elu_attention, {"eps": -1.0}, "elu: eps=-1.0; allowed: a finite number > 0"),
    (xnorm_attention, {"eps": -1e-6}, "xnorm: eps=-1e-06; allowed: a finite number > 0"),
    (xnorm_attention, {"eps": math.inf}, "xnorm: eps=inf"),
    (xnorm_attention, {"gamma_q": math.inf}, "xnorm: gamma_q=inf; allowed: a finite number"),
    (xnorm_attention, {"gamma_kv": math.nan}, "xnorm: gamma_kv=nan; allowed: a finite number"),
    (OPS["soft"], {"ratio": 0}, "soft: ratio=0; allowed: an integer >= 1"),
    (OPS["soft"], {"num_iters": 2.5}, "soft: num_iters=2.5; allowed: an integer >= 0"),
    (soft_attention, {"grid_size": (0, 4)}, "soft: grid_size=(0, 4); allowed: (H, W), two integers >= 1"),
]


@pytest.mark.parametrize("op, kwargs, says", BAD_SCALARS, ids=[s.split(";")[0] for _, _, s in BAD_SCALARS])
def test_functional_ops_refuse_scalar_options_outside_their_range(op, kwargs, says):
    q = _q()
    _raises_one_line(lambda: op(q, q, q, **kwargs), says)


# ---------------------------------------------------------------- model inputs
TINY_MODELS = {
    "sima_deit_tiny_patch16_224": dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2),
    "relu_vit_small_patch16_224": dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2),
    "sima_nano_12_p16": dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1),
    "ufo_vit_tiny": dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1),
    "sima_cvt_13": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), patch_sizes=(7, 3),
                        patch_strides=(4, 2), patch_paddings=(2, 1)),
    "soft_tiny": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), v_conv_kernels=(3,),
                      stem_chans=8),
}


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_models_refuse_inputs_that_are_not_in_chans_image_batches(name):
    model = timm.create_model(name, num_classes=3, **TINY_MODELS[name]).eval()
    size = TINY_MODELS[name]["img_size"]
    with torch.no_grad():
        assert model(torch.randn(1, 3, size, size)).shape == (1, 3)
        for shape in [(1, 1, size, size), (2, 4, size, size), (3, size, size), (1, 1, 3, size, size)]:
            msg = _raises_one_line(lambda: model(torch.randn(shape)), "in_chans=3", f"shape {shape}")
            assert re.match(r"^\w+: expected an image batch", msg), msg
        _raises_one_line(lambda: model.forward_intermediates(torch.randn(1, 1, size, size)), "in_chans=3")


# ---------------------------------------------------------------- SOFT at large activations
@pytest.mark.parametrize("d", [32, 64])
def test_soft_single_token_large_activations_finite_and_exact(d):
    """At N = 1 a token is its own landmark: the kernel is exp(0) = 1 and the output is v / 1.01 for the released
    Newton init. Inputs ×1e4 used to lose exp(0) to the rounding of ‖a‖² + ‖b‖² − 2a·b (non-finite at d = 64)."""
    for seed in range(3):
        x = torch.randn(2, 2, 1, d, generator=torch.Generator().manual_seed(seed)) * 1e4
        out = soft_attention(x, x, x, grid_size=(1, 1))
        ref = R.soft_reference(x.double(), x.double(), (1, 1))
        assert torch.isfinite(out).all() and error_ratio(out, ref) < 1e-6
        for dtype in (torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                low = soft_attention(x, x, x, grid_size=(1, 1))
            assert torch.isfinite(low).all() and error_ratio(low, ref) <= torch.finfo(dtype).eps


def test_soft_tokens_far_from_the_origin_keep_fp32_accuracy():
    """Tokens close to each other (spread 0.5) but ~1e4 from the origin: the kernel depends on their distances
    only, so the fast path is as accurate as the oracle's explicit differences in fp32 (both limited by pooling
    values of 1e4 in fp32, ~2e-4); the expanded ‖a‖² + ‖b‖² − 2a·b on the raw values was off by 30-90×."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 1, 64, generator=g) * 1e4 + torch.randn(2, 2, 16, 64, generator=g) * 0.5
    v = torch.randn(2, 2, 16, 64, generator=g)
    out = soft_attention(x, x, v, grid_size=(4, 4))
    ref = R.soft_reference(x.double(), v.double(), (4, 4))
    plain_fp32 = error_ratio(R.soft_reference(x, v, (4, 4)), ref)
    assert torch.isfinite(out).all() and error_ratio(out, ref) <= 1.5 * plain_fp32 < 1e-3


# ---------------------------------------------------------------- softmax under autocast at large activations
# Bound: rms relative error vs the fp64 oracle ≤ 1 machine epsilon of the autocast dtype (fp16 2⁻¹⁰, bf16 2⁻⁷),
# i.e. the rounding of the output to that dtype; before, fp32 inputs were rounded before the scores (10-20 % off).
@pytest.mark.parametrize("path", ["fused", "explicit"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_softmax_autocast_large_fp32_inputs_accurate(dtype, path):
    fn = softmax_attention if path == "fused" else (lambda q, k, v: softmax_weights(q, k) @ v)
    for seed in (0, 1):
        q, k, v = qkv(b=1, n=197, scale=1e4, seed=seed)
        ref = R.softmax_reference(q.double(), k.double(), v.double())
        with torch.autocast("cpu", dtype=dtype):
            out = fn(q, k, v)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert error_ratio(out, ref) <= torch.finfo(dtype).eps, (seed, error_ratio(out, ref))


def test_softmax_explicit_path_large_fp16_inputs_finite():
    """fp16 scores of ×1e4 inputs overflow (|q·k| ~ 1e9): the explicit weights compute them in fp32."""
    dtype = torch.float16
    q, k, v = (t.to(dtype) for t in qkv(b=1, n=17, scale=1e4))
    ref = R.softmax_reference(q.double(), k.double(), v.double())
    with torch.autocast("cpu", dtype=dtype):
        out = softmax_weights(q, k) @ v
    assert torch.isfinite(out).all() and error_ratio(out, ref) <= torch.finfo(dtype).eps
    m = SoftmaxAttention(32, num_heads=2, fused=False)
    with torch.autocast("cpu", dtype=dtype):
        y = m(torch.randn(2, 17, 32) * 1e4)
    assert torch.isfinite(y).all()
