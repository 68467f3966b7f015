"""simattn bench data: a tiny run over the three copies it writes itself (the shards through the pack writer, read by
the wds dataset), its output files, the copies' formats, and one-line errors for bad options."""
from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

import pytest

from cli_inputs import one_line_error
from conftest import needs
from simattn.bench import data as bench_data
from simattn.cli import main as simattn_main
from simattn.data.shards import ShardDataset

pytestmark = needs("datasets")

TINY_MODEL = ["--model-kwargs", "depth=1", "embed_dim=32", "num_heads=2"]


def test_tiny_run_writes_rows_files_and_identical_copies(tmp_path, capsys):
    out, copies = tmp_path / "out", tmp_path / "copies"
    code = bench_data.main(["--img-size", "16", "--images", "10", "--batch-size", "4", "--workers", "0", "2",
                            "--rounds", "1", "--threads", "1", "--repeats", "2", "--in-process", *TINY_MODEL,
                            "--copies", str(copies), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed[-2000:]
    assert "features:" in printed and "The model trains at" in printed
    result = json.loads((out / "bench_data.json").read_text())
    rows = result["rows"]
    assert {(r["what"], r["workers"]) for r in rows} == {(w, n) for w in ("folder", "shards", "hfds") for n in (0, 2)}
    for row in rows:
        assert row["images"] == 10 and row["ips"] > 0 and row["worker_ips"] > 0 and row["first_pass_ips"] > 0
        assert row["of_model"] > 0 and row["active_workers"] == max(1, row["workers"])
    assert result["model"]["ips"] > 0 and result["meta"]["cpu_features"] is not None
    with open(out / "bench_data.csv") as f:
        assert len(list(csv.DictReader(f))) == 7  # six loaders and the model
    assert (out / "bench_data.md").read_text().startswith("Decode + augment")
    assert (out / "bench_data.png").stat().st_size > 1000

    # the three copies hold the same bytes; the shards follow the pack format
    files = sorted((copies / "folder" / "train").rglob("*.jpg"))
    folder = {int(p.stem): p.read_bytes() for p in files}
    import datasets
    saved = datasets.load_from_disk(str(copies / "hfds"))["train"].cast_column("image", datasets.Image(decode=False))
    assert [saved[i]["image"]["bytes"] for i in range(len(saved))] == [folder[i] for i in range(10)]
    info = json.loads((copies / "shards" / "_info.json").read_text())
    assert info["splits"]["train"]["num_samples"] == 10 and info["classes"] == [str(i) for i in range(10)]
    assert info["splits"]["train"]["shard_lengths"] == [5, 5]  # a shard per worker of the most workers measured
    assert isinstance(bench_data.open_copy("shards", copies / "shards", "train", None), ShardDataset)
    with tarfile.open(copies / "shards" / "train-000000.tar") as tar:
        members = tar.getmembers()
        assert [m.name for m in members[:2]] == ["00000000.jpg", "00000000.cls"]
        assert all((m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o444) for m in members)
        assert tar.extractfile("00000003.jpg").read() == folder[3]
        assert int(tar.extractfile("00000003.cls").read()) == saved[3]["label"]


def test_existing_copies_are_read_and_readers_chosen(tmp_path, capsys):
    copies = tmp_path / "copies"
    code = bench_data.main(["--img-size", "16", "--images", "6", "--batch-size", "3", "--workers", "0",
                            "--rounds", "1", "--readers", "folder", "--no-train-step", "--copies", str(copies),
                            "--out", str(tmp_path / "a")])
    assert code == 0
    capsys.readouterr()
    code = bench_data.main(["--img-size", "16", "--workers", "0", "--rounds", "1", "--batch-size", "3",
                            "--readers", "folder", "--folder", str(copies / "folder"), "--no-train-step",
                            "--out", str(tmp_path / "b")])
    assert code == 0
    assert "writing" not in capsys.readouterr().out  # nothing written: the copy given is read
    rows = json.loads((tmp_path / "b" / "bench_data.json").read_text())["rows"]
    assert [(r["what"], r["images"]) for r in rows] == [("folder", 6)]


@pytest.mark.parametrize("args, message", [
    (["--readers", "folder", "tapes"], "'tapes' not allowed; allowed: some of folder, shards, hfds"),
    (["--workers", "-1"], "option '--workers': got [-1]"),
    (["--format", "gif"], "option '--format': got 'gif'; allowed: one of jpg, png"),
    (["--folder", "/does/not/exist"], "--folder '/does/not/exist': folder not found"),
    (["--readers", "hfds", "--folder", "."], "--folder '.' is not read: --readers leaves folder out"),
    (["--dataset", "tapes"], "--dataset 'tapes': unknown"),
    (["--dataset", "folder"], "dataset 'folder' needs a data directory"),
    (["--no-train-step", "--in-process"], "--in-process applies to the model's training step"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, args, message):
    code = simattn_main(["bench", "data", *args, "--out", str(tmp_path / "out")])
    assert message in one_line_error(capsys, code)
    assert not (tmp_path / "out").exists()


def test_hfds_without_the_datasets_package_is_left_out_or_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_data, "_has_datasets", lambda: False)
    code = simattn_main(["bench", "data", "--readers", "folder", "hfds", "--out", str(tmp_path / "out")])
    assert "--readers hfds: dataset 'hfds' needs the Hugging Face datasets package" in one_line_error(capsys, code)
    code = bench_data.main(["--img-size", "16", "--images", "4", "--batch-size", "2", "--workers", "0", "--rounds",
                            "1", "--no-train-step", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0 and "note: hfds left out" in printed and "measuring folder, shards" in printed
    rows = json.loads((tmp_path / "out" / "bench_data.json").read_text())["rows"]
    assert [(r["what"], r["images"]) for r in rows] == [("folder", 4), ("shards", 4)]


def test_out_and_copies_must_be_usable(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code = simattn_main(["bench", "data", "--out", str(tmp_path / "file")])
    assert "is a file" in one_line_error(capsys, code)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    code = simattn_main(["bench", "data", "--copies", str(tmp_path / "full"), "--out", str(tmp_path / "out")])
    err = one_line_error(capsys, code)
    assert "--copies" in err and "is not a new or empty folder" in err
