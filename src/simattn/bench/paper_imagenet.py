"""``simattn bench paper --only peers --peers-parts imagenet``: the peers' released ImageNet-1k checkpoints, one row per
timm tag (DeiT, PVT and Swin families), the authors' top-1 beside the params and GMACs of the model built here and the
figures the authors' READMEs give.

* The authors' top-1 and the input size come from the tag's ``pretrained_cfg`` (its ``notes`` and ``input_size``),
  where the tags keep them; the READMEs' params and FLOPs (:data:`README_FIGURES`) where a README gives them.
* Params are counted on the meta device (no weights made); GMACs (multiply-adds, the READMEs' FLOPs) of one forward
  at the tag's input size, batch 1, by :func:`simattn.bench.counters.count_flops`. No weights are downloaded: the
  figures are the architecture's, which a tag's checkpoint fills.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..models.released import tag_top1
from .report import gap_pct, markdown_table, new_figure, progress, save_figure

__all__ = ["README_FIGURES", "released_tags", "tag_top1", "run_imagenet_rows", "imagenet_markdown", "tag_kind",
           "plot_imagenet"]

#: the READMEs' (params M, FLOPs G) of each tag where its README gives them (FLOPs None: params only); FLatten's,
#: PolaFormer's and SLAB's READMEs give top-1 only
README_FIGURES: Dict[str, Tuple[float, Optional[float]]] = {
    "agent_deit_tiny_patch16_224.in1k": (6.0, 1.2), "agent_deit_small_patch16_224.in1k": (22.7, 4.4),
    "inline_deit_tiny_patch16_224.in1k": (6.5, 1.1), "inline_deit_small_patch16_224.in1k_288": (16.7, 5.0),
    "pvt_tiny.in1k": (13.2, None), "pvt_small.in1k": (24.5, None), "pvt_medium.in1k": (44.2, None),
    "pvt_large.in1k": (61.4, None),
    "agent_pvt_tiny.in1k": (11.6, 2.0), "agent_pvt_small.in1k": (20.6, 4.0), "agent_pvt_medium.in1k": (35.9, 7.0),
    "agent_pvt_medium.in1k_256": (36.1, 9.2), "agent_pvt_large.in1k": (48.7, 10.4),
    "inline_pvt_tiny.in1k": (12.0, 2.0), "inline_pvt_small.in1k": (21.6, 3.9), "inline_pvt_medium.in1k": (37.6, 6.9),
    "inline_pvt_large.in1k": (50.2, 10.2),
    "agent_swin_tiny_patch4_window7_224.in1k": (29.0, 4.5), "agent_swin_small_patch4_window7_224.in1k": (50.0, 8.7),
    "agent_swin_base_patch4_window7_224.in1k": (88.0, 15.4),
    "agent_swin_small_patch4_window7_224.in1k_288": (50.0, 14.6),
    "agent_swin_base_patch4_window7_224.in1k_384": (88.0, 46.3),
    "inline_swin_tiny_patch4_window7_224.in1k": (30.0, 4.5), "inline_swin_small_patch4_window7_224.in1k": (50.0, 8.7),
    "inline_swin_base_patch4_window7_224.in1k": (88.0, 15.4),
}
def released_tags() -> List[str]:
    """Every tag with weights of a model registered here, sorted."""
    import timm

    from .. import models

    ours = set(models.list_models())
    return sorted(tag for tag in timm.list_pretrained() if tag.split(".")[0] in ours)


def _gap(ours: Optional[float], readme: Optional[float]) -> Optional[float]:
    gap = gap_pct(ours, readme)
    return None if gap is None else round(gap, 2)


def imagenet_row(tag: str, params: bool = True, gmacs: bool = True) -> Dict[str, Any]:
    """One tag's row: the authors' top-1 and input size, the README's figures, and the model built here: its params
    (``params``: counted on the meta device) and GMACs (``gmacs``: one forward, batch 1)."""
    import timm

    from ..models.factory import create_model
    from .counters import count_flops

    cfg = timm.models.get_pretrained_cfg(tag).to_dict()
    size = cfg["input_size"][-1]
    readme_params, readme_flops = README_FIGURES.get(tag, (None, None))
    row: Dict[str, Any] = {"tag": tag, "paper": cfg.get("paper_name"), "input_px": size, "top1": tag_top1(cfg),
                           "params_m": None, "readme_params_m": readme_params, "params_gap_pct": None,
                           "gmacs": None, "readme_gflops": readme_flops, "gmacs_gap_pct": None,
                           "weights": cfg.get("url") or f"hf-hub:{cfg.get('hf_hub_id')}/{cfg.get('hf_hub_filename')}"}
    if params:
        with torch.device("meta"):  # shapes only
            count = sum(p.numel() for p in create_model(tag).parameters()) / 1e6
        row.update(params_m=round(count, 3), params_gap_pct=_gap(count, readme_params))
    if gmacs:
        torch.manual_seed(0)
        model = create_model(tag).eval()
        x = torch.randn(1, 3, size, size)
        with torch.inference_mode():
            row["gmacs"] = round(count_flops(lambda: model(x)).total / 2e9, 3)
        row["gmacs_gap_pct"] = _gap(row["gmacs"], readme_flops)
    return row


def run_imagenet_rows(tags: Optional[Sequence[str]] = None, params: bool = True,
                      gmacs: bool = True) -> List[Dict[str, Any]]:
    """A row per tag (default every released tag); a tag whose model fails to build is a row with its error."""
    rows = []
    tags = list(tags) if tags is not None else released_tags()
    for tag in progress(tags, "peers imagenet"):
        try:
            rows.append(imagenet_row(tag, params, gmacs))
        except Exception as exc:  # a row per tag whatever happens: the others still count
            rows.append({"tag": tag, "error": f"{type(exc).__name__}: {exc}"})
    return rows


IMAGENET_COLUMNS = ["tag", "input_px", "top1", "params_m", "readme_params_m", "params_gap_pct", "gmacs",
                    "readme_gflops", "gmacs_gap_pct", "error"]


def imagenet_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    heads = ["tag", "px", "authors' top-1", "params (M)", "README (M)", "gap %", "GMACs", "README FLOPs (G)", "gap %",
             "error"]
    text = ("The peers' released ImageNet-1k checkpoints as timm tags: the authors' top-1 (from the tag), params and "
            "GMACs (multiply-adds, the READMEs' FLOPs; batch 1 at the tag's input size) of the model built here, "
            "and the README's figures where it gives them.")
    return "\n".join([markdown_table(list(rows), IMAGENET_COLUMNS, heads), "", text, ""])


def tag_kind(tag: str) -> str:
    """The attention a tag's model is made for, from its name's first word (``pvt`` and ``pvt_*_prepbn``: PVT's
    softmax; ``prepbn_deit``: softmax DeiT with SLAB's norm)."""
    first = tag.split("_", 1)[0]
    return {"pvt": "softmax", "prepbn": "softmax"}.get(first, first)


def plot_imagenet(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> bool:
    """The authors' top-1 against GMACs and against params, one point per tag with a top-1, coloured by the kind
    its model is made for (:func:`tag_kind`); False (no figure) where no row has both figures."""
    points = [r for r in rows if r.get("top1") is not None and not r.get("error")]
    if not any(r.get("gmacs") is not None or r.get("params_m") is not None for r in points):
        return False
    import matplotlib

    fig, axes = new_figure(2, size=5.5)
    kinds = sorted({tag_kind(r["tag"]) for r in points})
    colors = {k: matplotlib.colormaps["tab10"](i % 10) for i, k in enumerate(kinds)}
    for ax, key, label in ((axes[0], "gmacs", "GMACs per image (the tag's input size)"),
                           (axes[1], "params_m", "params (M)")):
        for kind in kinds:
            mine = [r for r in points if tag_kind(r["tag"]) == kind and r.get(key) is not None]
            ax.scatter([r[key] for r in mine], [r["top1"] for r in mine], color=colors[kind], label=kind, s=22)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("authors' ImageNet-1k top-1 (%)")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].legend(fontsize=7, title="attention", title_fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return True
