"""``simattn bench model --head fpn|upernet``: segmenters over the benchmarked backbones, HxW input sizes, peak memory
of the per-pixel logits, the measured attention share, and exported segmenters in the deployment runtimes."""
import csv
import json

import pytest
import torch
from torch import nn

import simattn  # noqa: F401  (registers the models)
from simattn.bench.model import cli as bench_model
from simattn.bench.model.probes import attention_share
from simattn.bench.model.runner import build_model
from simattn.bench.model.spec import BenchSpec, parse_size
from simattn.cli import main as simattn_main
from simattn.models.segmentation import Segmenter

BACKBONE = "sima_deit_tiny_patch16_224"
TINY = ["--models", BACKBONE, "--model-kwargs", "embed_dim=32", "depth=4", "num_heads=2",
        "--warmup", "0", "--repeats", "1", "--threads", "1", "--in-process"]


@pytest.mark.parametrize("text, size", [("512", 512), ("1024x2048", [1024, 2048]), ("64X128", [64, 128]),
                                        ("96x96", 96), (224, 224)])
def test_sizes_are_n_or_hxw(text, size):
    assert parse_size(text) == size
    assert BenchSpec(model=BACKBONE, img_size=[96, 96]).img_size == 96


@pytest.mark.parametrize("argv, message", [
    (["--img-size", "0"], "'0': sizes must be positive"),
    (["--img-size", "12x"], "'12x' is not a size; allowed: N or HxW"),
    (["--img-size", "axb"], "'axb' is not a size; allowed: N or HxW"),
    (["--img-size", "64x0"], "'64x0': sizes must be positive"),
    (["--img-size", "0x10"], "'0x10': sizes must be positive"),  # text, not YAML's hexadecimal 16
    (["--img-size", "64x128", "48x96", "--head", "fpn"],
     "--img-size 48x96: semantic_fpn on sima_deit_tiny_patch16_224 takes heights and widths that are multiples of 32"),
    (["--img-size", "64x128", "--head", "segformer"], "option '--head': got 'segformer'; allowed: one of fpn, upernet"),
])
def test_bad_sizes_and_heads_are_one_line_errors_before_any_work(argv, message, capsys, tmp_path):
    out = tmp_path / "bench"
    assert simattn_main(["bench", "model", *TINY, *argv, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert "configuration(s)" not in captured.out and not out.exists()


def test_head_wraps_the_backbone_and_its_attention_reaches_it():
    kwargs = {"embed_dim": 32, "depth": 4, "num_heads": 2}
    model = build_model(BenchSpec(model=BACKBONE, head="upernet", attn="softmax", img_size=[64, 128],
                                  model_kwargs=kwargs)).eval()
    assert isinstance(model, Segmenter) and model.head == "upernet" and model.attn_type == "softmax"
    assert model.backbone.patch_embed.img_size == (64, 128)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 128)).shape == (1, 150, 64, 128)


