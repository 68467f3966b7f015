"""``simattn bench paper --only peers``: every registered attention kind side by side, at DeiT-T size and on digits.

The softmax-free attentions published after SimA report DeiT-T (or Swin-T, PVT-T) results with their own code;
here every kind runs in the same network, counted, timed and trained the same way:

* **Costs** (:func:`run_peer_costs`): params, GMACs and exp-like evaluations per image of each kind's DeiT-T at
  224 px, batch 1 (:func:`simattn.bench.paper_tables.measure_row`), beside the paper's DeiT-T figures
  (:data:`PEER_PAPERS`) where the paper has a DeiT-T row. A kind's DeiT-T is its own registered
  ``<kind>_deit_tiny_patch16_224`` where there is one (with that model's settings: Agent-DeiT's agents and biases,
  sigmoid attention's qk-LayerNorm), otherwise DeiT-T's layout with the kind's default options
  (``sima_deit_tiny_patch16_224`` with ``attn_type=<kind>``).
* **Latency** (:func:`run_peer_latency`): forward of the same model at 197 tokens (224 px) and 785 tokens (448 px,
  the position embedding resampled), batch 1, inference mode, on this CPU at the command's thread count.
* **Digits** (:func:`run_peer_digits`): every kind trained by the one training engine
  (:func:`simattn.bench.paper_tables.run_digits`, the ``paper_digits_cpu`` recipe: 20 epochs), seeds 0-2, top-1
  mean ± spread, and the check each new kind is held to: every run finished, no non-finite step (the engine stops
  a run at the first one), a mean top-1 at least :data:`DIGITS_ABOVE_CHANCE` points above chance, softmax's too
  (else nothing is compared: softmax itself did not learn), and within :data:`DIGITS_MARGIN` points of softmax's.
* **Deploy** (:func:`run_peer_deploy`): the first seed's digits weights of each kind through ``simattn export`` as
  each of :data:`DEPLOY_FORMATS` (parity with PyTorch in the file's runtime, the exp-like op audit, the ops left
  outside the format's delegate), and each file scored on the digits val split in its runtime by ``simattn
  validate``: it must give the checkpoint's top-1 (:data:`DEPLOY_TOLERANCE`).

:func:`peers_records` joins the four by kind; :func:`peers_markdown` and :func:`plot_peers` write the table and the
figure (only the panels a part measured: none, no figure). A part left out (no digits run, no timing) leaves its
columns empty. :func:`peers_failures` names what failed (a kind's check, an export, a model that did not build), for
the command's exit code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..attention import list_attentions
from .report import gap_pct, markdown_table, new_figure, progress, save_figure

__all__ = ["PeerPaper", "PEER_PAPERS", "DIGITS_MARGIN", "DIGITS_ABOVE_CHANCE", "PEER_TOKENS", "peer_model",
           "registered_kinds", "peer_notes", "run_peer_costs", "run_peer_latency", "run_peer_digits", "digits_check",
           "DEPLOY_FORMATS", "DEPLOY_TOLERANCE", "run_peer_deploy", "peers_records", "peers_failures",
           "peers_markdown", "plot_peers"]


@dataclass(frozen=True)
class PeerPaper:
    """A paper's DeiT-T row (``params_m``, ``gflops`` as the paper counts them: multiply-adds, ``top1`` on
    ImageNet-1k), or only ``note`` where the paper has none."""

    method: str
    params_m: Optional[float] = None
    gflops: Optional[float] = None
    top1: Optional[float] = None
    note: str = ""


#: the papers' DeiT-T figures (ImageNet-1k, 224 px) of the kinds that have one, as their READMEs state them (Agent's
#: and InLine's FLOPs, like DeiT's, count a multiply-add once: GMACs); DeiT-T itself for softmax
PEER_PAPERS: Dict[str, PeerPaper] = {
    "softmax": PeerPaper("DeiT-T (Touvron et al.)", 5.7, 1.3, 72.2),
    "agent": PeerPaper("Agent-DeiT-T (Han et al., ECCV 2024)", 6.0, 1.2, 74.9),
    "inline": PeerPaper("InLine-DeiT-T (Han et al., NeurIPS 2024)", 6.5, 1.1, 74.5),
    "slab": PeerPaper("SLAB-DeiT-T (Guo et al., ICML 2024)", top1=74.3,
                      note="its README (xinghaochen/SLAB) gives DeiT-T's top-1 only, no params or FLOPs"),
    "flatten": PeerPaper("FLatten (Han et al., ICCV 2023)", note="no DeiT-T row (Swin-T 82.1, PVT-T 77.8)"),
    "polaformer": PeerPaper("PolaFormer (Meng et al., ICLR 2025)", note="no DeiT-T row (Swin-T 82.6, PVT-T 78.8)"),
    "sigmoid": PeerPaper("Sigmoid attention (Ramapuram et al., ICLR 2025)",
                         note="no DeiT-T row (ViT-B/16, reported to match softmax)"),
}
#: a kind passes the digits check within this many points of softmax's mean top-1
DIGITS_MARGIN = 10.0
#: ... and with a mean top-1 at least this many points above chance (100 / classes: 50 % on digits' 10 classes), and
#: softmax too, else "within the margin" compares noise. The full recipe (20 epochs) puts each of the twelve kinds
#: of README's digits table at 87.7 % or more, while short runs stay near chance (measured on softmax, Agent and
#: InLine, 2 seeds: 10-15 % after --quick's 2 updates, 16-22 % after 1 epoch, 28-36 % after 3): 50 % lies between,
#: and under softmax's mean minus the margin in any full run, so a kind that trains as the recipe intends never
#: trips it
DIGITS_ABOVE_CHANCE = 40.0
#: the latency points: tokens → image size (16 px patches and a class token)
PEER_TOKENS = {197: 224, 785: 448}
#: the formats each kind's digits weights are exported to and validated in
DEPLOY_FORMATS = ("onnx", "executorch")
#: an exported file passes when its digits top-1 is within this many points of the checkpoint's (less than one image
#: of the 359 in the val split: the same predictions)
DEPLOY_TOLERANCE = 0.2
#: the deploy part's columns (:func:`run_peer_deploy`)
DEPLOY_COLUMNS = ("ckpt_top1", *(f"{name}_{what}" for what in ("top1", "exp_ops", "not_delegated")
                                  for name in DEPLOY_FORMATS), "deploy_matches")


def peer_model(kind: str) -> Tuple[str, Dict[str, Any]]:
    """The DeiT-T model of ``kind``: its own ``<kind>_deit_tiny_patch16_224`` if registered, else DeiT-T's layout
    with the kind (and its default options)."""
    from ..models import list_models

    own = f"{kind}_deit_tiny_patch16_224"
    if own in list_models():
        return own, {}
    return "sima_deit_tiny_patch16_224", {"attn_type": kind}


def _paper_row(kind: str):
    from .paper_tables import PaperModel

    model, kwargs = peer_model(kind)
    paper = PEER_PAPERS.get(kind)
    figures = {} if paper is None else {"params_m": paper.params_m, "gflops": paper.gflops, "top1": paper.top1}
    return PaperModel(paper.method if paper else kind, model, kind, figures, model_kwargs=kwargs)


def run_peer_costs(kinds: Sequence[str]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Params, GMACs and exp counts per image of each kind's DeiT-T at 224 px; a kind whose model fails to build
    or run gets its error instead."""
    from .paper_tables import measure_row

    records = []
    for kind in progress(list(kinds), "peers: costs", str):
        try:
            rec = measure_row(_paper_row(kind))
        except (RuntimeError, ValueError) as e:
            records.append({"kind": kind, "error": str(e).splitlines()[0]})
            continue
        rec["kind"] = kind
        records.append(rec)
    return records, peer_notes(kinds)


