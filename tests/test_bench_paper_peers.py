"""``bench paper --only peers``'s assembly from stand-in measurements: the digits check (non-finite steps, the floor
above chance, the margin to softmax), the rows joined by kind beside the papers' DeiT-T figures, the Markdown, the
plot, the options, and the command's exit code and --overwrite with its training and export stubbed. (The
measurements themselves are paper_tables' functions, tested in test_bench_paper_tables.py.)"""
import json
from pathlib import Path

import pytest

import simattn  # noqa: F401  (registers the models)
from simattn.bench import paper_peers as pp

from fitted_heads import fit_head


def _digits(kind, top1, **run):
    runs = [{"seed": s, "top1": t, "nonfinite_skipped": 0, "num_classes": 10, **run} for s, t in enumerate(top1)]
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
    with pytest.raises(ValueError, match="--peers-parts deploy exports the weights the digits part trains"):
        bench_paper.main(["--only", "peers", "--peers-parts", "costs", "deploy", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="'tflite' not allowed"):
        bench_paper.main(["--only", "peers", "--peers-formats", "tflite", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def _digits_weights(path, kind):
    """A tiny ``kind`` DeiT with its head fitted to the digits train split (:func:`fit_head`: predictions that mean
    something, in a second), saved as a training run saves its final weights."""
    import timm
    import torch

    from simattn.data.digits import digits_tensors
    from simattn.models.weights import save_weights, weights_metadata

    name, kwargs = f"{kind}_deit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=1,
                                                         num_heads=2, num_classes=10)
    torch.manual_seed(0)
    model = timm.create_model(name, **kwargs).eval()
    x, y = digits_tensors("train", img_size=32, normalize=False)
    fit_head(model, (x - 0.5) / 0.5, y)  # the preprocessing the record below states
    path.parent.mkdir(parents=True)
    data = {"input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
            "interpolation": "bilinear"}
    save_weights(model, path, weights_metadata(name, kwargs, producer="test", data_config=data))


def test_deploy_exports_each_kinds_digits_weights_and_scores_them_as_the_checkpoint(tmp_path):
    """SLAB's digits weights through ``simattn export`` (ONNX, the TorchScript exporter: seconds) and ``simattn
    validate``: the file scores the checkpoint's top-1 on digits, and its graph's only exp-like op is GELU's erf; a
    kind without weights gets a one-line error and the others still run."""
    _digits_weights(tmp_path / "runs" / "slab" / "seed1" / "final.safetensors", "slab")
    records = pp.run_peer_deploy(["slab", "inline"], tmp_path / "runs", 1, tmp_path / "deploy", ["onnx"],
                                 ["--exporter", "torchscript"])
    slab, inline = records
    assert slab["ckpt_top1"] > 30, slab  # predictions that mean something
    assert slab["onnx_top1"] == pytest.approx(slab["ckpt_top1"], abs=pp.DEPLOY_TOLERANCE) and slab["deploy_matches"]
    assert (slab["onnx_exp_ops"], slab["onnx_not_delegated"]) == (1, 0) and "deploy_error" not in slab
    assert (tmp_path / "deploy" / "slab" / "model.onnx").is_file()
    assert inline == {"kind": "inline", "deploy_error": f"no digits weights at "
                                                        f"{tmp_path / 'runs' / 'inline' / 'seed1' / 'final.safetensors'}"}
    rows = pp.peers_records(["slab", "inline"], deployed=records)
    assert rows[0]["onnx_top1"] == slab["onnx_top1"] and rows[0]["executorch_top1"] is None
    assert rows[1]["error"].startswith("no digits weights") and rows[1]["deploy_matches"] is None
    assert "top-1, onnx" in pp.peers_markdown(rows, [], "paper_digits_cpu", [1])


def test_deploy_judges_each_file_against_the_checkpoint_and_names_a_failed_export(tmp_path, monkeypatch):
    """Stand-ins for the two commands: a file a point off the checkpoint fails the check; an export that fails
    stops that kind with the command's last line."""
    import json

    import simattn.export.cli as export_cli
    import simattn.validate as validate

    for kind in ("slab", "agent"):
        (tmp_path / "runs" / kind / "seed0").mkdir(parents=True)
        (tmp_path / "runs" / kind / "seed0" / "final.safetensors").write_bytes(b"stand-in")

    def fake_export(argv):
        out = argv[argv.index("-o") + 1]
        if "/agent/" in out:
            print("could not export: boom")
            return 1
        open(out, "wb").close()
        report = {"audit": {"exp_like_count": 0}, "delegation": {"not_delegated": {"mean_dim": 3, "gt_scalar": 1}}}
        with open(out + ".json", "w") as f:
            json.dump(report, f)
        return 0

    top1 = {"final.safetensors": 80.0, "model.onnx": 80.0, "model.pte": 79.7}
    monkeypatch.setattr(export_cli, "main", fake_export)
    monkeypatch.setattr(validate, "validate_weights", lambda path, **kw: {"top1": top1[path.name]})
    slab, agent = pp.run_peer_deploy(["slab", "agent"], tmp_path / "runs", 0, tmp_path / "deploy")
    assert (slab["onnx_top1"], slab["executorch_top1"], slab["executorch_not_delegated"]) == (80.0, 79.7, 4)
    assert slab["deploy_matches"] is False  # 0.3 points: more than one image of 359
    assert agent["deploy_error"] == "onnx export failed: could not export: boom" and not agent["deploy_matches"]


def test_digits_check_fails_a_kind_near_chance_and_everything_when_softmax_did_not_learn():
    """Within the margin of softmax means nothing near chance (10 % on digits): a kind under chance + 40 points
    fails, named, whatever softmax got; softmax under it fails every kind."""
    quick = pp.digits_check([_digits("softmax", [10.0, 14.8]), _digits("agent", [10.3, 10.3])])
    assert not any(r["passes"] for r in quick)
    by = {r["kind"]: r for r in quick}
    assert by["softmax"]["floor"] == pytest.approx(50.0)
    assert "softmax itself did not learn" in by["softmax"]["check"] and "under 50 %" in by["softmax"]["check"]
    assert "softmax itself did not learn" in by["agent"]["check"]
    assert pp.peers_failures(digits=quick) == [
        "peers digits: every kind (softmax: top-1 12.4 % is under 50 % (chance + 40): softmax itself did not learn; "
        "no kind is compared with it)"]
    short = {r["kind"]: r for r in pp.digits_check([_digits("softmax", [58.0]), _digits("agent", [48.5]),
                                                     _digits("inline", [52.0])])}
    assert short["softmax"]["passes"] and short["inline"]["passes"]
    assert not short["agent"]["passes"] and short["agent"]["gap_to_softmax"] == pytest.approx(-9.5)
    assert pp.peers_failures(digits=short.values()) == ["peers digits: agent (top-1 48.5 % is under 50 % (chance "
                                                        "+ 40))"]
    assert "FAIL: top-1 48.5 %" in pp.peers_markdown(pp.peers_records(["softmax", "agent"], digits=short.values()),
                                                     [], "paper_digits_cpu", [0])


def test_plot_draws_only_the_panels_with_data(tmp_path):
    """Costs alone have no panel: no figure; digits alone: one panel (one panel's width), no empty one beside."""
    import matplotlib.image

    costs = [{"kind": "softmax", "params_m": 5.7, "gmacs": 1.26}, {"kind": "agent", "params_m": 6.3, "gmacs": 1.14}]
    assert pp.plot_peers(pp.peers_records(["softmax", "agent"], costs), tmp_path / "costs.png", "costs") == []
    assert not (tmp_path / "costs.png").exists()
    digits = pp.digits_check([_digits("softmax", [92.0]), _digits("agent", [45.0])])
    rows = pp.peers_records(["softmax", "agent"], costs, digits=digits)
    assert pp.plot_peers(rows, tmp_path / "digits.png", "digits") == ["digits"]
    assert matplotlib.image.imread(tmp_path / "digits.png").shape[1] == 6.5 * 120  # one 6.5-inch panel, 120 dpi


def test_every_deit_t_figure_a_readme_states_is_beside_the_measured_one():
    """Agent's and InLine's READMEs give DeiT-T's params, GMACs (their FLOPs count a multiply-add once) and top-1;
    SLAB's gives top-1 only; FLatten, PolaFormer and sigmoid attention have no DeiT-T row."""
    stated = {"agent": (6.0, 1.2, 74.9), "inline": (6.5, 1.1, 74.5), "slab": (None, None, 74.3)}
    assert {k: (p.params_m, p.gflops, p.top1) for k, p in pp.PEER_PAPERS.items() if k in stated} == stated
    rows = pp.peers_records(["inline"], [{"kind": "inline", "params_m": 6.47, "gmacs": 1.105}])
    assert rows[0]["paper_gflops"] == 1.1 and rows[0]["gmacs_gap_pct"] == pytest.approx(0.45, abs=0.01)
    notes = pp.peer_notes(["inline", "slab"])
    assert len(notes) == 1 and "not recorded" not in notes[0] and notes[0].startswith("slab: ")


def _stub_training_and_deploy(monkeypatch, top1, failing_export=()):
    """Digits training that writes stand-in weights and returns ``top1`` per kind, an export that fails for the
    kinds in ``failing_export`` as a missing package does, and a validation that scores every file 90 %."""
    import json

    import simattn.export.cli as export_cli
    import simattn.validate as validate
    from simattn.bench import paper_tables

    def run_digits(kinds, seeds, out, recipe, overrides):
        for kind in kinds:
            (out / kind / "seed0").mkdir(parents=True)
            (out / kind / "seed0" / "final.safetensors").write_bytes(b"stand-in")
        return [_digits(kind, [top1[kind]]) for kind in kinds], []

    def export(argv):
        out = argv[argv.index("-o") + 1]
        if any(f"/{kind}/" in out for kind in failing_export):
            print("error: onnx export needs onnxscript, which is not installed")
            return 2
        Path(out).write_bytes(b"stand-in")
        Path(out + ".json").write_text(json.dumps({"audit": {"exp_like_count": 0},
                                                   "delegation": {"not_delegated": {}}}))
        return 0

    monkeypatch.setattr(paper_tables, "run_digits", run_digits)
    monkeypatch.setattr(export_cli, "main", export)
    monkeypatch.setattr(validate, "validate_weights", lambda path, **kw: {"top1": 90.0})


PEERS = ["bench", "paper", "--only", "peers", "--peers-parts", "digits", "deploy", "--peers-formats", "onnx",
         "--digits-seeds", "0", "--threads", "1"]


def test_a_failed_part_writes_the_table_then_exits_1_naming_it(tmp_path, monkeypatch, capsys):
    from simattn.cli import main as simattn_main

    _stub_training_and_deploy(monkeypatch, {"softmax": 10.0, "agent": 10.3}, failing_export=["agent"])
    out = tmp_path / "paper"
    assert simattn_main([*PEERS, "--peers-kinds", "agent", "--out", str(out)]) == 1
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("simattn bench paper")]
    assert line == ["simattn bench paper: failed: peers digits: every kind (softmax: top-1 10.0 % is under 50 % "
                    "(chance + 40): softmax itself did not learn; no kind is compared with it); peers deploy: agent "
                    "(onnx export failed: error: onnx export needs onnxscript, which is not installed)"]
    rows = {r["kind"]: r for r in json.loads((out / "peers.json").read_text())["rows"]}
    assert rows["agent"]["passes"] is False and rows["softmax"]["deploy_matches"] is True
    assert "## Failed" in (out / "paper.md").read_text() and (out / "peers.csv").is_file()


def test_overwrite_replaces_the_earlier_results_whole(tmp_path, monkeypatch, capsys):
    """An earlier run's folders of kinds this run does not train are gone, so is its figure when this run draws none
    (drawing stubbed: seconds saved), nothing is left aside, and a failed part does not bring the earlier files back;
    a file the command never writes is refused, not removed."""
    from simattn.cli import main as simattn_main

    out = tmp_path / "paper"
    for old in ("peers_digits/inline/seed0/final.safetensors", "peers_deploy/inline/model.onnx", "peers.png",
                "table3.json"):
        (out / old).parent.mkdir(parents=True, exist_ok=True)
        (out / old).write_bytes(b"earlier run")
    _stub_training_and_deploy(monkeypatch, {"softmax": 92.0, "agent": 60.0})
    monkeypatch.setattr(pp, "plot_peers", lambda rows, path, title: [])
    code = simattn_main([*PEERS, "--peers-kinds", "agent", "--out", str(out), "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == ["paper.md", "peers.csv", "peers.json", "peers_deploy",
                                                     "peers_digits"]
    assert code == 1  # agent 32 points below softmax
    assert sorted(p.name for p in (out / "peers_digits").iterdir()) == ["agent", "softmax"]
    assert sorted(p.name for p in (out / "peers_deploy").iterdir()) == ["agent", "softmax"]
    assert json.loads((out / "peers.json").read_text())["failed"] == ["peers digits: agent (32.0 points below "
                                                                      "softmax)"]
    assert "![peers]" not in (out / "paper.md").read_text()
    (out / "notes.txt").write_text("the user's")
    assert simattn_main([*PEERS, "--out", str(out), "--overwrite"]) == 2
    assert "notes.txt, which this command does not write" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "the user's" and (out / "peers_digits" / "agent").is_dir()


def test_imagenet_rows_name_every_released_tag_with_its_authors_top1_beside_the_readme():
    """A row per released tag (DeiT, PVT and Swin: 45) from its pretrained_cfg, no model built; params and GMACs of
    one tag's model (meta device for params, one forward for GMACs) beside its README's figures."""
    import timm

    from simattn.bench import paper_imagenet as pi

    tags = pi.released_tags()
    assert len(tags) == 45 and set(tags) <= set(timm.list_pretrained())
    rows = pi.run_imagenet_rows(params=False, gmacs=False)
    assert [r["tag"] for r in rows] == tags and all(r["top1"] and r["weights"] for r in rows)
    by = {r["tag"]: r for r in rows}
    assert (by["polaformer_pvt_tiny.in1k"]["top1"], by["pvt_large.in1k"]["top1"]) == (78.8, 81.7)
    assert by["agent_pvt_medium.in1k_256"]["input_px"] == 256 and by["agent_pvt_medium.in1k_256"]["top1"] == 83.8
    assert by["inline_deit_small_patch16_224.in1k_288"]["readme_gflops"] == 5.0
    assert by["polaformer_swin_tiny_patch4_window7_224.in1k"]["weights"].startswith("hf-hub:ZachMeng/PolaFormer/")
    row = pi.imagenet_row("agent_pvt_tiny.in1k")
    assert row["params_m"] == 11.57 and row["readme_params_m"] == 11.6 and abs(row["params_gap_pct"]) < 1
    assert row["gmacs"] == pytest.approx(1.986, abs=1e-3) and row["readme_gflops"] == 2.0
    assert abs(row["gmacs_gap_pct"]) < 1
    text = pi.imagenet_markdown(rows + [{"tag": "x.in1k", "error": "boom"}])
    assert "| agent_pvt_tiny.in1k | 224 | 78.4 |" in text and "| x.in1k |" in text and "boom" in text


def test_imagenet_figure_puts_each_tag_by_its_cost_coloured_by_kind(tmp_path, monkeypatch):
    """One point per tag with a top-1 in each panel (top-1 against GMACs, against params), a colour per kind the
    model is made for (PVT and the PRepBN DeiTs: softmax); no figure without costs."""
    import matplotlib.axes

    from simattn.bench import paper_imagenet as pi
    rows = [{"tag": "agent_pvt_tiny.in1k", "top1": 78.4, "gmacs": 2.0, "params_m": 11.6},
            {"tag": "pvt_tiny.in1k", "top1": 75.1, "gmacs": 1.9, "params_m": 13.2},
            {"tag": "prepbn_deit_tiny_patch16_224.in1k", "top1": 73.6, "gmacs": 1.3, "params_m": 5.7},
            {"tag": "x.in1k", "error": "boom"}]
    assert not pi.plot_imagenet([{**r, "gmacs": None, "params_m": None} for r in rows], tmp_path / "no.png", "t")
    drawn = []
    real = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, **kw: drawn.append((kw["label"], list(x), list(y))) or real(self, x, y, **kw))
    assert pi.plot_imagenet(rows, tmp_path / "imagenet.png", "t") and (tmp_path / "imagenet.png").stat().st_size
    assert drawn == [("agent", [2.0], [78.4]), ("softmax", [1.9, 1.3], [75.1, 73.6]),
                     ("agent", [11.6], [78.4]), ("softmax", [13.2, 5.7], [75.1, 73.6])]


def test_the_imagenet_part_writes_its_rows_and_section(tmp_path, monkeypatch):
    from simattn.bench import paper as bench_paper
    from simattn.bench import paper_imagenet as pi

    monkeypatch.setattr(pi, "released_tags", lambda: ["pvt_tiny.in1k"])
    monkeypatch.setattr(pi, "imagenet_row", lambda tag, params, gmacs: {"tag": tag, "top1": 75.1, "gmacs": 1.93})
    assert bench_paper.main(["--only", "peers", "--peers-parts", "imagenet", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "peers_imagenet.json").read_text())["rows"]
    assert rows == [{"tag": "pvt_tiny.in1k", "top1": 75.1, "gmacs": 1.93}]
    assert (tmp_path / "peers_imagenet.csv").read_text().splitlines()[0].startswith("tag,")
    assert "the released ImageNet-1k checkpoints" in (tmp_path / "paper.md").read_text()


def test_the_imagenet_part_alone_writes_its_table_and_figure_and_no_deit_table(tmp_path, monkeypatch, capsys):
    from simattn.bench import paper_imagenet as pi
    from simattn.cli import main as simattn_main
    rows = [{"tag": "agent_pvt_tiny.in1k", "input_px": 224, "top1": 78.4, "gmacs": 2.0, "params_m": 11.6},
            {"tag": "pvt_tiny.in1k", "input_px": 224, "top1": 75.1, "gmacs": 1.9, "params_m": 13.2}]
    monkeypatch.setattr(pi, "run_imagenet_rows", lambda: rows)
    out = tmp_path / "out"
    assert simattn_main(["bench", "paper", "--only", "peers", "--peers-parts", "imagenet", "--threads", "1",
                         "--output", str(out)]) == 0, capsys.readouterr().err
    report = (out / "paper.md").read_text()
    assert "### Peers: the released ImageNet-1k checkpoints" in report and "![peers imagenet](peers_imagenet.png)" \
        in report
    assert "every attention kind at DeiT-T" not in report and not (out / "peers.json").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("peers")) == [
        "peers_imagenet.csv", "peers_imagenet.json", "peers_imagenet.png"]
