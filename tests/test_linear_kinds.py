"""The kinds of the papers' comparison tables (Linformer, Performer, Nyströmformer, Efficient Attention, CosFormer)
beyond the shared attention cases (tests/attention_cases.py: oracles forward and backward, masks, fp16/bf16 bounds):
their exp-count class, the Performer's features and redraw policy, Linformer's two projection forms, CosFormer's
re-weighting, Nyströmformer's pseudo-inverse, the token grid and class token in the three backbone families, graph
capture and ONNX export with the exp-op audit, and bad input."""
import io

import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the kinds and the models)
from simattn.attention import create_attention, get_attention_class, list_attentions
from simattn.attention import reference as R
from simattn.attention.cosformer import cosformer_attention, cosformer_weights
from simattn.attention.linformer import linformer_attention, window_projection
from simattn.attention.nystrom import iterative_pinv, nystrom_attention
from simattn.attention.performer import orthogonal_random_features, performer_attention

from attention_cases import assert_ratio, qkv

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_KINDS = ["linformer", "performer", "nystrom", "efficient", "cosformer"]
#: how each kind's exps grow (the kinds that pool the grid at a fixed ratio: N², see their notes), XCA's channel
#: softmax, and the point-wise kinds
EXP_CLASS = {"softmax": "HN²", "linformer": "HN²", "performer": "ND", "nystrom": "HN²", "soft": "HN²", "efficient": "ND",
             "cosformer": "0", "sima": "0", "xca": "Hd²", "elu": "ND", "relu": "0", "xnorm": "0"}
# agent attention: 2·N·n softmax exps per head with n agents fixed; sigmoid attention: one per query-key pair
EXP_CLASS.update({"agent": "HN", "sigmoid": "HN²"})
# the linear kinds on the grid: softplus/sigmoid of parameters (FLatten, PolaFormer) and InLine's kernel GELU, per
# channel whatever N; SLAB's ReLU none
EXP_CLASS.update({"flatten": "Hd²", "inline": "Hd²", "slab": "0", "polaformer": "Hd²"})


# ---------------------------------------------------------------- exp-count class
def test_every_kind_declares_its_exp_class():
    assert set(EXP_CLASS) == set(list_attentions())
    for kind, expected in EXP_CLASS.items():
        assert get_attention_class(kind).exp_complexity == expected, kind
    # h with an exp-like function puts one evaluation on every score
    assert create_attention("relu", 16, num_heads=2, activation="sigmoid").exp_complexity == "HN²"
    assert create_attention("relu", 16, num_heads=2, activation="relu2").exp_complexity == "0"


