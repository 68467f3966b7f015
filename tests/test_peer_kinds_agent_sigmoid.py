"""Agent attention and sigmoid attention at DeiT-T's shapes: fast paths against the papers' references (fp32, and
bf16/fp16 under autocast within a stated bound), what each method's parts do, and the DeiT models' sizes.

The small-shape oracle checks of every kind (fp64, masks, modules) are in test_attention.py and
test_attention_precision.py; these use the shapes the models run (14×14 grid + CLS, 49 agents, head dim 64)."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import simattn  # noqa: F401  (registers the models)
from simattn.attention import create_attention
from simattn.attention import reference as R
from simattn.attention.agent import agent_attention, pool_agents
from simattn.attention.sigmoid import sigmoid_attention

from attention_cases import assert_grads_close, error_ratio

pytestmark = pytest.mark.usefixtures("one_thread")

GRID, PREFIX, HEADS, D = (14, 14), 1, 3, 64
N = PREFIX + GRID[0] * GRID[1]
#: fp32 against the fp64 reference (the acceptance bound; measured ~1e-7)
FP32_BOUND = 1e-4
#: under autocast: forward and gradients within one machine epsilon of the dtype (rms relative), as
#: test_attention_precision.py holds every kind at small shapes
LOW_BOUND = {torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps}


def _inputs(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, HEADS, N, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            for _ in range(3)]


def _agent_biases(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, HEADS, 49, N, generator=g, dtype=torch.float64),
            torch.randn(1, HEADS, N, 49, generator=g, dtype=torch.float64))


def _mask():
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[0, 3:40] = False
    mask[1, 150:] = False
    return mask


def _agent_pair(q, k, v):
    b1, b2 = (b.to(q.dtype) for b in _agent_biases())
    fast = agent_attention(q, k, v, grid_size=GRID, num_prefix_tokens=PREFIX, agent_bias=b1, query_bias=b2)
    hi = [t.detach().double().requires_grad_() for t in (q, k, v)]
    b1, b2 = _agent_biases()
    ref = R.agent_reference(*hi, GRID, pool_side=7, num_prefix_tokens=PREFIX, agent_bias=b1, query_bias=b2)
    return fast, ref, hi


def _sigmoid_pair(q, k, v):
    fast = sigmoid_attention(q, k, v, mask=_mask())
    hi = [t.detach().double().requires_grad_() for t in (q, k, v)]
    return fast, R.sigmoid_reference(*hi, mask=_mask()), hi


PAIRS = {"agent": _agent_pair, "sigmoid": _sigmoid_pair}


def _compare(kind, dtype, bound, autocast=False):
    lo = _inputs(dtype)
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        fast, ref, hi = PAIRS[kind](*lo)
    assert torch.isfinite(fast).all()
    assert error_ratio(fast, ref) <= bound, f"{kind} {dtype} forward: {error_ratio(fast, ref):.3g}"
    g = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    g_fast = torch.autograd.grad(fast, lo, g.to(fast.dtype))
    g_ref = torch.autograd.grad(ref, hi, g)
    assert_grads_close(g_fast, g_ref, bound, "qkv", f"{kind} {dtype}")


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_fp32_forward_and_gradients_equal_the_reference(kind):
    _compare(kind, torch.float32, FP32_BOUND)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_low_precision_within_one_epsilon(kind, dtype):
    _compare(kind, dtype, LOW_BOUND[dtype], autocast=True)


# ---------------------------------------------------------------- agent attention's parts
def test_agents_are_adaptive_means_of_the_query_grid_as_torch_pools():
    """On a grid the pooling does not divide (4×5 → 3×3: overlapping windows) and on DeiT-T's (14×14 → 7×7)."""
    for grid, side in (((4, 5), 3), (GRID, 7)):
        q = torch.randn(2, HEADS, 1 + grid[0] * grid[1], 8, dtype=torch.float64)
        img = q[:, :, 1:].reshape(2 * HEADS, *grid, 8).permute(0, 3, 1, 2)
        torch_pooled = F.adaptive_avg_pool2d(img, side).flatten(2).transpose(1, 2).reshape(2, HEADS, side * side, 8)
        assert torch.allclose(pool_agents(q, grid, side, 1), torch_pooled, rtol=0, atol=1e-14)
        assert torch.allclose(R.agent_pool_reference(q, grid, side, 1), torch_pooled, rtol=0, atol=1e-14)


