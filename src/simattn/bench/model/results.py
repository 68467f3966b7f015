"""A sweep's rows as results: speed-ups over the baseline and over eager PyTorch, the JSON/CSV/markdown tables and
the figure."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..report import markdown_table, new_figure, relative_spread, save_figure, spread_warning, \
    write_result_files
from .spec import DEFAULT_ATTN, FLOOR_LABEL, SEG_CLASSES, size_side, size_text

def speedups(rows: Sequence[Dict[str, Any]], baseline: str = "softmax") -> List[Dict[str, Any]]:
    """Baseline time / row time for every row that has a baseline row (the one labelled ``baseline``, e.g.
    ``softmax`` or ``softmax:fused=False``) with the same model, size, precision
    device and runtime (inference and training, p50 and min — the min is the steadier on a busy machine; >1 means
    faster than the baseline)."""
    def key(r):
        return r["model"], r.get("head", ""), r["img_size"], r["precision"], r["device"], r.get("runtime")

    base = {key(r): r for r in rows if r.get("label") == baseline and "error" not in r}
    out = []
    for r in rows:
        b = base.get(key(r))
        if b is None or r is b or "error" in r:
            continue
        entry = {"model": r["model"], "head": r.get("head", ""), "label": r["label"], "baseline": b["label"],
                 "img_size": r["img_size"], "precision": r["precision"], "device": r["device"],
                 "runtime": r.get("runtime")}
        for metric, name in (("infer_p50_ms", "infer_speedup"), ("infer_min_ms", "infer_speedup_min"),
                             ("train_p50_ms", "train_speedup"), ("train_min_ms", "train_speedup_min")):
            if r.get(metric) and b.get(metric):
                entry[name] = b[metric] / r[metric]
        for metric, name in (("infer_ips", "infer_ips_ratio"), ("train_ips", "train_ips_ratio")):
            if r.get(metric) and b.get(metric):
                entry[name] = r[metric] / b[metric]
        entry.update(_ratio_spread(b, r, "infer"))
        if len(entry) > 8:  # some timing was measured on both
            out.append(entry)
    return out


def _ratio_spread(slow: Dict[str, Any], fast: Dict[str, Any], prefix: str) -> Dict[str, float]:
    """The range of ``slow / fast`` that the two p10-p90 ranges allow (p10/p90 to p90/p10)."""
    keys = [f"{prefix}_p10_ms", f"{prefix}_p90_ms"]
    if not all(slow.get(k) and fast.get(k) for k in keys):
        return {}
    return {f"{prefix}_speedup_lo": slow[keys[0]] / fast[keys[1]],
            f"{prefix}_speedup_hi": slow[keys[1]] / fast[keys[0]]}


def floor_ratios(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each row's time over its attention-free floor's: the row labelled ``floor`` (``--floor``) with the same
    model, head, size, batch, precision, device and runtime. Training and inference, from images/s where both
    measured it (the floor's / the row's), else from the p50 latency (1.0: the attention costs nothing)."""
    def key(r):
        return r["model"], r.get("head", ""), r["img_size"], r.get("batch_size"), r["precision"], r["device"], \
            r.get("runtime")

    floors = {key(r): r for r in rows if r.get("label") == FLOOR_LABEL and "error" not in r}
    out = []
    for r in rows:
        f = floors.get(key(r))
        if f is None or r is f or "error" in r:
            continue
        entry = {"model": r["model"], "head": r.get("head", ""), "label": r["label"], "runtime": r.get("runtime"),
                 "img_size": r["img_size"], "precision": r["precision"]}
        for prefix in ("train", "infer"):
            ips, p50 = f"{prefix}_ips", f"{prefix}_p50_ms"
            if r.get(ips) and f.get(ips):
                entry[f"{prefix}_over_floor"] = f[ips] / r[ips]
            elif r.get(p50) and f.get(p50):
                entry[f"{prefix}_over_floor"] = r[p50] / f[p50]
        if any(k.endswith("_over_floor") for k in entry):
            out.append(entry)
    return out


