"""``simattn bench paper``: the SimA paper's speed results (Table 3, Figure A1) regenerated on this machine.

* Table 3: one attention block (qkv projection, attention, output projection) at D=64 N=256 H=8 (vanilla, ELU,
  SimA) and D=256 N=64 H=8 (SOFT, XCA, ELU, SimA). The paper does not say whether D is the token dimension (head
  dim D/H: 8 and 32) or the dimension per head (token dim D·H: 512 and 2048); its exp-count column (H·D² for XCA,
  Table 1) only holds with D per head. Both readings are run, every ratio is printed beside its reading, and the
  exp evaluations of each block are counted (:mod:`simattn.bench.counters`) to show which reading gives the
  paper's counts. The caption fixes the order to (QKᵀ)V so every method does the same products and only exp
  differs: the ★ SimA rows (the reference of each setting) and the paper's ELU rows run (q̂k̂ᵀ)v; the linear orders
  q̂(k̂ᵀv) and φ(q)(φ(k)ᵀv) are extra, labelled rows.
* Figure A1: whole models, inference latency. Left: DeiT-S vs SimA (dim 384) as the resolution grows, SimA in
  (q̂k̂ᵀ)v order so both are O(N²D). Right: XCiT vs SimA as the channel dim grows at 224 px, SimA in q̂(k̂ᵀv)
  order so both are O(ND²). Each model runs in its own subprocess (:func:`simattn.bench.model.workers.run_specs`).

The comparison tables of SimA and SOFT (SimA's Table 2, SOFT's Table 1 and Fig. 1b, and every kind trained on the
embedded digits) are :mod:`simattn.bench.paper_tables`; the newer softmax-free attentions beside all the others
(params, GMACs and exp counts at DeiT-T beside each paper's DeiT-T figures, CPU latency at 197 and 785 tokens, digits
top-1 over seeds with the non-finite and softmax-margin check, each kind's digits weights exported to ONNX and
ExecuTorch and validated there) are :mod:`simattn.bench.paper_peers` (``peers``), and the peers' released ImageNet-1k
checkpoints (each tag's authors' top-1 beside the params and GMACs built here and its README's) are
:mod:`simattn.bench.paper_imagenet` (``--peers-parts imagenet``).
``--only`` picks parts (``table3 figure_a1 table2 table1 figure1b digits peers``; default all).

The paper's published numbers are printed beside ours, with every time also given relative to SimA, the
comparison that carries across machines. The full run covers the paper's ranges (224-1536 px; dims to 3072 on CPU,
8192 on CUDA) and takes hours on a small CPU; ``--quick`` takes minutes. Outputs in ``--output``: ``paper.md``
(every part run, with the CPU and threads), ``table3.{json,csv,png}``, ``figure_a1.{json,csv,png}``,
``table2.{json,csv}``, ``table1.{json,csv}``, ``figure1b.{json,csv,png}``, ``digits.{json,csv}`` (and ``digits/<kind>/seed<k>/``, the training runs),
``peers.{json,csv,png}`` (and ``peers_digits/<kind>/seed<k>/``, ``peers_deploy/<kind>/``: the exported files),
``peers_imagenet.{json,csv}``.
A part that ran but failed (a worker's error, a kind failing the peers check, an export) still writes its files; the
command then names it in one line and exits 1. ``--overwrite`` replaces all of these whole (:func:`paper_files`).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from ..attention import ELUAttention, SimAAttention, SoftAttention, SoftmaxAttention, XCAttention, list_attentions
from ..attention.elu import elu_attention_reference
from ..utils.runs import claim_run_folder, settle_replaced
from ..utils.timing import keep_freed_memory, set_threads, time_fn
from .model.spec import BenchSpec
from .model.workers import run_specs
from . import paper_imagenet as pi, paper_peers as pp, paper_tables as pt
from .cli import check_bench_flags, check_out, refuse_unused, result_files
from ..utils.io import atomic_write_text
from .report import machine_info, markdown_table, new_figure, progress, rounds_median, save_figure, \
    write_result_files

__all__ = ["PAPER_TABLE3", "PAPER_DEVICES", "PAPER_FIGURE_A1", "READINGS", "Table3Row", "table3_rows", "run_table3",
           "table3_records", "reading_verdict",
           "run_figure_a1", "main"]

PAPER_DEVICES = ("Jetson Nano", "Apple M1", "Raspberry Pi 4")
#: Table 3 of the paper: (D, N, H) → method → ms on (Jetson Nano, M1, RPi4).
PAPER_TABLE3: Dict[Tuple[int, int, int], Dict[str, Tuple[float, float, float]]] = {
    (64, 256, 8): {"vanilla": (177.4, 35.8, 180.6), "elu": (144.5, 26.2, 160.0), "sima": (63.6, 20.4, 51.9)},
    (256, 64, 8): {"soft": (145.9, 36.0, 177.4), "xca": (144.4, 36.1, 178.7), "elu": (105.2, 26.4, 160.1),
                   "sima": (58.0, 20.5, 53.2)},
}
#: Figure A1 (RTX 8000, batch 8): the baseline is this much slower than SimA at the largest point.
PAPER_FIGURE_A1 = {"deit": {"at": 1536, "axis": "px", "slower": 0.58},
                   "xcit": {"at": 8192, "axis": "channels", "slower": 0.22}}


#: how Table 3's D is read: name → (description, token dim for the paper's D and H)
READINGS: Dict[str, Tuple[str, Callable[[int, int], int]]] = {
    "per_head": ("D per head", lambda d, h: d * h),
    "total": ("D total", lambda d, h: d),
}


class QuadraticELUAttention(ELUAttention):
    """ELU attention computed as (φ(q)φ(k)ᵀ)v, the O(N²) order vanilla attention is stuck with."""

    def attend(self, q, k, v, mask):
        return elu_attention_reference(q, k, v, mask=mask, eps=self.eps)


@dataclass
class Table3Row:
    """One block of Table 3 under one reading of D: ``paper`` names the paper's method whose numbers belong beside
    it (None: extra row); ``reference`` marks the SimA row the others are compared with."""

    setting: Tuple[int, int, int]
    label: str
    build: Callable[[int, int], nn.Module]
    paper: Optional[str] = None
    reference: bool = False
    reading: str = "per_head"
    result: Dict[str, float] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        """The block's token dimension under this row's reading of D."""
        d, _, h = self.setting
        return READINGS[self.reading][1](d, h)


def table3_rows(readings: Sequence[str] = tuple(READINGS)) -> List[Table3Row]:
    """The blocks Table 3 compares (plus SDPA softmax and the linear orders, labelled), once per reading of D."""
    top, bottom = (64, 256, 8), (256, 64, 8)

    def block(cls, **options):
        return lambda dim, heads: cls(dim, heads, qkv_bias=True, **options)

    rows = []
    for reading in readings:
        if reading not in READINGS:
            raise ValueError(f"unknown reading of D {reading!r}; expected one of {', '.join(READINGS)}")
        rows += [
            Table3Row(top, "vanilla softmax(qkᵀ)v", block(SoftmaxAttention, fused=False), paper="vanilla"),
            Table3Row(top, "softmax, fused SDPA", block(SoftmaxAttention)),
            Table3Row(top, "ELU (φ(q)φ(k)ᵀ)v", block(QuadraticELUAttention), paper="elu"),
            Table3Row(top, "SimA (q̂k̂ᵀ)v", block(SimAAttention, order="qk_first"), paper="sima", reference=True),
            Table3Row(bottom, "SOFT (Nyström, 2×2 pooled landmarks)", block(SoftAttention), paper="soft"),
            Table3Row(bottom, "XCA softmax(q̂ᵀk̂) on v", block(XCAttention), paper="xca"),
            Table3Row(bottom, "ELU (φ(q)φ(k)ᵀ)v", block(QuadraticELUAttention), paper="elu"),
            Table3Row(bottom, "ELU φ(q)(φ(k)ᵀv), linear order", block(ELUAttention)),
            Table3Row(bottom, "SimA (q̂k̂ᵀ)v", block(SimAAttention, order="qk_first"), paper="sima", reference=True),
            Table3Row(bottom, "SimA q̂(k̂ᵀv), linear order", block(SimAAttention, order="kv_first")),
        ]
        for row in rows[-10:]:
            row.reading = reading
    return rows


def run_table3(rows: Sequence[Table3Row], *, batch: int, device: str, warmup: int, repeats: int,
               rounds: int) -> List[Dict[str, Any]]:
    """Time every block (forward, inference mode, fp32). Rounds interleave the blocks so a slow phase of a
    shared machine hits all of them; the reported time is the median over rounds of each round's median."""
    from .counters import trace_ops

    torch.manual_seed(0)
    blocks, inputs, exps = [], [], []
    for row in rows:
        _, tokens, heads = row.setting
        blocks.append(row.build(row.dim, heads).to(device).eval())
        inputs.append(torch.randn(batch, tokens, row.dim, device=device))
        with torch.inference_mode():
            exps.append(trace_ops(lambda: blocks[-1](inputs[-1][:1])).exp_total)  # feature maps included
    stats: List[List[Dict[str, float]]] = [[] for _ in rows]
    jobs = [(r, i) for r in range(rounds) for i in range(len(rows))]
    def describe(job):
        row = rows[job[1]]
        return f"{row.label}, {READINGS[row.reading][0]} (round {job[0] + 1})"

    for r, i in progress(jobs, "table 3", describe):
        block, x = blocks[i], inputs[i]
        with torch.inference_mode():
            stats[i].append(time_fn(lambda: block(x), warmup=warmup, repeats=repeats, device=device))
    for row, st, n_exp in zip(rows, stats, exps):
        row.result = {**rounds_median(st), "exps": n_exp}
    return table3_records(rows, batch)


