"""``simattn bench model``'s linear floor, profiled shares and bar figure: tiny models, torch and onnxruntime."""
import json

import pytest
import torch
from torch import nn

import simattn  # noqa: F401  (registers the models)
from simattn.bench.model import cli as bench_model, results as bench_results
from simattn.bench.model.probes import LinearFloor, linear_calls, linear_floor
from simattn.bench.model.runner import build_model
from simattn.bench.model.spec import BenchSpec

TINY_MODEL = "sima_deit_tiny_patch16_224"
TINY = {"patch_size": 4, "embed_dim": 32, "num_heads": 2}
ARGS = ["--models", TINY_MODEL, "--img-size", "16", "--model-kwargs", *(f"{k}={v}" for k, v in TINY.items()),
        "depth=1", "--warmup", "0", "--repeats", "2", "--threads", "1", "--in-process", "--measure", "latency"]


def _tiny(depth):
    return build_model(BenchSpec(model=TINY_MODEL, attn="sima", img_size=16, model_kwargs={**TINY, "depth": depth}))


def test_floor_holds_every_linear_the_model_runs_at_its_input_shape():
    model = _tiny(2)
    x = torch.randn(1, 3, 16, 16)
    calls = linear_calls(model, x)
    # 2 blocks × (qkv, proj, fc1, fc2) on 16 patches + the class token, then the head on the class token; the
    # convolution patch embedding is no linear
    assert [c["name"] for c in calls] == [f"blocks.{b}.{n}" for b in range(2)
                                          for n in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")] + ["head"]
    assert [(c["input_shape"], c["out_features"]) for c in calls] == \
        [((1, 17, 32), 96), ((1, 17, 32), 32), ((1, 17, 32), 128), ((1, 17, 128), 32)] * 2 + [((1, 32), 1000)]

    floor = linear_floor(model, x)
    assert isinstance(floor, LinearFloor) and all(isinstance(m, nn.Linear) for m in floor.layers)
    assert [(m.in_features, m.out_features) for m in floor.layers] == \
        [(c["in_features"], c["out_features"]) for c in calls]
    assert sum(isinstance(m, nn.Linear) for m in floor.modules()) == len(calls)
    # the floor's own layers see the shapes the model's did, and nothing else runs a linear
    seen = linear_calls(floor, x)
    assert [c["input_shape"] for c in seen] == [c["input_shape"] for c in calls]
    assert floor(torch.randn(2, 3, 16, 16)).shape == (2, 1000)  # any batch: exporters trace it at batch 2
    with pytest.raises(ValueError, match="no nn.Linear"):
        LinearFloor([])


def test_floor_and_profile_columns_for_onnxruntime(tmp_path, capsys):
    out = tmp_path / "ort"
    assert bench_model.main(ARGS + ["--attn", "sima", "softmax", "--runtime", "torch", "onnxruntime",
                                    "--onnx-exporter", "torchscript", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "bench_model.json").read_text())
    rows = data["rows"]
    assert sorted(r["runtime"] for r in rows) == ["eager", "eager", "onnxruntime", "onnxruntime"]
    for r in rows:  # on by default with a runtime besides torch, for every row
        assert "error" not in r and r["floor_linears"] == 1 * 4 + 1
        assert 0 < r["floor_p10_ms"] <= r["floor_ms"] <= r["floor_p90_ms"]
        assert r["of_floor"] == pytest.approx(r["infer_p50_ms"] / r["floor_ms"])
    for r in rows:
        if r["runtime"] == "onnxruntime":
            assert 0 < r["non_linear_share"] < 1 and r["profile_ops"]
        else:
            assert "non_linear_share" not in r
    assert all(u["of_floor"] > 0 for u in data["runtime_speedups"])
    assert "floor_ms" in printed and "of_floor" in printed and "non_linear_share" in printed
    assert "a convolution patch embedding is not a linear" in printed


def test_floor_is_off_for_torch_alone_and_on_when_asked(tmp_path):
    assert bench_model.main(ARGS + ["--attn", "sima", "--out", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain" / "bench_model.json").read_text())["rows"]
    assert "floor_ms" not in plain[0] and plain[0]["infer_p50_ms"] > 0
    assert bench_model.main(ARGS + ["--attn", "sima", "--floor", "--out", str(tmp_path / "floor")]) == 0
    floor = json.loads((tmp_path / "floor" / "bench_model.json").read_text())["rows"]
    assert floor[0]["floor_ms"] > 0 and floor[0]["of_floor"] > 0


def _rows(sizes, runtimes=("eager", "onnxruntime", "onnxruntime int8"), labels=("sima", "softmax")):
    rows = []
    for size in sizes:
        for i, runtime in enumerate(runtimes):
            for j, label in enumerate(labels):
                ms = size / 10 / (i + 1) * (1 + j)
                rows.append({"model": TINY_MODEL, "label": label, "attn": label, "runtime": runtime,
                             "img_size": size, "precision": "fp32", "device": "cpu", "infer_p50_ms": ms,
                             "infer_p10_ms": 0.9 * ms, "infer_p90_ms": 1.2 * ms, "floor_ms": 0.5 * ms / (1 + j)})
    return rows


@pytest.fixture
def figures(monkeypatch):
    kept = []
    monkeypatch.setattr(bench_results, "save_figure", lambda fig, path: kept.append(fig))
    yield kept
    import matplotlib.pyplot as plt
    for fig in kept:
        plt.close(fig)


def test_one_size_plots_grouped_bars_with_floor_and_speedups(figures, tmp_path):
    bench_results.plot_results(_rows([224]), tmp_path / "bars.png")
    ax = figures[0].axes[0]
    assert len(ax.patches) == 3 * 2  # runtimes × attention kinds
    assert [t.get_text() for t in ax.get_xticklabels()] == ["torch\nfp32", "onnxruntime\nfp32", "onnxruntime\nint8"]
    floors = [c for c in ax.collections if c.get_label() == "linear floor (floor_ms)"]
    assert len(floors) == 1 and sum(len(c.get_segments()) for c in ax.collections
                                    if type(c).__name__ == "LineCollection" and c.get_linewidth()[0] > 2) == 6
    notes = [t.get_text() for t in ax.texts]
    assert "2.00× eager\n2.00× softmax" in notes  # onnxruntime SimA: half eager's time, half softmax's
    assert "2.00× softmax" in notes and "3.00× eager" in notes  # eager SimA; onnxruntime int8 softmax


def test_several_sizes_keep_the_line_plot(figures, tmp_path):
    bench_results.plot_results(_rows([224, 384]), tmp_path / "lines.png")
    ax = figures[0].axes[0]
    assert not ax.patches
    # one line per attention kind and runtime, each through both sizes
    named = [ln for ln in ax.lines if not ln.get_label().startswith("_")]
    assert len(named) == 2 * 3 and all(len(ln.get_xdata()) == 2 for ln in named)
    assert "sima (onnxruntime int8)" in {ln.get_label() for ln in named}


def test_attention_free_floor_keeps_the_network_and_passes_the_values_through():
    from simattn.attention import TokenAttention
    from simattn.bench.model.runner import without_attention

    model = _tiny(2).eval()
    floor = build_model(BenchSpec(model=TINY_MODEL, attn="sima", img_size=16, model_kwargs={**TINY, "depth": 2},
                                  attention_free=True)).eval()
    assert floor.state_dict().keys() == model.state_dict().keys()
    attention = [m for m in floor.modules() if isinstance(m, TokenAttention)]
    assert len(attention) == 2 and all(type(m).__name__ == "AttentionFreeSimAAttention" for m in attention)
    x = torch.randn(2, 17, 32)
    module = attention[0]
    _, _, v = module.project(x)
    with torch.no_grad():  # the module's own projections around the values: heads merged, then proj
        assert torch.equal(module(x), module.proj(v.transpose(1, 2).reshape(2, 17, 32)))
    assert floor(torch.randn(1, 3, 16, 16)).shape == (1, 1000)
    with pytest.raises(ValueError, match="replaces simattn's attention kinds, not Attention"):
        import timm
        without_attention(timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=1))
    with pytest.raises(ValueError, match="has no attention module"):
        without_attention(nn.Sequential(nn.Linear(2, 2)))


def test_floor_rows_per_size_and_the_ratios_over_them(tmp_path, capsys):
    out = tmp_path / "floor"
    argv = ARGS[:ARGS.index("--measure")] + ["--img-size", "16", "32", "--batch-size", "2", "3", "--attn", "sima",
                                             "softmax", "--floor", "--measure", "train-throughput", "--out", str(out)]
    assert bench_model.main(argv) == 0
    data = json.loads((out / "bench_model.json").read_text())
    rows = data["rows"]
    assert [(r["label"], r["attn"], r["img_size"], r["train_batch"]) for r in rows] == [
        ("sima", "sima", 16, 2), ("softmax", "softmax", 16, 2), ("floor", "sima", 16, 2),
        ("sima", "sima", 32, 3), ("softmax", "softmax", 32, 3), ("floor", "sima", 32, 3)]
    floors = {r["img_size"]: r for r in rows if r["label"] == "floor"}
    by = {(u["label"], u["img_size"]): u for u in data["floor_ratios"]}
    assert set(by) == {(label, size) for label in ("sima", "softmax") for size in (16, 32)}
    for r in rows:
        if r["label"] != "floor":
            assert by[r["label"], r["img_size"]]["train_over_floor"] == \
                pytest.approx(floors[r["img_size"]]["train_ips"] / r["train_ips"])
    assert "Time over the attention-free floor" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--models", TINY_MODEL, "--attn", "floor=softmax", "--floor"],
     "--attn label 'floor' names the attention-free floor's rows"),
    (["--models", "vit_tiny_patch16_224", "--floor"], "replaces simattn's attention kinds, not Attention"),
])
def test_floor_refusals_are_one_line_before_any_work(argv, message, tmp_path, capsys):
    from simattn.cli import main as simattn_main

    out = tmp_path / "bench"
    code = simattn_main(["bench", "model", *argv, "--img-size", "16", "--model-kwargs", "patch_size=4",
                         "embed_dim=32", "num_heads=2", "depth=1", "--in-process", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_exported_runtimes_keep_the_linear_floor_and_torch_gets_the_attention_free_rows():
    argv = ["--models", TINY_MODEL, "--img-size", "16", "--attn", "sima", "softmax", "--measure", "latency",
            "--runtime", "torch", "onnxruntime"]
    default = bench_model.build_specs(bench_model.parse_args(argv), 1)
    assert [(s.runtime, s.label, s.floor, s.attention_free) for s in default] == [
        (runtime, label, True, False) for runtime in ("torch", "onnxruntime") for label in ("sima", "softmax")]
    given = bench_model.build_specs(bench_model.parse_args(argv + ["--floor"]), 1)
    assert [(s.runtime, s.label, s.attention_free) for s in given] == [
        ("torch", "sima", False), ("torch", "softmax", False), ("torch", "floor", True),
        ("onnxruntime", "sima", False), ("onnxruntime", "softmax", False)]
