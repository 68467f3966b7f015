"""Segmentation datasets: ADE20K, VOC, Cityscapes and folder layouts read from tiny fixtures, their label mappings,
the joint transforms (alignment, padding, cat_max_ratio, reproducibility), the embedded digit scenes, and the
one-line errors for bad data."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from simattn.data.digit_scenes import DIGIT_SCENE_CLASSES, digit_scenes
from simattn.data.seg_transforms import SegEvalTransform, SegTrainTransform, photometric_distortion, rescale_size
from simattn.data.segmentation import (ADE20K_CLASSES, VOC_CLASSES, DigitScenes, color_palette,
                                       create_segmentation_dataset)


def _image(path: Path, h: int = 10, w: int = 12, seed: int = 0) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return arr


def _mask(path: Path, values: np.ndarray, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(values.astype(np.uint8), mode="L")
    if mode == "P":
        img = img.convert("P")
        img.putpalette([v for c in color_palette(256) for v in c])
        img.putdata(values.reshape(-1).tolist())
    elif mode != "L":
        img = img.convert(mode)
    img.save(path)


def _labels(h: int = 10, w: int = 12, values=(0, 1, 2)) -> np.ndarray:
    out = np.zeros((h, w), np.int64)
    for i, v in enumerate(values):  # vertical stripes
        out[:, i * w // len(values):] = v
    return out


def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and text, text
    return text


def _folder(root: Path, names=("sky", "road", "car"), split: str = "train") -> Path:
    (root / "classes.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(names) + "\n")
    _image(root / "images" / split / "a.jpg")
    _mask(root / "masks" / split / "a.png", _labels(values=(0, 1, 255)))
    _image(root / "images" / split / "b.png", seed=1)
    _mask(root / "masks" / split / "b.png", _labels(values=(2, 2, 0)))
    return root


# ------------------------------------------------------------------------------------------------ layouts
def test_ade20k_layout_maps_zero_to_ignore_and_k_to_k_minus_1(tmp_path):
    root = tmp_path / "ADEChallengeData2016"
    for split, folder in (("train", "training"), ("val", "validation")):
        _image(root / "images" / folder / f"ADE_{split}_00000001.jpg")
        _mask(root / "annotations" / folder / f"ADE_{split}_00000001.png", _labels(values=(0, 1, 150)))
    for given in (root, tmp_path):  # the ADEChallengeData2016 folder or the folder holding it
        ds = create_segmentation_dataset("ade20k", given, "val", train=False)
        assert len(ds) == 1 and ds.stems == ["ADE_val_00000001"]
    assert ds.num_classes == 150 and ds.classes == list(ADE20K_CLASSES) and ds.classes[0] == "wall"
    assert ds.label_ids[0] == 1 and ds.label_ids[149] == 150 and len(ds.palette) == 150
    image, mask = ds.read(0)
    assert image.shape == (10, 12, 3) and image.dtype == np.uint8 and mask.dtype == np.int64
    np.testing.assert_array_equal(mask, _labels(values=(255, 0, 149)))
    np.testing.assert_array_equal(ds.encode_prediction(mask), _labels(values=(0, 1, 150)))
    x, m = ds[0]
    assert x.dtype == torch.float32 and m.dtype == torch.int64 and m.shape == (10, 12)
    assert len(create_segmentation_dataset("ade20k", root, "train", crop_size=8, scale=(16, 8))) == 1


def test_voc_layout_reads_palette_indices_and_keeps_255(tmp_path):
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    for i, stem in enumerate(("2007_000032", "2007_000033")):
        _image(voc / "JPEGImages" / f"{stem}.jpg", seed=i)
        _mask(voc / "SegmentationClass" / f"{stem}.png", _labels(values=(0, 15, 255)), mode="P")
    _image(voc / "JPEGImages" / "2007_000099.jpg")  # in no split file: not a sample, no error
    (voc / "ImageSets" / "Segmentation").mkdir(parents=True)
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("2007_000033\n2007_000032\n")
    assert Image.open(voc / "SegmentationClass" / "2007_000032.png").mode == "P"
    for root in (voc, tmp_path / "VOCdevkit"):
        ds = create_segmentation_dataset("voc", root, "train", train=False)
        assert ds.stems == ["2007_000033", "2007_000032"]  # the split file's order
    assert ds.classes == list(VOC_CLASSES) and ds.num_classes == 21 and ds.palette[15] == (192, 128, 128)
    _, mask = ds.read(1)
    np.testing.assert_array_equal(mask, _labels(values=(0, 15, 255)))
    np.testing.assert_array_equal(ds.encode_prediction(mask), _labels(values=(0, 15, 255)))


def test_cityscapes_layout_maps_label_ids_to_train_ids(tmp_path):
    stem = "aachen_000000_000019"
    _image(tmp_path / "leftImg8bit" / "val" / "aachen" / f"{stem}_leftImg8bit.png")
    city = tmp_path / "gtFine" / "val" / "aachen"
    _mask(city / f"{stem}_gtFine_labelIds.png", _labels(values=(7, 26, 0)))
    _mask(city / f"{stem}_gtFine_color.png", _labels(), mode="RGB")  # the other gtFine files are not read
    ds = create_segmentation_dataset("cityscapes", tmp_path, "val", train=False)
    assert ds.stems == [stem] and ds.num_classes == 19
    assert ds.classes[0] == "road" and ds.classes[13] == "car" and ds.palette[0] == (128, 64, 128)
    assert ds.label_ids[0] == 7 and ds.label_ids[13] == 26
    _, mask = ds.read(0)
    np.testing.assert_array_equal(mask, _labels(values=(0, 13, 255)))  # road, car, unlabeled
    np.testing.assert_array_equal(ds.encode_prediction(mask), _labels(values=(7, 26, 0)))


def test_folder_layout_with_classes_txt_or_a_classes_file(tmp_path):
    root = _folder(tmp_path / "data")
    ds = create_segmentation_dataset("folder", root, "train", train=False)
    assert ds.stems == ["a", "b"] and ds.classes == ["sky", "road", "car"] and len(set(ds.palette)) == 3
    image, mask = ds.read(0)
    assert image.shape == (10, 12, 3)
    np.testing.assert_array_equal(mask, _labels(values=(0, 1, 255)))
    other = tmp_path / "names.txt"
    other.write_text("a\nb\nc\nd\n")
    assert create_segmentation_dataset("folder", root, "train", train=False, classes_file=other).classes == list("abcd")


# ------------------------------------------------------------------------------------------------ transforms
def _stripes(h: int, w: int) -> tuple:
    """An image whose red channel encodes the label of each pixel (unequal stripes and a block, so a flip or a
    shift of one but not the other shows)."""
    label = np.zeros((h, w), np.uint8)
    label[:, w // 5:] = 1
    label[:, w // 2:] = 2
    label[h // 3: 2 * h // 3, w // 8: w // 3] = 3
    image = np.zeros((h, w, 3), np.uint8)
    image[..., 0] = 40 * label + 20
    image[..., 1] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    return image, label


def test_train_transform_keeps_image_and_mask_aligned():
    image, label = _stripes(60, 90)
    t = SegTrainTransform(crop_size=(40, 48), scale=(90, 60), ratio_range=(0.5, 2.0), cat_max_ratio=0.75,
                          hflip_prob=0.5, photometric=False, mean=0.0, std=1.0)
    for seed in range(12):
        x, m = t(image, label, np.random.default_rng(seed))
        assert x.shape == (3, 40, 48) and x.dtype == torch.float32 and m.shape == (40, 48) and m.dtype == torch.int64
        decoded = torch.round((x[0] * 255 - 20) / 40).long()
        inside = m != 255
        assert inside.any()
        assert (decoded[inside] == m[inside]).float().mean() > 0.9, seed  # only resampled edges may differ
        assert torch.all(x[:, ~inside] == 0)  # padding: image 0, mask 255


def test_pad_is_ignore_and_eval_keeps_the_mask_at_original_size():
    image, label = _stripes(20, 30)
    t = SegTrainTransform(crop_size=(64, 48), scale=(30, 20), ratio_range=(1.0, 1.0), hflip_prob=0.0,
                          photometric=False)
    x, m = t(image, label, np.random.default_rng(0))
    assert x.shape == (3, 64, 48)
    assert torch.equal(m[:20, :30], torch.from_numpy(label.astype(np.int64)))
    assert torch.all(m[20:] == 255) and torch.all(m[:, 30:] == 255) and torch.all(x[:, 20:] == 0)
    assert rescale_size(40, 100, (50, 20)) == (20, 50)  # long side <= 50 and short side <= 20
    x, m = SegEvalTransform(scale=(50, 20))(np.zeros((40, 100, 3), np.uint8), np.zeros((40, 100), np.int64))
    assert x.shape == (3, 20, 50) and m.shape == (40, 100) and m.dtype == torch.int64


def test_cat_max_ratio_redraws_crops_dominated_by_one_class():
    label = np.zeros((64, 64), np.uint8)
    label[:, :32] = 1
    image = np.zeros((64, 64, 3), np.uint8)

    def worst(cat_max_ratio: float) -> float:
        t = SegTrainTransform(crop_size=32, scale=64, ratio_range=(1.0, 1.0), cat_max_ratio=cat_max_ratio,
                              hflip_prob=0.0, photometric=False)
        ratios = []
        for seed in range(20):
            _, m = t(image, label, np.random.default_rng(seed))
            ratios.append(torch.bincount(m.reshape(-1), minlength=2).max().item() / m.numel())
        return max(ratios)

    assert worst(1.0) == 1.0  # without the check, some crops hold one class only
    assert worst(0.75) < 0.75
    # one class only: no crop can satisfy the ratio, the last draw is kept
    t = SegTrainTransform(crop_size=32, scale=64, ratio_range=(1.0, 1.0), cat_max_ratio=0.5, photometric=False)
    assert t(image, np.zeros((64, 64), np.uint8))[1].shape == (32, 32)


def test_train_transform_is_reproducible_under_torch_seed_and_leaves_numpy_global_rng_alone():
    image, label = _stripes(48, 64)
    t = SegTrainTransform(crop_size=32, scale=(64, 48))
    state = np.random.get_state()[1].copy()
    torch.manual_seed(7)
    a = t(image, label)
    torch.manual_seed(7)
    b = t(image, label)
    torch.manual_seed(8)
    c = t(image, label)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert np.array_equal(np.random.get_state()[1], state)


def test_photometric_distortion_changes_colours_only():
    image, _ = _stripes(16, 16)
    out = [photometric_distortion(image, np.random.default_rng(s)) for s in range(6)]
    assert all(o.shape == image.shape and o.dtype == np.uint8 for o in out)
    assert any(not np.array_equal(o, image) for o in out)


# ------------------------------------------------------------------------------------------------ digit scenes
def test_digit_scenes_are_deterministic_per_split_and_index():
    a = DigitScenes("train", num_train=12, canvas=32)
    fresh = digit_scenes.__wrapped__("train", 12, 32, (2, 4), (6, 20), 0)  # generated again, not from the cache
    assert np.array_equal(a.scene_images, fresh[0]) and np.array_equal(a.scene_masks, fresh[1])
    fewer = DigitScenes("train", num_train=5, canvas=32)  # scene i does not depend on how many are made
    assert np.array_equal(fewer.read(4)[0], a.read(4)[0])
    val = DigitScenes("val", num_val=12, canvas=32)
    assert not np.array_equal(val.scene_images, a.scene_images)
    assert not np.array_equal(DigitScenes("train", num_train=12, canvas=32, seed=1).scene_images, a.scene_images)
    assert a.classes == list(DIGIT_SCENE_CLASSES) and a.num_classes == 11 and a.stems[3] == "train_00003"
    image, mask = a.read(0)
    assert image.shape == (32, 32, 3) and mask.shape == (32, 32) and mask.dtype == np.int64
    masks = a.scene_masks
    assert masks.max() <= 10 and (masks == 0).mean() > 0.3 and len(np.unique(masks)) > 5
    ds = create_segmentation_dataset("digits", None, "train", crop_size=32, scale=32, num_train=12, canvas=32)
    x, m = ds[0]
    assert x.shape == (3, 32, 32) and m.shape == (32, 32) and int(m.max()) <= 10


def test_digit_scene_options_are_checked():
    with pytest.raises(ValueError, match="canvas") as e:
        DigitScenes("train", canvas=8)
    _one_line(e)
    with pytest.raises(ValueError, match="digit_size"):
        DigitScenes("train", num_train=2, canvas=32, digit_size=(10, 40))
    with pytest.raises(ValueError, match="split"):
        DigitScenes("test")


# ------------------------------------------------------------------------------------------------ bad data
def test_mask_size_differing_from_its_image_is_one_line_naming_the_file(tmp_path):
    root = _folder(tmp_path)
    _mask(root / "masks" / "train" / "b.png", _labels(h=11))
    ds = create_segmentation_dataset("folder", root, "train", train=False)
    ds.read(0)
    with pytest.raises(ValueError) as e:
        ds.read(1)
    assert "b.png" in _one_line(e) and "12x11" in str(e.value) and "12x10" in str(e.value)


@pytest.mark.parametrize("layout", ["folder", "ade20k", "voc", "cityscapes"])
def test_a_label_outside_the_classes_is_one_line_naming_the_file(tmp_path, layout):
    bad = _labels(values=(0, 1, 200))
    if layout == "folder":
        root = _folder(tmp_path)
        _mask(root / "masks" / "train" / "b.png", bad)
    elif layout == "ade20k":
        root = tmp_path
        _image(root / "images" / "training" / "x.jpg")
        _mask(root / "annotations" / "training" / "x.png", bad)
    elif layout == "voc":
        root = tmp_path
        _image(root / "JPEGImages" / "x.jpg")
        _mask(root / "SegmentationClass" / "x.png", bad, mode="P")
        (root / "ImageSets" / "Segmentation").mkdir(parents=True)
        (root / "ImageSets" / "Segmentation" / "train.txt").write_text("x\n")
    else:
        root = tmp_path
        _image(root / "leftImg8bit" / "train" / "c" / "x_leftImg8bit.png")
        _mask(root / "gtFine" / "train" / "c" / "x_gtFine_labelIds.png", bad)
    ds = create_segmentation_dataset(layout, root, "train", train=False)
    with pytest.raises(ValueError) as e:
        ds.read(len(ds) - 1)
    assert "200" in _one_line(e) and ".png" in str(e.value) and "allowed" in str(e.value)


def test_an_image_without_a_mask_is_found_when_the_dataset_is_opened(tmp_path):
    root = _folder(tmp_path)
    _image(root / "images" / "train" / "c.jpg")
    with pytest.raises(ValueError) as e:
        create_segmentation_dataset("folder", root, "train")
    assert "c.jpg" in _one_line(e) and "no mask" in str(e.value)


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_a_colour_mask_is_refused_where_an_index_mask_is_expected(tmp_path, mode):
    root = _folder(tmp_path)
    _mask(root / "masks" / "train" / "a.png", _labels(), mode=mode)
    ds = create_segmentation_dataset("folder", root, "train", train=False)
    with pytest.raises(ValueError) as e:
        ds.read(0)
    assert "a.png" in _one_line(e) and f"mode {mode}" in str(e.value) and "'P'" in str(e.value)


def test_missing_root_split_folder_or_split_file_is_one_line_file_not_found(tmp_path):
    for name in ("ade20k", "voc", "cityscapes", "folder"):
        with pytest.raises(FileNotFoundError) as e:
            create_segmentation_dataset(name, tmp_path / "nowhere", "train")
        assert "nowhere" in _one_line(e)
    root = _folder(tmp_path / "data")
    with pytest.raises(FileNotFoundError) as e:
        create_segmentation_dataset("folder", root, "val")
    assert "images/val" in _one_line(e)
    (tmp_path / "voc" / "ImageSets" / "Segmentation").mkdir(parents=True)
    (tmp_path / "voc" / "ImageSets" / "Segmentation" / "train.txt").write_text("x\n")
    with pytest.raises(FileNotFoundError) as e:
        create_segmentation_dataset("voc", tmp_path / "voc", "val")
    assert "val.txt" in _one_line(e) and "train" in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        create_segmentation_dataset("folder", root, "train", classes_file=tmp_path / "none.txt")
    assert "none.txt" in _one_line(e)


def test_unknown_names_and_misplaced_options_are_one_line_errors(tmp_path):
    for call, words in [
        (lambda: create_segmentation_dataset("coco", tmp_path), "known"),
        (lambda: create_segmentation_dataset("folder", tmp_path, canvas=64), "digits"),
        (lambda: create_segmentation_dataset("ade20k", None), "data directory"),
        (lambda: create_segmentation_dataset("digits", None, canvass=64), "known: num_train"),
        (lambda: create_segmentation_dataset("digits", None, crop_size=(0, 4)), "crop_size"),
        (lambda: create_segmentation_dataset("digits", None, ratio_range=(2.0, 1.0)), "ratio_range"),
        (lambda: create_segmentation_dataset("digits", None, cat_max_ratio=1.5), "cat_max_ratio"),
        (lambda: create_segmentation_dataset("digits", None, std=(1, 0, 1)), "std"),
    ]:
        with pytest.raises(ValueError) as e:
            call()
        assert words in _one_line(e)