def peer_notes(kinds: Sequence[str]) -> List[str]:
    """What the paper column lacks for ``kinds``, and why."""
    return [f"{kind}: {paper.method}: {paper.note}." for kind, paper in PEER_PAPERS.items()
            if paper.note and kind in kinds]


def run_peer_latency(kinds: Sequence[str], *, repeats: int = 5, warmup: int = 1) -> List[Dict[str, Any]]:
    """Forward latency (median ms) of each kind's DeiT-T at each of :data:`PEER_TOKENS`, batch 1."""
    from ..models.factory import create_model
    from ..utils.timing import time_fn

    records = []
    for kind in progress(list(kinds), "peers: latency", str):
        model_name, kwargs = peer_model(kind)
        rec: Dict[str, Any] = {"kind": kind}
        try:
            torch.manual_seed(0)
            model = create_model(model_name, **kwargs).eval()
            for tokens, size in PEER_TOKENS.items():
                x = torch.randn(1, 3, size, size)
                with torch.inference_mode():
                    rec[f"latency_{tokens}_ms"] = time_fn(lambda: model(x), warmup=warmup, repeats=repeats)["median_ms"]
        except (RuntimeError, ValueError) as e:
            rec["latency_error"] = str(e).splitlines()[0]
        records.append(rec)
    return records


