"""--dataset hfds: Hugging Face datasets saved with save_to_disk, read like folders (classification and segmentation),
through train and validate, with one-line errors for what a saved dataset can get wrong."""
from __future__ import annotations

import io
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_inputs import FLAGS, one_line_error
from conftest import needs
from simattn.cli import main as simattn_main
from simattn.data.factory import create_dataset
from simattn.data.segmentation import create_segmentation_dataset

# datasets is imported where it is used: collecting the suite does not load it on every worker
pytestmark = needs("datasets")

CLASSES = ["cat", "dog"]


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _images(n: int, seed: int, size: int = 8):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _save(obj, path: Path) -> Path:
    """``save_to_disk`` without its progress bar (it would land in the captured stderr of the error tests)."""
    import datasets
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        obj.save_to_disk(str(path))
    finally:
        if was:
            datasets.enable_progress_bars()
    return path


def _split(arrays, labels, names=CLASSES, image_feature=None, label_feature=None):
    import datasets
    features = datasets.Features({"image": image_feature or datasets.Image(),
                                  "label": label_feature or datasets.ClassLabel(names=names)})
    image = [{"bytes": _png(a), "path": None} for a in arrays] if isinstance(features["image"], datasets.Image) \
        else [_png(a) for a in arrays]
    return datasets.Dataset.from_dict({"image": image, "label": list(labels)}, features=features)


@pytest.fixture
def saved(tmp_path):
    """A DatasetDict (train: 8 images, validation: 4) and the same images as an image folder."""
    import datasets
    train, val = _images(8, 0), _images(4, 1)
    train_y, val_y = [i % 2 for i in range(8)], [i % 2 for i in range(4)]
    root = _save(datasets.DatasetDict(train=_split(train, train_y), validation=_split(val, val_y)), tmp_path / "hf")
    folder = tmp_path / "folder"
    for split, arrays, labels in (("train", train, train_y), ("val", val, val_y)):
        for i, (a, y) in enumerate(zip(arrays, labels)):
            d = folder / split / CLASSES[y]
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(a).save(d / f"{i:03d}.png")
    return root, folder


# ---------------------------------------------------------------- classification
def test_items_classes_and_the_val_alias_match_an_image_folder_of_the_same_images(saved):
    from torchvision import transforms
    root, folder = saved
    to_tensor = transforms.ToTensor()
    for split in ("train", "val"):
        hf = create_dataset("hfds", root, split, transform=to_tensor)
        ref = create_dataset("folder", folder, split, transform=to_tensor)
        assert hf.classes == ref.classes == CLASSES and len(hf) == len(ref)
        # the folder lists class by class, the saved dataset in row order: compare as sets of (pixels, label)
        seen = sorted((tuple(x.flatten().tolist()), y) for x, y in (hf[i] for i in range(len(hf))))
        want = sorted((tuple(x.flatten().tolist()), y) for x, y in (ref[i] for i in range(len(ref))))
        assert seen == want
    assert create_dataset("hfds", root, "validation").split == "validation"
    # workers receive the dataset pickled: it must survive the trip and still read
    again = pickle.loads(pickle.dumps(create_dataset("hfds", root, "train")))
    assert again[3][1] == 1 and again[3][0].size == (8, 8)


def test_bytes_column_and_a_single_dataset_read_as_split_all(tmp_path):
    import datasets
    arrays = _images(4, 2)
    root = _save(_split(arrays, [0, 1, 1, 0], image_feature=datasets.Value("binary")), tmp_path / "one")
    ds = create_dataset("hfds", root, "all")
    assert len(ds) == 4 and np.array_equal(np.asarray(ds[2][0]), arrays[2]) and ds[2][1] == 1
    with pytest.raises(ValueError, match=r"one Dataset without splits, so split 'train' is not there: use split "
                                         r"'all'"):
        create_dataset("hfds", root, "train")


def test_an_unreadable_image_is_skipped_with_a_warning(tmp_path, caplog):
    import datasets
    ds = datasets.Dataset.from_dict({"image": [_png(_images(1, 3)[0]), b"not a png"], "label": [0, 1]},
                                    features=datasets.Features({"image": datasets.Value("binary"),
                                                                "label": datasets.ClassLabel(names=CLASSES)}))
    root = _save(ds, tmp_path / "broken")
    data = create_dataset("hfds", root, "all")
    with caplog.at_level(logging.WARNING, logger="simattn.data.hfds"):
        assert data[1] is None and data[0] is not None
    assert any("skipping unreadable image at row 1" in r.getMessage() for r in caplog.records)


def test_train_and_validate_on_a_saved_dataset(tmp_path, capsys):
    """digits_cpu's recipe on the digits saved as a DatasetDict: a tiny run trains, and validate reads it back."""
    import datasets
    from simattn.data.digits import DigitsDataset
    splits = {}
    for split, name in (("train", "train"), ("val", "validation")):
        digits = DigitsDataset(split)
        keep = np.arange(0, len(digits), 8)  # a few hundred images keep the test short
        splits[name] = _split([np.asarray(digits[int(i)][0]) for i in keep], digits.targets[keep],
                              names=[str(c) for c in digits.classes])
    root = _save(datasets.DatasetDict(splits), tmp_path / "digits_hf")
    out = tmp_path / "run"
    code = simattn_main(["train", "-c", "digits_cpu", *FLAGS, "--dataset", "hfds", "--data-dir", str(root),
                         "--output", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert (out / "final.safetensors").is_file()
    capsys.readouterr()
    result = tmp_path / "val.json"
    code = simattn_main(["validate", "--weights", str(out / "final.safetensors"), "--dataset", "hfds", "--data-dir", str(root),
                         "--split", "val", "--output", str(result)])
    assert code == 0, capsys.readouterr().err[-2000:]
    record = json.loads(result.read_text())
    assert record["samples"] == len(splits["validation"]) and 0 <= record["top1"] <= 100


# ---------------------------------------------------------------- one-line errors
def _train_error(capsys, tmp_path, data_dir) -> str:
    capsys.readouterr()
    code = simattn_main(["train", *FLAGS, "--dataset", "hfds", "--data-dir", str(data_dir),
                         "--output", str(tmp_path / "run")])
    err = one_line_error(capsys, code)
    assert not (tmp_path / "run").exists()
    return err


def test_a_folder_that_is_no_saved_dataset_and_a_missing_split(saved, tmp_path, capsys):
    root, folder = saved
    err = _train_error(capsys, tmp_path, folder)
    assert "is not a dataset saved by datasets' save_to_disk" in err and str(folder) in err
    err = _train_error(capsys, tmp_path, tmp_path / "missing")
    assert "hfds folder not found" in err
    (root / "validation").rename(root / "test")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    err = _train_error(capsys, tmp_path, root)
    assert "has no split 'val' (splits there: train, test)" in err


def test_missing_columns_are_named_with_the_columns_there(tmp_path, capsys):
    import datasets
    no_image = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]},
                                          features=datasets.Features({"text": datasets.Value("string"),
                                                                      "label": datasets.ClassLabel(names=CLASSES)}))
    _save(datasets.DatasetDict(train=no_image, val=no_image), tmp_path / "noimg")
    err = _train_error(capsys, tmp_path, tmp_path / "noimg")
    assert "has no image column" in err and "text (Value string), label (ClassLabel)" in err

    arrays = _images(2, 4)
    no_label = datasets.Dataset.from_dict({"image": [{"bytes": _png(a), "path": None} for a in arrays],
                                           "caption": ["x", "y"]},
                                          features=datasets.Features({"image": datasets.Image(),
                                                                      "caption": datasets.Value("string")}))
    _save(datasets.DatasetDict(train=no_label, val=no_label), tmp_path / "nolabel")
    err = _train_error(capsys, tmp_path, tmp_path / "nolabel")
    assert "has no label column (a ClassLabel feature)" in err and "image (Image), caption (Value string)" in err

    plain = _split(arrays, [0, 1], label_feature=datasets.Value("int64"))
    _save(datasets.DatasetDict(train=plain, val=plain), tmp_path / "plain")
    err = _train_error(capsys, tmp_path, tmp_path / "plain")
    assert "label column 'label' is a plain integer, so the class names are unknown" in err
    assert "ClassLabel(names=[...])" in err