def runtime_speedups(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Eager PyTorch time / each other runtime's time, for the same model, label, size, precision and device, with
    the range the p10-p90 spreads allow (> 1: the runtime is faster than eager)."""
    def key(r):
        return r["model"], r.get("head", ""), r["label"], r["img_size"], r["precision"], r["device"]

    eager = {key(r): r for r in rows if r.get("runtime") == "eager" and "error" not in r}
    out = []
    for r in rows:
        e = eager.get(key(r))
        if e is None or r is e or "error" in r or not (r.get("infer_p50_ms") and e.get("infer_p50_ms")):
            continue
        out.append({"model": r["model"], "head": r.get("head", ""), "label": r["label"], "img_size": r["img_size"],
                    "runtime": r["runtime"],
                    "threads": r.get("threads"), "eager_ms": e["infer_p50_ms"], "runtime_ms": r["infer_p50_ms"],
                    "over_eager": e["infer_p50_ms"] / r["infer_p50_ms"], **_ratio_spread(e, r, "infer"),
                    **{k: r[k] for k in ("floor_ms", "of_floor") if r.get(k) is not None}})
    return out


def _series(rows: Sequence[Dict[str, Any]], by_runtime: bool = True) -> Dict[str, List[Dict[str, Any]]]:
    """Rows by the name of their series in the plots (label; model, head and precision when several), and with
    ``by_runtime`` the runtime when several ran."""
    series: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if "error" in r:
            continue
        name = r["label"] if r["attn"] != DEFAULT_ATTN else r["model"]
        if len({x["model"] for x in rows}) > 1 and r["attn"] != DEFAULT_ATTN:
            name = f"{r['model']} {name}"
        if len({x.get("head", "") for x in rows}) > 1:
            name += f" {r.get('head') or 'classifier'}"
        if len({x["precision"] for x in rows}) > 1:
            name += f" {r['precision']}"
        if by_runtime and len({x.get("runtime") for x in rows}) > 1:
            name += f" ({r.get('runtime')})"
        series.setdefault(name, []).append(r)
    return {k: sorted(v, key=lambda r: size_side(r["img_size"])) for k, v in series.items()}


#: the panels of the figure: (key, second key, y label of the line plot, y label of the bar plot, y scale)
_PANELS = [
    ("infer_p50_ms", "infer_p90_ms", "inference latency (ms): p50 solid, p90 dashed",
     "batch-1 inference latency (ms): p50 bars, p10-p90 whiskers", "log"),
    ("train_p50_ms", "train_p90_ms", "training step (ms): p50 solid, p90 dashed",
     "training step (ms): p50 bars, p10-p90 whiskers", "log"),
    ("peak_fwd_mb", "peak_train_mb", "peak memory (MB): forward solid, train step dashed",
     "peak memory (MB): forward filled, train step outlined", "log"),
    ("exp_softmax", "exp_total", "exp evaluations / forward: softmax solid, all dashed",
     "exp evaluations / forward: softmax filled, all outlined", "symlog"),
    ("train_ips", None, "training images/s (batch in the table)", "training images/s", "log"),
    ("infer_ips", None, "inference images/s (batch in the table)", "inference images/s", "log"),
    ("train_ips_peak_mb", "infer_ips_peak_mb", "peak CUDA memory at the throughput batch (MB): training solid, "
     "inference dashed", "peak CUDA memory at the throughput batch (MB): training filled, inference outlined", "log"),
]


def plot_results(rows: Sequence[Dict[str, Any]], path: Path, title: str = "", baseline: str = "softmax") -> None:
    """The figure of a sweep: with one input size, grouped bars (:func:`plot_bars`); with several, one line per
    series against input size (:func:`plot_lines`)."""
    measured = [r for r in rows if "error" not in r]
    if len({size_side(r["img_size"]) for r in measured}) == 1:
        plot_bars(rows, path, title, baseline)
    else:
        plot_lines(rows, path, title)


def plot_lines(rows: Sequence[Dict[str, Any]], path: Path, title: str = "") -> None:
    """Against input size, one line per series: inference latency, training step, peak memory and exp-like
    evaluations per forward (solid: softmax-family, the paper's column; dashed: all, activations included).
    Panels with nothing measured are left out."""
    series = _series(rows)
    panels = [p for p in _PANELS if any(r.get(p[0]) is not None or r.get(p[1]) is not None
                                        for rs in series.values() for r in rs)]
    fig, axes = new_figure(min(2, max(1, len(panels))), (len(panels) + 1) // 2 or 1, size=5.2)
    for ax, (solid, dashed, ylabel, _, scale) in zip(axes, panels):
        for name, rs in series.items():
            color = None
            for key, style in ((solid, "-"), (dashed, "--")):
                pts = [(size_side(r["img_size"]), r[key]) for r in rs if r.get(key) is not None]
                if pts:
                    line, = ax.plot(*zip(*pts), marker="o", linestyle=style, color=color,
                                    label=name if style == "-" else None)
                    color = line.get_color()
        ax.set_xlabel("input size (px; √(H·W) for H×W)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_yscale(scale, **({"linthresh": 1.0} if scale == "symlog" else {}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def _group_name(row: Dict[str, Any]) -> str:
    """The x group of a row in the bar plot: what ran it and at which precision ('torch fp32', 'onnxruntime
    int8', 'torch.compile bf16', ...)."""
    runtime = str(row.get("runtime", "eager"))
    extra = ", channels-last" if runtime.endswith(", channels-last") else ""
    runtime = runtime.removesuffix(", channels-last")
    if runtime.endswith(" int8"):
        runtime, precision = runtime.removesuffix(" int8"), "int8"
    else:
        precision = row.get("precision", "fp32")
    runtime = {"eager": "torch", "compiled": "torch.compile"}.get(runtime, runtime)
    return f"{runtime}\n{precision}{extra}"


def plot_bars(rows: Sequence[Dict[str, Any]], path: Path, title: str = "", baseline: str = "softmax") -> None:
    """One input size: per panel, a group of bars per runtime and precision (x), one bar per series (attention
    kind; model and head when several), side by side. Inference latency: p50 bars with p10-p90 error bars; the
    linear floor (``floor_ms``) as a black line across its bar; above each bar its speed-up over eager PyTorch
    (same series) and, for the other series, over the ``baseline`` series (e.g. softmax) in the same group.
    Training step: the same bars without the annotations; memory and exp counts: the first key filled, the
    second outlined. Panels with nothing measured are left out."""
    measured = [r for r in rows if "error" not in r]
    series_of = {id(r): name for name, rs in _series(measured, by_runtime=False).items() for r in rs}
    series = list(dict.fromkeys(series_of.values()))
    groups = list(dict.fromkeys(_group_name(r) for r in measured))
    at = {(_group_name(r), series_of[id(r)]): r for r in measured}
    base_series = next((n for n in series if any(r.get("label") == baseline and series_of[id(r)] == n
                                                 for r in measured)), None)
    panels = [p for p in _PANELS if any(r.get(p[0]) is not None or r.get(p[1]) is not None for r in measured)]
    panel_width = max(5.2, 1.0 + 0.75 * len(groups) * max(1, len(series)))
    ncols = 2 if len(panels) > 1 and panel_width <= 7 else 1  # narrow panels side by side, wide ones stacked
    nrows = -(-max(1, len(panels)) // ncols)
    fig, axes = new_figure(ncols, nrows, size=panel_width)
    fig.set_size_inches(panel_width * ncols, 4.8 * nrows)
    sizes = ", ".join(dict.fromkeys(f"{size_text(r['img_size'])} px" for r in measured))
    models = list(dict.fromkeys(r["model"] + (f" + {r['head']}" if r.get("head") else "") for r in measured))
    what = f"{models[0]} at {sizes}" if len(models) == 1 else sizes
    for ax, panel in zip(axes, panels):
        _bar_panel(ax, panel, _BarGrid(series, groups, at, base_series, baseline), what)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


@dataclass
class _BarGrid:
    """The bar plot's rows by (group, series), and the series the others are compared with."""
    series: List[str]
    groups: List[str]
    at: Dict[Tuple[str, str], Dict[str, Any]]
    base_series: Optional[str]
    baseline: str

    @property
    def width(self) -> float:
        return 0.8 / max(1, len(self.series))


def _bar_panel(ax, panel: Tuple, grid: _BarGrid, what: str) -> None:
    """One panel of :func:`plot_bars`: ``panel`` is an entry of :data:`_PANELS`."""
    key, second, _, ylabel, scale = panel
    used = [g for g in grid.groups if any(grid.at.get((g, n), {}).get(key) is not None for n in grid.series)]
    width, top, floor_drawn = grid.width, 0.0, False
    for i, name in enumerate(grid.series):
        rs = [(gi, grid.at[(g, name)]) for gi, g in enumerate(used) if grid.at.get((g, name), {}).get(key) is not None]
        if not rs:
            continue
        xs = [gi - 0.4 + width * (i + 0.5) for gi, _ in rs]
        rs = [r for _, r in rs]
        values = [r[key] for r in rs]
        prefix = key.split("_")[0]
        timed = [key.endswith("_ms") and r.get(f"{prefix}_p10_ms") is not None and r.get(f"{prefix}_p90_ms")
                 is not None for r in rs]
        lo = [max(0.0, r[key] - r[f"{prefix}_p10_ms"]) if t else 0.0 for r, t in zip(rs, timed)]
        hi = [max(0.0, r[f"{prefix}_p90_ms"] - r[key]) if t else 0.0 for r, t in zip(rs, timed)]
        color = f"C{i % 10}"
        if not key.endswith("_ms"):  # the second key (train-step memory, all exp) outlined behind
            outline = [(x, r[second]) for x, r in zip(xs, rs) if r.get(second) is not None]
            if outline:
                ax.bar(*zip(*outline), width * 0.92, fill=False, edgecolor=color, hatch="//", linewidth=1)
                top = max(top, max(v for _, v in outline))
        ax.bar(xs, values, width * 0.92, color=color, label=name,
               yerr=[lo, hi] if any(lo) or any(hi) else None, error_kw={"elinewidth": 0.8, "capsize": 2})
        top = max(top, max(v + h for v, h in zip(values, hi)))
        if key == "infer_p50_ms":
            floor_drawn = _annotate_latency(ax, name, list(zip(xs, values, hi, rs)), grid, floor_drawn)
    ax.set_xticks(range(len(used)))
    ax.set_xticklabels(used, fontsize=8)
    ax.set_xlim(-0.6, len(used) - 0.4)
    ax.set_ylabel(ylabel, fontsize=8)
    if scale == "symlog":
        ax.set_yscale("symlog", linthresh=1.0)
    else:
        ax.set_ylim(0, top * (1.45 if key == "infer_p50_ms" else 1.1) or 1.0)
    ax.set_title(what + ("\nabove each bar: its speed-up over eager PyTorch and over the same runtime's "
                         f"{grid.baseline}" if key == "infer_p50_ms" else ""), fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    # below the group names, where no bar or annotation can be
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(grid.series) + 1, frameon=False)


def _annotate_latency(ax, name: str, bars: Sequence[Tuple[float, float, float, Dict[str, Any]]], grid: _BarGrid,
                      floor_drawn: bool) -> bool:
    """On the latency panel, for each bar (x, value, upper whisker, row) of series ``name``: the linear floor as
    a black line, and above it the speed-ups over eager PyTorch and over the baseline series. Returns whether the
    floor's legend entry exists."""
    width = grid.width
    for x, v, h, r in bars:
        if r.get("floor_ms") is not None:
            ax.hlines(r["floor_ms"], x - width * 0.46, x + width * 0.46, colors="black", linewidth=2.2,
                      label=None if floor_drawn else "linear floor (floor_ms)")
            floor_drawn = True
        lines = []
        eager = grid.at.get((_group_name({**r, "runtime": "eager"}), name))
        if eager is not None and eager is not r and eager.get("infer_p50_ms"):
            lines.append(f"{eager['infer_p50_ms'] / v:.2f}× eager")
        base = grid.at.get((_group_name(r), grid.base_series)) if grid.base_series not in (None, name) else None
        if base is not None and base.get("infer_p50_ms"):
            lines.append(f"{base['infer_p50_ms'] / v:.2f}× {grid.baseline}")
        if lines:
            ax.annotate("\n".join(lines), (x, v + h), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=90)
    return floor_drawn


RESULT_COLUMNS = ["model", "head", "label", "attn", "attn_kwargs", "runtime", "sima_order", "img_size", "tokens",
                  "precision", "device", "threads", "params_m", "infer_p50_ms", "infer_p10_ms", "infer_p90_ms",
                  "infer_min_ms", "floor_ms", "floor_p10_ms", "floor_p90_ms", "floor_linears", "of_floor",
                  "non_linear_share", "non_delegated_share", "profile_ops", "profile_note", "attn_share",
                  "attn_core_share", "attn_share_runs",
                  "infer_ips", "infer_ips_p10", "infer_ips_p90", "train_p50_ms", "train_p10_ms", "train_p90_ms",
                  "train_min_ms", "train_ips", "train_ips_p10", "train_ips_p90", "batch_size", "infer_batch",
                  "train_batch", "infer_ips_peak_mb", "train_ips_peak_mb", "gflops",
                  "attn_gflops", "exp_total", "exp_softmax", "exp_activation", "exp_calls", "op_calls",
                  "peak_fwd_mb", "peak_train_mb", "runtime_max_abs_diff", "runtime_threads",
                  "rounds", "error"]


def write_results(rows: Sequence[Dict[str, Any]], out_dir: Path, meta: Dict[str, Any],
                  baseline: str = "softmax", stem: str = "bench_model") -> Dict[str, Path]:
    """``<stem>.json`` (meta, rows, speedups), ``.csv``, ``.md`` and ``.png`` in ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    ups = speedups(rows, baseline)
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "md", "png")}
    write_result_files(paths["json"], meta, rows, columns=RESULT_COLUMNS,
                       plot=lambda path: plot_results(rows, path, title=machine_line(meta).rstrip("."),
                                                      baseline=baseline),
                       markdown=summary_markdown(rows, ups, meta, runtime_speedups(rows)) + "\n",
                       speedups=ups, runtime_speedups=runtime_speedups(rows), floor_ratios=floor_ratios(rows))
    return paths


def machine_line(meta: Dict[str, Any]) -> str:
    """What ran the sweep, as the tables' first line: the device (the GPU's name on CUDA; else the CPU and its
    vector features), threads, and the torch and Triton versions."""
    if meta.get("gpu"):
        where = f"GPU {meta['gpu']} ({meta.get('device')})"
    else:
        features = f" (CPU {meta.get('cpu_name')}; {', '.join(meta['cpu_features'])})" if meta.get("cpu_features") \
            else ""
        where = f"Device {meta.get('device')}{features}"
    triton = f", Triton {meta['triton']}" if meta.get("triton") else ""
    return f"{where}, {meta.get('threads')} threads, torch {meta.get('torch')}{triton}."


def summary_markdown(rows: Sequence[Dict[str, Any]], ups: Sequence[Dict[str, Any]], meta: Dict[str, Any],
                     runtime_ups: Sequence[Dict[str, Any]] = ()) -> str:
    """Results and speedups as markdown tables, and a warning line when some timing's spread is wide."""
    cols = ["model", "head", "label", "runtime", "img_size", "tokens", "precision", "infer_p50_ms", "infer_p10_ms",
            "infer_p90_ms", "floor_ms", "floor_p10_ms", "floor_p90_ms", "of_floor", "non_linear_share",
            "non_delegated_share", "attn_share", "attn_core_share", "infer_batch", "infer_ips", "infer_ips_p10",
            "infer_ips_p90", "infer_ips_peak_mb", "train_p50_ms", "train_p10_ms", "train_p90_ms", "train_batch",
            "train_ips", "train_ips_p10", "train_ips_p90", "train_ips_peak_mb", "gflops",
            "attn_gflops", "exp_softmax", "exp_total", "peak_fwd_mb", "peak_train_mb", "runtime_max_abs_diff",
            "runtime_threads", "error"]
    present = [c for c in cols if any(r.get(c) not in (None, "") for r in rows)]
    parts = [f"{machine_line(meta)} Times in ms (p50 = median; p10/p90 beside it), throughput in images/s."
             + (" infer_batch/train_batch: the batch the throughput ran at (halved from batch_size on CUDA "
                "out-of-memory until it fit); *_ips_peak_mb: the peak CUDA memory of those calls."
                if "train_batch" in present or "infer_batch" in present else "")
             + (" attn_share: measured share of the eager forward's time inside the attention modules (forward "
                "hooks; attn_core_share: without their qkv/output projections)." if "attn_share" in present else "")
             + (f" Segmentation heads have {SEG_CLASSES} classes." if "head" in present else "")
             + (" floor_ms: the same model's nn.Linear layers alone (each applied to an input of the shape it sees "
                "in the model, same batch; a convolution patch embedding is not a linear and is left out; with a "
                "segmentation head, still the linears only), run through the same runtime, precision, threads and "
                "timing as the row (p10/p90 beside it); of_floor: the row's p50 / floor_ms."
                if "floor_ms" in present else "")
             + (" non_linear_share: from a separate profiled run, the share of the runtime's time outside matmul/"
                "GEMM/convolution kernels (onnxruntime: of the summed node kernel time, ops other than MatMul, Gemm, "
                "QLinearMatMul, MatMulInteger(ToFloat), QGemm, Conv and their fused forms, so (de)quantize steps "
                "count as non-linear and attention's own matmuls as linear; ExecuTorch: of Method::execute, "
                "outside XNNPACK's Fully Connected/Batch Matrix Multiply/Convolution operators, where LayerNorm's "
                "and SimA's sums, rewritten as GEMMs with columns of ones for XNNPACK, count as linear)."
                if "non_linear_share" in present else "")
             + (" non_delegated_share: ExecuTorch, from an ETDump of a separate run: the share of Method::execute "
                "outside XNNPACK delegate calls (portable kernels and the runtime's dispatch)."
                if "non_delegated_share" in present else ""), "",
             markdown_table(rows, present)]
    notes = dict.fromkeys(f"{r['runtime']}: {r['profile_note']}" for r in rows if r.get("profile_note"))
    parts += [f"no profile shares for {note}" for note in notes]
    timings = {"infer": ("infer_p10_ms", "infer_p90_ms", "infer_p50_ms"),
               "train": ("train_p10_ms", "train_p90_ms", "train_p50_ms"),
               "floor": ("floor_p10_ms", "floor_p90_ms", "floor_ms")}
    spreads = {f"{r['label']} {r['img_size']}px {r.get('runtime', '')} {what}": relative_spread(*map(r.get, keys))
               for r in rows for what, keys in timings.items() if r.get(keys[2])}
    warning = spread_warning(spreads)
    if warning:
        parts += ["", warning]
    if ups:
        ucols = [c for c in ("model", "head", "label", "baseline", "runtime", "img_size", "precision",
                             "infer_speedup", "infer_speedup_lo", "infer_speedup_hi", "infer_speedup_min",
                             "train_speedup", "train_speedup_min", "infer_ips_ratio", "train_ips_ratio")
                 if any(u.get(c) for u in ups)]
        parts += ["", "Speed-up over the baseline (baseline time / time; > 1 is faster; lo-hi: the range the p10-p90 "
                      "spreads allow):", "", markdown_table(ups, ucols)]
    over_floor = floor_ratios(rows)
    if over_floor:
        parts += ["", f"Time over the attention-free floor (the row labelled {FLOOR_LABEL}: the same network with "
                      "its attention cores replaced by a zero-cost stand-in; from images/s where measured, else the "
                      "p50 latency; 1.00: attention at no cost):", "",
                  markdown_table(over_floor, [c for c in ("model", "head", "label", "runtime", "img_size",
                                                          "precision", "train_over_floor", "infer_over_floor")
                                              if any(u.get(c) for u in over_floor)])]
    if runtime_ups:
        parts += ["", "Speed-up of each runtime over eager PyTorch (batch-1 latency, same threads):", "",
                  markdown_table(runtime_ups, ["model", *(["head"] if "head" in present else []), "label",
                                               "img_size", "runtime", "threads", "eager_ms",
                                               "runtime_ms", "over_eager", "infer_speedup_lo", "infer_speedup_hi",
                                               *(["floor_ms", "of_floor"] if "floor_ms" in present else [])])]
    return "\n".join(parts)