def run_peer_digits(kinds: Sequence[str], seeds: Sequence[int], out: Path, recipe: str = "paper_digits_cpu",
                    overrides: Optional[Mapping[str, Any]] = None) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Train every kind on digits (:func:`simattn.bench.paper_tables.run_digits`) and add the check
    (:func:`digits_check`; it needs softmax among ``kinds``)."""
    from .paper_tables import run_digits

    records, notes = run_digits(kinds, seeds, out, recipe, overrides)
    return digits_check(records), notes


def digits_check(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Each digits record with ``nonfinite_steps`` (skipped updates, plus runs stopped by a non-finite loss),
    ``gap_to_softmax`` (points), ``floor`` (chance + :data:`DIGITS_ABOVE_CHANCE`, from the runs' class count),
    ``passes`` and ``check`` (why it fails, None when it passes)."""
    classes = next((r["num_classes"] for rec in records for r in rec.get("runs", []) if r.get("num_classes")), None)
    floor = None if classes is None else 100.0 / classes + DIGITS_ABOVE_CHANCE
    softmax = next((r.get("top1_mean") for r in records if r["kind"] == "softmax"), None)
    softmax_learned = softmax is not None and floor is not None and softmax >= floor
    checked = []
    for rec in records:
        runs = rec.get("runs", [])
        nonfinite = sum(r.get("nonfinite_skipped", 0) for r in runs) + \
            sum("non-finite" in r.get("error", "") for r in runs)
        mean = rec.get("top1_mean")
        gap = None if mean is None or softmax is None else mean - softmax
        why = []
        if not runs or rec.get("failed"):
            why.append(f"{rec.get('failed') or 0} of {len(runs)} runs stopped")
        if nonfinite:
            why.append(f"{nonfinite} non-finite steps")
        if mean is not None and floor is not None and mean < floor:
            # softmax's own row says it did not learn; the others say they are compared with nothing
            why.append(f"top-1 {mean:.1f} % is under {floor:g} % (chance + {DIGITS_ABOVE_CHANCE:g})"
                       + (": softmax itself did not learn" if rec["kind"] == "softmax" else ""))
        if softmax is None:
            why.append("no softmax run to compare with")
        elif not softmax_learned and rec["kind"] != "softmax":
            why.append("softmax itself did not learn")
        elif gap is not None and gap < -DIGITS_MARGIN:
            why.append(f"{-gap:.1f} points below softmax")
        checked.append({**rec, "nonfinite_steps": nonfinite, "gap_to_softmax": gap, "floor": floor,
                        "passes": not why, "check": "; ".join(why) or None})
    return checked