def table3_records(rows: Sequence[Table3Row], batch: int) -> List[Dict[str, Any]]:
    """One record per row (``row.result`` holds median/p10/p90/mean ms and ``exps``, the exp evaluations of one
    image): times, time relative to the ★ SimA row of the same setting and reading, the paper's numbers."""
    refs = {(row.setting, row.reading): row.result["median_ms"] for row in rows if row.reference}
    records = []
    for row in rows:
        dim, tokens, heads = row.setting
        res = row.result
        rec: Dict[str, Any] = {"D": dim, "N": tokens, "H": heads, "reading": READINGS[row.reading][0],
                               "token_dim": row.dim, "head_dim": row.dim // heads, "batch": batch,
                               "method": row.label + (" ★" if row.reference else ""),
                               "exps": res.get("exps"), "ours_ms": res["median_ms"], "ours_p10_ms": res.get("p10_ms"),
                               "ours_p90_ms": res.get("p90_ms"), "ours_mean_ms": res.get("mean_ms"),
                               "ours_vs_sima": res["median_ms"] / refs[(row.setting, row.reading)]}
        paper = PAPER_TABLE3[row.setting].get(row.paper) if row.paper else None
        paper_sima = PAPER_TABLE3[row.setting]["sima"]
        for j, device in enumerate(PAPER_DEVICES):
            rec[f"paper_ms_{device}"] = paper[j] if paper else None
            rec[f"paper_vs_sima_{device}"] = paper[j] / paper_sima[j] if paper else None
        records.append(rec)
    return records


