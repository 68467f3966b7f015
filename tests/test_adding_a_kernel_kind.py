"""A kind with a kernel added the way ARCHITECTURE.md's "Adding an attention kind" says, in this one file: a Triton
kernel, its op made by ``simattn.kernels.host.op`` (eager Function, custom ops, fakes, registered autograd), the
functional op on ``backends.dispatch``, the kind's policy (``register_policy``) and its ``TokenAttention``. It runs
eagerly, under ``torch.compile(fullgraph=True)`` and in ``torch.export``, forward and backward, equal to a plain
reference; ``bench attention`` times it on a GPU.

The toy kind: out = q ⊙ k + v per token and channel (not attention; the smallest kernel with three inputs)."""
from typing import Optional, Tuple

import pytest
import torch
import triton
import triton.language as tl

from simattn.attention import TokenAttention, _registry, backends, register_attention
from simattn.attention.backends import Call, Policy, dispatch, register_policy, takes_triton
from simattn.kernels import host

KIND = "toy_fma"


# ------------------------------------------------------------------------------------------------ the kernel


@triton.jit
def _fma_kernel(a_ptr, b_ptr, c_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offsets < n
    a = tl.load(a_ptr + offsets, mask=keep)
    b = tl.load(b_ptr + offsets, mask=keep)
    c = tl.load(c_ptr + offsets, mask=keep)
    tl.store(out_ptr + offsets, a * b + c, mask=keep)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    _fma_kernel[(triton.cdiv(q.numel(), 64),)](q, k, v, out, q.numel(), BLOCK=64)
    return out


def _fake(q, k, v):
    return torch.empty_like(q)


def _backward(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    zeros = torch.zeros_like(g)
    return _forward(g, k, zeros), _forward(g, q, zeros), g.clone()


_toy_op = host.op("simattn_toy::fma", _forward, _backward, _fake, tensors=3, grads=3)


# ------------------------------------------------------------------------------------------------ the kind


def toy_reference(q, k, v):
    return q * k + v


def _toy_torch(q, k, v):
    return q * k + v


def _toy_triton(dt: torch.dtype, q, k, v):
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _toy_op(q, grad, q, k, v)


def toy_attention(q, k, v, *, backend: str = "auto"):
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"{KIND}: q, k and v must have one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    return dispatch(KIND, backend, Call(q, k, v), q.dtype, _toy_triton, _toy_torch, q, k, v)


@pytest.fixture
def toy_kind(monkeypatch):
    """The kind and its policy registered for one test (the registries as they were, afterwards)."""
    monkeypatch.setattr(_registry, "_ATTENTIONS", dict(_registry._ATTENTIONS))
    # the table itself, as its readers hold it, loses the kind at the end (setitem on a new key undoes by deleting)
    monkeypatch.setitem(backends.POLICIES, KIND, None)
    register_policy(KIND, Policy({"triton": takes_triton}, why=backends.EVERYWHERE))

    @register_attention(KIND)
    class ToyAttention(TokenAttention):
        supports_mask = False
        supports_cross_length = False
        exp_complexity = "0"

        def __init__(self, dim: int, num_heads: int = 8, *, backend: str = "auto", **kwargs) -> None:
            super().__init__(dim, num_heads, **kwargs)
            self.backend = backends.check_backend(type(self).__name__, KIND, backend)

        def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: Optional[torch.Tensor]) -> torch.Tensor:
            return toy_attention(q, k, v, backend=self.backend)

    return ToyAttention


def _inputs(device):
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(2, 2, 9, 16, generator=gen).to(device) for _ in range(4))
    return (q, k, v), g


def _run(fn, inputs, g):
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, g)]


def _check(got, inputs, g):
    want = _run(toy_reference, [t.double() for t in inputs], g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)


def test_the_toy_kind_runs_its_kernel_eagerly_forward_and_backward(toy_kind, kernel_device, monkeypatch):
    inputs, g = _inputs(kernel_device)
    calls = []
    monkeypatch.setattr(_fma_kernel, "run", lambda *a, _run=_fma_kernel.run, **kw: calls.append(1) or _run(*a, **kw))
    _check(_run(lambda *t: toy_attention(*t, backend="triton"), inputs, g), inputs, g)
    assert len(calls) == 3  # the forward, then dq and dk (dv is g itself)
    assert backends.choose(KIND, "auto", Call(*inputs, device="cpu")) == "torch"
    with pytest.raises(ValueError, match=rf"^{KIND}: unknown backend 'cuda'; expected one of auto, torch, triton$"):
        toy_attention(*inputs, backend="cuda")


def test_the_toy_kind_compiles_in_one_graph_forward_and_backward(toy_kind, kernel_device):
    inputs, g = _inputs(kernel_device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *t: toy_attention(*t, backend="triton"), fullgraph=True, backend="aot_eager")
    _check(_run(compiled, inputs, g), inputs, g)


def test_the_toy_kind_exports_as_one_op(toy_kind, kernel_device):
    inputs, g = _inputs(kernel_device)
    module = toy_kind(32, 2, backend="triton").to(kernel_device)

    class Core(torch.nn.Module):  # the op alone, on (B, H, N, d) tensors
        def forward(self, q, k, v):
            return toy_attention(q, k, v, backend="triton")

    program = torch.export.export(Core(), inputs)
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert targets == ["simattn_toy.fma_fwd.default"]
    torch.testing.assert_close(program.module()(*inputs), toy_reference(*inputs))
    x = torch.randn(2, 9, 32, device=kernel_device)
    exported = torch.export.export(module, (x,))
    torch.testing.assert_close(exported.module()(x), module(x))


def test_the_toy_kind_is_timed_by_bench_attention(toy_kind):
    """``bench attention`` derives the kinds it times on a GPU from the policies: a new kind with a Triton
    backend is among them, with no list to edit."""
    from simattn.bench import attention as bench_attention
    assert KIND in bench_attention.timed_kinds("cuda")