def run_peer_deploy(kinds: Sequence[str], runs: Path, seed: int, out: Path,
                    formats: Sequence[str] = DEPLOY_FORMATS,
                    export_options: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Export each kind's digits weights (``runs/<kind>/seed<seed>/final.safetensors``) with ``simattn export``
    into ``out/<kind>/`` as each of ``formats`` and validate every file on digits beside the checkpoint: per kind
    ``ckpt_top1``, ``<format>_top1``, ``<format>_exp_ops`` (exp-like ops in the written graph),
    ``<format>_not_delegated`` (ops its delegate does not run: ExecuTorch's left to portable kernels beside
    XNNPACK) and ``deploy_matches`` (every file within :data:`DEPLOY_TOLERANCE` of the checkpoint). A kind without
    weights, or whose export fails, gets ``deploy_error``. ``export_options`` are passed to every export (e.g. ``--exporter torchscript``)."""
    import contextlib
    import io
    import json

    from .. import deploy
    from ..export.cli import main as export_main
    from ..validate import validate_weights

    records = []
    for kind in progress(list(kinds), "peers: deploy", str):
        weights = Path(runs) / kind / f"seed{seed}" / "final.safetensors"
        rec: Dict[str, Any] = {"kind": kind}
        records.append(rec)
        if not weights.is_file():
            rec["deploy_error"] = f"no digits weights at {weights}"
            continue
        rec["ckpt_top1"] = validate_weights(weights, device="cpu")["top1"]
        folder = Path(out) / kind
        folder.mkdir(parents=True, exist_ok=True)
        for name in formats:
            path = folder / f"model{deploy.get(name).suffixes[0]}"
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                code = export_main(["--weights", str(weights), "--format", name, "-o", str(path), "--overwrite",
                                    *export_options])
            if code != 0 or not path.exists():
                last = [line for line in printed.getvalue().splitlines() if line.strip()][-1:]
                rec["deploy_error"] = f"{name} export failed: {last[0] if last else f'exit code {code}'}"
                break
            report = json.loads(path.with_name(path.name + ".json").read_text())
            rec[f"{name}_exp_ops"] = report["audit"]["exp_like_count"]
            rec[f"{name}_not_delegated"] = sum(report["delegation"]["not_delegated"].values())
            rec[f"{name}_top1"] = validate_weights(path, threads=1)["top1"]
        scored = [rec.get(f"{name}_top1") for name in formats]
        rec["deploy_matches"] = "deploy_error" not in rec and all(
            abs(top1 - rec["ckpt_top1"]) <= DEPLOY_TOLERANCE for top1 in scored)
    return records


def peers_records(kinds: Sequence[str], costs: Sequence[Mapping[str, Any]] = (),
                  latency: Sequence[Mapping[str, Any]] = (),
                  digits: Sequence[Mapping[str, Any]] = (),
                  deployed: Sequence[Mapping[str, Any]] = ()) -> List[Dict[str, Any]]:
    """One row per kind: what each part measured (parts not run leave their columns out) and the paper's DeiT-T
    figures."""
    by_kind = {}
    for part in (costs, latency, digits, deployed):
        for rec in part:
            by_kind.setdefault(rec["kind"], {}).update(rec)
    rows = []
    for kind in kinds:
        got = by_kind.get(kind, {})
        paper = PEER_PAPERS.get(kind, PeerPaper(""))
        model, _ = peer_model(kind)
        row = {"kind": kind, "model": model, "exp_class": got.get("exp_class"),
               "params_m": got.get("params_m"), "paper_params_m": paper.params_m,
               "params_gap_pct": gap_pct(got.get("params_m"), paper.params_m), "gmacs": got.get("gmacs"),
               "paper_gflops": paper.gflops, "gmacs_gap_pct": gap_pct(got.get("gmacs"), paper.gflops),
               "exp_kind": got.get("exp_kind"), "exp_other": got.get("exp_other_attention"),
               "paper_top1": paper.top1}
        row.update({f"latency_{t}_ms": got.get(f"latency_{t}_ms") for t in PEER_TOKENS})
        for key in ("top1_mean", "top1_spread", "seeds", "nonfinite_steps", "gap_to_softmax", "floor", "passes",
                    "check", *DEPLOY_COLUMNS):
            row[key] = got.get(key)
        errors = [got[k] for k in ("error", "latency_error", "deploy_error") if got.get(k)]
        row["error"] = "; ".join(errors) or None
        rows.append(row)
    return rows


def peers_failures(costs: Sequence[Mapping[str, Any]] = (), latency: Sequence[Mapping[str, Any]] = (),
                   digits: Sequence[Mapping[str, Any]] = (),
                   deployed: Sequence[Mapping[str, Any]] = ()) -> List[str]:
    """One entry per part that failed somewhere (``peers digits: agent (why), ...``): a model that did not build or
    run, a kind that failed the digits check (:func:`digits_check`), an export that failed or a file that does not
    score as its checkpoint. Empty when every part passed."""
    def part(name: str, failed: List[Tuple[str, str]]) -> List[str]:
        kinds: Dict[str, List[str]] = {}  # a reason shared by several kinds (a missing exporter) is named once
        for kind, why in failed:
            kinds.setdefault(why, []).append(kind)
        return [f"peers {name}: " + ", ".join(f"{', '.join(k)} ({why})" for why, k in kinds.items())] if failed else []

    softmax = next((r for r in digits if r["kind"] == "softmax"), None)
    if softmax is not None and (softmax.get("top1_mean") is None or softmax.get("floor") is None
                                or softmax["top1_mean"] < softmax["floor"]):
        # no kind can be compared with it: one reason, not the same one per kind
        checked = [("every kind", f"softmax: {softmax['check']}; no kind is compared with it")]
    else:
        checked = [(r["kind"], r["check"]) for r in digits if not r.get("passes")]
    return (part("costs", [(r["kind"], r["error"]) for r in costs if r.get("error")])
            + part("latency", [(r["kind"], r["latency_error"]) for r in latency if r.get("latency_error")])
            + part("digits", checked)
            + part("deploy", [(r["kind"], _deploy_failure(r)) for r in deployed if not r.get("deploy_matches")]))


def _deploy_failure(rec: Mapping[str, Any]) -> str:
    if rec.get("deploy_error"):
        return rec["deploy_error"]
    scored = ", ".join(f"{name} {rec[f'{name}_top1']:.2f}" for name in DEPLOY_FORMATS
                       if rec.get(f"{name}_top1") is not None)
    return f"top-1 {scored} vs the checkpoint's {rec['ckpt_top1']:.2f}"


def peers_markdown(rows: Sequence[Mapping[str, Any]], notes: Sequence[str], recipe: str,
                   seeds: Sequence[int]) -> str:
    cols = ["kind", "model", "exp_class", "params_m", "paper_params_m", "params_gap_pct", "gmacs", "paper_gflops",
            "gmacs_gap_pct", "exp_kind", "paper_top1"] + [f"latency_{t}_ms" for t in PEER_TOKENS] + \
           ["top1_mean", "top1_spread", "gap_to_softmax", "nonfinite_steps", "check", *DEPLOY_COLUMNS, "error"]
    heads = ["kind", "DeiT-T model", "exp class", "params (M)", "paper (M)", "gap %", "GMACs", "paper FLOPs (G)",
             "gap %", "exp / image", "paper DeiT-T top-1"] + [f"CPU ms, {t} tokens" for t in PEER_TOKENS] + \
            ["digits top-1 mean", "± (std)", "vs softmax", "non-finite steps",
             f"check: above chance + {DIGITS_ABOVE_CHANCE:g} (softmax too), within {DIGITS_MARGIN:g} of softmax, "
             "no non-finite step", "first seed's top-1",
             *(f"{head}, {name}" for head in ("top-1", "exp-like ops", "ops outside its delegate")
               for name in DEPLOY_FORMATS), "exported files score as the checkpoint", "error"]
    shown = [{**row, "check": None if row.get("passes") is None else "pass" if row["passes"] else
              f"FAIL: {row['check']}"} for row in rows]
    text = (f"Params, GMACs (multiply-adds, the papers' FLOPs) and exp-like evaluations per image (inside the "
            f"kind's attention) of each kind's DeiT-T at 224 px, batch 1; CPU forward latency p50 at batch 1 "
            f"(197 tokens: 224 px, 785: 448 px); digits: recipe `{recipe}`, seeds {', '.join(map(str, seeds))}, "
            f"top-1 at the last epoch, every kind through the same training engine; the first seed's weights exported "
            f"by `simattn export` and each file scored on the digits val split in its runtime by `simattn validate`. "
            f"The paper column is each paper's DeiT-T on ImageNet-1k where it has one.")
    return "\n".join([markdown_table(shown, cols, heads), "", text, ""] + [f"- {n}" for n in notes])


def plot_peers(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> List[str]:
    """The panels the rows have data for, side by side: ``digits`` (top-1 per kind, mean ± std, red where the check
    fails; softmax's mean, the margin below it and the floor above chance as lines) and ``latency`` (CPU latency per
    kind at each token count, log scale). Returns the panels drawn; none (costs only): no figure is written."""
    has = {"digits": any(r.get("top1_mean") is not None for r in rows),
           "latency": any(r.get(f"latency_{t}_ms") for r in rows for t in PEER_TOKENS)}
    panels = [name for name, drawn in has.items() if drawn]
    if not panels:
        return []
    import numpy as np

    fig, axes = new_figure(len(panels), size=6.5)
    kinds = [r["kind"] for r in rows]
    xs = np.arange(len(kinds))
    for ax, panel in zip(axes, panels):
        (_digits_panel if panel == "digits" else _latency_panel)(ax, rows, xs)
        ax.set_xticks(xs, kinds, rotation=45, ha="right", fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return panels


def _digits_panel(ax, rows: Sequence[Mapping[str, Any]], xs) -> None:
    import numpy as np

    means = [r["top1_mean"] if r.get("top1_mean") is not None else np.nan for r in rows]
    spreads = [r.get("top1_spread") or 0.0 for r in rows]
    colors = ["tab:green" if r.get("passes") else "tab:red" if r.get("passes") is False else "tab:gray"
              for r in rows]
    ax.bar(xs, means, yerr=spreads, color=colors, capsize=3)
    softmax = next((r["top1_mean"] for r in rows if r["kind"] == "softmax" and r.get("top1_mean") is not None), None)
    if softmax is not None:
        ax.axhline(softmax, color="k", linewidth=0.8, label="softmax")
        ax.axhline(softmax - DIGITS_MARGIN, color="k", linestyle="--", linewidth=0.8,
                   label=f"softmax − {DIGITS_MARGIN:g}")
    floor = next((r["floor"] for r in rows if r.get("floor") is not None), None)
    if floor is not None:
        ax.axhline(floor, color="tab:red", linestyle=":", linewidth=0.8,
                   label=f"chance + {DIGITS_ABOVE_CHANCE:g}: the floor")
    if ax.lines:
        ax.legend(fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("digits top-1 (%), mean ± std over seeds")
    ax.set_title("digits (green: passes the check, red: fails it)", fontsize=9)


def _latency_panel(ax, rows: Sequence[Mapping[str, Any]], xs) -> None:
    import numpy as np

    width = 0.8 / len(PEER_TOKENS)
    for j, tokens in enumerate(PEER_TOKENS):
        values = [r.get(f"latency_{tokens}_ms") or np.nan for r in rows]
        ax.bar(xs + (j - (len(PEER_TOKENS) - 1) / 2) * width, values, width, label=f"{tokens} tokens")
    ax.set_yscale("log")
    ax.set_ylabel("DeiT-T forward p50 (ms), batch 1")
    ax.legend(fontsize=7)
    ax.set_title("CPU latency", fontsize=9)


def registered_kinds(kinds: Optional[Sequence[str]] = None) -> Tuple[List[str], List[str]]:
    """``kinds`` (default every registered one) that are registered, softmax first (every check compares with it),
    and a note per one that is not."""
    known = list_attentions()
    asked = list(dict.fromkeys(["softmax", *(kinds or known)]))
    return [k for k in asked if k in known], [f"{k} not run: attention kind {k!r} is not registered here"
                                              for k in asked if k not in known]