def reading_verdict(records: Sequence[Dict[str, Any]]) -> str:
    """Which reading of D gives the paper's exp count for XCA (H·D², Table 1), from the counted exps."""
    counted = {r["reading"]: r["exps"] for r in records if r["method"].startswith("XCA") and r["exps"] is not None}
    xca = next((r for r in records if r["method"].startswith("XCA")), None)
    if xca is None or not counted:
        return "XCA was not run: no exp count to tell the readings of D apart."
    paper = xca["H"] * xca["D"] ** 2
    matches = [reading for reading, n in counted.items() if n == paper]
    found = ", ".join(f"{n:,} with {reading}" for reading, n in counted.items())
    verdict = (f"{' and '.join(matches)} matches" if matches else "neither reading matches")
    return (f"Exp evaluations of the XCA block per image: {found}; the paper's H·D² with D={xca['D']}, H={xca['H']} "
            f"is {paper:,}: {verdict} the paper's exp-count column.")


def table3_markdown(records: Sequence[Dict[str, Any]]) -> str:
    parts = [reading_verdict(records), ""]
    short = {"Jetson Nano": "Nano", "Apple M1": "M1", "Raspberry Pi 4": "RPi4"}
    for key in dict.fromkeys((r["D"], r["N"], r["H"], r["reading"]) for r in records):
        recs = [r for r in records if (r["D"], r["N"], r["H"], r["reading"]) == key]
        dim, tokens, heads, reading = key
        cols = ["method", "reading", "exps", "ours_ms", "ours_p10_ms", "ours_p90_ms", "ours_vs_sima"] + \
               [f"paper_ms_{d}" for d in PAPER_DEVICES] + [f"paper_vs_sima_{d}" for d in PAPER_DEVICES]
        headers = ["method", "D read as", "exps / image", "ours (ms)", "p10", "p90", "ours ×SimA"] + \
                  [f"paper {short[d]} (ms)" for d in PAPER_DEVICES] + [f"paper {short[d]} ×SimA" for d in PAPER_DEVICES]
        parts += [f"**D={dim} N={tokens} H={heads}, {reading}** (token dim {recs[0]['token_dim']}, head dim "
                  f"{recs[0]['head_dim']}, batch {recs[0]['batch']}; ×SimA = time / time of the ★ SimA row of this "
                  f"setting and reading, the (q̂k̂ᵀ)v order of the caption)", "",
                  markdown_table(recs, cols, headers), ""]
    return "\n".join(parts)