def test_module_biases_are_the_papers_three_parts_and_move_the_output():
    torch.manual_seed(0)
    m = create_attention("agent", 48, num_heads=HEADS, agent_num=9, window=5, num_prefix_tokens=1).double()
    for p in m.parameters():
        p.data.normal_()
    m.qkv.weight.data.mul_(0.1)  # logits of order 1: a softmax that the biases can move
    b1, b2 = m.biases((4, 6), 1)  # rows resized 5 → 4, columns 5 → 6, block 7×7 → 4×6
    ref1 = R.agent_bias_reference(m.agent_block_bias, m.agent_row_bias, m.agent_col_bias, m.agent_prefix_bias,
                                  (4, 6), 1)
    ref2 = R.agent_bias_reference(m.query_block_bias, m.query_row_bias, m.query_col_bias, m.query_prefix_bias,
                                  (4, 6), 1)
    assert torch.allclose(b1[0], ref1, atol=1e-13) and torch.allclose(b2[0], ref2.transpose(-2, -1), atol=1e-13)
    # on the grid the row and column biases were learned for, they are used as they are
    b1, _ = m.biases((5, 5), 1)
    block = F.interpolate(m.agent_block_bias, size=(5, 5), mode="bilinear", align_corners=False)
    expected = block + m.agent_row_bias[..., :, None] + m.agent_col_bias[..., None, :]
    assert torch.allclose(b1[0, :, :, 1:], expected.flatten(-2), rtol=0, atol=1e-13)
    x = torch.randn(2, 26, 48, dtype=torch.float64)
    y = m(x)
    with torch.no_grad():  # one agent's bias for the queries of one column (the same for every agent: no change)
        m.query_col_bias[:, 0, 2] += 1.0
    assert not torch.allclose(m(x), y)


def test_agent_rejects_what_it_cannot_take():
    with pytest.raises(ValueError, match="agent_num=50"):
        create_attention("agent", 48, num_heads=3, agent_num=50)
    with pytest.raises(ValueError, match="attn_drop"):
        create_attention("agent", 48, num_heads=3, attn_drop=0.1)
    m = create_attention("agent", 48, num_heads=3)
    with pytest.raises(ValueError, match="masks"):
        m(torch.randn(1, 17, 48), attn_mask=torch.ones(1, 17, dtype=torch.bool))
    with pytest.raises(ValueError, match="square token grid"):
        m(torch.randn(1, 19, 48))
    q = torch.randn(1, 3, 17, 16)
    with pytest.raises(ValueError, match=r"agent_bias must end in \(49, 17\)"):
        agent_attention(q, q, q, agent_bias=torch.zeros(1, 3, 17, 49))


# ---------------------------------------------------------------- sigmoid attention's bias
def test_sigmoid_bias_minus_log_n_gives_equal_logits_weight_one_over_n():
    """With q·k = 0 every weight is σ(−log n) = 1/(n + 1), n the (kept) keys: the output is their values' sum over
    n + 1, the same share for any key count."""
    v = torch.randn(2, HEADS, N, D, dtype=torch.float64)
    zeros = torch.zeros_like(v)
    out = sigmoid_attention(zeros, zeros, v)
    assert torch.allclose(out, v.sum(-2, keepdim=True).expand_as(v) / (N + 1), atol=1e-13)
    mask = _mask()
    out = sigmoid_attention(zeros, zeros, v, mask=mask)
    kept = mask.sum(-1).double().reshape(2, 1, 1, 1)
    expected = (v * mask[:, None, :, None]).sum(-2, keepdim=True) / (kept + 1)
    assert torch.allclose(out, expected.expand_as(v), atol=1e-13)
    # a fixed bias instead: σ(b) each
    out = sigmoid_attention(zeros, zeros, v, bias=math.log(3))
    assert torch.allclose(out, 0.75 * v.sum(-2, keepdim=True).expand_as(v), atol=1e-12)


# ---------------------------------------------------------------- models
_DEIT_T = 5_717_416  # timm's deit_tiny_patch16_224


def test_models_have_the_papers_sizes():
    sizes = {name: sum(p.numel() for p in timm.create_model(name).parameters())
             for name in ("agent_deit_tiny_patch16_224", "sigmoid_deit_tiny_patch16_224")}
    # Agent-DeiT-T: per block two 7×7 block biases, four row/column biases over 14, two class-token biases (each
    # per head and agent) and the 3×3 depthwise conv
    per_block = 2 * 3 * 49 * 49 + 4 * 3 * 49 * 14 + 2 * 3 * 49 + 192 * 9 + 192
    assert sizes["agent_deit_tiny_patch16_224"] == _DEIT_T + 12 * per_block
    assert abs(sizes["agent_deit_tiny_patch16_224"] / 6.0e6 - 1) < 0.05  # the paper's 6.0M
    # sigmoid: qk-LayerNorm (q and k, weight and bias over head dim 64) and LayerScale (two per block)
    assert sizes["sigmoid_deit_tiny_patch16_224"] == _DEIT_T + 12 * (2 * 2 * 64 + 2 * 192)


@pytest.mark.parametrize("name", ["agent_deit_tiny_patch16_224", "sigmoid_deit_tiny_patch16_224"])
def test_models_train_step_is_finite_under_fp16_autocast(name):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=32, embed_dim=48, depth=2, num_classes=10)
    x = torch.randn(4, 3, 32, 32) * 30
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
