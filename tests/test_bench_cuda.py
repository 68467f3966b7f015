"""``simattn bench attention|model --device cuda``: one line and exit code 2 without CUDA; the GPU sweep's rows,
bytes and roofline on CPU with a stand-in timer; the real sweeps when there is a GPU."""
import json
from types import SimpleNamespace

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


def test_gpu_sweep_runs_every_kernel_kind_forward_and_backward(monkeypatch):
    """Every row the GPU sweep derives for a kind with kernels runs, in torch and on its kernels (Triton's interpreter
    on CPU), both passes: no error row but XNorm's kernel's backward, which it has not. 17 tokens: a 4x4 grid and a
    class token for the kinds on the grid."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    kinds = [k for k in bench.timed_kinds("cuda") if not k.startswith(("sdpa", "sima_compile"))]
    assert {"sima_triton", "relu_triton", "polaformer_triton", "agent", "agent_triton"} <= set(kinds)
    rows = bench.run_gpu([17], kinds, batch=1, heads=1, head_dim=16, dtype=torch.float32, device="cpu",
                         peak_gbps=100.0, timer=lambda fn: time_fn(fn, warmup=0, repeats=1))
    assert [(r["kind"], r["pass"]) for r in rows] == [(kind, pass_) for kind in kinds for pass_ in bench.PASSES]
    assert [(r["kind"], r["pass"]) for r in rows if "error" in r] == [("xnorm_triton", "fwd+bwd")]


def test_the_timed_kinds_follow_the_kernel_policies(monkeypatch):
    """A kind given a GPU kernel backend in the policies is timed on CUDA in torch and on it, and a kind with a CPU
    kernel gets its torch row on CPU, with no list in the benchmark to edit."""
    from simattn.attention import backends

    policies = dict(backends.POLICIES)
    monkeypatch.setattr(backends, "POLICIES", {**policies, "xca": policies["sigmoid"],
                                               "softmax": policies["sima"]})
    gpu, cpu = bench.timed_kinds("cuda"), bench.timed_kinds("cpu")
    assert {"xca", "xca_triton", "softmax", "softmax_triton"} <= set(gpu) and "softmax_cpp" not in gpu
    assert {"softmax", "softmax_torch", "sima_torch", "xca"} <= set(cpu) and "xca_torch" not in cpu
    monkeypatch.setattr(backends, "POLICIES", policies)
    assert "xca_triton" not in bench.timed_kinds("cuda") and "softmax_torch" not in bench.timed_kinds("cpu")


def test_roofline_bandwidth_and_sdpa_ratio_from_known_timings():
    rows = [{"kind": "sdpa_flash", "pass": "fwd", "tokens": 4096, "median_ms": 2.0, "p10_ms": 1.9, "p90_ms": 2.1,
             "bytes": 400_000_000},
            {"kind": "sdpa_efficient", "pass": "fwd", "tokens": 4096, "median_ms": 4.0, "p10_ms": 4.0, "p90_ms": 4.0,
             "bytes": 400_000_000},
            {"kind": "sima_triton", "pass": "fwd", "tokens": 4096, "median_ms": 0.5, "p10_ms": 0.5, "p90_ms": 0.6,
             "graph_ms": 0.45, "bytes": 400_000_000},
            {"kind": "sima", "pass": "fwd+bwd", "tokens": 4096, "median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0,
             "bytes": 1_100_000_000},
            {"kind": "sdpa_flash", "pass": "fwd+bwd", "tokens": 4096, "error": "no kernel"}]
    rows = bench.add_roofline(rows, peak_gbps=4000)
    triton = rows[2]
    # by hand: 4e8 B / 0.5 ms = 800 GB/s; 4e8 B at 4000 GB/s = 0.1 ms = 20 % of 0.5 ms; flash 2.0 / 0.5 = 4;
    # host: 0.5 - 0.45 ms eager over graph
    assert triton["gbps"] == pytest.approx(800) and triton["roofline_ms"] == pytest.approx(0.1)
    assert triton["roofline_frac"] == pytest.approx(0.2) and triton["speedup_vs_sdpa"] == pytest.approx(4.0)
    assert triton["host_ms"] == pytest.approx(0.05) and rows[0]["host_ms"] is None  # no graph time, no host time
    assert rows[1]["speedup_vs_sdpa"] == pytest.approx(0.5)
    assert rows[3]["speedup_vs_sdpa"] is None  # no SDPA backend ran forward+backward
    table = bench.format_gpu_table(rows).splitlines()
    assert "% HBM" in table[0] and "graph" in table[0] and "host" in table[0]
    # times under 1 ms in µs, from 1 ms on in ms
    assert table[4].split() == ["sima_triton", "fwd", "4096", "500.0", "µs", "500.0", "µs", "600.0", "µs", "450.0",
                                "µs", "50.0", "µs", "800", "100.0", "µs", "20.0%", "4.00"]
    assert table[2].split()[3:5] == ["2.000", "ms"] and table[2].split()[9:11] == ["-", "-"]
    assert "not run: no kernel" in table[6]


def test_rounds_keep_a_graph_time_only_where_every_round_has_one():
    both = [{"median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0, "graph_ms": 0.2},
            {"median_ms": 3.0, "p10_ms": 3.0, "p90_ms": 3.0, "graph_ms": 0.4},
            {"median_ms": 2.0, "p10_ms": 2.0, "p90_ms": 2.0, "graph_ms": 0.3}]
    assert bench.rounds_median(both) == {"median_ms": 2.0, "p10_ms": 2.0, "p90_ms": 2.0, "graph_ms": 0.3}
    failed = [both[0], {**both[1], "graph_error": "operation not permitted when stream is capturing"}]
    failed[1].pop("graph_ms")
    assert bench.rounds_median(failed) == {"median_ms": 2.0, "p10_ms": 2.0, "p90_ms": 2.0,
                                           "graph_error": "operation not permitted when stream is capturing"}


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


def _timed(kind, pass_, n, ms, graph_ms=None):
    row = {"kind": kind, "pass": pass_, "tokens": n, "median_ms": ms, "batch": 8, "heads": 6, "head_dim": 64,
           "dtype": "bfloat16"}
    return row if graph_ms is None else {**row, "graph_ms": graph_ms}


def test_table_points_compare_gpu_times_and_a_rewrite_replaces_only_its_points(tmp_path):
    """Points where both SimA kinds ran, on the graph's GPU time (the eager time where a call had none); written
    into a table, a point measured again replaces the old one, the others stay."""
    rows = [_timed("sima", p, n, 1.0, graph_ms=0.3) for p in bench.PASSES for n in (197, 1025)]
    rows += [_timed("sima_triton", p, 197, 0.2, graph_ms=0.4) for p in bench.PASSES]  # eager faster, GPU slower
    rows += [_timed("sima_triton", "fwd", 1025, 0.5), dict(_timed("sima_triton", "fwd+bwd", 1025, 0), error="x")]
    points = bench.table_points(rows, "sm_90", {"gpu": "GPU A"})
    assert [(p["pass"], p["tokens"], p["triton_ms"], p["torch_ms"]) for p in points] == [
        ("fwd", 197, 0.4, 0.3), ("fwd", 1025, 0.5, 0.3), ("fwd+bwd", 197, 0.4, 0.3)]
    assert all(p["bh"] == 48 and p["capability"] == "sm_90" and p["gpu"] == "GPU A" for p in points)
    path = tmp_path / "table.json"
    bench.write_backend_table(points, str(path))
    again = [dict(points[0], triton_ms=0.1, bh=768), dict(points[1], triton_ms=0.1)]  # a new B·H, and a remeasure
    table = bench.write_backend_table(again, str(path))
    assert json.loads(path.read_text()) == table
    got = {(p["pass"], p["bh"], p["tokens"]): p["triton_ms"] for p in table["points"]}
    assert got == {("fwd", 48, 197): 0.4, ("fwd", 48, 1025): 0.1, ("fwd+bwd", 48, 197): 0.4, ("fwd", 768, 197): 0.1}


def _stand_in(shape, requires_grad=False, dtype=torch.bfloat16):
    """What auto's lookup reads of a CUDA tensor: device, shape, dtype, requires_grad."""
    return SimpleNamespace(device=torch.device("cuda", 0), shape=shape, dtype=dtype, requires_grad=requires_grad)