def plot_table3(records: Sequence[Dict[str, Any]], path: Path) -> None:
    """Time relative to SimA: ours beside the paper's three devices, per block."""
    import numpy as np

    settings = list(dict.fromkeys((r["D"], r["N"], r["H"], r["reading"]) for r in records))
    fig, axes = new_figure(min(2, len(settings)), (len(settings) + 1) // 2, size=6.0)
    for ax, setting in zip(axes, settings):
        recs = [r for r in records if (r["D"], r["N"], r["H"], r["reading"]) == setting]
        xs = np.arange(len(recs))
        series = [("ours", "ours_vs_sima")] + [(f"paper {d}", f"paper_vs_sima_{d}") for d in PAPER_DEVICES]
        width = 0.8 / len(series)
        for j, (name, key) in enumerate(series):
            values = [r[key] if r[key] is not None else np.nan for r in recs]
            ax.bar(xs + (j - (len(series) - 1) / 2) * width, values, width, label=name)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_xticks(xs, [r["method"] for r in recs], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("time / SimA time")
        ax.set_title(f"D={setting[0]} N={setting[1]} H={setting[2]}, {setting[3]}")
        ax.legend(fontsize=7)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------ Figure A1


def figure_a1_specs(args: argparse.Namespace, threads: int, xcit_model: str,
                    xcit_kwargs: Dict[str, Any]) -> Tuple[List[BenchSpec], List[Dict[str, Any]]]:
    """The model runs of Figure A1 and, per run, its panel and x value."""
    common = dict(device=args.device, threads=threads, latency_batch=args.batch, measures=("latency",),
                  warmup=args.warmup_models, repeats=args.repeats_models, max_time=args.max_time)
    deit = "sima_deit_small_patch16_224"
    deit_kwargs = {"depth": args.deit_depth} if args.deit_depth else {}
    left = [("DeiT-S softmax(qkᵀ)v", "softmax", None, {"fused": False}),
            ("DeiT-S fused SDPA", "softmax", None, {}),
            ("SimA (q̂k̂ᵀ)v", "sima", "qk_first", {})]
    right = [("XCiT (XCA)", "xca", None), ("SimA q̂(k̂ᵀv)", "sima", "kv_first")]
    specs, where = [], []
    for size in args.sizes:
        for label, attn, order, attn_kwargs in left:
            specs.append(BenchSpec(model=deit, attn=attn, attn_kwargs=attn_kwargs, img_size=size, sima_order=order,
                                   label=label, model_kwargs=deit_kwargs, **common))
            where.append({"panel": "deit", "x": size, "baseline": attn == "softmax",
                          "reference": label == "DeiT-S softmax(qkᵀ)v"})
    for dim in args.dims:
        for label, attn, order in right:
            specs.append(BenchSpec(model=xcit_model, attn=attn, img_size=224, sima_order=order, label=label,
                                   model_kwargs={**xcit_kwargs, "embed_dim": dim}, **common))
            where.append({"panel": "xcit", "x": dim, "baseline": attn == "xca", "reference": attn == "xca"})
    return specs, where


def figure_a1_records(rows: Sequence[Dict[str, Any]], where: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows with their panel and x, and each baseline's "% slower than SimA" at the same x."""
    records = [{**w, "label": r["label"], "model": r["model"], "ms": r.get("infer_p50_ms"),
                "p90_ms": r.get("infer_p90_ms"), "error": r.get("error")} for r, w in zip(rows, where)]
    sima = {(r["panel"], r["x"]): r["ms"] for r in records if r["label"].startswith("SimA")}
    for r in records:
        s = sima.get((r["panel"], r["x"]))
        r["slower_than_sima_pct"] = (r["ms"] / s - 1) * 100 if r["ms"] and s and r["baseline"] else None
    return records


def plot_figure_a1(records: Sequence[Dict[str, Any]], path: Path, batch: int, device: str) -> None:
    fig, axes = new_figure(2, size=5.5)
    titles = {"deit": "DeiT-S vs SimA, dim 384: inference vs resolution",
              "xcit": "XCiT vs SimA, 224 px: inference vs channel dim"}
    xlabels = {"deit": "input size (px)", "xcit": "embedding dim D"}
    for ax, panel in zip(axes, ("deit", "xcit")):
        recs = [r for r in records if r["panel"] == panel and r["ms"]]
        for label in dict.fromkeys(r["label"] for r in recs):
            pts = sorted((r["x"], r["ms"]) for r in recs if r["label"] == label)
            ax.plot(*zip(*pts), marker="o", label=label)
        ref = [r for r in recs if r["reference"] and r["slower_than_sima_pct"] is not None]
        if ref:
            last = max(ref, key=lambda r: r["x"])
            paper = PAPER_FIGURE_A1[panel]
            ax.text(0.98, 0.03, f"{last['label']}: {last['slower_than_sima_pct']:+.0f}% vs SimA at {last['x']}\n"
                                f"(paper: +{paper['slower'] * 100:.0f}% at {paper['at']})",
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
        ax.set_title(titles[panel], fontsize=9)
        ax.set_xlabel(xlabels[panel])
        ax.set_ylabel(f"latency p50 (ms), batch {batch}, {device}")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    save_figure(fig, path)


def figure_a1_markdown(records: Sequence[Dict[str, Any]], notes: Sequence[str]) -> str:
    parts = []
    for panel, axis in (("deit", "size (px)"), ("xcit", "embed dim")):
        recs = [r for r in records if r["panel"] == panel]
        if not recs:
            continue
        paper = PAPER_FIGURE_A1[panel]
        parts += [f"**{'Left' if panel == 'deit' else 'Right'}** (paper, RTX 8000 batch 8: baseline "
                  f"+{paper['slower'] * 100:.0f}% slower than SimA at {paper['at']} {paper['axis']})", "",
                  markdown_table(recs, ["x", "label", "model", "ms", "p90_ms", "slower_than_sima_pct", "error"],
                                 [axis, "model run", "model", "p50 (ms)", "p90 (ms)", "% slower than SimA",
                                  "error"]), ""]
    parts += [f"- {n}" for n in notes]
    return "\n".join(parts)


def run_figure_a1(args: argparse.Namespace, threads: int) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Run both panels; returns the records and notes on what was substituted."""
    notes = []
    xcit_model, xcit_kwargs = args.xcit_model, {"depth": args.xcit_depth, "num_heads": 8}
    if args.deit_depth:
        notes.append(f"DeiT-S runs with depth {args.deit_depth} instead of 12 (all blocks are alike, so the ratio "
                     f"per block is unchanged; patch embedding and head weigh a little more).")
    notes.append(f"Right panel: depth {args.xcit_depth}, 8 heads (head dim D/8), 224 px.")
    specs, where = figure_a1_specs(args, threads, xcit_model, xcit_kwargs)
    rows = run_specs(specs, rounds=args.rounds_models, timeout=args.timeout, desc="figure A1")
    return figure_a1_records(rows, where), notes


# ------------------------------------------------------------------------------------------------ CLI


PARTS = ("table3", "figure_a1", "table2", "table1", "figure1b", "digits", "peers")
PEER_PARTS = ("costs", "latency", "digits", "deploy", "imagenet")
QUICK = {"repeats": 10, "rounds": 3, "sizes": [224, 320, 448], "dims": [192, 384, 768], "deit_depth": 4,
         "repeats_models": 5, "warmup_models": 1, "rounds_models": 1,
         "table1_batch": 2, "figure1b_p": [1, 2], "figure1b_depth": 2, "digits_epochs": 1, "peers_epochs": 1,
         "peers_repeats": 2, "peers_formats": ["onnx"]}
FULL_CUDA_DIMS = [384, 768, 1536, 3072, 6144, 8192]
FULL = {"repeats": 100, "rounds": 5, "sizes": [224, 384, 512, 768, 1024, 1536], "dims": [384, 768, 1536, 3072],
        "deit_depth": 0, "repeats_models": 5, "warmup_models": 2, "rounds_models": 2,
        "table1_batch": 16, "figure1b_p": list(range(1, 9)), "figure1b_depth": 12, "digits_epochs": None,
        "peers_epochs": None, "peers_repeats": 5, "peers_formats": ["onnx", "executorch"]}
FIGURE1B_KINDS = ["softmax", "linformer", "performer", "nystrom", "soft", "sima"]


def _options():
    """Every option of ``bench paper`` (the shared ones from :mod:`simattn.bench.cli`) with its allowed values."""
    from ..utils.recipe import Opt, maybe
    from .cli import shared, some_of, xcit_models
    count, counts = dict(type=maybe(int), low=1), dict(type=maybe(List[int]), low=1)
    return {
        "quick": Opt(False, "fewer sizes, shallower models and repeats (minutes on CPU)"),
        "only": Opt(None, f"run these parts only ({', '.join(PARTS)}; default all)", type=maybe(List[str]),
                    check=some_of(list(PARTS))),
        "device": shared("device"),
        "threads": shared("threads"),
        "readings": Opt(None, f"Table 3: how D is read ({', '.join(READINGS)}; default all; per head: token dim D·H; "
                              "total: token dim D)", type=maybe(List[str]), check=some_of(list(READINGS))),
        "table3_batch": Opt(None, "batch of the Table 3 blocks (default 16; the paper does not state it)", **count),
        "batch": shared("batch", help="batch of the Figure A1 runs (default: 8 on CUDA as in the paper, 1 on CPU)"),
        "sizes": Opt(None, "Figure A1 left: input sizes", **counts),
        "dims": Opt(None, "Figure A1 right: embedding dims (multiples of 8; paper goes to 8192)", **counts),
        "deit_depth": Opt(None, "Figure A1 left: blocks (0 = DeiT-S's 12)", type=maybe(int), low=0),
        "xcit_model": Opt(None, "Figure A1 right: the XCiT/SimA model (default sima_small_12_p16; an XCiT-layout "
                                "model)", type=maybe(str), choices=xcit_models),
        "xcit_depth": Opt(None, "Figure A1 right: blocks (default 1; wide models are big)", **count),
        "repeats": shared("repeats", help="Table 3 timed runs per round"),
        "rounds": shared("rounds", help="Table 3 interleaved timing rounds (median reported)"),
        "repeats_models": Opt(None, "Figure A1 timed runs per model", **count),
        "rounds_models": Opt(None, "Figure A1 interleaved rounds (subprocesses)", **count),
        "warmup_models": Opt(None, "Figure A1 untimed runs per model", type=maybe(int), low=0),
        "max_time": shared("max_time", help="cap (s) on one Figure A1 model's timed runs (default 60)"),
        "timeout": shared("timeout", help="seconds before a Figure A1 or Table 1 worker is abandoned"),
        "table1_batch": Opt(None, "SOFT Table 1: batch of the throughput and memory runs (default 16; quick 2)",
                            **count),
        "figure1b_p": Opt(None, "SOFT Fig. 1b: p of the 784·p tokens (default 1-8; quick 1 2)", **counts),
        "figure1b_depth": Opt(None, "SOFT Fig. 1b: blocks in the stack (default the paper's 12; quick 2)", **count),
        "figure1b_kinds": Opt(None, f"SOFT Fig. 1b: attention kinds (default {' '.join(FIGURE1B_KINDS)})",
                              type=maybe(List[str]), check=some_of(_kind_names())),
        "memory_cap": Opt(8.0, "SOFT Fig. 1b: skip a point whose N×N matrices alone would need more GB",
                          type=float, low=0.0, low_open=True),
        "digits_kinds": Opt(None, "digits: attention kinds to train (default every registered kind)",
                            type=maybe(List[str]), check=some_of(_kind_names())),
        "digits_seeds": Opt([0, 1, 2], "digits: seeds per kind", type=List[int], low=0),
        "digits_recipe": Opt("paper_digits_cpu", "digits: the training recipe every kind runs"),
        "digits_epochs": Opt(None, "digits: epochs (default the recipe's; quick 1 epoch of 2 updates)", **count),
        "peers_kinds": Opt(None, "peers: attention kinds (default every registered kind; softmax always, the "
                                 "others are compared with it)", type=maybe(List[str]), check=some_of(_kind_names())),
        "peers_epochs": Opt(None, "peers: digits epochs (default the recipe's 20; quick 1 epoch of 2 updates); seeds "
                                  "and recipe are --digits-seeds and --digits-recipe", **count),
        "peers_repeats": Opt(None, "peers: timed forward runs per kind and token count (default 5; quick 2)",
                             **count),
        "peers_parts": Opt(None, "peers: which measurements (costs latency digits deploy imagenet; default all; "
                                 "deploy exports the digits part's weights, so it needs digits; imagenet: the "
                                 "released ImageNet tags' params and GMACs beside their READMEs')",
                           type=maybe(List[str]), check=some_of(list(PEER_PARTS))),
        "peers_formats": Opt(None, "peers: the formats deploy exports each kind's digits weights to and validates "
                                   "(default onnx executorch; quick onnx)", type=maybe(List[str]),
                             check=some_of(["onnx", "executorch"])),
        "output": shared("output", "runs/bench_paper", "output folder"),
        "overwrite": shared("overwrite"),
    }


def _kind_names() -> List[str]:
    """Kinds ``--figure1b-kinds`` / ``--digits-kinds`` take: the registered ones and the papers' (a paper kind
    this installation lacks is left out of the tables with a note)."""
    return sorted(set(list_attentions()) | set(pt.PAPER_KINDS))


def build_parser() -> argparse.ArgumentParser:
    from ..utils.recipe import command_parser
    return command_parser("simattn bench paper",
                          "Regenerate the SimA paper's Table 3 (one attention block), Figure A1 (whole models) and "
                          "Table 2, SOFT's Table 1 and Fig. 1b, and a digits accuracy table on this machine, the "
                          "papers' numbers beside ours.", _options())


def paper_files() -> List[str]:
    """What the parts write into --output (tables, figures, the digits runs' folders) and the report: what
    --overwrite replaces; a folder holding anything else is refused."""
    return ["paper.md", "digits", "peers_digits", "peers_deploy",
            *(name for part in _paper_parts()
              for name in result_files(part.name, ("json", "csv", "png") if part.plot else ("json", "csv")))]


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    check_bench_flags(args, _options())
    args.only = list(dict.fromkeys(args.only or PARTS))
    for part in _paper_parts():
        if part.options and part.name not in args.only:
            refuse_unused(args, list(part.options), f"to {part.name}, which --only {' '.join(args.only)} leaves out")
    args.peers_parts = list(dict.fromkeys(args.peers_parts or PEER_PARTS))
    if "deploy" in args.peers_parts and "digits" not in args.peers_parts:
        raise ValueError("--peers-parts deploy exports the weights the digits part trains: add digits")
    check_out(args.output, args.overwrite, paper_files())
    defaults = dict(QUICK if args.quick else FULL)
    if not args.quick and torch.device(args.device).type == "cuda":
        defaults["dims"] = FULL_CUDA_DIMS  # the paper's range; too big for a small CPU box
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch is None:
        args.batch = 8 if torch.device(args.device).type == "cuda" else 1
    args.readings = args.readings or list(READINGS)
    args.table3_batch = args.table3_batch or 16
    args.xcit_model = args.xcit_model or "sima_small_12_p16"
    args.xcit_depth = args.xcit_depth or 1
    args.max_time = args.max_time or 60.0
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {args.device!r} requested but CUDA is not available")
    bad = [d for d in args.dims if d % 8]
    if bad:
        raise ValueError(f"--dims {' '.join(map(str, bad))}: the XCiT panel's dims must be multiples of 8 (8 heads)")
    args.figure1b_kinds = args.figure1b_kinds or list(FIGURE1B_KINDS)
    if "figure_a1" in args.only:  # a model the sizes or dims do not fit: one line now, not after Table 3
        from .model.runner import check_builds

        check_builds(figure_a1_specs(args, 1, args.xcit_model, {"depth": args.xcit_depth, "num_heads": 8})[0])
    return args


class Setting(NamedTuple):
    """What the parts of a run share: the output folder, the run's meta, the thread count and the machine in words."""

    out: Path
    meta: Dict[str, Any]
    threads: int
    machine: str


@dataclass
class PartResult:
    """A part's rows and notes, what failed in it (one line per part, naming the runs) and its further JSON fields."""

    rows: List[Dict[str, Any]]
    notes: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)
    more: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    """One part of ``bench paper``, run when ``--only`` names ``only`` (default its name) and ``when`` holds: ``run``
    measures, the loop writes ``<name>.{json,csv}`` and, with a ``plot``, ``<name>.png`` (a plot that returns
    something empty drew nothing), linked as ``figure`` under ``markdown``, the part's section of ``paper.md``.
    ``options``: the flags only it takes (refused where --only leaves it out)."""

    name: str
    run: Callable[[argparse.Namespace, Setting], PartResult]
    markdown: Callable[[argparse.Namespace, Setting, PartResult], List[str]]
    plot: Optional[Callable[[argparse.Namespace, Setting, PartResult, Path], Any]] = None
    figure: str = ""
    options: Tuple[str, ...] = ()
    only: str = ""
    when: Callable[[argparse.Namespace], bool] = lambda args: True


def _failed(part: str, what: List[str]) -> List[str]:
    return [f"{part}: {', '.join(what)}"] if what else []


def _figure_a1(args: argparse.Namespace, setting: Setting) -> PartResult:
    records, notes = run_figure_a1(args, setting.threads)
    return PartResult(records, notes, _failed("figure_a1", [f"{r['label']} at {r['x']} ({r['error']})"
                                                            for r in records if r["error"]]))


def _table1(args: argparse.Namespace, setting: Setting) -> PartResult:
    records, notes = pt.run_table1(batch=args.table1_batch, threads=setting.threads, device=args.device,
                                   repeats=2 if args.quick else 5, timeout=args.timeout)
    return PartResult(records, notes, _failed("table1", [f"{r['model']} ({r['error']})" for r in records
                                                         if r["error"]]))


def _figure1b_title(args: argparse.Namespace, setting: Setting) -> str:
    return f"{args.figure1b_depth} blocks, d 384, 12 heads, batch 1 ({setting.machine})"


def _digits_overrides(args: argparse.Namespace, epochs: Optional[int], threads: int) -> Dict[str, Any]:
    """The digits recipe's overrides: this run's threads, the epochs asked for, 2 updates an epoch with --quick."""
    return {"threads": threads, **({"epochs": epochs} if epochs is not None else {}),
            **({"steps_per_epoch": 2} if args.quick else {})}


def _digits(args: argparse.Namespace, setting: Setting) -> PartResult:
    return PartResult(*pt.run_digits(args.digits_kinds or list_attentions(), args.digits_seeds,
                                     setting.out / "digits", args.digits_recipe,
                                     _digits_overrides(args, args.digits_epochs, setting.threads)))


def _peers(args: argparse.Namespace, setting: Setting) -> PartResult:
    """The peers' DeiT-T table (:mod:`simattn.bench.paper_peers`): what failed in it is
    :func:`~simattn.bench.paper_peers.peers_failures`."""
    kinds, notes = pp.registered_kinds(args.peers_kinds)
    parts = args.peers_parts
    costs, latency, digits, deployed = [], [], [], []
    if "costs" in parts:
        costs, more = pp.run_peer_costs(kinds)
        notes += more
    if "latency" in parts:
        latency = pp.run_peer_latency(kinds, repeats=args.peers_repeats)
    if "digits" in parts:
        digits, more = pp.run_peer_digits(kinds, args.digits_seeds, setting.out / "peers_digits", args.digits_recipe,
                                          _digits_overrides(args, args.peers_epochs, setting.threads))
        notes += more
    if "deploy" in parts:
        deployed = pp.run_peer_deploy(kinds, setting.out / "peers_digits", args.digits_seeds[0],
                                      setting.out / "peers_deploy", args.peers_formats)
    failed = pp.peers_failures(costs, latency, digits, deployed)
    if args.quick:
        failed = [f + (" (--quick trains 2 updates per kind, too few to learn digits: the check needs a run without "
                       "--quick)" if f.startswith("peers digits") else "") for f in failed]
    return PartResult(pp.peers_records(kinds, costs, latency, digits, deployed), notes, failed,
                      {"digits_runs": digits, "failed": failed})


def _peers_title(setting: Setting) -> str:
    return f"every attention kind at DeiT-T and on digits ({setting.machine})"


def _imagenet(args: argparse.Namespace, setting: Setting) -> PartResult:
    rows = pi.run_imagenet_rows()
    return PartResult(rows, failed=[f"peers imagenet: {row['tag']} ({row['error']})" for row in rows
                                    if row.get("error")])


def _paper_parts() -> List[Part]:
    """Every part in the order it runs and its section stands in ``paper.md``."""
    from . import paper_imagenet as pi
    from . import paper_peers as pp
    return [
        Part("table3", lambda args, s: PartResult(run_table3(
            table3_rows(args.readings), batch=args.table3_batch, device=args.device, warmup=5, repeats=args.repeats,
            rounds=args.rounds)), lambda args, s, r: ["## Table 3: one attention block, fixed matmul order", "",
                                                    table3_markdown(r.rows)],
             plot=lambda args, s, r, path: plot_table3(r.rows, path), figure="table 3",
             options=("readings", "table3_batch", "repeats", "rounds")),
        Part("figure_a1", _figure_a1,
             lambda args, s, r: [f"## Figure A1: whole models, inference, batch {args.batch}", "",
                                 figure_a1_markdown(r.rows, r.notes), ""],
             plot=lambda args, s, r, path: plot_figure_a1(r.rows, path, args.batch, args.device), figure="figure A1",
             options=("batch", "sizes", "dims", "deit_depth", "xcit_model", "xcit_depth", "repeats_models",
                      "rounds_models", "warmup_models", "max_time")),
        Part("table2", lambda args, s: PartResult(*pt.run_table2()),
             lambda args, s, r: [f"## SimA Table 2: params, FLOPs and exp per image ({s.machine})", "",
                                 pt.table2_markdown(r.rows, r.notes), ""]),
        Part("table1", _table1, lambda args, s, r: [f"## SOFT Table 1: the Tiny pyramid per kind ({s.machine})", "",
                                                    pt.table1_markdown(r.rows, r.notes), ""],
             options=("table1_batch",)),
        Part("figure1b", lambda args, s: PartResult(*pt.run_figure1b(
            args.figure1b_kinds, args.figure1b_p, depth=args.figure1b_depth, repeats=2 if args.quick else 5,
            memory_cap_gb=args.memory_cap)),
             lambda args, s, r: [f"## SOFT Fig. 1b: memory and latency against 784·p tokens, "
                                 f"{_figure1b_title(args, s)}", "", pt.figure1b_markdown(r.rows, r.notes), ""],
             plot=lambda args, s, r, path: pt.plot_figure1b(r.rows, path, _figure1b_title(args, s)),
             figure="figure 1b", options=("figure1b_p", "figure1b_depth", "figure1b_kinds")),
        Part("digits", _digits, lambda args, s, r: [
            f"## Every kind on the embedded digits ({s.machine})", "",
            pt.digits_markdown(r.rows, r.notes, args.digits_recipe, args.digits_seeds), ""],
             options=("digits_kinds", "digits_epochs")),
        # the released tags alone (--peers-parts imagenet) make no DeiT-T table
        Part("peers", _peers, lambda args, s, r: [
            f"## Peers: {_peers_title(s)}", "",
            pp.peers_markdown(r.rows, r.notes, args.digits_recipe, args.digits_seeds), ""],
             plot=lambda args, s, r, path: pp.plot_peers(r.rows, path, _peers_title(s)), figure="peers",
             options=("peers_kinds", "peers_epochs", "peers_repeats", "peers_parts", "peers_formats"),
             when=lambda args: bool({"costs", "latency", "digits", "deploy"} & set(args.peers_parts))),
        Part("peers_imagenet", _imagenet, lambda args, s, r: [
            "### Peers: the released ImageNet-1k checkpoints", "", pi.imagenet_markdown(r.rows), ""],
             plot=lambda args, s, r, path: pi.plot_imagenet(r.rows, path, "the peers' released ImageNet-1k "
                                                            "checkpoints: the authors' top-1 against the cost of the "
                                                            "model built here"),
             figure="peers imagenet", only="peers", when=lambda args: "imagenet" in args.peers_parts),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn bench paper``."""
    args = _resolve(build_parser().parse_args(argv))
    threads = set_threads(args.threads)
    meta = {**machine_info(args.device, threads), "allocator": keep_freed_memory(), "quick": args.quick,
            "command": "simattn bench paper " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(f"simattn bench paper on {args.device}, {threads} CPU threads" + (" (quick)" if args.quick else ""),
          flush=True)
    cpu, threads_said = meta.get('cpu_name') or meta['cpu'], f"{threads} thread{'' if threads == 1 else 's'}"
    setting = Setting(Path(args.output), meta, threads, f"{cpu}, {threads_said}")
    sections = ["# SimA and SOFT paper results on this machine", "",
                f"{meta['device']} ({cpu}), {threads_said}, torch {meta['torch']}. Command: `{meta['command']}`", ""]
    if args.overwrite:
        # the earlier results go whole (run folders under digits/ and peers_*/ too, which a run of other kinds or
        # seeds would leave beside the new ones): moved aside, and put back if this command stops half-way
        claim_run_folder(setting.out, overwrite=True, replaced=paper_files(), clean=False, lock=False)
    try:
        failed = _run_parts(args, setting, sections)
    except BaseException:
        settle_replaced(False)
        raise
    # every result is written: a failed part is a finding in them, not a half-done run, so the replaced files go
    settle_replaced(True)
    if failed:  # the whole list is in paper.md
        from ..commands import MAX_MESSAGE, bounded
        print(bounded(f"simattn bench paper: failed: {'; '.join(failed)}", MAX_MESSAGE), file=sys.stderr)
    return 1 if failed else 0


def _run_parts(args: argparse.Namespace, setting: Setting, sections: List[str]) -> List[str]:
    """Run the parts in ``args.only``, write their files and ``paper.md`` (``sections`` first); return what failed.
    """
    failed: List[str] = []
    for part in _paper_parts():
        if (part.only or part.name) not in args.only or not part.when(args):
            continue
        result = part.run(args, setting)
        plot = None if part.plot is None else (lambda path, part=part: part.plot(args, setting, result, path))
        drawn = write_result_files(setting.out / f"{part.name}.json", setting.meta, result.rows, result.notes,
                                   plot=plot, **result.more)
        sections += part.markdown(args, setting, result)
        sections += [f"![{part.figure}]({part.name}.png)", ""] if plot and (drawn is None or drawn) else []
        failed += result.failed
    if failed:
        sections += ["## Failed", "", *(f"- {f}" for f in failed), ""]
    report = "\n".join(sections)
    atomic_write_text(report, setting.out / "paper.md")
    print(report)
    print(f"wrote {setting.out}/paper.md and its tables and figures")
    return failed


if __name__ == "__main__":
    sys.exit(main())
