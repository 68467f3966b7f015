"""``simattn data pack``: shards and ``_info.json`` that tarfile and timm read back with the dataset's samples (digits,
image folders, digit scenes and the segmentation folder layout, masks exact), a SIGKILLed pack resumed to the bytes of
an uninterrupted one, and bad input as one line with exit code 2 that changes nothing."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from simattn.cli import main as simattn_main
from simattn.data.digits import DigitsDataset
from simattn.data.segmentation import DigitScenes, create_segmentation_dataset

from cli_inputs import one_line_error
from killing import kill_on_line
from test_seg_data import _folder, _image, _labels, _mask


def _pack(*argv) -> int:
    return simattn_main(["data", "pack", *map(str, argv)])


def _samples(shard: Path):
    """(key, {extension: bytes}) of a shard, in member order, and the member names."""
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
        for m in members:
            assert (m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) == (0, 0o444, 0, 0, "", ""), m.name
        names = [m.name for m in members]
        samples = {}
        for m in members:
            key, ext = m.name.split(".", 1)
            samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return list(samples.items()), names


def _split_samples(out: Path, split: str):
    from timm.data.readers.reader_wds import _parse_split_info
    info = json.loads((out / "_info.json").read_text())
    split_info = _parse_split_info(split, info)
    samples = []
    for name, length in zip(split_info.filenames, split_info.shard_lengths):
        shard, _ = _samples(out / name)
        assert len(shard) == length, name
        samples += shard
    assert len(samples) == split_info.num_samples
    assert [key for key, _ in samples] == [f"{i:08d}" for i in range(len(samples))]
    return info, samples


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img)


def _files(folder: Path):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ round trips
def test_digits_train_and_val_read_back_with_tarfile_and_timm(tmp_path, capsys):
    out = tmp_path / "shards"
    assert _pack("--dataset", "digits", "--split", "train", "--output", out, "--shard-samples", 500) == 0
    assert _pack("--dataset", "digits", "--split", "val", "--output", out) == 0  # a second split joins the first
    printed = capsys.readouterr().out
    assert "packed val: 359 samples in 1 shard" in printed
    for split, shards in (("train", [500, 500, 438]), ("val", [359])):
        info, samples = _split_samples(out, split)
        assert info["splits"][split]["shard_lengths"] == shards
        ds = DigitsDataset(split)
        assert [int(s["cls"]) for _, s in samples] == ds.targets.tolist()
        assert all(set(s) == {"png", "cls"} for _, s in samples)
        for i in (0, 7, len(ds) - 1):  # lossless: the pixels the dataset gives
            assert np.array_equal(_pixels(samples[i][1]["png"]), np.asarray(ds[i][0]))
    assert info["name"] == "digits" and info["task"] == "classification" and info["classes"] == list("0123456789")
    assert sorted(p.name for p in out.iterdir()) == ["_info.json", "pack_summary.json", "train-000000.tar",
                                                     "train-000001.tar", "train-000002.tar", "val-000000.tar"]
    summary = json.loads((out / "pack_summary.json").read_text())["splits"]
    assert summary["train"]["samples"] == 1438 and summary["train"]["shards"] == 3 and summary["val"]["classes"] == 10
    assert summary["val"]["bytes"] == (out / "val-000000.tar").stat().st_size
    assert sum(summary["train"]["class_counts"].values()) == 1438


def test_shard_bytes_bounds_every_shard(tmp_path):
    out = tmp_path / "shards"
    assert _pack("--dataset", "digits", "--split", "val", "--output", out, "--shard-bytes", 100_000) == 0
    info, samples = _split_samples(out, "val")
    sizes = [(out / f).stat().st_size for f in info["splits"]["val"]["filenames"]]
    assert len(sizes) > 3 and max(sizes) <= 100_000 and len(samples) == 359


def _class_folder(root: Path) -> Path:
    for split in ("train",):
        _image(root / split / "cat" / "a.JPEG", seed=1)
        _image(root / split / "cat" / "b.png", seed=2)
        _image(root / split / "dog" / "c.jpg", seed=3)
    return root


def test_image_folder_keeps_the_files_bytes_or_reencodes_jpeg(tmp_path):
    data = _class_folder(tmp_path / "data")
    kept, jpeg = tmp_path / "kept", tmp_path / "jpeg"
    assert _pack("--dataset", "imagenet", "--data-dir", data, "--split", "train", "--output", kept) == 0
    _, samples = _split_samples(kept, "train")
    files = [data / "train/cat/a.JPEG", data / "train/cat/b.png", data / "train/dog/c.jpg"]
    assert [sorted(s) for _, s in samples] == [["cls", "jpg"], ["cls", "png"], ["cls", "jpg"]]
    assert [s.get("jpg", s.get("png")) for _, s in samples] == [f.read_bytes() for f in files]
    assert [s["cls"] for _, s in samples] == [b"0", b"0", b"1"]
    assert _pack("--dataset", "folder", "--data-dir", data, "--split", "train", "--output", jpeg,
                 "--encode", "jpeg", "--quality", 80) == 0
    _, samples = _split_samples(jpeg, "train")
    assert all(sorted(s) == ["cls", "jpg"] and s["jpg"][:2] == b"\xff\xd8" for _, s in samples)
    assert _pixels(samples[1][1]["jpg"]).shape == (10, 12, 3)


def test_digit_scenes_pack_image_and_mask_exactly(tmp_path):
    out = tmp_path / "scenes"
    kwargs = ["num_train=5", "num_val=3", "canvas=32"]
    assert _pack("--task", "segmentation", "--dataset", "digits", "--dataset-kwargs", *kwargs, "--split", "val",
                 "--output", out, "--shard-samples", 2) == 0
    info, samples = _split_samples(out, "val")
    scenes = DigitScenes("val", num_train=5, num_val=3, canvas=32)
    assert info["task"] == "segmentation" and info["ignore_index"] == 255 and info["classes"] == scenes.classes
    assert len(info["palette"]) == 11 and info["splits"]["val"]["shard_lengths"] == [2, 1]
    for i, (_, sample) in enumerate(samples):
        image, mask = scenes.read(i)
        assert sorted(sample) == ["mask.png", "png"]
        assert np.array_equal(_pixels(sample["png"]), image)
        assert np.array_equal(_pixels(sample["mask.png"]), mask)


def test_segmentation_folder_layout_masks_are_train_ids(tmp_path):
    data = _folder(tmp_path / "data")
    out = tmp_path / "shards"
    assert _pack("--task", "segmentation", "--dataset", "folder", "--data-dir", data, "--split", "train",
                 "--output", out) == 0
    info, samples = _split_samples(out, "train")
    ds = create_segmentation_dataset("folder", data, "train", train=False)
    assert info["classes"] == ["sky", "road", "car"] and len(samples) == 2
    assert sorted(samples[0][1]) == ["jpg", "mask.png"] and sorted(samples[1][1]) == ["mask.png", "png"]
    for i, (_, sample) in enumerate(samples):
        assert sample.get("jpg", sample.get("png")) == Path(ds.images[i]).read_bytes()
        mask = _pixels(sample["mask.png"])
        assert mask.dtype == np.uint8 and np.array_equal(mask, ds.read(i)[1])
    assert set(np.unique(_pixels(samples[0][1]["mask.png"]))) == {0, 1, 255}


# ------------------------------------------------------------------------------------------------ resume
VICTIM = textwrap.dedent("""
    import sys, time
    from simattn.data import pack

    add = pack._ShardFile.add

    def add_then_hang(self, key, members):  # halfway through the fourth shard: stop to be killed
        add(self, key, members)
        if key == "00000350":
            print("HALF", flush=True)
            time.sleep(600)

    pack._ShardFile.add = add_then_hang
    from simattn.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_sigkill_mid_pack_then_rerun_equals_an_uninterrupted_pack(tmp_path, capsys):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    argv = ["data", "pack", "--dataset", "digits", "--split", "train", "--shard-samples", "100"]
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, *argv, "--output", str(killed)],
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
    watcher, seen = kill_on_line(victim, lambda line: line.startswith("HALF"))
    assert simattn_main([*argv, "--output", str(straight)]) == 0  # meanwhile, in this process
    watcher.join(timeout=300)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)
    left = sorted(p.name for p in killed.iterdir() if p.name != ".simattn.lock")  # a lock the kernel dropped
    # three whole shards, the fourth only as a temporary file, and no split in _info.json yet
    assert left == ["train-000000.tar", "train-000001.tar", "train-000002.tar", "train-000003.tar.tmp",
                    "train.packing.json"], left
    first = (killed / "train-000000.tar").stat()

    capsys.readouterr()
    code = simattn_main([*argv[:-1], "50", "--output", str(killed)])  # not the pack in progress
    assert "unfinished pack of split 'train' with other options" in one_line_error(capsys, code)

    assert simattn_main([*argv, "--output", str(killed)]) == 0
    assert "resuming after 3 whole shards, 300 samples" in capsys.readouterr().out
    assert (killed / "train-000000.tar").stat().st_ino == first.st_ino  # whole shards are not written again
    a, b = _files(straight), _files(killed)
    assert list(a) == list(b)
    for name in a:
        if name.endswith(".tar"):
            assert _samples(straight / name)[1] == _samples(killed / name)[1], name
        assert a[name] == b[name], name