def _lookup(monkeypatch, points, capability="sm_90"):
    from simattn.attention import backends

    index = backends.index_points(points)
    monkeypatch.setattr(backends, "backend_table", lambda name: index)

    def choose(bh, n, requires_grad=False, dtype=torch.bfloat16, d=64):
        q = _stand_in((1, bh, n, d), requires_grad, dtype)
        call = backends.Call(q, q, q, device="cuda", grad=requires_grad, autocast=None, capability=capability)
        return "torch" if backends.measured(call) is False else "triton"
    return choose


def test_auto_on_a_gpu_takes_the_faster_backend_at_the_nearest_measured_point(monkeypatch, tmp_path):
    """The table written from a sweep, read back: at each call the nearest measured (B·H, then N, on a log scale)
    point of this capability, dtype, head dim and pass decides; each B·H keeps its own points (no threshold taken
    over both); anything unmeasured runs Triton."""
    rows = []
    for batch, heads, slow_below in ((8, 6, 4097), (128, 6, 197)):  # B·H 48: Triton from 4097; 768: from 197
        for n in (197, 577, 4097):
            rows += [dict(_timed("sima", "fwd", n, 1.0, graph_ms=1.0), batch=batch, heads=heads),
                     dict(_timed("sima_triton", "fwd", n, 1.0, graph_ms=0.5 if n >= slow_below else 2.0),
                          batch=batch, heads=heads)]
    path = tmp_path / "table.json"
    for b in (8, 128):
        bench.write_backend_table(bench.table_points([r for r in rows if r["batch"] == b], "sm_90", {}), str(path))
    choose = _lookup(monkeypatch, json.loads(path.read_text())["points"])
    assert [choose(48, n) for n in (197, 577, 1500, 2000, 10 ** 5)] == ["torch", "torch", "torch", "triton",
                                                                          "triton"]
    assert [choose(768, n) for n in (1, 197, 4097)] == ["triton"] * 3
    # B·H 96 is nearer 48 than 768 on a log scale (their geometric mean is 192); 300 is nearer 768
    assert (choose(96, 577), choose(300, 577)) == ("torch", "triton")
    assert choose(48, 197, requires_grad=True) == "triton"  # fwd+bwd: not measured
    assert choose(48, 197, dtype=torch.float16) == "triton" and choose(48, 197, d=32) == "triton"
    assert _lookup(monkeypatch, json.loads(path.read_text())["points"], capability="sm_80")(48, 197) == "triton"


def test_auto_lookup_compiles_without_graph_breaks_for_static_and_symbolic_sizes(monkeypatch):
    """Under torch.compile(fullgraph=True) the choice is made while tracing (sizes become guards): the compiled
    function takes the branch eager takes on either side of a measured boundary."""
    from simattn.attention import backends

    points = [dict(capability="sm_90", dtype="float32", head_dim=16, bh=2, tokens=n, triton_ms=t, torch_ms=1.0,
                   **{"pass": "fwd"}) for n, t in ((16, 2.0), (256, 0.5))]
    _lookup(monkeypatch, points)

    def f(q):
        call = backends.Call(q, q, q, device="cuda", grad=False, autocast=None, capability="sm_90")
        return q * 3 if backends.measured(call) is False else q * 2

    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="eager")
        for n, factor in ((60, 3), (70, 2)):  # either side of 64, the geometric mean of 16 and 256
            q = torch.ones(1, 2, n, 16)
            assert torch.equal(compiled(q), q * factor), (dynamic, n)
    torch._dynamo.reset()


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
    rows = json.loads(out.read_text())["rows"]
    triton = [r for r in rows if r["kind"] == "sima_triton"]
    assert len(triton) == 4 and all("error" not in r and r["gbps"] > 0 for r in triton)
    # short calls are replayed from a CUDA graph too: GPU time alone, and the host's share beside it
    assert all(r["graph_ms"] > 0 and r["host_ms"] == r["median_ms"] - r["graph_ms"] for r in triton
               if r["tokens"] == 197), [(r.get("graph_ms"), r.get("graph_error")) for r in triton]


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
