"""Agent attention on its Triton kernels (``backend='triton'``: both steps) against the plain reference (fp64),
forward and every gradient (q, k, v and both biases, through the pooled agents). Without CUDA the kernels
run in Triton's interpreter on CPU (``TRITON_INTERPRET=1``, set by conftest.py before they are imported); with
CUDA compiled on the GPU.

Bounds. fp32: rms(triton − oracle) / rms(oracle) ≤ 1e-4 for the output, and each gradient's rms error relative to
the largest gradient's rms ≤ 1e-4 (fp32 round-off gives ~1e-7; a wrong derivative, scale or bias gives order 1).
Half inputs, against the oracle on the same rounded values: within one machine epsilon of the dtype, the bound the
torch path is held to (test_peer_kinds_agent_sigmoid.py): the agents are pooled in the inputs' dtype and the output
and q's gradient are rounded to it, each a rounding of relative size up to u = eps/2 (the interpreter truncates:
up to eps), against fp32 everywhere else. Compiled on CUDA, the products of fp32 operands (the softmax weights, V_A,
the gradients passed between the steps) run at TF32 for half inputs, which keeps 10 mantissa bits: each such operand
moves by up to 2^-11 relative, and the longest chain of them to one result holds 3 (k's and v's gradients: the
broadcast's dW = P_bᵀG rounded into the gather's backward, where it and P_g or dX_g are rounded again; the output:
P_g, then P_b and V_A), so the bound there is eps + 3·2^-11 (fp16: 2.4e-3). The interpreter multiplies fp32 operands
in fp32 (no such rounding).
"""
import pytest
import torch

from simattn.attention import create_attention
from simattn.attention import reference as R
from simattn.attention.backends import Call, choose
from simattn.attention.agent import agent_attention

from attention_cases import assert_grads_close, error_ratio, fp64_oracle, qkv_leaves, qkv_views

pytest.importorskip("triton")
from simattn.kernels.agent import launch as agent_triton  # noqa: E402,F401 - registers the ops; in the mode conftest set

TOL = 1e-4
HALF_TOL = {torch.bfloat16: torch.finfo(torch.bfloat16).eps, torch.float16: torch.finfo(torch.float16).eps}
#: TF32's unit roundoff (10 explicit mantissa bits), and the most TF32-rounded operands on one result's chain
TF32_U, TF32_CHAIN = 2.0 ** -11, 3


def half_bound(dtype, device):
    """HALF_TOL, plus the TF32 roundings of fp32 operands where the kernels are compiled (see the docstring)."""
    return HALF_TOL[dtype] + (TF32_CHAIN * TF32_U if torch.device(device).type == "cuda" else 0.0)


CASES = {  # name → batch, heads, grid, prefix tokens, agents, head dim, fused qkv, biases
    # 37 tokens: past one tile (32 in the interpreter); 9 agents, both biases
    "prefix_biases": (2, 2, (6, 6), 1, 9, 16, False, True),
    # DeiT's 49 agents (a padded tile of 64) on a grid they overlap, strided views of one projection; with few
    # heads the token axis is split over programs (2 chunks of 20), their results merged
    "fused_49_agents": (1, 2, (5, 8), 0, 49, 16, True, False),
    # one agent (the broadcast's weights are all 1), split in 2 chunks of 18 keys, both biases
    "one_agent_d32": (1, 1, (5, 7), 1, 1, 32, False, True),
}


def _leaves(case, device, dtype=torch.float32):
    """q, k, v (views of one fused projection or three tensors), the biases, and the leaves to differentiate."""
    B, H, grid, prefix, n, d, fused, biases = case
    N = prefix + grid[0] * grid[1]
    gen = torch.Generator().manual_seed(0)
    qkv, leaves = qkv_leaves(((B, H, N, d), (B, H, N, d)), device, fused, dtype, gen)
    bias = [None, None]
    if biases:  # the module's shapes: (1, H, n, N) and (1, H, N, n), fp32 parameters
        bias = [torch.randn(1, H, *shape, generator=gen).mul(0.5).to(device).requires_grad_()
                for shape in ((n, N), (N, n))]
    return qkv, bias, list(leaves) + [b for b in bias if b is not None]


def _compare(case, device, dtype, tol, autocast=False):
    B, H, grid, prefix, n, d, fused, biases = case
    qkv, (b1, b2), leaves = _leaves(case, device, dtype)
    with torch.autocast(torch.device(device).type, dtype=dtype, enabled=autocast):
        out = agent_attention(*qkv, grid_size=grid, num_prefix_tokens=prefix, agent_num=n, agent_bias=b1,
                              query_bias=b2, backend="triton")
    grads, ref, ref_grads = fp64_oracle(out, leaves, lambda hi: R.agent_reference(
        *qkv_views(hi), grid, pool_side=int(n ** 0.5), num_prefix_tokens=prefix,
        agent_bias=hi[-2] if biases else None, query_bias=hi[-1] if biases else None))
    assert out.shape == ref.shape and out.dtype == dtype and torch.isfinite(out).all()
    assert error_ratio(out.cpu(), ref) <= tol, f"forward: error ratio {error_ratio(out.cpu(), ref):.3g}"
    names = (["qkv"] if fused else ["q", "k", "v"]) + (["agent_bias", "query_bias"] if biases else [])
    assert [a.dtype for a in grads] == [t.dtype for t in leaves]
    assert_grads_close(grads, ref_grads, tol, names, f"agent triton {dtype}")


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_reference(case, kernel_device):
    _compare(CASES[case], kernel_device, torch.float32, TOL)


def test_given_agents_and_cross_lengths_match_reference(kernel_device):
    """Agents passed in (16 of them), 20 queries reading 45 keys (2 chunks of the key axis), dv ≠ d."""
    gen = torch.Generator().manual_seed(5)
    shapes = ((1, 1, 20, 16), (1, 1, 45, 16), (1, 1, 45, 24), (1, 1, 16, 16))
    leaves = [torch.randn(*shape, generator=gen).to(kernel_device).requires_grad_() for shape in shapes]
    out = agent_attention(*leaves[:3], agents=leaves[3], backend="triton")
    hi = [t.detach().cpu().double().requires_grad_() for t in leaves]
    ref = R.agent_reference(*hi[:3], (4, 4), agents=hi[3])
    assert error_ratio(out.cpu(), ref) <= TOL
    g = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    assert_grads_close([a.cpu() for a in torch.autograd.grad(out, leaves, g.to(out))],
                       torch.autograd.grad(ref, hi, g), TOL, ["q", "k", "v", "agents"], "cross lengths")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_under_autocast_within_one_epsilon(dtype, kernel_device):
    _compare(CASES["prefix_biases"], kernel_device, dtype, half_bound(dtype, kernel_device), autocast=True)


def test_module_backend_triton_equals_torch(kernel_device):
    """The module passes ``backend`` through: same parameters, both backends, same output and parameter gradients
    (the depthwise conv and the biases' three parts included)."""
    torch.manual_seed(0)
    mods = [create_attention("agent", 32, num_heads=2, agent_num=9, window=4, backend=b).to(kernel_device)
            for b in ("torch", "triton")]
    mods[1].load_state_dict(mods[0].state_dict())
    x = torch.randn(2, 1 + 5 * 4, 32, device=kernel_device)
    outs = [m(x, grid_size=(5, 4)) for m in mods]
    assert error_ratio(outs[1], outs[0]) <= TOL
    grads = [torch.autograd.grad(o.square().sum(), list(m.parameters())) for o, m in zip(outs, mods)]
    assert_grads_close(grads[1], grads[0], TOL, [n for n, _ in mods[0].named_parameters()], "module")


def test_custom_ops_pass_opcheck(kernel_device):
    """Schema, fake implementations and the autograd registration of the four ops, on strided q and k with biases
    that broadcast."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 2, 16, generator=gen).to(kernel_device).transpose(1, 2).requires_grad_()
    agents, agent_v = (torch.randn(1, 2, 4, c, generator=gen).to(kernel_device).requires_grad_() for c in (16, 8))
    bias = torch.randn(2, 6, 4, generator=gen).to(kernel_device).requires_grad_()
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.simattn.agent_broadcast_fwd.default, (q, agents, agent_v, bias, torch.float32),
                          test_utils=checks)
    g = torch.randn(1, 2, 6, 8, device=kernel_device)
    torch.library.opcheck(torch.ops.simattn.agent_broadcast_bwd.default,
                          (g, q.detach(), agents.detach(), agent_v.detach(), bias.detach(), torch.float32, True),
                          test_utils=checks)
    k, v = q.detach().transpose(-1, -2)[..., :4].transpose(-1, -2), agent_v.detach()  # 4 keys, strided
    key_bias = torch.randn(2, 4, 4, generator=gen).to(kernel_device).requires_grad_()
    torch.library.opcheck(torch.ops.simattn.agent_gather_fwd.default, (agents, k, v, key_bias), test_utils=checks)
    w, lse = torch.ops.simattn.agent_gather_fwd(agents.detach(), k, v, key_bias.detach())
    torch.library.opcheck(torch.ops.simattn.agent_gather_bwd.default,
                          (torch.randn_like(w), agents.detach(), k, v, key_bias.detach(), w, lse, True),
                          test_utils=checks)


def test_auto_runs_torch_on_cpu_and_refusals_are_one_line():
    q = torch.randn(1, 2, 1 + 16 * 16, 16)
    assert choose("agent", "auto", Call(q, q, q, params=(q[:, :, :4],))) == "torch"
    with pytest.raises(ValueError, match=r"^agent: backend 'triton' takes float32, float16 or bfloat16, got "
                                         r"torch.float64, .*; backend 'auto' runs torch there$"):
        agent_attention(q.double(), q.double(), q.double(), backend="triton")
    with pytest.raises(ValueError, match=r"^agent: backend 'triton' takes up to 128 agents, got 144; backend 'auto' "
                                         r"runs torch there$"):
        agent_attention(q, q, q, agent_num=144, backend="triton")
    with pytest.raises(ValueError, match=r"^agent: unknown backend 'cuda'; expected one of auto, torch, triton$"):
        agent_attention(q, q, q, backend="cuda")
    with pytest.raises(ValueError, match="AgentAttention: unknown backend"):
        create_attention("agent", 32, num_heads=2, backend="fast")
