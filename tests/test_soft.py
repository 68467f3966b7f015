"""SOFT fidelity: the released Newton–Raphson inverse and the paper's, the released conv landmarks, convergence,
grid handling, and the SOFT-Tiny size with conv landmarks."""
import pytest
import timm
import torch

import simattn  # noqa: F401
from simattn.attention import create_attention, pinv_residual
from simattn.attention import reference as R
from simattn.attention.soft import gaussian_kernel, newton_pinv, pool_landmarks, soft_attention

from attention_cases import H, assert_ratio

# small tensors: one intra-op thread is fastest on a shared CPU
pytestmark = pytest.mark.usefixtures("one_thread")


def _landmark_kernel(std, b=2, side=8, d=16, seed=0):
    """The m×m kernel of pooled landmarks (m = 16) of a random q with the given std, fp64."""
    torch.manual_seed(seed)
    q = torch.randn(b, H, side * side, d, dtype=torch.float64) * std
    lm = pool_landmarks(q, (side, side), 2)
    return q, gaussian_kernel(lm, lm)


@pytest.mark.parametrize("std", [0.2, 1.0, 3.0])
def test_newton_pinv_default_is_the_released_formula(std):
    _, core = _landmark_kernel(std)
    for num_iters in (0, 1, 20):
        ours = newton_pinv(core, num_iters)
        released = R.newton_inverse_reference(core, num_iters, "released")
        assert (ours - released).abs().max() <= 1e-6 * released.abs().max()
    # 20 released iterations approximate (M + 0.01 I)⁻¹, not M⁺
    inv = torch.linalg.inv(core + 0.01 * torch.eye(core.shape[-1], dtype=core.dtype))
    assert_ratio(newton_pinv(core, 40), inv, 1e-8, "released converges to (M + 0.01 I)^-1")


@pytest.mark.parametrize("std", [0.2, 1.0, 3.0])
def test_newton_pinv_paper_init(std):
    _, core = _landmark_kernel(std)
    ours = newton_pinv(core, 20, newton_init="paper")
    paper = R.newton_inverse_reference(core, 20, "paper")
    assert (ours - paper).abs().max() <= 1e-6 * paper.abs().max()
    # the paper's α = 2βⁿ/‖M‖₁² with the smallest n such that ‖I − αM‖₁ ≤ 1 (searched up to n = 10)
    x0 = newton_pinv(core, 0, newton_init="paper")
    alpha = x0[..., 0, 0] / core[..., 0, 0]
    n = torch.log2(2 / (alpha * core.abs().sum(-2).amax(-1) ** 2))
    torch.testing.assert_close(n, n.round())
    eye = torch.eye(core.shape[-1], dtype=core.dtype)

    def norm1(a):
        return (eye - a[..., None, None] * core).abs().sum(-2).amax(-1)

    assert ((n.round() == 10) | (norm1(alpha) <= 1 + 1e-12)).all()
    assert ((n.round() == 0) | (norm1(2 * alpha) > 1)).all()  # one halving fewer would not meet it


def test_released_and_paper_outputs_differ_where_the_kernel_is_ill_conditioned():
    """The two inits are different methods: (M + 0.01 I)⁻¹ vs M⁺ after 20 steps. Near-duplicate landmarks (small
    std) make M ill conditioned, where they differ the most."""
    q, _ = _landmark_kernel(0.2)
    v = torch.randn_like(q)
    released = soft_attention(q, q, v, ratio=2)
    paper = soft_attention(q, q, v, ratio=2, newton_init="paper")
    assert_ratio(released, R.soft_reference(q, v, (8, 8), ratio=2), 1e-9, "released")
    assert_ratio(paper, R.soft_reference(q, v, (8, 8), ratio=2, init="paper"), 1e-9, "paper")
    assert (released - paper).abs().max() > 1e-3 * released.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backward", ["exact", "iterative"])
def test_soft_converged_matches_exact_inverse_oracle(dtype, backward):
    q, _ = _landmark_kernel(0.5, b=1)
    q = q.to(dtype).requires_grad_()
    v = torch.randn(1, H, 64, 16, dtype=dtype, requires_grad=True)
    out = soft_attention(q, q, v, ratio=2, num_iters=30, backward=backward)
    ref = R.soft_reference(q, v, (8, 8), ratio=2, num_iters=None)  # torch.linalg.inv(M + 0.01 I)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert_ratio(out, ref, tol, "forward")
    g = torch.randn_like(out)
    for a, b, name in zip(torch.autograd.grad(out, (q, v), g), torch.autograd.grad(ref, (q, v), g), "qv"):
        assert_ratio(a, b, tol * 10, f"d/d{name}")


@pytest.mark.parametrize("newton_init,std", [("released", 0.5), ("paper", 2.0)])
def test_soft_residual_decreases_with_iterations(newton_init, std):
    """The released P = M + 0.01 I has eigenvalues ≥ 0.01 and converges even for close landmarks (std 0.5);
    the paper's P = M needs better-separated landmarks for 25 steps (it converges slowly in its small eigenvalues)."""
    _, core = _landmark_kernel(std)
    res = [pinv_residual(core, it, newton_init).max().item() for it in (1, 3, 6, 12, 25)]
    assert all(a > b for a, b in zip(res, res[1:])), res
    assert res[-1] < 1e-4


def test_soft_prefix_token_and_grid_inference():
    torch.manual_seed(0)
    q = torch.randn(1, H, 1 + 36, 16, dtype=torch.float64) * 0.5
    v = torch.randn(1, H, 37, 16, dtype=torch.float64)
    out = soft_attention(q, q, v, ratio=2)  # CLS + 6×6 grid inferred
    assert_ratio(out, R.soft_reference(q, v, (6, 6), ratio=2, num_prefix_tokens=1), 1e-9, "CLS + 6x6")
    with pytest.raises(ValueError, match="square token grid"):
        soft_attention(q[:, :, :30], q[:, :, :30], v[:, :, :30])
    g = q[:, :, 1:31]
    out_g = soft_attention(g, g, v[:, :, 1:31], grid_size=(5, 6), ratio=2)  # windows clipped at the edge
    assert_ratio(out_g, R.soft_reference(g, v[:, :, 1:31], (5, 6), ratio=2), 1e-9, "5x6 grid")


def test_conv_landmarks_follow_the_released_layout():
    m = create_attention("soft", 64, num_heads=2, landmarks="conv", ratio=4)
    conv = m.landmark_conv
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (32, 32, (4, 4), (4, 4))
    assert conv.bias is None and m.landmark_norm.normalized_shape == (32,)
    # one conv for all heads: swapping the heads' queries swaps their landmarks
    torch.manual_seed(0)
    q = torch.randn(2, 2, 64, 32)
    lm = m.conv_landmarks(q, (8, 8), 0)
    assert lm.shape == (2, 2, 4, 32)
    torch.testing.assert_close(m.conv_landmarks(q.flip(1), (8, 8), 0), lm.flip(1))


def test_soft_tiny_with_conv_landmarks_has_published_size():
    """SOFT paper Table 4b: SOFT-Tiny with conv landmarks has 13.07M parameters."""
    torch.manual_seed(0)
    model = timm.create_model("soft_tiny", attn_kwargs={"landmarks": "conv"})
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - 13.07e6) <= 0.01 * 13.07e6, f"{n_params / 1e6:.3f}M"
    model = timm.create_model("soft_tiny", attn_kwargs={"newton_init": "paper"}, depths=(1, 1, 1, 1))
    assert model.stages[0].blocks[0].attn.newton_init == "paper"
