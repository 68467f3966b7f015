"""``bench paper --only peers``'s assembly from stand-in measurements: the digits check (non-finite steps, the margin
to softmax), the rows joined by kind beside the papers' DeiT-T figures, the Markdown, the plot and the options.
(The measurements themselves are paper_tables' functions, tested in test_bench_paper_tables.py.)"""
import pytest

import simattn  # noqa: F401  (registers the models)
from simattn.bench import paper_peers as pp


def _digits(kind, top1, **run):
    runs = [{"seed": s, "top1": t, "nonfinite_skipped": 0, **run} for s, t in enumerate(top1)]
    return {"kind": kind, "top1_mean": sum(top1) / len(top1) if top1 else None, "top1_spread": 1.0,
            "seeds": len(runs), "failed": 0, "runs": runs}


def test_digits_check_holds_each_kind_to_softmax_and_to_no_non_finite_step():
    stopped = _digits("sigmoid", [80.0])
    stopped["runs"].append({"seed": 1, "error": "training diverged: the loss is nan at update 3 (1 non-finite so far"})
    stopped["failed"] = 1
    records = [_digits("agent", [85.0, 83.0]), _digits("softmax", [92.0, 92.0]), _digits("inline", [81.0]),
               _digits("slab", [90.0], nonfinite_skipped=2), stopped]
    by = {r["kind"]: r for r in pp.digits_check(records)}
    assert by["agent"]["gap_to_softmax"] == pytest.approx(-8.0) and by["agent"]["passes"]
    assert by["softmax"]["passes"] and by["softmax"]["gap_to_softmax"] == 0
    assert by["inline"]["gap_to_softmax"] == pytest.approx(-11.0) and not by["inline"]["passes"]  # past the margin
    assert by["slab"]["nonfinite_steps"] == 2 and not by["slab"]["passes"]  # skipped updates
    assert by["sigmoid"]["nonfinite_steps"] == 1 and not by["sigmoid"]["passes"]  # a run stopped by one
    # without a softmax run there is nothing to compare with: no kind passes
    assert not any(r["passes"] for r in pp.digits_check(records[:1]))


def test_rows_join_the_parts_by_kind_beside_the_papers_deit_t_figures(tmp_path):
    costs = [{"kind": "agent", "params_m": 6.3, "gmacs": 1.14, "exp_kind": 700, "exp_other_attention": 0,
              "exp_class": "HN"},
             {"kind": "relu", "error": "boom"}]
    latency = [{"kind": "agent", "latency_197_ms": 5.0, "latency_785_ms": 21.0}]
    digits = pp.digits_check([_digits("softmax", [92.0]), _digits("agent", [88.0])])
    rows = pp.peers_records(["softmax", "agent", "relu"], costs, latency, digits)
    by = {r["kind"]: r for r in rows}
    agent = by["agent"]
    assert agent["model"] == "agent_deit_tiny_patch16_224"  # its own DeiT-T
    assert agent["params_gap_pct"] == pytest.approx(5.0) and agent["gmacs_gap_pct"] == pytest.approx(-5.0)
    assert (agent["paper_top1"], agent["latency_785_ms"], agent["passes"]) == (74.9, 21.0, True)
    assert by["relu"]["model"] == "sima_deit_tiny_patch16_224" and by["relu"]["error"] == "boom"
    assert by["relu"]["params_m"] is None and by["relu"]["paper_top1"] is None  # not measured, no DeiT-T row
    assert by["softmax"]["latency_197_ms"] is None and by["softmax"]["top1_mean"] == 92.0
    text = pp.peers_markdown(rows, ["sigmoid: no DeiT-T row."], "paper_digits_cpu", [0, 1, 2])
    assert "CPU ms, 785 tokens" in text and "| agent | agent_deit_tiny_patch16_224 |" in text
    assert "- sigmoid: no DeiT-T row." in text and "seeds 0, 1, 2" in text
    pp.plot_peers(rows, tmp_path / "peers.png", "stand-ins")
    assert (tmp_path / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kinds_put_softmax_first_and_note_unknown_ones():
    kinds, notes = pp.registered_kinds(["agent", "nosuchkind"])
    assert kinds == ["softmax", "agent"] and notes == ["nosuchkind not run: attention kind 'nosuchkind' is not "
                                                       "registered here"]
    assert pp.registered_kinds()[0][0] == "softmax" and "sigmoid" in pp.registered_kinds()[0]


def test_peers_options_are_refused_for_other_parts(tmp_path):
    from simattn.bench import paper as bench_paper

    with pytest.raises(ValueError, match="--peers-epochs applies to peers, which --only digits leaves out"):
        bench_paper.main(["--only", "digits", "--peers-epochs", "2", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="'timing' not allowed"):
        bench_paper.main(["--only", "peers", "--peers-parts", "timing", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []
