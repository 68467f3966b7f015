"""Pack, then read: what ``simattn data pack`` writes, the ``wds`` datasets give back as the source gives it (pixels,
labels, masks, classes, palette, label ids), whatever image format the pack kept; the pack writer for encoded samples
refuses what the readers would; ``simattn convert`` trains on shards."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from simattn.cli import main as simattn_main
from simattn.data.factory import create_dataset
from simattn.data.segmentation import create_segmentation_dataset

SCENES = {"num_train": 6, "num_val": 5, "canvas": 32}


def _pack(*argv) -> None:
    assert simattn_main(["data", "pack", *map(str, argv)]) == 0


def _arrays(dataset):
    return [(np.asarray(image), label) for image, label in dataset]


def test_digits_read_back_from_packed_shards(tmp_path):
    out = tmp_path / "digits"
    _pack("--dataset", "digits", "--split", "val", "--output", out, "--shard-samples", 100)
    source, shards = create_dataset("digits", None, "val"), create_dataset("wds", out, "val")
    assert shards.classes == [str(c) for c in source.classes] and len(shards) == len(source) == 359
    assert len(shards.urls) == 4
    got, want = _arrays(shards), _arrays(source)
    assert [label for _, label in got] == [int(label) for _, label in want]
    assert all(a.shape == b.shape and np.array_equal(a, b) for (a, _), (b, _) in zip(got, want))
    # through a tensor transform: the same tensors
    to_tensor = lambda img: torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)  # noqa: E731
    tensors = [x for x, _ in create_dataset("wds", out, "val", transform=to_tensor)]
    assert all(torch.equal(t, to_tensor(img)) for t, (img, _) in zip(tensors, source))


def test_digit_scenes_read_back_with_masks_palette_and_label_ids(tmp_path):
    out = tmp_path / "scenes"
    _pack("--task", "segmentation", "--dataset", "digits", "--dataset-kwargs",
          *[f"{k}={v}" for k, v in SCENES.items()], "--split", "val", "--output", out, "--shard-samples", 2)
    source = create_segmentation_dataset("digits", None, "val", train=False, scale=(32, 32), **SCENES)
    shards = create_segmentation_dataset("wds", out, "val", train=False, scale=(32, 32))
    assert len(shards) == len(source) == 5 and len(shards.urls) == 3
    assert shards.classes == list(source.classes) and shards.num_classes == source.num_classes
    assert shards.palette == [tuple(c) for c in source.palette]
    assert shards.label_ids == list(source.label_ids) and shards.ignore_index == 255
    # the evaluation transform of both gives the same tensors
    for (x, y), i in zip(shards, range(len(source))):
        sx, sy = source[i]
        assert torch.equal(x, sx) and torch.equal(y, sy)
    # and the decoded pairs are the scenes' own images and masks
    shards.transform = lambda image, mask: (image, mask)
    for (image, mask), i in zip(shards, range(len(source))):
        want_image, want_mask = source.read(i)
        assert np.array_equal(image, want_image) and np.array_equal(mask, want_mask)


def _save(path: Path, seed: int, **kwargs) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, **kwargs)
    return pixels


def test_every_image_format_a_pack_keeps_is_read(tmp_path):
    data = tmp_path / "data"
    names = {"a/one.bmp": {}, "a/two.tif": {}, "a/three.webp": {"lossless": True}, "b/four.JPEG": {"quality": 95},
             "b/five.png": {}, "b/six.ppm": {}}
    for seed, (name, kwargs) in enumerate(names.items()):
        _save(data / "train" / name, seed, **kwargs)
    out = tmp_path / "shards"
    _pack("--dataset", "folder", "--data-dir", data, "--split", "train", "--output", out, "--encode", "keep")
    with tarfile.open(out / "train-000000.tar") as tar:
        kept = sorted(m.name.split(".", 1)[1] for m in tar.getmembers() if not m.name.endswith(".cls"))
    assert kept == ["bmp", "jpg", "png", "ppm", "tif", "webp"]
    got, want = _arrays(create_dataset("wds", out, "train")), _arrays(create_dataset("folder", data, "train"))
    assert len(got) == len(want) == 6
    assert all(la == lb and np.array_equal(a, b) for (a, la), (b, lb) in zip(got, want))
    # every extension the folder readers take (and so a pack may keep) is one the shard reader looks for
    from torchvision.datasets.folder import IMG_EXTENSIONS
    from simattn.data.segmentation import _IMAGE_EXTS
    from simattn.data.shards import IMAGE_EXTENSIONS
    assert {e.lstrip(".").replace("jpeg", "jpg") for e in IMG_EXTENSIONS + _IMAGE_EXTS} <= set(IMAGE_EXTENSIONS)


def test_the_samples_writer_refuses_what_the_readers_would(tmp_path):
    from simattn.data.pack import write_samples
    png = tmp_path / "x.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(png)
    good = [("png", png.read_bytes()), ("cls", b"1")]
    cases = [([[("png", png.read_bytes())]], "sample 0: members ['png']; expected the image first, then 'cls'"),
             ([good, [("png", png.read_bytes()), ("cls", b"2")]], "sample 1: label 2 is outside the 2 classes"),
             ([good, [("png", b"not an image"), ("cls", b"0")]], "sample 1: cannot decode the image")]
    for samples, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
            write_samples(samples, "train", tmp_path / "out", name="x", classes=["a", "b"], shard_samples=1)
        assert "\n" not in str(e.value)
    # the shard finished before the bad sample stays for a rerun; the split is not entered, nothing half-written
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train-000000.tar", "train.packing.json"]
    mask = Image.fromarray(np.full((4, 4), 3, np.uint8))
    buf = io.BytesIO()
    mask.save(buf, format="PNG")
    with pytest.raises(ValueError, match=r"sample 0: mask holds train ids \[3\] outside the 2 classes"):
        write_samples([[("png", png.read_bytes()), ("mask.png", buf.getvalue())]], "val", tmp_path / "seg",
                      name="x", classes=["a", "b"], task="segmentation", shard_samples=1)


def test_a_pack_keeps_the_other_folders_this_process_holds(tmp_path):
    from simattn.data.pack import write_samples
    from simattn.utils.runs import held_run_folders, lock_run_folder, release_run_folders
    run = tmp_path / "run"
    run.mkdir()
    assert lock_run_folder(run)
    try:
        png = tmp_path / "x.png"
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(png)
        write_samples([[("png", png.read_bytes()), ("cls", b"0")]], "train", tmp_path / "out", name="x",
                      classes=["a"], shard_samples=1)
        held = held_run_folders()
        assert str(run.resolve()) in held and str((tmp_path / "out").resolve()) not in held
        assert not (tmp_path / "out" / ".simattn.lock").exists()
    finally:
        release_run_folders()


def _tar_files(folder: Path):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def test_packed_shards_pack_again(tmp_path):
    first, again, jpeg = tmp_path / "first", tmp_path / "again", tmp_path / "jpeg"
    _pack("--dataset", "digits", "--split", "val", "--output", first, "--shard-samples", 100)
    # the same shard size again: the same bytes
    _pack("--dataset", "wds", "--data-dir", first, "--split", "val", "--output", again, "--shard-samples", 100)
    assert _tar_files(again) == _tar_files(first) and len(_tar_files(first)) == 4
    # through a pipe: URL, into fewer shards, as JPEG
    _pack("--dataset", "wds", "--data-dir", f"pipe:cat {first}/val-{{000000..000003}}.tar", "--split", "val",
          "--output", jpeg, "--shard-samples", 200, "--encode", "jpeg")
    source, shards = create_dataset("digits", None, "val"), create_dataset("wds", jpeg, "val")
    assert len(shards.urls) == 2 and shards.classes == [str(c) for c in source.classes]
    assert [label for _, label in shards] == [int(label) for _, label in source]
    # a resumed pack asks for its samples from the middle: the reader skips to it
    from simattn.data.pack import open_source
    members = open_source("classification", "wds", first, "val").members
    with tarfile.open(first / "val-000001.tar") as tar:
        want = [("png", tar.extractfile("00000105.png").read()), ("cls", tar.extractfile("00000105.cls").read())]
    assert members(105) == want and members(106) != want and members(105) == want
    # an output among the shards it reads is refused
    code = simattn_main(["data", "pack", "--dataset", "wds", "--data-dir", f"{first}/val-{{000000..000001}}.tar",
                         "--split", "val", "--output", str(first / "sub")])
    assert code == 2 and not (first / "sub").exists()


def test_packed_scenes_pack_again_with_masks(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    _pack("--task", "segmentation", "--dataset", "digits", "--dataset-kwargs",
          *[f"{k}={v}" for k, v in SCENES.items()], "--split", "val", "--output", first, "--shard-samples", 2)
    _pack("--task", "segmentation", "--dataset", "wds", "--data-dir", first, "--split", "val", "--output", again)
    info = json.loads((again / "_info.json").read_text())
    assert info["splits"]["val"]["shard_lengths"] == [5]
    assert {k: info[k] for k in ("classes", "palette", "label_ids", "ignore_index", "task")} == \
        {k: json.loads((first / "_info.json").read_text())[k] for k in ("classes", "palette", "label_ids",
                                                                          "ignore_index", "task")}
    source = create_segmentation_dataset("digits", None, "val", train=False, **SCENES)
    shards = create_segmentation_dataset("wds", again, "val", train=False)
    shards.transform = lambda image, mask: (image, mask)
    for (image, mask), i in zip(shards, range(len(source))):
        want_image, want_mask = source.read(i)
        assert np.array_equal(image, want_image) and np.array_equal(mask, want_mask)


def test_a_saved_hf_segmentation_dataset_packs_and_reads_back(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (12, 16, 3), dtype=np.uint8) for _ in range(3)]
    masks = [rng.choice(np.array([0, 1, 2, 255], np.uint8), (12, 16)) for _ in range(3)]

    def png(array):
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image()})
    split = datasets.Dataset.from_dict({"image": [png(a) for a in images], "mask": [png(m) for m in masks]},
                                       features=features)
    root = tmp_path / "hf"
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        datasets.DatasetDict(train=split).save_to_disk(str(root))
    finally:
        if was:
            datasets.enable_progress_bars()
    (root / "classes.txt").write_text("sky\ntree\nroad\n")
    _pack("--task", "segmentation", "--dataset", "hfds", "--data-dir", root, "--split", "train", "--output",
          tmp_path / "shards")
    shards = create_segmentation_dataset("wds", tmp_path / "shards", "train", train=False)
    assert shards.classes == ["sky", "tree", "road"]
    shards.transform = lambda image, mask: (image, mask)
    got = list(shards)
    assert len(got) == 3
    assert all(np.array_equal(a, image) and np.array_equal(b, mask) for (a, b), image, mask in zip(got, images, masks))