@pytest.mark.parametrize("bad", [-1, 2])
def test_a_label_outside_the_classes(tmp_path, capsys, bad):
    import datasets
    arrays = _images(3, 5)
    split = _split(arrays, [0, 1, bad], names=CLASSES if bad < 0 else CLASSES + ["extra"])
    root = _save(datasets.DatasetDict(train=split, val=split), tmp_path / "bad")
    if bad >= 0:  # ClassLabel refuses such a label on write: shorten the names the saved features record
        for info in root.glob("*/dataset_info.json"):
            meta = json.loads(info.read_text())
            meta["features"]["label"]["names"] = CLASSES
            info.write_text(json.dumps(meta))
    err = _train_error(capsys, tmp_path, root)
    assert f"row 2 has label {bad} in column 'label', outside its 2 classes 0..1" in err


# ---------------------------------------------------------------- segmentation
def _seg_arrays(n: int, seed: int):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 255, (12, 16, 3), dtype=np.uint8) for _ in range(n)]
    masks = [rng.choice(np.array([0, 1, 2, 255], np.uint8), (12, 16)) for _ in range(n)]
    return images, masks


def _seg_split(images, masks):
    import datasets
    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image()})
    return datasets.Dataset.from_dict({"image": [{"bytes": _png(a), "path": None} for a in images],
                                       "mask": [{"bytes": _png(m), "path": None} for m in masks]}, features=features)


def test_segmentation_reads_image_and_mask_columns_like_a_segmentation_folder(tmp_path):
    import datasets
    images, masks = _seg_arrays(3, 6)
    root = _save(datasets.DatasetDict(train=_seg_split(images, masks), val=_seg_split(images, masks)),
                 tmp_path / "seg")
    (root / "classes.txt").write_text("sky\ntree\nroad\n")
    folder = tmp_path / "segfolder"
    for split in ("train", "val"):
        for i, (a, m) in enumerate(zip(images, masks)):
            for sub, arr in (("images", a), ("masks", m)):
                (folder / sub / split).mkdir(parents=True, exist_ok=True)
                Image.fromarray(arr).save(folder / sub / split / f"{i:03d}.png")
    (folder / "classes.txt").write_text("sky\ntree\nroad\n")
    opts = dict(crop_size=(8, 8), scale=(16, 12))
    for train in (False, True):
        hf = create_segmentation_dataset("hfds", root, "train", train=train, **opts)
        ref = create_segmentation_dataset("folder", folder, "train", train=train, **opts)
        assert hf.classes == ref.classes == ["sky", "tree", "road"] and len(hf) == len(ref) == 3
        for i in range(3):
            state = torch.random.get_rng_state()
            x, y = hf[i]
            torch.random.set_rng_state(state)  # the random crop and flip draw alike for both readers
            rx, ry = ref[i]
            assert torch.equal(x, rx) and torch.equal(y, ry)
    assert set(torch.unique(create_segmentation_dataset("hfds", root, "val", **opts)[0][1]).tolist()) <= {0, 1, 2,
                                                                                                          255}


def test_segmentation_errors(tmp_path):
    import datasets
    images, masks = _seg_arrays(2, 7)
    masks[1][0, 0] = 7
    root = _save(datasets.DatasetDict(train=_seg_split(images, masks)), tmp_path / "seg")
    with pytest.raises(FileNotFoundError, match=r"no class names: give classes_file .* or put classes.txt in"):
        create_segmentation_dataset("hfds", root, "train")
    (root / "classes.txt").write_text("sky\ntree\nroad\n")
    data = create_segmentation_dataset("hfds", root, "train", crop_size=(8, 8), scale=(16, 12))
    data[0]
    with pytest.raises(ValueError, match=r"holds values 7 that are no hfds label: allowed 0..2"):
        data[1]
    only_images = datasets.Dataset.from_dict({"image": [{"bytes": _png(a), "path": None} for a in images]},
                                             features=datasets.Features({"image": datasets.Image()}))
    bare = _save(datasets.DatasetDict(train=only_images), tmp_path / "nomask")
    with pytest.raises(ValueError, match=r"has no mask column .*columns there: image \(Image\)"):
        create_segmentation_dataset("hfds", bare, "train", classes_file=root / "classes.txt")