def test_a_recorded_shard_that_changed_is_written_again(tmp_path):
    straight, damaged = tmp_path / "straight", tmp_path / "damaged"
    argv = ["--dataset", "digits", "--split", "val", "--shard-samples", 100]
    assert _pack(*argv, "--output", straight) == 0
    assert _pack(*argv, "--output", damaged) == 0
    # as a pack killed after its second shard whose first shard was then cut short
    info = json.loads((damaged / "_info.json").read_text())
    record = {"options": info["splits"]["val"]["pack"],
              "shards": [{"filename": f, "samples": n, "bytes": (damaged / f).stat().st_size}
                         for f, n in zip(info["splits"]["val"]["filenames"][:2], [100, 100])]}
    del info["splits"]["val"]
    (damaged / "_info.json").write_text(json.dumps(info))
    (damaged / "val.packing.json").write_text(json.dumps(record))
    with open(damaged / "val-000000.tar", "r+b") as f:
        f.truncate(5000)
    (damaged / "val-000009.tar.tmp").write_bytes(b"half")  # as from a pack of another size
    assert _pack(*argv, "--output", damaged) == 0
    assert _files(straight) == _files(damaged)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("where", ["same", "inside", "holds"])
def test_an_output_that_is_in_or_around_the_input_is_refused(tmp_path, capsys, where):
    data = _class_folder(tmp_path / "data")
    out = {"same": data, "inside": data / "train" / "shards", "holds": tmp_path}[where]
    before = _files(tmp_path)
    code = _pack("--dataset", "folder", "--data-dir", data, "--split", "train", "--output", out)
    err = one_line_error(capsys, code)
    assert "--output" in err and "the input --data-dir" in err
    assert _files(tmp_path) == before and not (data / "train" / "shards").exists()


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "mnist"], "--dataset 'mnist': unknown classification dataset; known: digits"),
    (["--dataset", "ade20k"], "'ade20k' is a segmentation dataset: add --task segmentation"),
    (["--task", "segmentation", "--dataset", "cifar10"], "'cifar10' is a classification dataset"),
    (["--dataset", "digits", "--shard-samples", "10", "--shard-bytes", "1000"], "give one shard size, not both"),
    (["--dataset", "digits", "--shard-samples", "0"], "option '--shard-samples': got 0; allowed: an integer >= 1"),
    (["--dataset", "digits", "--shard-bytes", "-5"], "option '--shard-bytes': got -5; allowed: an integer >= 1"),
    (["--dataset", "digits", "--quality", "80"], "--quality 80 applies to --encode jpeg only"),
    (["--dataset", "digits", "--data-dir", "x"], "is embedded and reads no folder"),
    (["--split", "val"], "--dataset is required"),
    (["--dataset", "digits", "--split", "../val"], "--split '../val': allowed: letters, digits, '_' and '-'"),
    (["--dataset", "digits", "--split", "start"], "a split name may not contain 'tar'"),
])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "shards"
    split = [] if "--split" in argv else ["--split", "val"]
    code = _pack(*argv, *split, "--output", out)
    err = one_line_error(capsys, code)
    assert err.startswith("simattn data pack: error: ") and message in err, err
    assert not out.exists()


