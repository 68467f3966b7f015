"""Counters: exp-like evaluations from the dispatched ops, FLOPs (with the CPU flash kernel), peak memory."""
import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the models)
from simattn.attention import create_attention
from simattn.bench.counters import OpTrace, PeakMemory, attention_module_names, count_flops, peak_memory, trace_ops
from simattn.deploy.ops import exp_like

DEIT = "sima_deit_small_patch16_224"
HEADS, DIM, DEPTH = 6, 384, 12  # DeiT-S
SHALLOW = 2  # blocks of the models that only check per-block formulas (model creation dominates test time)


def _is_exp_like(op):
    """Judged by name, independently of the counter's own table."""
    return (op in {"exp", "exp2", "expm1", "erf", "erfc", "tanh", "sigmoid", "gelu", "silu", "elu", "softplus",
                   "logsumexp"} or "softmax" in op or "scaled_dot_product" in op)


def _deit(attn_type, img_size=64, **kwargs):
    return timm.create_model(DEIT, attn_type=attn_type, img_size=img_size, **kwargs).eval()


def _forward_trace(model, img_size=64, grad_mode=torch.no_grad):
    x = torch.randn(1, 3, img_size, img_size)
    with grad_mode():
        return trace_ops(lambda: model(x))


def _tokens(img_size, patch=16):
    return (img_size // patch) ** 2 + 1  # + CLS


@pytest.fixture(scope="module")
def relu_deits():
    """The full DeiT-S → SimA with ReLU MLP (the paper's exp-free variant) and its softmax twin."""
    return {kind: _deit(kind, act_layer="relu") for kind in ("sima", "softmax")}


def test_sima_deit_with_relu_mlp_has_no_exp_like_op(relu_deits):
    trace = _forward_trace(relu_deits["sima"])
    assert trace.exp_total == 0 and trace.exp_softmax == 0
    offending = [op for op in trace.ops if _is_exp_like(op)]
    assert offending == [], f"exp-like ops in SimA/ReLU DeiT: {offending}"
    assert trace.ops["bmm"] > 0 and trace.ops["addmm"] > 0  # the trace did see the model's kernels


def test_softmax_deit_counts_h_n2_exps_per_block(relu_deits):
    n = _tokens(64)
    model = relu_deits["softmax"]
    for grad_mode in (torch.no_grad, torch.inference_mode):  # inference_mode hides composites until decomposed
        trace = _forward_trace(model, grad_mode=grad_mode)
        assert [op for op in trace.ops if _is_exp_like(op)] == ["_scaled_dot_product_flash_attention_for_cpu"]
        assert trace.exp_softmax == DEPTH * HEADS * n * n
        assert trace.exp_total == trace.exp_softmax
        assert trace.exp_calls["_scaled_dot_product_flash_attention_for_cpu"] == DEPTH


def test_explicit_softmax_path_counts_the_same_as_fused_sdpa():
    n = _tokens(64)
    trace = _forward_trace(_deit("softmax", act_layer="relu", attn_kwargs={"fused": False}, depth=SHALLOW))
    assert trace.exp_calls["_softmax"] == SHALLOW
    assert trace.exp_softmax == SHALLOW * HEADS * n * n


def test_gelu_mlp_counts_one_activation_per_hidden_unit():
    n = _tokens(64)
    trace = _forward_trace(_deit("sima", depth=SHALLOW))
    assert trace.exp_softmax == 0
    assert trace.summary()["exp_activation"] == SHALLOW * n * 4 * DIM  # erf inside exact GELU
    assert trace.exp_like_ops() == ["gelu"]


def test_xca_counts_h_d2_exps_per_block():
    head_dim = DIM // HEADS
    for img_size in (32, 64):
        trace = _forward_trace(_deit("xca", act_layer="relu", depth=SHALLOW, img_size=img_size), img_size)
        assert trace.exp_softmax == SHALLOW * HEADS * head_dim * head_dim  # independent of N


def test_elu_and_sigmoid_are_exp_like():
    with OpTrace() as trace:
        torch.nn.functional.elu(torch.randn(3, 5))
        torch.randn(7).sigmoid_()
        torch.randn(2, 4).exp()
    assert trace.exp_evals["elu"] == 15 and trace.exp_evals["sigmoid"] == 7 and trace.exp_evals["exp"] == 8
    assert trace.by_category["exp"] == 8 and trace.exp_total == 30
    assert all(exp_like(op) for op in ("elu", "sigmoid", "exp", "gelu", "_softmax", "tanh", "erf"))


def test_training_step_trace_includes_backward_kernels():
    model = _deit("softmax", img_size=32, depth=1).train()
    x = torch.randn(2, 3, 32, 32)
    trace = trace_ops(lambda: model(x).sum().backward())
    n = _tokens(32)
    assert trace.exp_calls["_scaled_dot_product_flash_attention_for_cpu_backward"] == 1
    assert trace.exp_softmax == 2 * 2 * HEADS * n * n  # forward + recomputed in backward, batch 2
    assert trace.exp_calls["gelu_backward"] == 1


def _attention_flops(attn_type, img_size, **attn_kwargs):
    model = _deit(attn_type, img_size=img_size, depth=1, attn_kwargs=attn_kwargs)
    x = torch.randn(1, 3, img_size, img_size)
    with torch.no_grad():
        return count_flops(lambda: model(x), model)


def test_attention_flops_scale_linear_for_sima_quadratic_for_softmax():
    d = DIM // HEADS
    small, large = 128, 256
    n1, n2 = _tokens(small), _tokens(large)  # 65, 257
    soft = [_attention_flops("softmax", s) for s in (small, large)]
    sima = [_attention_flops("sima", s, order="kv_first") for s in (small, large)]
    # q kᵀ and weights·v: 2 matmuls of 2·N²·d FLOPs per head (the CPU flash kernel counted, not zero).
    assert [r.attention for r in soft] == [4 * HEADS * n * n * d for n in (n1, n2)]
    # kᵀv and q·(kᵀv): 2 matmuls of 2·N·d² per head.
    assert [r.attention for r in sima] == [4 * HEADS * n * d * d for n in (n1, n2)]
    # Projections and MLP are the same in both; only the attention core differs.
    assert soft[0].total - soft[0].attention == sima[0].total - sima[0].attention > 0


def test_attention_module_names_are_outermost():
    model = _deit("sima", depth=2)
    assert attention_module_names(model) == ["blocks.0.attn", "blocks.1.attn"]


def test_peak_memory_is_exact_and_deterministic():
    keep = []

    def fn():
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B, freed below
        keep.append(torch.empty(500, dtype=torch.float64))  # 4000 B, kept
        b = a.view(10, 100)  # a view: no new memory
        del a, b
        torch.empty(250, dtype=torch.float32)  # 1000 B, freed at once

    assert peak_memory(fn) == 8000
    assert peak_memory(fn) == 8000  # independent of what the previous call left alive
    with PeakMemory("cpu") as meter:
        torch.ones(10).add_(1)  # in place: one allocation only
    assert meter.peak_bytes == 40


def _block_peak(kind, tokens, **options):
    block = create_attention(kind, 32, num_heads=2, **options).eval()
    x = torch.randn(1, tokens, 32)
    with torch.no_grad():
        return peak_memory(lambda: block(x))


def test_peak_memory_quadratic_for_explicit_softmax_linear_for_sima():
    soft = _block_peak("softmax", 512, fused=False) / _block_peak("softmax", 256, fused=False)
    sima = _block_peak("sima", 512, order="kv_first") / _block_peak("sima", 256, order="kv_first")
    assert soft > 3.5, soft  # the N×N weights dominate
    assert 1.8 < sima < 2.2, sima


def test_training_peak_counts_gradients_and_saved_activations():
    model = _deit("sima", img_size=32, depth=1).train()
    x = torch.randn(1, 3, 32, 32)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad():
        fwd = peak_memory(lambda: model(x))
    train = peak_memory(lambda: model(x).sum().backward())
    assert train >= grads > fwd > 0
