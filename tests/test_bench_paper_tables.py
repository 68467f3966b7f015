"""The comparison tables of ``simattn bench paper`` (:mod:`simattn.bench.paper_tables`): exp counts held to the
exported graph and to each kind's complexity class, and each table on tiny models."""
import json
import math
import statistics

import pytest
import torch
from torch import nn

import simattn  # noqa: F401  (registers the models)
from simattn.attention import create_attention, list_attentions
from simattn.bench import paper_tables as pt
from simattn.bench.counters import count_flops

#: every kind the papers compare, and every kind this installation has
KINDS = sorted(set(pt.PAPER_KINDS) | set(list_attentions()))


def _need(kind: str) -> None:
    if kind not in list_attentions():
        pytest.skip(f"attention kind {kind!r} is not registered in this checkout")


def _tiny_deit(kind: str) -> nn.Module:
    """digits_cpu's network, smaller, with a ReLU MLP: its only exp-like ops are the attention's."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("sima_deit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2,
                             num_heads=2, mlp_ratio=2.0, attn_type=kind, act_layer="relu", num_classes=10).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_exp_count_column_equals_the_exported_graph(kind):
    _need(kind)
    model, x = _tiny_deit(kind), torch.randn(2, 3, 16, 16)
    counted = pt.attention_exps(model, x, kind)
    graph = pt.exported_exps(model, x, kind)
    audit = graph.pop("audit")
    assert counted == graph
    # ReLU MLP; the activations of ELU's feature map, FLatten's and PolaFormer's parameter maps, InLine's kernel
    # GELU and sigmoid attention's weights are the kind's own
    assert counted["model_activation"] == 0 or kind in ("elu", "flatten", "inline", "polaformer", "sigmoid")
    # the exp-op audit of the exported graph: exp-like ops exactly where the class says the kind evaluates exp
    assert (audit.exp_count == 0) == (pt.exp_complexity(kind) == "0") == (counted["kind"] == 0)


def _block_exps(kind: str, tokens: int, dim: int, heads: int) -> int:
    """Exp-like evaluations of one block of ``kind`` (default options) on a 8×(tokens/8) grid, batch 1."""
    torch.manual_seed(0)
    block = create_attention(kind, dim, num_heads=heads).eval()
    x = torch.randn(1, tokens, dim)
    kwargs = {"grid_size": (8, tokens // 8)} if getattr(block, "uses_grid", False) else {}
    from simattn.bench.counters import trace_ops
    with torch.inference_mode():
        return trace_ops(lambda: block(x, **kwargs)).exp_total


def _measured_class(kind: str) -> str:
    """The class the counts grow as: tokens ×2 (rN), head dim ×2 (rC), heads ×2 at the same head dim."""
    base = _block_exps(kind, 64, 32, 2)
    if base == 0:
        return "0"
    r_n = _block_exps(kind, 128, 32, 2) / base
    r_c = _block_exps(kind, 64, 64, 2) / base
    if r_n > 3.5:
        return "HN²"
    if r_n < 1.2:
        return "Hd²"
    return "ND" if r_c > 1.5 else "HN"


@pytest.mark.parametrize("kind", KINDS)
def test_complexity_class_is_what_the_counts_grow_as(kind):
    _need(kind)
    assert pt.exp_complexity(kind) in ("0", "HN", "ND", "Hd²", "HN²")
    assert _measured_class(kind) == pt.exp_complexity(kind)


def test_paper_rows_carry_the_papers_classes():
    """Table 2's kinds are in the paper's class, except Linformer's and Nyströmformer's: pooled at a fixed ratio as
    in SOFT's pyramid, their exps grow as N² (the paper's HN assumes a fixed length), and the notes say so."""
    from simattn.attention import get_attention_class

    for row in pt.TABLE2:
        if row.kind in list_attentions():
            pooled = get_attention_class(row.kind).takes_reduction_ratio
            assert (pt.exp_complexity(row.kind) == row.paper["exp"]) == (not pooled or row.paper["exp"] == "HN²"), \
                row.label
            if pooled and row.paper["exp"] != "HN²":
                rec = {"exp_class": pt.exp_complexity(row.kind), "params_m": None, "gmacs": None}
                assert any("fixed ratio" in n for n in pt._row_notes(rec, row)), row.label


def _core_flops(module: nn.Module, x: torch.Tensor, **kwargs) -> int:
    """FLOPs of an attention block's core (its linear projections left out)."""
    wrapper = _Root(module)  # the counter names the attention module under the root it is called through
    with torch.inference_mode():
        return count_flops(lambda: wrapper(x, **kwargs), wrapper).attention