@pytest.mark.parametrize("kind,options", [(k, {}) for k in NEW_KINDS] + [("cosformer", {"reweight": True})])
def test_onnx_graph_matches_exp_class(kind, options):
    """The exported graph has exp-like ops exactly when the kind's class is not '0', and runs in onnxruntime as the
    module does. (TorchScript-based exporter: the dynamo exporter takes these kinds too, at seconds each.)"""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from simattn.deploy.onnx import audit_onnx
    torch.manual_seed(0)
    m = create_attention(kind, 32, num_heads=2, **options).eval()
    x = torch.randn(2, 17, 32)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=18)
    proto = onnx.load_from_string(buf.getvalue())
    audit = audit_onnx(proto)
    assert audit.total_ops > 10 and audit.op_counts.get("MatMul", 0) >= 2
    assert (audit.exp_count == 0) == (m.exp_complexity == "0"), audit.exp_like
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), m(x), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- Performer
def test_orthogonal_features_are_orthogonal_in_blocks_with_gaussian_lengths():
    w = orthogonal_random_features(40, 16, torch.Generator().manual_seed(0), dtype=torch.float64)
    assert w.shape == (40, 16)
    for block in (w[:16], w[16:32], w[32:]):
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-10
    # lengths: norms of 16-dim standard Gaussians (mean ≈ √15.5 ≈ 3.94); not unit rows, not all equal
    lengths = w.norm(dim=1)
    assert 3.0 < lengths.mean() < 4.8 and lengths.std() > 0.2
    same = orthogonal_random_features(40, 16, torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(w, same)


def test_performer_approximates_softmax_attention():
    """FAVOR+ is an unbiased estimate of softmax attention: many features bring it close, few do not."""
    q, k, v = (t.double() * 0.5 for t in qkv(b=1, n=30, d=16, seed=0))
    exact = R.softmax_reference(q, k, v)
    errors = []
    for m in (16, 4096):
        w = orthogonal_random_features(m, 16, torch.Generator().manual_seed(1), dtype=torch.float64)
        errors.append(((performer_attention(q, k, v, features=w) - exact).norm() / exact.norm()).item())
    assert errors[1] < 0.05 < errors[0], errors


def test_performer_redraws_in_training_only_and_keeps_features_in_checkpoints():
    m = create_attention("performer", 32, num_heads=2, redraw_interval=2, feature_seed=7)
    first = m.features.clone()
    x = torch.randn(1, 9, 32)
    m.eval()
    for _ in range(5):
        m(x)
    assert torch.equal(m.features, first)  # evaluation is deterministic
    m.train()
    m(x), m(x)
    assert torch.equal(m.features, first)  # the first `redraw_interval` calls use the initial draw
    m(x)
    assert not torch.equal(m.features, first)
    # seeded: another module with the same seed draws the same sequence
    twin = create_attention("performer", 32, num_heads=2, redraw_interval=2, feature_seed=7).train()
    assert torch.equal(twin.features, first)
    twin(x), twin(x), twin(x)
    assert torch.equal(twin.features, m.features)
    # the features are saved with the weights: a loaded model evaluates as the trained one
    loaded = create_attention("performer", 32, num_heads=2).eval()
    loaded.load_state_dict(m.state_dict())
    m.eval()
    torch.testing.assert_close(loaded(x), m(x), rtol=0, atol=0)
    never = create_attention("performer", 32, num_heads=2, redraw_interval=0).train()
    start = never.features.clone()
    for _ in range(3):
        never(x)
    assert torch.equal(never.features, start)


def test_performer_default_feature_count_and_errors():
    assert create_attention("performer", 64, num_heads=2).num_features == int(32 * torch.log(torch.tensor(32.)))
    q, k, v = qkv(n=5)
    with pytest.raises(ValueError, match=r"performer: features must have shape \(m, d\) = \(m, 16\), got \(8, 15\)"):
        performer_attention(q, k, v, features=torch.ones(8, 15))
    with pytest.raises(ValueError, match="redraw_interval=-1; allowed: an integer >= 0"):
        create_attention("performer", 32, num_heads=2, redraw_interval=-1)


# ---------------------------------------------------------------- Linformer
def test_linformer_window_projection_is_the_block_matrix_of_the_windows():
    x = torch.randn(2, 3, 1 + 5 * 7, 4, dtype=torch.float64)
    w = torch.randn(3, 3, dtype=torch.float64)
    e = R.linformer_window_matrix_reference((5, 7), 3, w, num_prefix_tokens=1)
    assert e.shape == (1 + 2 * 3, 36)
    assert_ratio(window_projection(x, (5, 7), w, num_prefix_tokens=1), e @ x, 1e-14, "window projection")


def test_linformer_window_form_starts_as_average_pooling_of_keys():
    """Initialised to the window mean, the grid form is softmax attention over 2×2-pooled keys and values."""
    m = create_attention("linformer", 16, num_heads=2, ratio=2, num_prefix_tokens=0).double()
    q, k, v = (t.double() for t in qkv(b=1, n=16, d=8))
    pool = lambda t: R.pool_landmarks_reference(t, (4, 4), 2)  # noqa: E731
    out = m.attend(q[:, :2], k[:, :2], v[:, :2], None, grid_size=(4, 4))
    assert_ratio(out, R.softmax_reference(q[:, :2], pool(k[:, :2]), pool(v[:, :2])), 1e-12, "pooled keys")


def test_linformer_dense_form_takes_exactly_its_sequence_length():
    m = create_attention("linformer", 32, num_heads=2, seq_len=17, proj_len=5)
    assert m.proj_k.shape == (5, 17) and m.proj_v.shape == (5, 17)
    assert m(torch.randn(2, 17, 32)).shape == (2, 17, 32)
    with pytest.raises(ValueError, match="built for seq_len=17 tokens .* got 10; allowed: exactly 17"):
        m(torch.randn(2, 10, 32))
    with pytest.raises(ValueError, match="proj_len=5 needs seq_len"):
        create_attention("linformer", 32, num_heads=2, proj_len=5)
    shared = create_attention("linformer", 32, num_heads=2, share_kv=True)
    assert shared.proj_v is None and "proj_v" not in dict(shared.named_parameters())


def test_linformer_and_nystrom_refuse_masks():
    q, k, v = qkv(n=20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    with pytest.raises(ValueError, match="linformer: token masks are not supported"):
        linformer_attention(q, k, v, proj_k=torch.ones(4, 20), mask=mask)
    with pytest.raises(ValueError, match="nystrom: token masks are not supported"):
        nystrom_attention(q, k, v, grid_size=(4, 5), mask=mask)
    for kind in ("linformer", "nystrom"):
        with pytest.raises(ValueError, match="does not support attention masks"):
            create_attention(kind, 32, num_heads=2)(torch.randn(2, 16, 32), attn_mask=mask[:, :16])


# ---------------------------------------------------------------- Nyströmformer
def test_nystrom_pinv_iteration_converges_to_the_pseudo_inverse():
    torch.manual_seed(0)
    a = torch.randn(2, 8, 8, dtype=torch.float64).softmax(-1)
    exact = torch.linalg.pinv(a)
    errors = [((iterative_pinv(a, n) - exact).norm() / exact.norm()).item() for n in (1, 6, 20)]
    assert errors[2] < 1e-10 < errors[0] and errors[1] < errors[0], errors


def test_nystrom_with_every_token_a_landmark_is_softmax_attention():
    """ratio 1: the landmarks are the tokens, and the Nyström factorization is exact."""
    q, k, v = (t.double() for t in qkv(b=1, n=12, d=8))
    out = nystrom_attention(q, k, v, grid_size=(3, 4), ratio=1, num_iters=30)
    assert_ratio(out, R.softmax_reference(q, k, v), 1e-8, "ratio 1")


# ---------------------------------------------------------------- CosFormer
def test_cosformer_reweighting_takes_four_products_and_equals_the_cosine_weights():
    w = cosformer_weights((4, 5), 1, torch.float64, torch.device("cpu"))
    assert w.shape == (4, 21)
    assert torch.equal(w[:, 0], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))  # prefix token at angle 0
    # Σ_p w_p(i) w_p(j) = cos(α_i − α_j) cos(β_i − β_j): the four products rebuild SimA's A.4 weight
    rows, cols = torch.arange(20) // 5, torch.arange(20) % 5
    alpha = torch.cat([torch.zeros(1), (rows + 1) * torch.pi / 8]).double()
    beta = torch.cat([torch.zeros(1), (cols + 1) * torch.pi / 10]).double()
    expected = torch.cos(alpha[:, None] - alpha) * torch.cos(beta[:, None] - beta)
    torch.testing.assert_close(w.T @ w, expected)


def test_cosformer_reweight_needs_one_grid():
    q, k, v = qkv(n=20, nk=16)
    cosformer_attention(q, k, v)  # plain: any lengths
    with pytest.raises(ValueError, match="cosformer: this attention needs equal query and key lengths"):
        cosformer_attention(q, k, v, reweight=True)
    q, k, v = qkv(n=18)
    with pytest.raises(ValueError, match="cosformer: cannot infer a square token grid from N=18"):
        cosformer_attention(q, k, v, reweight=True)
    with pytest.raises(ValueError, match="reweight='yes'; allowed: True or False"):
        create_attention("cosformer", 32, num_heads=2, reweight="yes")


# ---------------------------------------------------------------- the three backbone families
def test_soft_pyramid_gives_its_reduction_ratio_to_linformer_and_nystrom():
    for kind in ("linformer", "nystrom"):
        model = timm.create_model("soft_tiny", attn_type=kind, num_classes=3).eval()
        attn = [stage.blocks[0].attn for stage in model.stages]
        assert [a.ratio for a in attn[:3]] == [8, 4, 2] and all(a.num_prefix_tokens == 0 for a in attn[:3])
        # SOFT's Table 1: 13M parameters for every attention in the Tiny pyramid (head of 1000 classes)
        params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("head")) + 513 * 1000
        assert abs(params - 13e6) / 13e6 < 0.05, params


@pytest.mark.parametrize("kind,options", [(k, {}) for k in NEW_KINDS] + [("cosformer", {"reweight": True})])
def test_kind_runs_in_the_soft_pyramid_and_is_captured(kind, options):
    """The SOFT pyramid (non-square grids passed, a class token in the last stage) runs each kind (DeiT and XCiT
    take every kind in test_attention.py and test_models_xcit.py); a pyramid attention module called on a grid and
    a module inferring a square grid after a class token (DeiT's call) give eager's outputs under TorchScript and
    torch.export (dynamic batch)."""
    torch.manual_seed(0)
    pyramid = timm.create_model("soft_tiny", img_size=64, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                                num_heads=(1, 2, 2, 4), stem_chans=8, num_classes=3, attn_type=kind,
                                attn_kwargs=options).eval()
    with torch.no_grad():
        out = pyramid(torch.randn(2, 3, 64, 96))
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        stage_attn = pyramid.stages[1].blocks[0].attn  # ratio 2 where the kind takes one: a 5×7 grid clips windows
        x, grid = torch.randn(2, 35, 32), (5, 7)
        eager = stage_attn(x, grid_size=grid)
        torch.testing.assert_close(torch.jit.script(stage_attn)(x, None, False, grid), eager, rtol=1e-5, atol=1e-6)
        deit_attn, x_cls = create_attention(kind, 32, num_heads=2, **options).eval(), torch.randn(2, 17, 32)
        eager = deit_attn(x_cls)
        torch.testing.assert_close(torch.jit.script(deit_attn)(x_cls), eager, rtol=1e-5, atol=1e-6)
        batch = torch.export.Dim("batch", min=1, max=64)
        exported = torch.export.export(deit_attn, (x_cls,), dynamic_shapes=({0: batch},))
        x3 = torch.randn(3, 17, 32)
        torch.testing.assert_close(exported.module()(x3), deit_attn(x3), rtol=1e-5, atol=1e-6)
