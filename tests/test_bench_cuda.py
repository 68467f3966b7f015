"""``simattn bench attention|model --device cuda``: one line and exit code 2 without CUDA; the GPU sweep's rows,
bytes and roofline on CPU with a stand-in timer; the real sweeps when there is a GPU."""
import json

import pytest
import torch

from simattn.bench import attention as bench
from simattn.cli import main as simattn_main
from simattn.utils.timing import time_fn

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


@NO_CUDA
@pytest.mark.parametrize("what", ["attention", "model"])
def test_without_cuda_one_line_and_exit_2_before_any_work(what, tmp_path, capsys):
    out = tmp_path / "out"
    assert simattn_main(["bench", what, "--device", "cuda", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"simattn bench {what}: error: no CUDA device: --device cuda")
    assert captured.out == "" and not out.exists()


def test_gpu_sweep_rows_on_cpu_with_a_stand_in_timer(monkeypatch):
    """The sweep's code path end to end on CPU tensors (Triton in its interpreter, a CPU timer): every kind × pass
    × N gets a row; a backend with no kernel here gives an error row instead of stopping the sweep."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    kinds = ["sima", "sima_triton", "sdpa_flash", "sdpa_efficient"]
    rows = bench.run_gpu([16, 33], kinds, batch=1, heads=2, head_dim=16, dtype=torch.float32, device="cpu",
                         peak_gbps=100.0, timer=lambda fn: time_fn(fn, warmup=1, repeats=2))
    assert [(r["kind"], r["pass"], r["tokens"]) for r in rows] == [
        (kind, pass_, n) for n in (16, 33) for kind in kinds for pass_ in bench.PASSES]
    ran = [r for r in rows if "error" not in r]
    assert {r["kind"] for r in ran} >= {"sima", "sima_triton"}
    for r in ran:
        tensor = 1 * 2 * r["tokens"] * 16 * 4  # one (B, H, N, d) fp32 tensor
        assert r["bytes"] == (4 if r["pass"] == "fwd" else 11) * tensor
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        assert r["roofline_ms"] == pytest.approx(r["bytes"] / 100e6)
    assert "not run:" in bench.format_gpu_table(rows) or all("error" not in r for r in rows)


def test_roofline_bandwidth_and_sdpa_ratio_from_known_timings():
    rows = [{"kind": "sdpa_flash", "pass": "fwd", "tokens": 4096, "median_ms": 2.0, "p10_ms": 1.9, "p90_ms": 2.1,
             "bytes": 400_000_000},
            {"kind": "sdpa_efficient", "pass": "fwd", "tokens": 4096, "median_ms": 4.0, "p10_ms": 4.0, "p90_ms": 4.0,
             "bytes": 400_000_000},
            {"kind": "sima_triton", "pass": "fwd", "tokens": 4096, "median_ms": 0.5, "p10_ms": 0.5, "p90_ms": 0.6,
             "bytes": 400_000_000},
            {"kind": "sima", "pass": "fwd+bwd", "tokens": 4096, "median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0,
             "bytes": 1_100_000_000},
            {"kind": "sdpa_flash", "pass": "fwd+bwd", "tokens": 4096, "error": "no kernel"}]
    rows = bench.add_roofline(rows, peak_gbps=4000)
    triton = rows[2]
    # by hand: 4e8 B / 0.5 ms = 800 GB/s; 4e8 B at 4000 GB/s = 0.1 ms = 20 % of 0.5 ms; flash 2.0 / 0.5 = 4
    assert triton["gbps"] == pytest.approx(800) and triton["roofline_ms"] == pytest.approx(0.1)
    assert triton["roofline_frac"] == pytest.approx(0.2) and triton["speedup_vs_sdpa"] == pytest.approx(4.0)
    assert rows[1]["speedup_vs_sdpa"] == pytest.approx(0.5)
    assert rows[3]["speedup_vs_sdpa"] is None  # no SDPA backend ran forward+backward
    table = bench.format_gpu_table(rows).splitlines()
    assert "% HBM" in table[0]
    assert table[4].split()[:10] == ["sima_triton", "fwd", "4096", "0.500", "0.500", "0.600", "800", "0.1000",
                                     "20.0%", "4.00"]
    assert "not run: no kernel" in table[6]


@pytest.mark.parametrize("name, gbps", [("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H200", 4800),
                                        ("NVIDIA GH200 480GB", 4000), ("NVIDIA A100-SXM4-80GB", 2039),
                                        ("NVIDIA H100 PCIe", 2000), ("Some Future GPU", bench.DEFAULT_HBM_GBPS)])
def test_hbm_peak_by_device_name(name, gbps, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak, source = bench.hbm_gbps(torch.device("cuda"))
    assert peak == gbps and source.startswith(name)
    # the share of that peak a row reaches: 1 GB in 1 ms is 1000 GB/s
    row = bench.add_roofline([{"kind": "sima_triton", "pass": "fwd", "tokens": 1, "median_ms": 1.0,
                               "bytes": 1_000_000_000}], peak)[0]
    assert row["roofline_frac"] == pytest.approx(1000 / gbps)


def _timed(kind, pass_, n, ms):
    return {"kind": kind, "pass": pass_, "tokens": n, "median_ms": ms}


def test_triton_crossover_is_where_triton_wins_from_then_on():
    rows = [_timed("sima", p, n, 1.0) for p in bench.PASSES for n in (197, 577, 1025, 4097)]
    triton = {(p, n): ms for p in bench.PASSES for n, ms in ((197, 0.5), (577, 1.5), (1025, 0.9), (4097, 0.2))}
    triton[("fwd+bwd", 1025)] = 1.1  # forward faster at 1025 but training slower: not from 1025 on
    rows += [_timed("sima_triton", p, n, ms) for (p, n), ms in triton.items()]
    assert bench.triton_crossover(rows) == 4097
    triton_all = [dict(r, median_ms=0.5) if r["kind"] == "sima_triton" else r for r in rows]
    assert bench.triton_crossover(triton_all) == 197
    slow_at_top = [dict(r, median_ms=2.0) if r["kind"] == "sima_triton" and r["tokens"] == 4097 else r
                   for r in triton_all]
    assert bench.triton_crossover(slow_at_top) is None
    errored = [dict(r, error="no kernel") if r["kind"] == "sima_triton" else r for r in rows]
    assert bench.triton_crossover(errored) is None


def test_write_backend_table_adds_this_gpu_keeps_the_others_and_combines_sweeps(tmp_path):
    import json

    from simattn.attention import sima

    path = tmp_path / "table.json"
    rows = [_timed(kind, p, n, ms) for p in bench.PASSES for n in (197, 1025)
            for kind, ms in (("sima", 1.0), ("sima_triton", 0.5 if n == 1025 else 2.0))]
    bench.write_backend_table(rows, "GPU A", str(path), {"batch": 128})
    table = json.loads(path.read_text())
    assert table["default_min_tokens"] == sima.gpu_table()["default_min_tokens"]
    assert table["gpus"]["GPU A"] == {"min_tokens": 1025, "sweeps": [{"batch": 128}]}
    faster = [dict(r, median_ms=0.1) if r["kind"] == "sima_triton" else r for r in rows]
    bench.write_backend_table(faster, "GPU B", str(path), {})
    bench.write_backend_table(faster, "GPU A", str(path), {"batch": 8})  # a second sweep: the larger N stays
    table = json.loads(path.read_text())
    assert table["gpus"]["GPU B"]["min_tokens"] == 197
    assert table["gpus"]["GPU A"] == {"min_tokens": 1025, "sweeps": [{"batch": 128}, {"batch": 8}]}
    slower = [dict(r, median_ms=9.0) if r["kind"] == "sima_triton" else r for r in rows]
    bench.write_backend_table(slower, "GPU B", str(path), {})
    assert json.loads(path.read_text())["gpus"]["GPU B"]["min_tokens"] is None


def test_write_table_is_for_the_gpu_sweep_and_needs_both_sima_kinds(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--write-table applies to --device cuda"):
        bench.main(["--write-table", str(tmp_path / "t.json")])
    monkeypatch.setattr(bench, "require_cuda", lambda device: None)  # past the CUDA check, before any work
    with pytest.raises(ValueError, match="--write-table compares sima with sima_triton: add sima_triton to --kinds"):
        bench.main(["--device", "cuda", "--kinds", "sima", "sdpa_flash", "--write-table", str(tmp_path / "t.json")])
    assert not (tmp_path / "t.json").exists()


def test_gpu_kinds_are_refused_on_cpu():
    with pytest.raises(ValueError, match="--kinds sima_triton: GPU kinds, for --device cuda"):
        bench.main(["--kinds", "sima_triton"])


@CUDA
def test_attention_sweep_on_cuda(tmp_path, monkeypatch):
    # torch.compile's inductor would start a pool of compile workers that outlives the test
    monkeypatch.setattr("torch._inductor.config.compile_threads", 1)
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cuda", "--tokens", "197", "1024", "--repeats", "5", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    triton = [r for r in rows if r["kind"] == "sima_triton"]
    assert len(triton) == 4 and all("error" not in r and r["gbps"] > 0 for r in triton)


@CUDA
def test_model_bench_on_cuda(tmp_path):
    from simattn.bench.model import cli as bench_model

    args = ["--device", "cuda", "--models", "sima_deit_small_patch16_224", "--img-size", "64",
            "--model-kwargs", "depth=1", "embed_dim=64", "num_heads=2", "--attn", "sima", "triton=sima", "softmax",
            "--attn-kwargs", "triton.backend=triton", "--measure", "throughput", "train-throughput", "memory",
            "--warmup", "1", "--repeats", "2", "--batch-size", "4", "--out", str(tmp_path)]
    assert bench_model.main(args) == 0
    rows = json.loads((tmp_path / "bench_model.json").read_text())["rows"]
    assert {r["label"] for r in rows} == {"sima", "triton", "softmax"}
    for r in rows:
        assert r["precision"] == "bf16" and r["infer_ips"] > 0 and r["train_ips"] > 0 and r["peak_train_mb"] > 0
