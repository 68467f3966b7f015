"""``simattn bench model`` and ``simattn bench paper``: tiny configurations end to end, specs, speed-ups, errors."""
import csv
import json
import subprocess
import sys
import textwrap

import pytest

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.attention import SimAAttention
from simattn.bench.model import cli as bench_model
from simattn.bench import paper as bench_paper
from simattn.bench.model.results import speedups
from simattn.bench.model.runner import build_model
from simattn.bench.model.spec import BenchSpec
from simattn.bench.model import workers
from simattn.bench.model.workers import measure, run_specs

DEIT = "sima_deit_small_patch16_224"
TINY = {"depth": 1, "embed_dim": 32, "num_heads": 2}
TINY_ARGS = ["--models", DEIT, "--img-size", "32", "--model-kwargs", *(f"{k}={v}" for k, v in TINY.items()),
             "--warmup", "0", "--repeats", "1", "--batch-size", "2"]


def _read_png(path):
    import matplotlib.image as mpimg
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # not blank
    return image


def test_cli_runs_tiny_models_in_subprocesses_and_writes_results(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_model.main(TINY_ARGS + ["--attn", "sima", "softmax", "--threads", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "1 CPU threads" in printed and "Speed-up over the baseline" in printed

    data = json.loads((out / "bench_model.json").read_text())
    assert data["meta"]["threads"] == 1 and data["meta"]["device"] == "cpu"
    rows = {r["attn"]: r for r in data["rows"]}
    assert set(rows) == {"sima", "softmax"}
    for row in rows.values():
        assert row["threads"] == 1 and row["tokens"] == 5 and "error" not in row and row["runtime"] == "eager"
        assert 0 < row["infer_p10_ms"] <= row["infer_p50_ms"] <= row["infer_p90_ms"]
        assert 0 < row["train_p10_ms"] <= row["train_p50_ms"] <= row["train_p90_ms"]
        assert 0 < row["infer_ips_p10"] <= row["infer_ips"] <= row["infer_ips_p90"] and row["train_ips"] > 0
        assert row["peak_train_mb"] > row["peak_fwd_mb"] > 0
    assert rows["softmax"]["exp_softmax"] == 1 * 2 * 5 * 5  # depth · H · N²
    assert rows["sima"]["exp_softmax"] == 0
    assert rows["sima"]["exp_activation"] == rows["softmax"]["exp_activation"] == 5 * 4 * 32  # GELU
    assert rows["sima"]["gflops"] > 0 and rows["softmax"]["attn_gflops"] > 0
    assert [s["label"] for s in data["speedups"]] == ["sima"]

    with open(out / "bench_model.csv", newline="") as f:
        header = next(csv.reader(f))
    assert len(header) == len(set(header)), "CSV columns repeat"
    with open(out / "bench_model.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 and {"infer_p50_ms", "infer_p10_ms", "train_ips", "exp_total", "runtime"} <= set(table[0])
    assert float(table[0]["infer_p50_ms"]) > 0
    assert "| sima |" in (out / "bench_model.md").read_text()
    _read_png(out / "bench_model.png")


def test_fixed_order_forces_sima_quadratic_order():
    spec = BenchSpec(model=DEIT, attn="sima", img_size=32, sima_order="qk_first", model_kwargs=TINY)
    orders = {m.order for m in build_model(spec).modules() if isinstance(m, SimAAttention)}
    assert orders == {"qk_first"}
    # a model whose own attention is SimA ('default') gets the order too
    default = BenchSpec(model=DEIT, img_size=32, sima_order="kv_first", model_kwargs=TINY)
    assert {m.order for m in build_model(default).modules() if isinstance(m, SimAAttention)} == {"kv_first"}
    args = bench_model.build_parser().parse_args(["--fixed-order"])
    assert args.fixed_order and args.sima_order is None


def test_attention_options_reach_the_modules_and_the_label():
    parsed = bench_model.parse_attn(["sima", "softmax", "explicit=softmax", "relu"],
                                    ["explicit.fused=false", "relu.activation=relu2", "relu.alpha=0.5"])
    assert parsed == [("sima", "sima", {}), ("softmax", "softmax", {}), ("explicit", "softmax", {"fused": False}),
                      ("relu", "relu", {"activation": "relu2", "alpha": 0.5})]
    label, name, options = parsed[2]
    spec = BenchSpec(model=DEIT, attn=name, attn_kwargs=options, label=label, img_size=32, model_kwargs=TINY)
    assert {m.fused for m in build_model(spec).modules() if hasattr(m, "fused")} == {False}


@pytest.mark.parametrize("attn, kwargs, message", [
    (["softmax:fused=false"], [], "is not KIND or LABEL=KIND"),
    (["sima", "sima"], [], "lists 'sima' twice"),
    (["sima"], ["softmax.fused=false"], "'softmax' is not one of --attn (sima)"),
    (["sima"], ["sima=qk_first"], "gives no option name"),
    (["sima"], ["order"], "not KEY=VALUE"),
])
def test_attention_option_errors_are_one_line(attn, kwargs, message):
    with pytest.raises(ValueError) as info:
        bench_model.parse_attn(attn, kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_measure_in_process_selected_measures_and_precision():
    spec = BenchSpec(model=DEIT, attn="sima", img_size=32, precision="bf16", sima_order="qk_first",
                     model_kwargs=TINY, measures=("latency", "counts"), warmup=0, repeats=2)
    row = measure(spec)
    assert row["precision"] == "bf16" and row["sima_order"] == "qk_first" and row["exp_softmax"] == 0
    assert row["infer_p50_ms"] > 0 and "train_p50_ms" not in row and "peak_fwd_mb" not in row


def test_compiled_and_onnxruntime_runtimes_on_a_tiny_model(tmp_path, capsys):
    # in-process to keep it short; the 'eager' dynamo backend compiles without generating C++ code
    base = TINY_ARGS + ["--attn", "sima", "softmax", "--threads", "1", "--in-process", "--measure", "latency",
                        "throughput"]
    assert bench_model.main(base + ["--compile", "--compile-backend", "eager", "--channels-last",
                                    "--out", str(tmp_path / "compiled")]) == 0
    assert bench_model.main(base + ["--runtime", "onnxruntime", "--onnx-exporter", "torchscript", "--measure",
                                    "latency", "counts", "train-latency", "--out", str(tmp_path / "ort")]) == 0
    printed = capsys.readouterr().out
    assert "--runtime onnxruntime: not measured: throughput" not in printed
    assert "not measured: train-latency (inference only)" in printed
    compiled = json.loads((tmp_path / "compiled" / "bench_model.json").read_text())["rows"]
    ort = json.loads((tmp_path / "ort" / "bench_model.json").read_text())["rows"]
    assert [r["runtime"] for r in compiled] == ["compiled, channels-last"] * 2
    assert [r["runtime"] for r in ort] == ["onnxruntime"] * 2
    for r in compiled + ort:
        assert "error" not in r and 0 < r["infer_p10_ms"] <= r["infer_p50_ms"] <= r["infer_p90_ms"]
    assert all(r["infer_ips"] > 0 for r in compiled)
    for r in ort:  # the exported graph computes the model's logits; counts are the eager model's
        assert r["runtime_max_abs_diff"] < 1e-4 and "train_p50_ms" not in r and "infer_ips" not in r
    assert {r["label"]: r["exp_softmax"] for r in ort} == {"sima": 0, "softmax": 1 * 2 * 5 * 5}
    with open(tmp_path / "ort" / "bench_model.csv", newline="") as f:
        assert [row["runtime"] for row in csv.DictReader(f)] == ["onnxruntime"] * 2


def test_speedups_pair_rows_with_the_baseline():
    def row(attn, size, infer, train):
        return {"model": "m", "label": attn, "attn": attn, "img_size": size, "precision": "fp32", "device": "cpu",
                "infer_p50_ms": infer, "train_p50_ms": train}

    rows = [row("softmax", 224, 10.0, 30.0), row("sima", 224, 5.0, 10.0), row("sima", 512, 1.0, 1.0),
            {**row("xca", 224, 1.0, 1.0), "error": "boom"}, {**row("softmax", 224, 20.0, 40.0), "label": "explicit"}]
    ups = speedups(rows)
    assert [u["label"] for u in ups] == ["sima", "explicit"]  # 512 has no baseline; failed rows are skipped
    assert ups[0]["infer_speedup"] == 2.0 and ups[0]["train_speedup"] == 3.0 and ups[0]["baseline"] == "softmax"
    assert speedups(rows, baseline="explicit")[1]["infer_speedup"] == 4.0  # baseline chosen by label


def test_failed_worker_becomes_an_error_row(monkeypatch):
    def fake_run(cmd, **kwargs):
        assert cmd[1:3] == ["-m", "simattn.bench.model.workers"]
        assert BenchSpec.from_json(cmd[3]).model == DEIT and kwargs["env"]["OMP_NUM_THREADS"] == "1"
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="Traceback ...\nValueError: boom\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    rows = run_specs([BenchSpec(model=DEIT, model_kwargs=TINY)])
    assert rows[0]["error"] == "ValueError: boom"


ASSERTION = ("/pytorch/aten/src/ATen/native/cuda/NLLLoss2d.cu:104: void nll_loss2d_forward_kernel<float>(float *, "
             "long const *): block: [3,0,0], thread: [7,0,0] Assertion `t >= 0 && t < n_classes` failed.")
CUDA_ERROR = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at some "
              "other API call.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
              "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
# stand-in workers (no torch, so each starts in milliseconds), by label: one dies of a CUDA error after its kernel
# printed the assertion, one reports its error in a row as the real worker does, one is killed, one measures
STAND_IN_WORKER = textwrap.dedent(f"""
    import json, os, signal, sys
    spec = json.loads(sys.argv[1])
    row = {{"model": spec["model"], "label": spec["label"], "train_ips": 10.0}}
    if spec["label"] in ("crashed", "reported"):
        print({ASSERTION!r}, flush=True)
    if spec["label"] == "crashed":
        raise RuntimeError({CUDA_ERROR!r})
    if spec["label"] == "reported":
        row["error"] = "AcceleratorError: CUDA error: device-side assert triggered"
    if spec["label"] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    print("{workers._RESULT_TAG}" + json.dumps(row), flush=True)
""")


def test_a_failing_row_carries_its_cause_and_the_next_rows_still_run(monkeypatch, capsys):
    monkeypatch.setattr(workers, "_worker_command", lambda spec: [sys.executable, "-c", STAND_IN_WORKER,
                                                                  spec.to_json()])
    labels = ["crashed", "measured", "reported", "killed", "measured2"]
    rows = run_specs([BenchSpec(model=DEIT, label=label) for label in labels])
    assert [r["label"] for r in rows] == labels
    asserted = "Assertion `t >= 0 && t < n_classes` failed in void nll_loss2d_forward_kernel<float>(float *, " \
               "long const *) (NLLLoss2d.cu:104)"
    assert rows[0]["error"] == f"RuntimeError: CUDA error: device-side assert triggered; {asserted}"
    assert rows[2]["error"] == f"AcceleratorError: CUDA error: device-side assert triggered; {asserted}"
    assert rows[3]["error"] == "worker killed by SIGKILL"
    assert [r.get("train_ips") for r in rows] == [None, 10.0, 10.0, None, 10.0]
    assert "TORCH_USE_CUDA_DSA" not in capsys.readouterr().err


def test_the_worker_reports_an_exception_as_its_rows_first_line(monkeypatch, capsys):
    def fail(spec):
        raise RuntimeError(CUDA_ERROR)

    monkeypatch.setattr(workers, "measure", fail)
    assert workers.worker_main(BenchSpec(model=DEIT, label="broken").to_json()) == 1
    captured = capsys.readouterr()
    tagged = [line for line in captured.out.splitlines() if line.startswith(workers._RESULT_TAG)]
    row = json.loads(tagged[0][len(workers._RESULT_TAG):])
    assert row["label"] == "broken" and row["error"] == "RuntimeError: CUDA error: device-side assert triggered"
    assert "Traceback (most recent call last)" in captured.err  # the whole story stays on the worker's stderr


@pytest.mark.parametrize("argv, message", [
    (["--models", "no_such_model"], "unknown model 'no_such_model'"),
    (["--attn", "nope"], "unknown attention 'nope'"),
    (["--model-kwargs", "depth"], "not KEY=VALUE"),
    (["--runtime", "onnxruntime", "--compile"], "apply to --runtime torch"),
    (["--runtime", "onnxruntime", "--precision", "bf16"], "runs fp32 on cpu"),
    (["--runtime", "onnxruntime", "--measure", "memory"], "measures latency, throughput, counts"),
    (["--compile", "--compile-backend", "nope"], "--compile-backend 'nope' is not one of"),
    (["--compile-mode", "reduce-overhead"], "--compile-mode applies to --compile"),
    (["--compile", "--compile-backend", "eager", "--compile-mode", "reduce-overhead"], "is inductor's"),
    (["--img-size", "32", "64", "--batch-size", "2", "4", "8"], "--batch-size gives 3 batches for 2 --img-size"),
    (["--img-size", "0"], "option '--img-size': got ['0']; '0': sizes must be positive"),
    (["--device", "cuda:0"], None),
])
def test_cli_rejects_bad_input_with_one_line(argv, message, capsys, tmp_path):
    import torch

    if message is None:
        if torch.cuda.is_available():
            pytest.skip("CUDA present")
        message = "CUDA is not available"
    assert simattn_main(["bench", "model", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_spec_json_round_trip_rejects_unknown_fields():
    spec = BenchSpec(model=DEIT, attn="softmax", model_kwargs=TINY)
    assert BenchSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="unknown fields: bogus"):
        BenchSpec.from_json(json.dumps({"model": DEIT, "bogus": 1}))


def test_paper_table3_and_figure_a1_tiny(tmp_path, monkeypatch, capsys):
    # Figure A1's model runs are subprocesses in real use; here they run in-process to keep the test fast.
    real_run_specs = bench_paper.run_specs
    monkeypatch.setattr(bench_paper, "run_specs",
                        lambda specs, **kw: real_run_specs(specs, **{**kw, "in_process": True}))
    out = tmp_path / "paper"
    rc = bench_paper.main(["--quick", "--only", "table3", "figure_a1", "--table3-batch", "1", "--repeats", "1",
                           "--rounds", "1", "--sizes", "32",
                           "48", "--dims", "16", "--deit-depth", "1", "--repeats-models", "1",
                           "--warmup-models", "0", "--rounds-models", "1", "--out", str(out)])
    assert rc == 0
    report = (out / "paper.md").read_text()
    assert "D=64 N=256 H=8, D per head" in report and "D=256 N=64 H=8, D total" in report
    # the counted exps decide the reading: XCA's H·d² is 8·256² with D per head, 8·32² with D total
    assert "524,288 with D per head, 8,192 with D total" in report
    assert "D per head matches the paper's exp-count column" in report

    table = json.loads((out / "table3.json").read_text())["rows"]
    assert len(table) == 20
    by = {(r["D"], r["reading"], r["method"]): r for r in table}
    assert {(r["D"], r["reading"]): r["token_dim"] for r in table} == {
        (64, "D per head"): 512, (256, "D per head"): 2048, (64, "D total"): 64, (256, "D total"): 256}
    for reading in ("D per head", "D total"):
        assert by[(64, reading, "vanilla softmax(qkᵀ)v")]["exps"] == 8 * 256 * 256  # H·N² at N=256
        assert by[(256, reading, "SimA (q̂k̂ᵀ)v ★")]["exps"] == 0
    # the starred rows (the reference of each setting and reading) follow the caption's (q̂k̂ᵀ)v order
    assert sorted((r["D"], r["reading"]) for r in table if r["method"].endswith("★")) == sorted(
        {(r["D"], r["reading"]) for r in table})
    assert {r["method"] for r in table if r["method"].endswith("★")} == {"SimA (q̂k̂ᵀ)v ★"}
    assert by[(256, "D total", "SimA q̂(k̂ᵀv), linear order")]["paper_ms_Jetson Nano"] is None
    assert all(r["ours_ms"] > 0 for r in table)

    figure = json.loads((out / "figure_a1.json").read_text())["rows"]
    assert {(r["panel"], r["x"]) for r in figure} == {("deit", 32), ("deit", 48), ("xcit", 16)}
    assert all(r["ms"] > 0 and r["error"] is None for r in figure)
    assert all((r["slower_than_sima_pct"] is None) == (not r["baseline"]) for r in figure)
    for name in ("table3.png", "figure_a1.png"):
        _read_png(out / name)
    assert (out / "table3.csv").read_text().startswith("D,N,H,reading,token_dim,head_dim,batch,method")


def test_table3_ratios_and_reading_verdict_from_known_numbers():
    rows = [r for r in bench_paper.table3_rows(["total"]) if r.setting == (64, 256, 8)]
    for row, ms in zip(rows, (30.0, 6.0, 24.0, 12.0)):
        row.result = {"median_ms": ms, "exps": 0}
    records = bench_paper.table3_records(rows, batch=16)
    assert [r["ours_vs_sima"] for r in records] == [2.5, 0.5, 2.0, 1.0]  # by hand: time / 12
    assert records[0]["head_dim"] == 8 and records[0]["paper_vs_sima_Apple M1"] == pytest.approx(35.8 / 20.4)
    xca = {"method": "XCA softmax(q̂ᵀk̂) on v", "D": 256, "H": 8}
    verdict = bench_paper.reading_verdict([{**xca, "reading": "D per head", "exps": 8 * 256 ** 2},
                                           {**xca, "reading": "D total", "exps": 8 * 32 ** 2}])
    assert verdict.endswith("D per head matches the paper's exp-count column.")
    assert "neither reading matches" in bench_paper.reading_verdict([{**xca, "reading": "D total", "exps": 5}])
