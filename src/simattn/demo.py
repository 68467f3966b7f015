"""``simattn demo``: SimA vs softmax attention, same model, same data, same seed, on this CPU in a few minutes.

Trains the shipped CPU recipe (``digits_cpu``: a small DeiT-style model on the embedded digits data) twice, once
with SimA and once with softmax attention, re-validates both from their saved weights, times both at two input
sizes, prints a side-by-side table and writes ``<output>/report.md`` with a PNG of the training curves and
``<output>/demo.json`` with every number.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

__all__ = ["main", "run_demo"]

KINDS = (("sima", "SimA"), ("softmax", "softmax"))


def _latency(model: torch.nn.Module, img_size: int, batch: int, fast: bool) -> Dict[str, float]:
    from .utils.timing import time_fn
    x = torch.randn(batch, 3, img_size, img_size)
    model.eval()
    with torch.inference_mode():
        return time_fn(lambda: model(x), warmup=1 if fast else 5, repeats=3 if fast else 30,
                       min_time=0.0 if fast else 2.0, max_time=2.0 if fast else 20.0)


def _plot_curves(runs: Dict[str, Dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .utils.io import save_figure
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for label, run in runs.items():
        hist = run["summary"]["history"]
        epochs = [h["epoch"] for h in hist]
        ax_loss.plot(epochs, [h["train_loss"] for h in hist], marker=".", label=label)
        val = [(h["epoch"], h["val_top1"]) for h in hist if "val_top1" in h]
        ax_acc.plot([e for e, _ in val], [a for _, a in val], marker=".", label=label)
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="training loss")
    ax_acc.set(xlabel="epoch", ylabel="val top-1 (%)", title="validation accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


#: the files a demo writes beside its two run folders
DEMO_FILES = ("report.md", "curves.png", "demo.json")


def _check_output(out: Path) -> None:
    """A one-line ValueError when ``out`` holds files other than an earlier demo's: the demo replaces its own
    earlier results, and nothing else."""
    from .utils.runs import run_files

    others = [n for n in run_files(out) if n not in {"sima", "softmax", *DEMO_FILES}] if out.is_dir() else []
    if others:
        raise ValueError(f"{out} holds files that are not an earlier demo's ({', '.join(others)}); "
                         "choose another --output")


def _recipe_overrides(seed: int, epochs: Optional[int], fast: bool, threads: Optional[int]) -> Dict[str, Any]:
    """What the demo changes in the recipe: the seed, the schedule (``fast``: 1 epoch of 2 updates) and threads."""
    overrides: Dict[str, Any] = {"seed": seed, "overwrite": True}
    if epochs is not None:
        overrides["epochs"] = epochs
    elif fast:
        overrides["epochs"] = 1
    if fast:
        overrides["steps_per_epoch"] = 2
    if threads is not None:
        overrides["threads"] = threads
    return overrides


def _train_twins(base, out: Path) -> Dict[str, Dict[str, Any]]:
    """Each attention kind of :data:`KINDS` trained from the config ``base`` into ``out/<kind>``, then re-validated
    from its saved weights; by label: summary, validated metrics, params, weights path and the trained model."""
    from .models.factory import with_attention
    from .train import train
    from .validate import validate_weights

    runs: Dict[str, Dict[str, Any]] = {}
    for kind, label in KINDS:
        cfg = dataclasses.replace(base, model_kwargs=with_attention(base.model_kwargs, kind), output=str(out / kind))
        print(f"== training {label} ({cfg.model}, attn_type={kind}) ==", flush=True)
        result = train(cfg)
        weights = out / kind / "final.safetensors"
        checked = validate_weights(weights, dataset=cfg.dataset, data_dir=cfg.data_dir, split=cfg.val_split,
                                   batch_size=cfg.batch_size, device="cpu")
        runs[label] = {"summary": result.summary, "validated": checked,
                       "latency": {}, "params": checked["params"], "weights": str(weights)}
        runs[label]["model"] = result.model
    return runs


def _metric(run: Dict[str, Any], key: str = "top1") -> float:
    return run["validated"][key]


def _comparison_rows(sima: Dict[str, Any], soft: Dict[str, Any], sizes: Sequence[int],
                     tokens: Dict[int, int]) -> List[List[str]]:
    """The side-by-side table's rows: accuracy, loss, params, train time, then latency at each size."""
    rows: List[List[str]] = [
        ["val top-1 (%)", f"{_metric(sima):.2f}", f"{_metric(soft):.2f}", f"{_metric(sima) - _metric(soft):+.2f} pt"],
        ["val top-5 (%)", f"{_metric(sima, 'top5'):.2f}", f"{_metric(soft, 'top5'):.2f}", ""],
        ["val loss", f"{_metric(sima, 'loss'):.4f}", f"{_metric(soft, 'loss'):.4f}", ""],
        ["params", f"{sima['params']:,}", f"{soft['params']:,}", ""],
        ["train time (s)", f"{sima['summary']['train_time_s']:.1f}", f"{soft['summary']['train_time_s']:.1f}", ""],
    ]
    for s in sizes:
        a, b = sima["latency"][s]["median_ms"], soft["latency"][s]["median_ms"]
        rows.append([f"latency {s}px, {tokens[s]} tokens (ms)", f"{a:.2f}", f"{b:.2f}", f"SimA speed-up ×{b / a:.2f}"])
    return rows


def _report_markdown(base, recipe: str, fast: bool, seed: int, sima: Dict[str, Any], rows: List[List[str]],
                     gap: float, latency_batch: int, n_threads: int, sizes: Sequence[int], total_time: float) -> str:
    """``report.md``: what was compared, the table, the verdict, how latency was measured, and the machine."""
    md_rows = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    arch = ", ".join(f"{k}={v}" for k, v in base.model_kwargs.items() if k != "attn_type")
    schedule = f"{base.epochs} epochs" + (f" of {base.steps_per_epoch} updates (fast mode)" if fast else "")
    verdict = "within 1 point" if abs(gap) <= 1.0 else "more than 1 point apart"
    return f"""# SimA vs softmax attention on the embedded digits data

Two copies of `{base.model}` ({arch}) trained with the same recipe (`{recipe}`, {schedule}), data and seed
({seed}); they differ only in the attention: SimA (l1-normalized q and k, no softmax) or softmax. Accuracy is
re-measured from each run's saved `final.safetensors` with `simattn validate` on the {sima['validated']['samples']}
validation images (one image = {100 / sima['validated']['samples']:.2f} points).

| | SimA | softmax | SimA vs softmax |
|---|---|---|---|
{md_rows}

SimA is **{gap:+.2f} points** from softmax here ({verdict}).
Latency: median of batch-{latency_batch} forward passes with {n_threads} CPU thread(s), at
{' and '.join(f'{s} px' for s in sizes)} (trained at {base.img_size} px; the position embedding is resampled);
the SimA speed-up is softmax time / SimA time (above ×1 SimA is faster, below ×1 slower). Train times are wall-clock, so they include whatever else the machine was
running.

![training curves](curves.png)

Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}; the whole demo took
{total_time:.0f} s. Per-run files (weights, `metrics.jsonl`, `summary.json`) are in `sima/` and `softmax/`;
every number is in `demo.json`.
"""


def run_demo(output: str | Path = "runs/demo", recipe: str = "digits_cpu", epochs: Optional[int] = None,
             fast: bool = False, threads: Optional[int] = None, seed: int = 0, latency_batch: int = 1,
             latency_sizes: Sequence[int] = (32, 64)) -> Dict[str, Any]:
    """Train, validate and time the SimA and softmax twins; write report.md, curves.png and demo.json."""
    from .train import load_config
    from .engine.log import format_table
    from .utils.io import atomic_write_json, atomic_write_text
    from .utils.timing import set_threads

    out = Path(output)
    _check_output(out)
    base = load_config(recipe, _recipe_overrides(seed, epochs, fast, threads))
    n_threads = set_threads(base.threads)
    sizes = tuple(latency_sizes)

    started = time.perf_counter()
    runs = _train_twins(base, out)
    for size in sizes:  # alternate the two models per size so both see the same machine load
        for label in runs:
            runs[label]["latency"][size] = _latency(runs[label]["model"], size, latency_batch, fast)
    total_time = time.perf_counter() - started
    sima, soft = runs["SimA"], runs["softmax"]
    with torch.inference_mode():  # tokens per image at each size (patches, plus CLS when the model has one)
        tokens = {s: sima["model"].forward_features(torch.zeros(1, 3, s, s)).shape[1] for s in sizes}

    rows = _comparison_rows(sima, soft, sizes, tokens)
    headers = ["", "SimA", "softmax", "SimA vs softmax"]
    table = format_table(headers, rows)
    print(table, flush=True)

    _plot_curves(runs, out / "curves.png")
    gap = _metric(sima) - _metric(soft)
    atomic_write_text(_report_markdown(base, recipe, fast, seed, sima, rows, gap, latency_batch, n_threads, sizes,
                                       total_time), out / "report.md")
    result = {
        "recipe": recipe, "epochs": base.epochs, "fast": fast, "seed": seed, "threads": n_threads,
        "total_time_s": total_time, "latency_batch": latency_batch,
        "runs": {label: {"validated": r["validated"], "final": r["summary"]["final"], "best": r["summary"]["best"],
                         "params": r["params"], "train_time_s": r["summary"]["train_time_s"],
                         "latency": {f"{s}px": r["latency"][s] for s in sizes}, "weights": r["weights"]}
                 for label, r in runs.items()},
        "top1_gap_points": gap,
        "sima_speedup": {f"{s}px": soft["latency"][s]["median_ms"] / sima["latency"][s]["median_ms"] for s in sizes},
    }
    atomic_write_json(result, out / "demo.json")
    print(f"report: {out / 'report.md'} (curves: {out / 'curves.png'}); total {total_time:.0f} s", flush=True)
    return result


def _options():
    from .utils.recipe import Opt, maybe
    return {
        "output": Opt("runs/demo", "folder for the runs and report.md"),
        "recipe": Opt("digits_cpu", "training recipe (a shipped name or a YAML file)"),
        "epochs": Opt(None, "override the recipe's epochs", type=maybe(int), low=1),
        "fast": Opt(False, "smoke test: 1 epoch of 2 updates, short timings"),
        "threads": Opt(None, "CPU threads (default: the recipe's)", type=maybe(int), low=1),
        "seed": Opt(0, "base seed", low=0),
        "latency_batch": Opt(1, "batch size of the latency measurement", low=1, high=4096),
        "latency_sizes": Opt([32, 64], "the two input sizes timed (px)", type=List[int], low=8, high=4096, length=2),
    }


def main(argv: Optional[List[str]] = None) -> int:
    from .utils.recipe import checked_flags, command_parser
    parser = command_parser(
        "simattn demo", "Train a small SimA model and its softmax twin on the embedded digits data (CPU, a few "
        "minutes), validate and time both, and write a report with training curves.", _options())
    o = checked_flags(parser.parse_args(argv), _options())
    run_demo(o["output"], o["recipe"], o["epochs"], o["fast"], o["threads"], o["seed"], o["latency_batch"],
             o["latency_sizes"])
    return 0