class _Root(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.attn(x, **kwargs)


def test_cosformer_reweighting_takes_four_times_simas_qk_products():
    _need("cosformer")
    torch.manual_seed(0)
    dim, heads, grid = 64, 2, (8, 8)
    x = torch.randn(1, grid[0] * grid[1], dim)
    sima = _core_flops(create_attention("sima", dim, num_heads=heads, backend="torch", order="kv_first"), x)
    reweighted, plain = (create_attention("cosformer", dim, num_heads=heads, reweight=r).eval() for r in (True, False))
    grid_kw = lambda m: {"grid_size": grid} if getattr(m, "uses_grid", False) else {}  # noqa: E731
    assert 3.5 < _core_flops(reweighted, x, **grid_kw(reweighted)) / sima < 4.6
    assert 0.8 < _core_flops(plain, x, **grid_kw(plain)) / sima < 1.3
    from simattn.bench.counters import trace_ops
    with torch.inference_mode():
        assert trace_ops(lambda: reweighted(x, **grid_kw(reweighted))).exp_total == 0


def test_table2_counts_rows_and_explains_gaps_and_missing_kinds():
    tiny = dict(depths=(1, 1, 1, 1), img_size=64, attn_kwargs={"num_iters": 3})
    rows = [pt.PaperModel("SOFT", "soft_tiny", "soft", dict(params_m=5.0, gflops=0.1, exp="HN²"),
                          model_kwargs=tiny, reasons={"params": "a stated reason"}),
            pt.PaperModel("Nowhere", "soft_tiny", "no_such_kind", dict(params_m=13, gflops=1.9, exp="HN"))]
    records, notes = pt.run_table2(rows, img_size=64)
    assert [r["model"] for r in records] == ["SOFT"]
    rec = records[0]
    assert rec["exp_class"] == "HN²" and rec["exp_kind"] > 0 and rec["exp_other_attention"] > 0
    assert rec["gflops_torch"] == pytest.approx(2 * rec["gmacs"])
    assert rec["params_gap_pct"] == pytest.approx((rec["params_m"] / 5.0 - 1) * 100)
    assert any("'no_such_kind' is not registered" in n for n in notes)
    assert any(n.startswith("SOFT: params") and n.endswith("a stated reason") for n in notes)
    text = pt.table2_markdown(records, notes)
    assert "| SOFT | soft_tiny |" in text and "GMACs" in text


def test_table1_throughput_and_memory_estimate(monkeypatch):
    from simattn.bench.model import workers

    real = workers.run_specs
    monkeypatch.setattr(workers, "run_specs", lambda specs, **kw: real(specs, **{**kw, "in_process": True}))
    row = pt.PaperModel("SOFT", "soft_tiny", "soft", pt.TABLE1[-1].paper, model_kwargs={"depths": (1, 1, 1, 1)})
    records, _ = pt.run_table1([row], batch=4, threads=1, repeats=1, warmup=0, img_size=128)
    rec = records[0]
    assert rec["error"] is None and rec["infer_ips"] > 0 and rec["train_ips"] > 0
    # activations grow with the batch: a positive per-image memory, extended linearly to 1024 images
    assert rec["train_mb_per_image"] > 0
    assert rec["est_memory_gb_1024"] * 1024 == pytest.approx(rec["peak_train_mb"] + 1020 * rec["train_mb_per_image"])
    assert rec["paper_memory_gb"] == 15.8


def test_figure1b_memory_grows_quadratically_for_softmax_only(tmp_path):
    records, notes = pt.run_figure1b(["softmax", "sima", "no_such_kind"], [1, 2], dim=24, depth=1, num_heads=2,
                                     repeats=1)
    mem = {(r["kind"], r["p"]): r["train_peak_mb"] for r in records}
    assert mem[("softmax", 2)] / mem[("softmax", 1)] > 3.0  # N×N weights dominate
    assert 1.5 < mem[("sima", 2)] / mem[("sima", 1)] < 2.5
    assert notes == ["no_such_kind not run: attention kind 'no_such_kind' is not registered here"]
    pt.plot_figure1b(records, tmp_path / "f.png", "tiny")
    assert (tmp_path / "f.png").stat().st_size > 0
    assert "softmax: memory" in pt.figure1b_markdown(records, notes)
    skipped, _ = pt.run_figure1b(["softmax"], [2], dim=24, depth=1, num_heads=2, repeats=1, memory_cap_gb=1e-3)
    assert skipped[0]["skipped"].startswith("needs > ") and "train_peak_mb" not in skipped[0]


def test_figure1b_grids_hold_784p_tokens_and_pool_to_at_most_49_landmarks():
    from simattn.models.soft_vit import landmark_ratios

    for p in range(1, 9):
        h, w = pt.figure1b_grid(p)
        ratio = landmark_ratios([(h, w)], 49)[0]
        assert h * w == 784 * p and h <= w
        assert math.ceil(h / ratio) * math.ceil(w / ratio) <= 49


def test_digits_table_trains_each_kind_through_the_engine(tmp_path):
    records, notes = pt.run_digits(["sima", "softmax", "no_such_kind"], [0, 1], tmp_path,
                                   overrides={"epochs": 1, "steps_per_epoch": 1, "threads": 1})
    by = {r["kind"]: r for r in records}
    assert set(by) == {"sima", "softmax"}
    for rec in by.values():
        assert rec["failed"] == 0 and rec["seeds"] == 2
        assert (tmp_path / rec["kind"] / "seed1" / "final.safetensors").is_file()
        # the table's figures are those of the runs' own summaries: mean and sample std over the seeds
        top1 = [json.loads((tmp_path / rec["kind"] / f"seed{s}" / "summary.json").read_text())["final"]["top1"]
                for s in (0, 1)]
        assert rec["top1_mean"] == pytest.approx(statistics.mean(top1))
        assert rec["top1_spread"] == pytest.approx(statistics.stdev(top1))
        assert (rec["top1_min"], rec["top1_max"]) == (min(top1), max(top1))
    assert by["sima"]["paper_imagenet_top1"] == 82.1
    assert any("'no_such_kind' is not registered" in n for n in notes)
    assert "± (std)" in pt.digits_markdown(records, notes, "paper_digits_cpu", [0, 1])


def test_bench_paper_writes_figure1b_with_the_machine(tmp_path):
    from simattn.bench import paper as bench_paper

    out = tmp_path / "paper"
    rc = bench_paper.main(["--only", "figure1b", "--quick", "--figure1b-depth", "1", "--figure1b-p", "1",
                           "--figure1b-kinds", "sima", "linformer", "--threads", "1", "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"paper.md", "figure1b.json", "figure1b.csv", "figure1b.png"}
    report = (out / "paper.md").read_text()
    assert "## SOFT Fig. 1b" in report and "1 thread, torch" in report and "1 threads" not in report
    assert ("linformer not run" in report) == ("linformer" not in list_attentions())


def test_bench_paper_refuses_options_of_parts_it_does_not_run(tmp_path):
    from simattn.bench import paper as bench_paper

    with pytest.raises(ValueError, match="--figure1b-p applies to figure1b, which --only table2 leaves out"):
        bench_paper.main(["--only", "table2", "--figure1b-p", "2", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="'nosuchkind' not allowed"):
        bench_paper.main(["--only", "digits", "--digits-kinds", "nosuchkind", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []
