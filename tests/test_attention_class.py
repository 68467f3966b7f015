"""XCiT / SimA class attention: both kinds against their oracles, attention dropout, and ``cls_attn_type``."""
import pytest
import timm
import torch

import simattn  # noqa: F401
from simattn.attention import reference as R
from simattn.models.sima_xcit import ClassAttention

from attention_cases import assert_grads_close, assert_ratio

# small tensors: one intra-op thread is fastest on a shared CPU
pytestmark = pytest.mark.usefixtures("one_thread")

ORACLES = {"sima": R.sima_class_attention_reference, "softmax": R.softmax_class_attention_reference}


def class_attention_oracle(m, x):
    B, N, C = x.shape
    Hh = m.num_heads

    def heads(t):
        return t.reshape(B, N, Hh, C // Hh).transpose(1, 2)

    q, k, v = (heads(x @ lin.weight.T + lin.bias) for lin in (m.q, m.k, m.v))
    out = ORACLES[m.kind](q, k, v, **({"eps": m.eps} if m.kind == "sima" else {}))
    return out.transpose(1, 2).reshape(B, 1, C) @ m.proj.weight.T + m.proj.bias


@pytest.mark.parametrize("kind", ["sima", "softmax"])
@pytest.mark.parametrize("hooked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_class_attention_matches_oracle(kind, hooked, dtype):
    torch.manual_seed(0)
    m = ClassAttention(24, num_heads=2, qkv_bias=True, kind=kind).to(dtype)
    seen = []
    if hooked:  # the explicit path (softmax otherwise runs timm's fused SDPA)
        m.attn_weights.register_forward_hook(lambda mod, inp, out: seen.append(out))
    x = torch.randn(2, 11, 24, dtype=dtype, requires_grad=True)
    y, y_o = m(x), class_attention_oracle(m, x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert y.shape == (2, 1, 24)
    assert_ratio(y, y_o, tol, f"{kind} forward")
    g = torch.randn_like(y)
    params = list(m.parameters())
    names = ["x"] + [n for n, _ in m.named_parameters()]
    assert_grads_close(torch.autograd.grad(y, [x] + params, g), torch.autograd.grad(y_o, [x] + params, g),
                       tol * 10, names, kind)
    if hooked:
        assert seen[0].shape == (2, 2, 1, 11)
        sums = seen[0].sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums)) == (kind == "softmax")  # SimA's weights are not a softmax


@pytest.mark.parametrize("kind", ["sima", "softmax"])
def test_class_attention_applies_attn_drop_in_training(kind):
    torch.manual_seed(0)
    m = ClassAttention(24, num_heads=2, qkv_bias=True, kind=kind, attn_drop=0.5)
    x = torch.randn(2, 11, 24)
    m.train()
    assert not torch.allclose(m(x), m(x))
    m.eval()
    torch.testing.assert_close(m(x), m(x), rtol=0, atol=0)
    plain = ClassAttention(24, num_heads=2, qkv_bias=True, kind=kind).eval()
    plain.load_state_dict(m.state_dict())
    torch.testing.assert_close(m(x), plain(x), rtol=0, atol=0)


def test_sima_class_attention_drops_the_weights():
    """As the official code: dropout on the (B, H, 1, N) CLS weights, kept entries scaled by 1 / (1 - p)."""
    torch.manual_seed(0)
    m = ClassAttention(24, num_heads=2, kind="sima", attn_drop=0.5).train()
    pairs = []
    m.attn_drop.register_forward_hook(lambda mod, inp, out: pairs.append((inp[0], out)))
    m(torch.randn(2, 40, 24))
    w_in, w_out = pairs[0]
    assert w_in.shape == (2, 2, 1, 40)
    zero = w_out == 0
    assert 0.2 < zero.float().mean() < 0.8
    torch.testing.assert_close(w_out[~zero], 2 * w_in[~zero])


@pytest.mark.parametrize("attn_type,cls_attn_type,expected", [
    ("sima", None, "sima"), ("xca", None, "softmax"), ("elu", None, "softmax"),
    ("xca", "sima", "sima"), ("sima", "softmax", "softmax"),
])
def test_cls_attn_type_default_and_override(attn_type, cls_attn_type, expected):
    torch.manual_seed(0)
    model = timm.create_model("sima_nano_12_p16", depth=1, num_classes=3, attn_type=attn_type,
                              cls_attn_type=cls_attn_type).eval()
    assert model.cls_attn_type == expected
    blocks = [blk.attn for blk in model.cls_attn_blocks]
    assert len(blocks) == 2 and all(isinstance(a, ClassAttention) and a.kind == expected for a in blocks)
    # the forward runs that kind: its weights reach the hook point, and only softmax's rows sum to 1
    seen = []
    blocks[0].attn_weights.register_forward_hook(lambda mod, inp, out: seen.append(out))
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    sums = seen[0].sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums)) == (expected == "softmax")


def test_cls_attn_type_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="unknown cls_attn_type 'relu'; expected one of softmax, sima"):
        timm.create_model("sima_nano_12_p16", depth=1, cls_attn_type="relu")
    with pytest.raises(ValueError, match="unknown class attention 'relu'"):
        ClassAttention(24, num_heads=2, kind="relu")
