"""``simattn bench model --preset gpu`` and what the GPU table is made of, on CPU: the preset's specs, the batch
that halves on CUDA out-of-memory (a stand-in that raises it), the table's machine line and the per-size figure;
and BenchSpec checked by its one declaration."""
import pytest
import torch

import simattn  # noqa: F401  (registers the models)
from simattn.bench.model import cli, results, workers
from simattn.bench.model.runner import largest_fitting_batch
from simattn.bench.model.spec import BenchSpec
from simattn.cli import main as simattn_main
from simattn.utils.recipe import option_paths

DEIT = "sima_deit_small_patch16_224"


def test_gpu_preset_builds_sima_against_softmax_at_every_size_with_its_batches():
    args = cli.parse_args(["--preset", "gpu", "--device", "cpu"])
    specs = cli.build_specs(args, threads=1)
    grid = {(s.label, s.head, str(s.img_size)): s for s in specs}
    assert len(specs) == len(grid) == 10
    assert {(head, size) for _, head, size in grid} == {
        (None, "224"), (None, "512"), (None, "1024"), ("fpn", "512"), ("fpn", "[1024, 2048]")}
    assert {label for label, _, _ in grid} == {"sima", "softmax"}
    assert grid[("sima", None, "224")].batch_size == 1024 and grid[("softmax", "fpn", "[1024, 2048]")].batch_size == 8
    for s in specs:
        assert s.model == DEIT and s.precision == "bf16" and s.fill_batch
        assert s.measures == ["throughput", "train-throughput", "memory"]
    # flags beside the preset still apply
    args = cli.parse_args(["--preset", "gpu", "--device", "cpu", "--measure", "train-throughput", "--no-fill-batch"])
    assert {(tuple(s.measures), s.fill_batch) for s in cli.build_specs(args, threads=1)} == {
        (("train-throughput",), False)}


def test_without_a_preset_unset_flags_take_the_specs_defaults():
    args = cli.parse_args(["--models", DEIT])
    (spec,) = cli.build_specs(args, threads=1)
    defaults = option_paths(BenchSpec)
    assert (spec.img_size, spec.batch_size, spec.fill_batch, spec.precision, spec.device) == (
        defaults["img_size"].default, defaults["batch_size"].default, False, "fp32", "cpu")
    assert spec.measures == list(defaults["measures"].default)


@pytest.mark.parametrize("argv, message", [
    (["--preset", "gpu", "--device", "cpu", "--img-size", "224"], "--preset gpu sets the sizes, heads and batches "
                                                                  "of its table; drop --img-size"),
    (["--preset", "gpu", "--device", "cpu", "--batch-size", "4", "--head", "fpn"], "drop --head, --batch-size"),
    (["--preset", "cpu"], "option '--preset': got 'cpu'; allowed: one of gpu"),
])
def test_preset_errors_are_one_line_before_any_work(argv, message, capsys, tmp_path):
    assert simattn_main(["bench", "model", *argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_preset_needs_cuda(capsys, tmp_path):
    assert simattn_main(["bench", "model", "--preset", "gpu", "--out", str(tmp_path / "out")]) == 2
    assert "no CUDA device: --device cuda" in capsys.readouterr().err


def _oom_above(limit, tried):
    def run(batch):
        tried.append(batch)
        if batch > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")
    return run


def test_batch_halves_on_out_of_memory_until_a_call_fits():
    tried = []
    assert largest_fitting_batch(_oom_above(40, tried), 256) == 32
    assert tried == [256, 128, 64, 32]
    tried = []
    assert largest_fitting_batch(_oom_above(1000, tried), 256) == 256 and tried == [256]
    with pytest.raises(torch.cuda.OutOfMemoryError):
        largest_fitting_batch(_oom_above(0, []), 4)


class _StandInRun:
    """What ``workers._throughput`` uses of a Runner: its spec, device and timer."""

    def __init__(self, spec):
        self.spec, self.device, self.timed_batches = spec, torch.device("cpu"), []

    def time(self, fn):
        fn()
        return {"median_ms": 10.0, "p10_ms": 8.0, "p90_ms": 20.0}


@pytest.mark.parametrize("fill, batch", [(True, 2), (False, None)])
def test_throughput_row_names_the_batch_it_ran(fill, batch):
    spec = BenchSpec(model=DEIT, batch_size=8, fill_batch=fill, measures=["train-throughput"])
    run = _StandInRun(spec)
    step = _oom_above(2, run.timed_batches)
    if not fill:
        with pytest.raises(torch.cuda.OutOfMemoryError):
            workers._throughput(run, "train", lambda b: (lambda: step(b)))
        return
    row = workers._throughput(run, "train", lambda b: (lambda: step(b)))
    assert row["train_batch"] == batch and row["train_ips"] == pytest.approx(batch * 1e3 / 10.0)
    assert row["train_ips_p10"] == pytest.approx(batch * 1e3 / 20.0)
    assert run.timed_batches == [8, 4, 2, 2]  # the search, then the timed call at the batch that fit


def _gpu_rows():
    def row(label, head, size, ips, batch):
        return {"model": DEIT, "label": label, "attn": label, "head": head, "img_size": size, "precision": "bf16",
                "device": "cuda", "runtime": "eager", "train_ips": ips, "train_batch": batch,
                "train_ips_peak_mb": 1000.0 + ips}
    return [row("sima", "", 224, 900.0, 1024), row("softmax", "", 224, 1000.0, 512),
            row("sima", "", 1024, 50.0, 64), row("softmax", "", 1024, 20.0, 32),
            row("sima", "fpn", "1024x2048", 4.0, 8), row("softmax", "fpn", "1024x2048", 1.0, 4)]


def test_gpu_table_names_the_gpu_torch_triton_and_the_batches():
    meta = {"device": "cuda", "gpu": "NVIDIA H200", "threads": 16, "torch": "2.11.0", "triton": "3.6.0"}
    assert results.machine_line(meta) == "GPU NVIDIA H200 (cuda), 16 threads, torch 2.11.0, Triton 3.6.0."
    rows = _gpu_rows()
    text = results.summary_markdown(rows, results.speedups(rows), meta)
    assert text.startswith("GPU NVIDIA H200 (cuda), 16 threads, torch 2.11.0, Triton 3.6.0.")
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    assert "train_batch" in header and "train_ips_peak_mb" in header
    ratios = {(u["head"], u["img_size"]): u["train_ips_ratio"] for u in results.speedups(rows)}
    assert ratios == {("", 224): 0.9, ("", 1024): 2.5, ("fpn", "1024x2048"): 4.0}
    cpu = {"device": "cpu", "threads": 2, "torch": "2.11.0", "cpu_name": "x", "cpu_features": ["AVX2"]}
    assert results.machine_line(cpu) == "Device cpu (CPU x; AVX2), 2 threads, torch 2.11.0."


def test_figure_draws_sima_against_softmax_per_size(monkeypatch, tmp_path):
    kept = []
    monkeypatch.setattr(results, "save_figure", lambda fig, path: kept.append(fig))
    results.plot_results(_gpu_rows(), tmp_path / "gpu.png")
    (fig,) = kept
    panel = next(ax for ax in fig.axes if ax.get_ylabel().startswith("training images/s"))
    lines = {line.get_label(): list(line.get_xydata()[:, 1]) for line in panel.get_lines()}
    assert lines == {"sima classifier": [900.0, 50.0], "softmax classifier": [1000.0, 20.0],
                     "sima fpn": [4.0], "softmax fpn": [1.0]}


def test_spec_options_are_checked_by_their_one_declaration():
    for kwargs, message in [({"precision": "fp8"}, "option 'precision': got 'fp8'; allowed: one of fp32, bf16, "
                                                   "fp16"),
                            ({"batch_size": 0}, "option 'batch_size': got 0; allowed: an integer >= 1"),
                            ({"measures": ["speed"]}, "'speed' not allowed; allowed: some of latency"),
                            ({"img_size": [1, 2, 3]}, "option 'img_size'"),
                            ({"model": "no_such_model"}, "unknown model 'no_such_model'")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            BenchSpec(**{"model": DEIT, **kwargs})
    flags = cli._options()
    for name in ("warmup", "repeats", "max_time", "compile", "channels_last", "sima_order"):
        assert flags[name] == option_paths(BenchSpec)[name], name
    assert flags["batch_size"].default is None and flags["batch_size"].low == option_paths(BenchSpec)["batch_size"].low
