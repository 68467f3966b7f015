"""``simattn bench attention``: a tiny sweep end to end; ratios, spread and the table from known timings."""
import json

import pytest
import torch

from simattn.bench import attention as bench


@pytest.mark.parametrize("layout", bench.LAYOUTS)
def test_tiny_sweep_end_to_end(tmp_path, layout, capsys, one_thread):
    out = tmp_path / "bench.json"
    # no --threads: the count in force (what OMP_NUM_THREADS sets) is used, not the machine's core count
    assert bench.main(["--tokens", "16", "65", "--heads", "2", "--head-dim", "8", "--repeats", "3", "--rounds", "2",
                       "--layout", layout, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["layout"] == layout and data["meta"]["threads"] == 1
    rows = data["rows"]
    assert {r["kind"] for r in rows} == set(bench.timed_kinds("cpu")) and data["notes"]
    assert {(r["tokens"], r["batch"]) for r in rows} == {(16, 1), (65, 1)}
    for r in rows:
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["layout"] == layout
    captured = capsys.readouterr()
    assert "sima_official" in captured.out and "round 2/2" in captured.err
    assert "p10" in captured.out and "x floor" in captured.out and " µs " in captured.out
    assert not any(word in captured.out for word in ("PASS", "MISS", "target"))


def test_bad_counts_are_rejected():
    with pytest.raises(ValueError, match=r"option '--rounds': got 0; allowed: an integer >= 1"):
        bench.main(["--rounds", "0"])
    with pytest.raises(ValueError, match=r"option '--threads': got 0"):
        bench.main(["--threads", "0"])


def _row(kind, n, ms, p10=None, p90=None):
    return {"kind": kind, "tokens": n, "batch": 1, "median_ms": ms, "p10_ms": p10 or ms, "p90_ms": p90 or ms,
            "spread": ((p90 or ms) - (p10 or ms)) / ms}


def test_ratios_and_printed_table_from_known_timings():
    rows = bench.add_ratios([_row("softmax", 197, 10.0), _row("sima_official", 197, 4.0),
                             _row("sima_matmuls", 197, 0.5), _row("sima", 197, 2.0, 1.9, 2.1),
                             _row("elu", 64, 3.0)])
    sima = rows[3]
    # by hand: 10 / 2 = 5, 4 / 2 = 2, 2 / 0.5 = 4
    assert sima["speedup_vs_sdpa"] == 5.0 and sima["speedup_vs_official_sima"] == 2.0 and sima["x_floor"] == 4.0
    assert rows[2]["x_floor"] == 1.0 and rows[0]["x_floor"] == 20.0
    assert rows[4]["speedup_vs_sdpa"] is None and rows[4]["x_floor"] is None  # nothing else timed at N=64
    lines = bench.format_table(rows).splitlines()
    assert lines[5].split() == ["sima", "197", "1", "2.000", "ms", "1.900", "ms", "2.100", "ms", "5.00", "2.00",
                                "4.00"]
    # under 1 ms: µs
    assert lines[4].split()[3:9] == ["500.0", "µs", "500.0", "µs", "500.0", "µs"]
    assert lines[6].split()[-3:] == ["-", "-", "-"]


def test_wide_spread_is_warned_once_naming_the_widest_and_how_to_measure_quietly():
    calm = [_row("softmax", 64, 1.0, 0.95, 1.1), _row("sima", 64, 2.0, 1.9, 2.2)]  # 15 %, 15 %
    notes = bench.table_notes(calm)  # the columns' legend, and which SimA implementation the sima row ran
    assert len(notes) == 2 and notes[1].startswith("sima: SimA") and not any("warning" in n for n in notes)
    busy = calm + [_row("xca", 64, 1.0, 0.9, 1.5), _row("elu", 64, 1.0, 0.9, 1.25)]  # 60 %, 35 %
    notes = bench.table_notes(busy)
    assert len(notes) == 3 and notes[2].startswith("warning: wide spread in 2 of 4 timings")
    assert "widest: xca N=64, 60%" in notes[2] and "above 20% of the median" in notes[2]
    assert "For a quiet measurement: an idle machine, fewer threads than its" in notes[2]
    assert "--threads" in notes[2] and "--repeats" in notes[2] and "\n" not in notes[2]


def test_a_sima_time_under_its_floor_is_warned_as_impossible():
    """x floor < 1 (SimA faster than its own two matmuls, as a busy machine can show) is named as impossible; other
    kinds under SimA's floor are not SimA's to warn about."""
    rows = bench.add_ratios([_row("softmax", 197, 1.0), _row("sima_official", 197, 3.0),
                             _row("sima_matmuls", 197, 2.0), _row("sima", 197, 1.0), _row("sima_torch", 197, 2.5),
                             _row("elu", 197, 1.5)])
    (warning,) = [n for n in bench.table_notes(rows) if n.startswith("warning")]
    assert warning.startswith("warning: impossible ratio: sima N=197 (x floor 0.50) ran faster than SimA's two "
                              "matmuls alone")
    assert "sima_torch" not in warning and "elu" not in warning and "softmax" not in warning
    assert "For a quiet measurement" in warning
    fine = [dict(r, median_ms=2.0) if r["kind"] == "sima" else r for r in rows]
    assert bench.floor_warning(bench.add_ratios(fine)) is None


def test_host_cost_rows_ratios_and_summary_from_stand_in_figures():
    from simattn.bench.attention import host_cost

    rows = host_cost.add_ratios([{"kind": k, "pass": p, "host_us": us, "host_us_p10": us, "host_us_p90": us}
                                 for k, p, us in (("sima", "fwd", 12.0), ("sima", "fwd+bwd", 45.0),
                                                  ("sima_launch", "fwd", 20.0), ("sdpa", "fwd", 10.0),
                                                  ("sdpa", "fwd+bwd", 30.0))]
                                + [{"kind": "sima_launch", "pass": "fwd+bwd", "error": "RuntimeError: no ptxas"}])
    assert [r["x_sdpa"] for r in rows] == [1.2, 1.5, 2.0, 1.0, 1.0, None]
    assert host_cost.summary(rows, "CPU X, 1 thread(s)") == (
        "Triton host cost per call, sima simattn's path: fwd 12.0 µs (1.20x SDPA's), fwd+bwd 45.0 µs (1.50x "
        "SDPA's); sima with Triton's launch path: fwd 20.0 µs (2.00x SDPA's); on CPU X, 1 thread(s)")
    table = host_cost.format_rows(rows).splitlines()
    assert table[3].split() == ["sima", "fwd+bwd", "45.0", "45.0", "45.0", "1.50"]
    assert " ".join(table[7].split()) == "sima_launch fwd+bwd not measured: RuntimeError: no ptxas"


def test_host_cost_runs_the_public_triton_path_without_a_gpu(tmp_path, monkeypatch, capsys):
    """``--host-cost`` end to end on CPU: SimA's public op with backend 'triton', forward and forward+backward
    through autograd, with the launches skipped, beside SDPA; rows in µs and the JSON written. (Triton's launch
    path, ``sima_launch``, needs kernels compiled for a GPU: under the suite's interpreter its rows say so.)"""
    pytest.importorskip("triton")
    import functools

    from simattn.attention import sima
    from simattn.kernels import host
    from simattn.bench.attention import host_cost

    seen = []
    real = sima.sima_attention
    monkeypatch.setattr(sima, "sima_attention", lambda *a, **kw: seen.append(kw["backend"]) or real(*a, **kw))
    monkeypatch.setattr(host_cost, "measure", functools.partial(host_cost.measure, calls=2))
    out = tmp_path / "host.json"
    assert bench.main(["--host-cost", "--repeats", "2", "--rounds", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["kind"], r["pass"]): r for r in data["rows"]}
    assert set(rows) == {(k, p) for k in host_cost.KINDS for p in host_cost.PASSES}
    timed = {key: r for key, r in rows.items() if "error" not in r}
    assert {k for k, _ in timed} >= {"sima", "sdpa"}
    assert all(r["host_us"] > 0 and r["host_us_p10"] <= r["host_us"] <= r["host_us_p90"] for r in timed.values())
    if host.interpreting():
        assert all("TRITON_INTERPRET=1" in rows[("sima_launch", p)]["error"] for p in host_cost.PASSES)
    assert rows[("sdpa", "fwd")]["x_sdpa"] == 1.0
    assert set(seen) == {"triton"} and data["meta"]["threads"] == 1
    printed = capsys.readouterr().out
    assert "host µs" in printed and "Triton host cost per call, sima simattn's path: fwd " in printed


@pytest.mark.parametrize("argv, says", [
    (["--host-cost", "--tokens", "64"], "--tokens applies to the sweeps, not --host-cost"),
    (["--host-cost", "--kinds", "sima"], "--kinds applies to the sweeps, not --host-cost"),
    (["--host-cost", "--device", "cuda"], "--host-cost runs on CPU"),
])
def test_host_cost_refuses_the_sweeps_options_in_one_line(argv, says, tmp_path, capsys):
    from simattn.cli import main as simattn_main

    assert simattn_main(["bench", "attention", *argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and not (tmp_path / "x.json").exists()


def test_qkv_layout_gives_strided_views_of_one_projection():
    q, k, v = bench.make_qkv(2, 3, 5, 4, "qkv", torch.Generator().manual_seed(0), "cpu", torch.float32)
    assert q.shape == k.shape == v.shape == (2, 3, 5, 4)
    assert not q.is_contiguous() and q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert all(t.is_contiguous() for t in bench.make_qkv(2, 3, 5, 4, "contiguous", torch.Generator(), "cpu",
                                                          torch.float32))


def test_keep_freed_memory_stops_page_faults_between_calls():
    """After keep_freed_memory, allocating and freeing the same large buffers again costs no fresh pages."""
    import subprocess
    import sys

    script = """
import resource, torch
from simattn.utils.timing import keep_freed_memory
mode = keep_freed_memory()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        a = torch.ones(12 << 20); del a   # 48 MiB: above glibc's largest dynamic mmap threshold (32 MiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(mode.startswith("glibc"), faults())
"""
    kept, faults = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                  check=True).stdout.split()
    if kept != "True":
        pytest.skip("not glibc: the allocator is left alone")
    assert int(faults) < 1000  # without it, each round faults all 12288 pages in again
