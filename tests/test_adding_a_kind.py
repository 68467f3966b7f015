"""A kind added the way ARCHITECTURE.md's "Adding an attention kind" says (a reference, an op, a registered
``TokenAttention``), with no other file touched: every model builds with it, ``simattn export`` writes it to ONNX
equal to PyTorch, and ``bench attention`` measures it."""
import json
from typing import Optional

import pytest
import torch

from simattn.attention import TokenAttention, _registry, register_attention
from simattn.cli import main as simattn_main
from simattn.models.factory import create_model

pytestmark = pytest.mark.usefixtures("one_thread")

KIND = "toy_l2"
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10)


def toy_reference(q, k, v):
    """The paper's form: l2-normalized queries and keys, their N×N products weighting the values, over N."""
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    return (q @ k.transpose(-2, -1)) @ v / k.shape[-2]


def toy_attention(q, k, v, eps: float = 1e-6):
    """The fast path: keys with values first (d×d), in fp32."""
    acc = torch.promote_types(q.dtype, torch.float32)
    qn = q.to(acc) / q.to(acc).norm(dim=-1, keepdim=True).clamp_min(eps)
    kn = k.to(acc) / k.to(acc).norm(dim=-1, keepdim=True).clamp_min(eps)
    return (qn @ (kn.transpose(-2, -1) @ v.to(acc)) / k.shape[-2]).to(q.dtype)


@pytest.fixture
def toy_kind(monkeypatch):
    """The kind registered for one test (the registry as it was, afterwards)."""
    monkeypatch.setattr(_registry, "_ATTENTIONS", dict(_registry._ATTENTIONS))

    @register_attention(KIND)
    class ToyAttention(TokenAttention):
        supports_mask = False
        exp_complexity = "0"

        def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: Optional[torch.Tensor]) -> torch.Tensor:
            return toy_attention(q, k, v)

    return ToyAttention


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2 ** -6)])
def test_the_op_holds_to_its_reference_forward_and_backward(dtype, bound):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 17, 16, generator=gen) for _ in range(3))
    grad = torch.randn(2, 2, 17, 16, generator=gen)
    outs = []
    for fn, dt in ((toy_reference, torch.float64), (toy_attention, dtype)):
        inputs = [t.to(dt).requires_grad_() for t in (q, k, v)]
        out = fn(*inputs)
        out.backward(grad.to(dt))
        outs.append([out.double()] + [t.grad.double() for t in inputs])
    scale = max(t.abs().max() for t in outs[0])
    for ref, fast in zip(*outs):
        assert (ref - fast).abs().max() <= bound * scale


def test_a_model_builds_and_trains_with_the_kind(toy_kind):
    model = create_model("sima_deit_tiny_patch16_224", attn_type=KIND, **TINY)
    assert all(type(block.attn) is toy_kind for block in model.blocks)
    loss = model(torch.randn(2, 3, 32, 32)).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_export_and_bench_take_the_kind(toy_kind, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "toy.onnx"
    kwargs = [f"{k}={v}" for k, v in dict(TINY, attn_type=KIND, act_layer="relu").items()]  # no GELU: exp-free
    assert simattn_main(["export", "--model", "sima_deit_tiny_patch16_224", "--model-kwargs", *kwargs,
                         "--exporter", "torchscript", "--require-exp-free", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    report = json.loads(out.with_name(out.name + ".json").read_text())
    assert report["attention"] == KIND and report["max_abs_diff"] <= 1e-4 and report["audit"]["exp_like_count"] == 0

    bench = tmp_path / "bench.json"
    assert simattn_main(["bench", "attention", "--kinds", KIND, "--tokens", "64", "--repeats", "1", "--rounds", "1",
                         "--threads", "1", "--output", str(bench)]) == 0, capsys.readouterr().err
    rows = json.loads(bench.read_text())["rows"]
    assert any(row["kind"] == KIND and row["median_ms"] > 0 for row in rows), rows
