"""`simattn demo` end to end in its fast mode: both twins trained, validated, timed, reported."""
from __future__ import annotations

import json
import re

import torch
from PIL import Image

from simattn import cli


def test_demo_fast_mode_writes_report_and_curves(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        code = cli.main(["demo", "--fast", "--epochs", "1", "--output", str(tmp_path / "demo")])
    finally:
        torch.set_num_threads(threads)  # the recipe fixes the thread count
    out = capsys.readouterr().out
    assert code == 0
    demo = tmp_path / "demo"
    report = (demo / "report.md").read_text()
    with Image.open(demo / "curves.png") as png:
        assert png.format == "PNG" and png.size[0] > 300
    result = json.loads((demo / "demo.json").read_text())
    assert set(result["runs"]) == {"SimA", "softmax"}
    for label, run in result["runs"].items():
        # re-validating the saved weights gives the accuracy training reported
        assert abs(run["validated"]["top1"] - run["final"]["top1"]) < 1e-9
        assert set(run["latency"]) == {"32px", "64px"} and all(v["median_ms"] > 0 for v in run["latency"].values())
        assert f"{run['validated']['top1']:.2f}" in report
        assert (demo / ("sima" if label == "SimA" else "softmax") / "final.safetensors").is_file()
    assert result["runs"]["SimA"]["params"] == result["runs"]["softmax"]["params"]  # the same model, other attention
    assert "![training curves](curves.png)" in report
    assert "SimA vs softmax" in out and "latency 64px" in out  # the side-by-side table
    for size in ("32px", "64px"):  # speed-up = softmax time / SimA time, said as such in the table and report
        lat = {label: result["runs"][label]["latency"][size]["median_ms"] for label in ("SimA", "softmax")}
        speedup = result["sima_speedup"][size]
        assert (speedup > 1) == (lat["softmax"] > lat["SimA"])
        assert f"SimA speed-up ×{lat['softmax'] / lat['SimA']:.2f}" in report
    assert not re.search(r"ratio \d", report)


def test_demo_refuses_a_folder_holding_other_files(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "final.safetensors").write_bytes(b"a training run's weights")
    (out / ".demo.json.k1lled.tmp").write_text("{")  # a killed demo's half-written file is the demo's own
    assert cli.main(["demo", "--fast", "--epochs", "1", "--output", str(out)]) == 2
    assert "not an earlier demo's (final.safetensors)" in capsys.readouterr().err
    assert (out / "final.safetensors").read_bytes() == b"a training run's weights"
