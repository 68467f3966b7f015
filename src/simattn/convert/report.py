"""The conversion report: ``report.md`` (a table and the curves' PNG) from the results of :func:`convert`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ..utils.io import atomic_write_text, save_figure

__all__ = ["report_rows", "write_report", "plot_curves"]


def report_rows(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per model: name, epochs of training it had, val top-1, and its gap to the teacher."""
    teacher = results["teacher"]["top1"]
    kind = results["student"]["attention"]
    rows = [{"name": f"teacher ({results['teacher']['attention']})", "epochs": None, "top1": teacher},
            {"name": f"{kind}, attention swapped, no training (zero-shot)", "epochs": 0,
             "top1": results["zero_shot"]["top1"]}]
    if results.get("transfer"):
        rows.append({"name": f"{kind}, after stage 1 (attention transfer)", "epochs": results["transfer"]["epochs"],
                     "top1": results["transfer"]["final"]["top1"]})
    done = (results["transfer"]["epochs"] if results.get("transfer") else 0) + results["distill"]["epochs"]
    rows.append({"name": f"{kind}, after stage 2 (distillation): converted", "epochs": done,
                 "top1": results["distill"]["final"]["top1"]})
    for key, label in (("finetune", "plain fine-tuning of the swapped model"), ("scratch", "from scratch")):
        if results.get(key):
            rows.append({"name": f"{kind}, {label}", "epochs": results[key]["epochs"],
                         "top1": results[key]["final"]["top1"]})
    for row in rows:
        row["gap"] = row["top1"] - teacher
    return rows


def plot_curves(results: Dict[str, Any], path: Path) -> Optional[Path]:
    """Val top-1 against epochs: the conversion (zero-shot, stage 1, stage 2), the baselines, the teacher."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    zero = results["zero_shot"]["top1"]
    kind = results["student"]["attention"]
    transfer = results.get("transfer")
    start = [[0, zero]]
    if transfer:
        pts = start + transfer["curve"]
        ax.plot(*zip(*pts), marker="o", color="tab:orange", label="stage 1: attention transfer")
        start = transfer["curve"][-1:]
        ax.axvline(transfer["epochs"], color="gray", linestyle=":", linewidth=1)
    pts = start + results["distill"]["curve"]
    ax.plot(*zip(*pts), marker="o", color="tab:red", label="stage 2: distillation (converted)")
    if results.get("finetune"):
        ax.plot(*zip(*([[0, zero]] + results["finetune"]["curve"])), marker="s", color="tab:blue",
                label="plain fine-tuning")
    if results.get("scratch"):
        ax.plot(*zip(*results["scratch"]["curve"]), marker="^", color="tab:green", label="from scratch")
    ax.axhline(results["teacher"]["top1"], color="black", linestyle="--", label="teacher")
    ax.scatter([0], [zero], color="black", zorder=3, label="zero-shot (attention swapped)")
    ax.set_xlabel("epochs")
    ax.set_ylabel("val top-1 (%)")
    ax.set_title(f"{results['teacher']['model']}: {results['teacher']['attention']} → {kind}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    return path


def write_report(results: Dict[str, Any], out: Path) -> str:
    """Write ``out/report.md`` and ``out/convert.png``; returns the table as text."""
    rows = report_rows(results)
    png = plot_curves(results, out / "convert.png")
    table = ["| model | epochs | val top-1 | vs teacher |", "|---|---|---|---|"]
    for r in rows:
        epochs = "" if r["epochs"] is None else str(r["epochs"])
        gap = "" if r["epochs"] is None else f"{r['gap']:+.2f}"
        table.append(f"| {r['name']} | {epochs} | {r['top1']:.2f} % | {gap} |")
    opts = results["convert"]
    text = "\n".join([
        f"# Conversion: {results['teacher']['model']} {results['teacher']['attention']} → {opts['to']}",
        "",
        f"Teacher: `{results['teacher']['weights']}`. Recipe: `{results['recipe']}`, a budget of {results['epochs']} "
        f"epochs: {opts['transfer_epochs']} of attention transfer ({opts['transfer_target']} outputs, "
        f"{opts['transfer_loss']}; trainable: {', '.join(opts['transfer_params'])}; lr {opts['transfer_lr']:g}), the "
        f"rest distillation (α {opts['distill_alpha']:g}, τ {opts['distill_tau']:g}). "
        f"{results['world_size']} process(es).",
        "",
        *table,
        "",
        f"Converted weights: `{results['final']['weights']}`.",
        "",
        f"![val top-1 against epochs]({png.name})" if png else "",
        "",
    ])
    atomic_write_text(text, out / "report.md")
    return "\n".join(table)
