"""SimA's compiled CPU kernel against the plain reference written from the paper, and where 'auto' runs it.

The kernel is inference-only (no autograd), so it is held to the reference in the forward pass; every call that needs
gradients runs the torch path, whose forward and backward tests/test_attention_fast_paths.py covers."""
import shutil

import pytest
import torch

from simattn.attention import SimAAttention
from simattn.kernels.cpu import sima as sima_cpu
from simattn.attention import reference as R
from simattn.attention.sima import sima_attention


@pytest.fixture(scope="module")
def kernel():
    """The built kernel: built here where scripts/setup_venv.sh did not (a compiler is there but the build failed:
    the test fails); skipped only on a machine without a C++ compiler."""
    if not sima_cpu.available():
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler to build SimA's CPU kernel")
        sima_cpu.build()
    return sima_cpu


class Spy:
    """Counts the kernel's calls and runs it."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = sima_cpu.sima_kv_first

        def call(*args):
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(sima_cpu, "sima_kv_first", call)


def _views(b, n, h, d, layout, seed):
    """q, k, v (B, H, N, d): views of one fused (B, N, 3, H, d) projection, token-major (B, N, H, d) tensors seen
    as (B, H, N, d), or contiguous (B, H, N, d) tensors."""
    g = torch.Generator().manual_seed(seed)
    if layout == "fused":
        return torch.randn(b, n, 3, h, d, generator=g).permute(2, 0, 3, 1, 4).unbind(0)
    if layout == "token_major":
        return [torch.randn(b, n, h, d, generator=g).transpose(1, 2) for _ in range(3)]
    return [torch.randn(b, h, n, d, generator=g) for _ in range(3)]


def _close(out, q, k, v, eps=1e-12):
    ref = R.sima_reference(q.double(), k.double(), v.double(), eps=eps)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6 * max(1.0, ref.abs().max().item()))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("b, n, h, d, layout", [
    (1, 64, 6, 64, "fused"),          # the bench's smallest size
    (2, 300, 3, 16, "fused"),         # several token blocks; three threads split one item's tokens
    (3, 65, 4, 16, "token_major"),    # the demo's model
    (1, 1, 2, 8, "contiguous"),       # one token: every entry of q̂ and k̂ is ±1
    (2, 7, 5, 3, "contiguous"),       # odd sizes, heads not side by side
])
def test_kernel_matches_the_reference(kernel, b, n, h, d, layout, threads):
    q, k, v = _views(b, n, h, d, layout, seed=n + d)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = kernel.sima_kv_first(q, k, v, 1e-12)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (b, h, n, d)
    assert out.transpose(1, 2).is_contiguous()  # token-major: merging the heads is a view
    _close(out, q, k, v)


def test_kernel_floors_zero_norms_at_eps(kernel):
    """A channel that is zero in every token has norm 0, and one of tiny entries a norm below eps: the floor eps
    applies to both, as in F.normalize (the tiny channel's output term is a fraction of what it would be
    unfloored: 9e-5 / 1e-3, about 1/11), and the output stays finite; v with another width than q and k."""
    q, k, _ = _views(1, 9, 2, 4, "contiguous", seed=1)
    v = torch.randn(1, 2, 9, 6)
    q[..., 0] = 0
    k[..., 1] = 0
    k[..., 2] = 1e-5 * k[..., 2].sign()  # l1 norm 9e-5 < eps
    out = kernel.sima_kv_first(q, k, v, 1e-3)
    assert out.shape == (1, 2, 9, 6) and torch.isfinite(out).all()
    _close(out, q, k, v, eps=1e-3)


def test_auto_runs_the_kernel_only_where_it_applies(kernel, monkeypatch):
    spy = Spy(monkeypatch)
    q, k, v = _views(2, 40, 2, 8, "fused", seed=3)
    with torch.no_grad():
        _close(sima_attention(q, k, v), q, k, v)
    assert spy.calls == 1
    with torch.no_grad():  # a mask, fp64, the (q̂k̂ᵀ)v order, overlapping rows: torch
        mask = torch.ones(2, 40, dtype=torch.bool)
        mask[:, -3:] = False
        sima_attention(q, k, v, mask=mask)
        sima_attention(q.double(), k.double(), v.double())
        sima_attention(q, k, v, order="qk_first")
        shared = v[:, :, :1].expand_as(v)  # one value row for every token: BLAS cannot take rows that overlap
        _close(sima_attention(q, k, shared), q, k, shared)
    assert spy.calls == 1
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))  # gradients: torch, and they flow
    sima_attention(qg, kg, vg).sum().backward()
    assert spy.calls == 1 and qg.grad is not None and torch.isfinite(qg.grad).all()


def test_explicit_cpp_backend_says_why_it_cannot_run(kernel):
    q, k, v = _views(1, 10, 2, 4, "contiguous", seed=4)
    with pytest.raises(ValueError, match=r"backend 'cpp' has no autograd") as info:
        sima_attention(q.requires_grad_(True), k, v, backend="cpp")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"backend 'cpp' takes no mask"):
        sima_attention(q.detach(), k, v, backend="cpp", mask=torch.ones(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"backend 'cpp' takes float32 q, k and v"):
        sima_attention(q.detach().double(), k.double(), v.double(), backend="cpp")


def test_module_runs_the_kernel_in_inference_and_torch_in_training(kernel, monkeypatch):
    torch.manual_seed(0)
    auto = SimAAttention(32, num_heads=4).eval()
    plain = SimAAttention(32, num_heads=4, backend="torch").eval()
    plain.load_state_dict(auto.state_dict())
    x = torch.randn(2, 33, 32)
    spy = Spy(monkeypatch)
    with torch.inference_mode():
        fast, expected = auto(x), plain(x)
    assert spy.calls == 1
    torch.testing.assert_close(fast, expected, rtol=1e-5, atol=1e-6)
    auto.train()(x).sum().backward()  # parameters need gradients: torch
    assert spy.calls == 1 and auto.qkv.weight.grad is not None


def test_not_built_runs_torch_and_explicit_cpp_names_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMATTN_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(sima_cpu, "_loaded", None)
    assert not sima_cpu.available() and "simattn build-kernels" in sima_cpu.unavailable_reason()
    q, k, v = _views(1, 10, 2, 4, "contiguous", seed=5)
    with torch.no_grad():
        _close(sima_attention(q, k, v), q, k, v)
        with pytest.raises(ValueError, match=r"backend 'cpp' is not built: .*simattn build-kernels"):
            sima_attention(q, k, v, backend="cpp")
    assert not (tmp_path / "kernels").exists()  # asking never builds


def test_build_without_a_compiler_fails_in_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIMATTN_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(sima_cpu, "_loaded", None)
    assert sima_cpu.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("simattn: SimA's CPU kernel was not built: no C++ compiler") and "\n" not in err
    assert not (tmp_path / "kernels").exists()