def test_a_split_packed_with_other_options_is_refused_and_the_same_pack_again_is_a_no_op(tmp_path, capsys):
    out = tmp_path / "shards"
    assert _pack("--dataset", "digits", "--split", "val", "--output", out, "--shard-samples", 100) == 0
    before = _files(out)
    capsys.readouterr()
    code = _pack("--dataset", "digits", "--split", "val", "--output", out, "--shard-samples", 50)
    err = one_line_error(capsys, code)
    assert "already holds split 'val' packed with other options (shard_samples 100 now 50)" in err
    code = _pack("--task", "segmentation", "--dataset", "digits", "--dataset-kwargs", "num_train=2", "--split", "train",
                 "--output", out)
    assert "holds the shards of 'digits' (classification, 10 classes)" in one_line_error(capsys, code)
    assert _files(out) == before
    assert _pack("--dataset", "digits", "--split", "val", "--output", out, "--shard-samples", 100) == 0
    assert "already packed" in capsys.readouterr().out and _files(out) == before


def test_shards_not_written_by_a_pack_are_refused(tmp_path, capsys):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "val-000000.tar").write_bytes(b"someone else's")
    code = _pack("--dataset", "digits", "--split", "val", "--output", out)
    assert "holds val-000000.tar but no pack of split 'val' in progress" in one_line_error(capsys, code)
    assert sorted(p.name for p in out.iterdir()) == ["val-000000.tar"]


def test_an_image_that_does_not_decode_stops_the_pack_naming_it(tmp_path, capsys):
    data = _class_folder(tmp_path / "data")
    bad = data / "train" / "dog" / "c.jpg"
    bad.write_bytes(bad.read_bytes()[:40])
    out = tmp_path / "shards"
    code = _pack("--dataset", "folder", "--data-dir", data, "--split", "train", "--output", out, "--shard-samples", 2)
    err = one_line_error(capsys, code)
    assert f"split 'train' sample 2 ({bad}): cannot decode the image" in err
    # the whole first shard stays for a rerun; nothing half-written, no split in _info.json
    assert sorted(p.name for p in out.iterdir()) == ["train-000000.tar", "train.packing.json"]


def test_a_mask_label_outside_the_classes_stops_the_pack_naming_it(tmp_path, capsys):
    data = _folder(tmp_path / "data")
    _mask(data / "masks" / "train" / "b.png", _labels(values=(2, 7, 0)))
    out = tmp_path / "shards"
    code = _pack("--task", "segmentation", "--dataset", "folder", "--data-dir", data, "--split", "train",
                 "--output", out)
    err = one_line_error(capsys, code)
    assert "split 'train' sample 1: mask" in err and "holds values 7 that are no folder label" in err
    assert sorted(p.name for p in out.iterdir()) == ["train.packing.json"]