def test_fpn_rows_have_hxw_sizes_attention_share_and_pixel_memory(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_model.main([*TINY, "--head", "fpn", "--img-size", "64x128", "--attn", "sima", "softmax",
                           "--measure", "latency", "memory", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "bench_model.json").read_text())
    rows = {r["label"]: r for r in data["rows"]}
    assert set(rows) == {"sima", "softmax"}
    logits_mb = 150 * 64 * 128 * 4 / 2 ** 20
    for label, row in rows.items():
        assert "error" not in row and row["head"] == "fpn" and row["attn_type"] == label
        assert row["img_size"] == "64x128" and row["tokens"] == 4 * 8 + 1
        assert 0 < row["attn_core_share"] < row["attn_share"] < 1 and row["attn_share_runs"] == 1
        # the forward holds the logits and little else; the training step its per-pixel loss and gradients
        assert logits_mb < row["peak_fwd_mb"] < 2 * logits_mb
        assert row["peak_train_mb"] > 0 and row["infer_p50_ms"] > 0
    assert [(s["label"], s["head"], s["img_size"]) for s in data["speedups"]] == [("sima", "fpn", "64x128")]
    with open(out / "bench_model.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert 0 < float(table[0]["attn_share"]) < 1 and table[0]["img_size"] == "64x128"
    md = (out / "bench_model.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    assert "| head |" in header and "| attn_share | attn_core_share |" in header
    assert "| fpn | softmax | eager | 64x128 |" in md


class _Clock:
    """A stand-in for ``time.perf_counter`` that moves only when the modules below say they spent time: the shares
    come out the same on an idle or a loaded machine."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float):
        self.now += seconds


class _SlowLinear(nn.Linear):
    def __init__(self, clock, *args):
        super().__init__(*args)
        self.clock = clock

    def forward(self, x):
        self.clock.spend(0.01)
        return super().forward(x)


class _SlowAttention(nn.Module):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.proj = _SlowLinear(clock, 4, 4)

    def forward(self, x):
        self.clock.spend(0.01)
        return self.proj(x)


class _Net(nn.Module):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.attn = _SlowAttention(clock)

    def forward(self, x):
        self.clock.spend(0.02)
        return self.attn(x)


def test_attention_share_is_the_time_inside_attention_modules(monkeypatch):
    from simattn.bench.model import probes

    clock = _Clock()
    monkeypatch.setattr(probes, "time", clock)
    model = _Net(clock)
    x = torch.randn(1, 4)
    share = attention_share(model, lambda: model(x), torch.device("cpu"), repeats=3)
    assert share["attn_share_runs"] == 3
    assert share["attn_share"] == pytest.approx(0.5)  # 20 of 40 ms
    assert share["attn_core_share"] == pytest.approx(0.25)  # without the 10 ms projection
    assert not model.attn._forward_hooks and not model.attn._forward_pre_hooks  # the hooks are removed


def test_segmenter_in_onnxruntime_matches_torch(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_model.main([*TINY, "--head", "fpn", "--img-size", "64x128", "--attn", "sima",
                           "--runtime", "torch", "onnxruntime", "--measure", "latency", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = {r["runtime"]: r for r in json.loads((out / "bench_model.json").read_text())["rows"]}
    assert set(rows) == {"eager", "onnxruntime"}
    onnx = rows["onnxruntime"]
    assert "error" not in onnx and onnx["head"] == "fpn" and onnx["img_size"] == "64x128"
    assert onnx["runtime_max_abs_diff"] < 1e-4 and onnx["infer_p50_ms"] > 0
    assert "attn_share" in rows["eager"] and "attn_share" not in onnx  # measured on the eager model only


def test_segmenter_captures_at_a_fixed_size_without_resampling_its_position_embedding():
    """What ExecuTorch, Core ML and LiteRT export: the backbone laid out for the size, the decoder's upsampling
    kept."""
    from simattn.deploy.base import capture_fixed
    from simattn.deploy.ops import aten_op_counts

    model = build_model(BenchSpec(model=BACKBONE, head="fpn", attn="softmax", img_size=[64, 128],
                                  model_kwargs={"embed_dim": 32, "depth": 4, "num_heads": 2})).eval()
    x = torch.randn(1, 3, 64, 128)
    with torch.no_grad():
        ref = model(x)
    prepared, program = capture_fixed(model, (3, 64, 128))
    ops = aten_op_counts(program)
    assert not any("bicubic" in op for op in ops) and any("upsample_bilinear" in op for op in ops)
    assert not prepared.backbone.dynamic_img_size
    with torch.no_grad():
        assert torch.allclose(program.module()(x), ref, atol=1e-5)


def test_fpn_training_takes_its_loss_in_chunks_and_refuses_a_row_over_the_limit(tmp_path, capsys, monkeypatch):
    import torch.nn.functional as F

    from simattn.engine import losses

    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", 150 * 64 * 128)  # one image's logits per call
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda x, *a, **k: calls.append(tuple(x.shape)) or real(x, *a, **k))
    argv = [*TINY, "--head", "fpn", "--img-size", "64x128", "--attn", "sima", "--floor", "--batch-size", "2",
            "--measure", "train-throughput"]
    assert bench_model.main([*argv, "--out", str(tmp_path / "bench")]) == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "bench" / "bench_model.json").read_text())
    assert [(r["label"], r["train_batch"], "error" in r) for r in data["rows"]] == [("sima", 2, False),
                                                                                   ("floor", 2, False)]
    assert calls and set(calls) == {(1, 150, 64, 128)}  # every step's loss, one image at a time
    assert [(u["label"], u["head"]) for u in data["floor_ratios"]] == [("sima", "fpn")]
    assert data["floor_ratios"][0]["train_over_floor"] > 0

    capsys.readouterr()
    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", 150 * 128 - 1)
    out = tmp_path / "refused"
    assert simattn_main(["bench", "model", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "a row of 150 classes × 128 px holds 19200 logits, over the 19199" in err and len(err.splitlines()) == 1
    assert not out.exists()
