"""A segmentation run deployed and scored: ``simattn export`` of segmentation weights to ONNX (dynamic height and
width) and ExecuTorch (static int8 calibrated on the recorded dataset), ``simattn validate`` of the weights
and of each exported file (mIoU on the dataset the record names), ``--save-predictions`` as indexed PNGs in the
dataset's own ids, and an independent check of the reported mIoU (torchmetrics over the saved PNGs and the
dataset's masks on disk). Nothing is trained: the networks are tiny and random."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("segmentation_models_pytorch")

import simattn  # noqa: E402,F401  (registers the models)
from simattn.cli import main as simattn_main  # noqa: E402

from cli_inputs import one_line_error  # noqa: E402

#: the tiny segmenter
TINY = dict(backbone="sima_deit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2,
            decoder_channels=16, segmentation_channels=64)
DIGITS = {"canvas": 32, "num_val": 12, "num_train": 16}


def make_weights(path: Path, *, dataset: str = "digits", data_dir=None, dataset_kwargs=None, crop=(32, 32),
                 img_scale=(32, 32), seed: int = 0) -> Path:
    """A random tiny segmenter saved with the record ``simattn segment`` writes (the task's own functions). Its
    classifier leans to class 0 (background), so that about half the pixels are predicted as such and some are
    right: scores that are not all 0."""
    from simattn.engine.state import export_weights, weights_metadata
    from simattn.models.factory import create_model
    from simattn.segment.config import SegmentConfig
    from simattn.segment.task import backbone_norm, dataset_record, open_segmentation_data

    cfg = SegmentConfig(model="semantic_fpn", model_kwargs=dict(TINY), dataset=dataset, data_dir=data_dir,
                        dataset_kwargs=dict(DIGITS if dataset_kwargs is None else dataset_kwargs),
                        crop_size=list(crop), img_scale=list(img_scale))
    data = open_segmentation_data(cfg, "val", train=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = create_model("semantic_fpn", **TINY, num_classes=data.num_classes).eval()
    with torch.no_grad():
        model.classifier[1].bias[0] += 0.3  # about half the pixels (measured: 23 % at 0.2, 76 % at 0.5)
    mean, std = backbone_norm(TINY["backbone"])
    data_config = {"input_size": [3, *crop], "mean": list(mean), "std": list(std), "interpolation": "bilinear",
                   "crop_pct": 1.0}
    meta = weights_metadata("semantic_fpn", {**TINY, "num_classes": data.num_classes}, data_config,
                            producer="simattn segment", **dataset_record(data, cfg))
    export_weights(model, path, meta)
    return path


def validate(capsys, *argv) -> dict:
    code = simattn_main(["validate", *map(str, argv), "--threads", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    return json.loads(out.out)


def export(capsys, weights, output, *argv) -> dict:
    code = simattn_main(["export", "--weights", str(weights), "-o", str(output), "--threads", "1", *argv])
    out = capsys.readouterr()
    assert code == 0, (out.out[-2000:], out.err[-2000:])
    return json.loads(Path(str(output) + ".json").read_text())


def read_png(path: Path):
    from PIL import Image
    with Image.open(path) as img:
        return img.mode, img.getpalette(), np.asarray(img)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("segrun")
    make_weights(folder / "final.safetensors")
    return folder


@pytest.fixture(scope="module")
def exported(run):
    """The run's weights as an ONNX file and a static int8 ExecuTorch file calibrated on the recorded dataset,
    through ``simattn export`` (the reports too). One ExecuTorch lowering serves every question about a fixed-size
    program: the int8 file lowers the same float graph (norms, decoder, upsampling) around its int8 layers, and the
    fp32 XNNPACK lowering is held to PyTorch in test_export_edge.py and test_export_delegation.py."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("executorch")
    capsys = _NoCapture()
    reports = {"onnx": export(capsys, run / "final.safetensors", run / "seg.onnx", "--format", "onnx"),
               "executorch": export(capsys, run / "final.safetensors", run / "seg8.pte", "--format", "executorch",
                                    "--quantize", "static", "--calib-images", "8")}
    return {"onnx": run / "seg.onnx", "pte": run / "seg8.pte", "reports": reports}


class _NoCapture:
    """Module fixtures cannot take capsys: the command's output goes to the terminal (pytest captures it)."""

    def readouterr(self):
        from types import SimpleNamespace
        return SimpleNamespace(out="", err="")


#: Random weights leave many pixels with nearly tied logits, where int8 rounding (max |logit diff| about 0.1 on
#: these inputs) flips the argmax: the int8 file must still predict what fp32 predicts for 90 % of the pixels
#: (measured: 98.6 % on average, 97.8 % on the worst image) and score within 5 points of pixel accuracy
INT8_AGREEMENT, INT8_AACC_POINTS = 0.9, 5


def test_exported_files_score_the_checkpoints_miou(run, exported, capsys, tmp_path):
    onnx_report, pte_report = exported["reports"]["onnx"], exported["reports"]["executorch"]
    # ONNX keeps height and width dynamic (checked by the exporter at a second size); parity compares logits
    assert onnx_report["export"]["dynamic_spatial"] is True
    assert all(r["ok"] and r["shape"][1:] in ([3, 32, 32], [3, 64, 64]) for r in onnx_report["parity"].values())
    # the int8 file calibrated on the training images of the dataset the weights record
    assert pte_report["calibration"] == {"dataset": "digits", "split": "train", "images": 8}
    # the dataset the weights record rides along, so validate finds the same images
    meta = onnx_report["metadata"]
    assert (meta["task"], meta["dataset"], meta["dataset_kwargs"], meta["img_scale"], meta["label_ids"][:3]) == \
        ("semantic_segmentation", "digits", DIGITS, [32, 32], [0, 1, 2])

    ref = validate(capsys, "--weights", run / "final.safetensors", "--output", tmp_path / "ckpt.json")
    assert json.loads((tmp_path / "ckpt.json").read_text()) == ref
    assert (ref["task"], ref["dataset"], ref["split"], ref["images"], ref["runtime"]) == \
        ("semantic_segmentation", "digits", "val", 12, "torch")
    assert ref["pixels"] == 12 * 32 * 32 and set(ref["per_class"]) == {"background", *map(str, range(10))}
    got = validate(capsys, "--weights", exported["onnx"])
    assert (got["runtime"], got["input_size"], got["images"]) == ("onnxruntime", None, 12)
    assert abs(got["miou"] - ref["miou"]) <= 0.5 and abs(got["aacc"] - ref["aacc"]) <= 0.5, got
    got = validate(capsys, "--weights", exported["pte"])
    assert (got["runtime"], got["input_size"], got["images"]) == ("executorch", [32, 32], 12)
    assert abs(got["aacc"] - ref["aacc"]) <= INT8_AACC_POINTS, (got, ref)

    # another inference: slide windows at 2x scale; a fixed-size program takes windows of its own size
    slide = ["--mode", "slide", "--crop-size", "32", "32", "--stride", "16", "16", "--scales", "2.0"]
    a = validate(capsys, "--weights", run / "final.safetensors", *slide)
    b = validate(capsys, "--weights", exported["pte"], *slide)
    assert a["mode"] == b["mode"] == "slide" and a["crop_size"] == b["crop_size"] == [32, 32] and a["scales"] == [2.0]
    assert abs(a["aacc"] - b["aacc"]) <= INT8_AACC_POINTS and a["miou"] != ref["miou"], (a, b)


def _stems(folder: Path):
    return sorted(p.stem for p in folder.iterdir())


def test_saved_predictions_are_indexed_pngs_in_the_datasets_ids_for_weights_and_files(run, exported, capsys,
                                                                                      tmp_path):
    from simattn.data.segmentation import color_palette
    ckpt, onnx, int8 = tmp_path / "ckpt", tmp_path / "new" / "onnx", tmp_path / "int8"
    (tmp_path / "ckpt").mkdir()  # an empty folder is taken
    validate(capsys, "--weights", run / "final.safetensors", "--save-predictions", ckpt)
    got = validate(capsys, "--weights", exported["onnx"], "--save-predictions", onnx)
    assert got["predictions"] == str(onnx)
    validate(capsys, "--weights", exported["pte"], "--save-predictions", int8)
    stems = [f"val_{i:05d}" for i in range(12)]
    assert _stems(ckpt) == _stems(onnx) == _stems(int8) == stems
    palette = [v for c in color_palette(11) for v in c]
    agree, agree8 = [], []
    for stem in stems:
        (mode_a, pal_a, a), (mode_b, pal_b, b) = read_png(ckpt / f"{stem}.png"), read_png(onnx / f"{stem}.png")
        assert mode_a == mode_b == "P" and pal_a[:33] == pal_b[:33] == palette
        assert a.shape == b.shape == (32, 32) and set(np.unique(a)) <= set(range(11))
        agree.append((a == b).mean())
        agree8.append((a == read_png(int8 / f"{stem}.png")[2]).mean())
    assert np.mean(agree) > 0.999
    assert np.mean(agree8) >= INT8_AGREEMENT, np.mean(agree8)


# ---------------------------------------------------------------- the oracle: an independent mIoU
@pytest.fixture(scope="module")
def ade(tmp_path_factory):
    """An ADE20K-layout folder (``images/validation/*.png``, ``annotations/validation/*.png`` in ADE20K's own ids:
    0 = other (ignored), k = class k) of 64x64 digit scenes, and a 150-class segmenter trained on 'it' (random)."""
    from PIL import Image

    from simattn.data.segmentation import DigitScenes
    root = tmp_path_factory.mktemp("ade") / "ADEChallengeData2016"
    scenes = DigitScenes("val", num_val=6, canvas=64, seed=3)
    for folder in ("images", "annotations"):
        (root / folder / "validation").mkdir(parents=True)
    for i in range(len(scenes)):
        image, mask = scenes.read(i)
        ade_ids = (mask + 1).astype(np.uint8)  # train id k -> ADE20K label k + 1
        ade_ids[:3] = 0  # a band of unlabelled pixels
        Image.fromarray(image).save(root / "images" / "validation" / f"ADE_val_{i:08d}.png")
        Image.fromarray(ade_ids, mode="L").save(root / "annotations" / "validation" / f"ADE_val_{i:08d}.png")
    weights = make_weights(root.parent / "ade.safetensors", dataset="ade20k", data_dir=str(root), dataset_kwargs={},
                           img_scale=(64, 32), seed=1)
    return root, weights


def test_reported_miou_equals_torchmetrics_over_the_saved_pngs_and_the_masks_on_disk(ade, capsys, tmp_path):
    from PIL import Image
    from torchmetrics.classification import MulticlassJaccardIndex

    root, weights = ade
    out = tmp_path / "preds"
    result = validate(capsys, "--weights", weights, "--save-predictions", out)
    assert result["dataset"] == "ade20k" and result["data_dir"] == str(root) and result["images"] == 6
    # independent of simattn: PIL reads both, torchmetrics scores them (ADE20K ids, 0 ignored, 150 classes)
    metric = MulticlassJaccardIndex(num_classes=151, ignore_index=0, average="macro")
    masks = sorted((root / "annotations" / "validation").iterdir())
    assert sorted(p.name for p in out.iterdir()) == [m.name for m in masks]
    for mask in masks:
        truth = torch.from_numpy(np.asarray(Image.open(mask)).astype(np.int64))
        pred = torch.from_numpy(np.asarray(Image.open(out / mask.name)).astype(np.int64))
        assert pred.shape == truth.shape == (64, 64) and int(pred.min()) >= 1  # full size, ADE ids 1..150
        metric.update(pred[None], truth[None])
    assert float(metric.compute()) * 100 == pytest.approx(result["miou"], abs=1e-3)
    assert result["miou"] > 0


def test_a_train_state_is_scored_like_its_safetensors(run, capsys, tmp_path):
    """``last.pth`` records the run's config, not the weights record: the dataset comes from it."""
    from simattn.models.sources import read_weights_record
    from simattn.segment.config import SegmentConfig
    from simattn.utils.io import load_checkpoint

    record = read_weights_record(run / "final.safetensors")
    cfg = SegmentConfig(model="semantic_fpn", model_kwargs=dict(TINY), dataset="digits", dataset_kwargs=DIGITS,
                        crop_size=[32, 32], img_scale=[32, 32])
    state = {"task": "simattn segment", "model_name": "semantic_fpn", "model_kwargs": record.create_kwargs(),
             "config": cfg.to_dict(), "data_config": record.data_config,
             "model": load_checkpoint(run / "final.safetensors")}
    torch.save(state, tmp_path / "last.pth")
    a = validate(capsys, "--weights", run / "final.safetensors")
    b = validate(capsys, "--weights", tmp_path / "last.pth")
    assert (b["miou"], b["per_class"], b["dataset"]) == (a["miou"], a["per_class"], "digits")


# ---------------------------------------------------------------- errors: one line, exit 2, nothing written
@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from simattn.models.factory import create_model
    from simattn.models.weights import save_weights, weights_metadata
    kwargs = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10)
    path = tmp_path_factory.mktemp("cls") / "cls.safetensors"
    save_weights(create_model("sima_deit_tiny_patch16_224", **kwargs), path,
                 weights_metadata("sima_deit_tiny_patch16_224", kwargs, producer="test"))
    return path


@pytest.mark.parametrize("args, message", [
    (["--save-predictions", "{tmp}/full"], "--save-predictions {tmp}/full: the folder is not empty"),
    (["--save-predictions", "{weights}"], "--save-predictions {weights} is the --weights input"),
    (["--save-predictions", "{tmp}/full/keep.png"], "{tmp}/full/keep.png: exists and is not a folder"),
    (["--img-size", "64"], "--img-size applies to classifiers only"),
    (["--crop-pct", "0.9", "--batch-size", "8"], "--crop-pct, --batch-size applies to classifiers only"),
    (["--dataset", "cifar10"], "--dataset cifar10: final.safetensors holds a segmenter"),
    (["--mode", "tiles"], "option '--mode': got 'tiles'; allowed: one of whole, slide"),
    (["--stride", "0", "4"], "option '--stride': got [0, 4]"),
    (["--split", "test"], "digits split 'test'"),
])
def test_segmentation_input_errors(run, tmp_path, capsys, args, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.png").write_bytes(b"x")
    fill = {"tmp": tmp_path, "weights": run / "final.safetensors"}
    argv = [a.format(**fill) for a in args]
    code = simattn_main(["validate", "--weights", str(run / "final.safetensors"), *argv])
    err = one_line_error(capsys, code)
    assert message.format(**fill) in err, err
    assert (tmp_path / "full" / "keep.png").read_bytes() == b"x" and sorted(tmp_path.iterdir()) == [tmp_path / "full"]


@pytest.mark.parametrize("args, message", [
    (["--save-predictions", "{tmp}/p"], "--save-predictions applies to segmentation weights only"),
    (["--mode", "slide", "--flip"], "--mode, --flip applies to segmentation weights only"),
    (["--dataset", "ade20k"], "--dataset ade20k (a segmentation dataset): cls.safetensors holds a classifier"),
])
def test_segmentation_options_on_a_classifier_are_refused(classifier, tmp_path, capsys, args, message):
    code = simattn_main(["validate", "--weights", str(classifier), *[a.format(tmp=tmp_path) for a in args]])
    assert message.format(tmp=tmp_path) in one_line_error(capsys, code)
    assert list(tmp_path.iterdir()) == []


def test_export_and_deployed_file_errors(run, exported, tmp_path, capsys):
    code = simattn_main(["export", "--weights", str(run / "final.safetensors"), "--format", "executorch",
                         "--quantize", "static", "--calib-data", "digits", "-o", str(tmp_path / "x.pte")])
    assert "--calib-data digits: segmentation weights calibrate on the training images of the dataset they record" \
        in one_line_error(capsys, code)
    code = simattn_main(["validate", "--weights", str(exported["pte"]), "--mode", "slide", "--crop-size", "16", "16"])
    assert "--crop-size 16 16: seg8.pte takes 32x32 inputs only" in one_line_error(capsys, code)
    code = simattn_main(["validate", "--weights", str(exported["onnx"]), "--use-ema"])
    assert "--use-ema do(es) not apply to an exported file (seg.onnx)" in one_line_error(capsys, code)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_onnx_height_and_width_stay_dynamic_as_multiples_of_the_segmenters_stride(tmp_path):
    """A UFO-ViT segmenter: torch.export cannot prove that free sizes halve evenly down the decoder (and the
    TorchScript tracer freezes the position embedding's resampling), so sizes are exported as multiples of 32."""
    pytest.importorskip("onnxruntime")
    from simattn.deploy.onnx import export_and_verify
    from simattn.models.factory import create_model
    from simattn.models.weights import export_record

    kwargs = dict(backbone="ufo_vit_tiny", img_size=64, embed_dim=32, depth=4, num_heads=2, num_classes=5,
                  decoder_channels=16, segmentation_channels=64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = create_model("semantic_fpn", **kwargs).eval()
    record = export_record("semantic_fpn", kwargs, {"input_size": [3, 64, 64], "mean": [0.5] * 3, "std": [0.25] * 3})
    result, parity = export_and_verify(model, tmp_path / "ufo.onnx", record, threads=1, spatial_multiple=32)
    assert (result.exporter, result.dynamic_spatial) == ("dynamo", True), result.notes
    assert parity["random_b1_96x96"]["ok"] and parity["random_b1_96x96"]["max_abs_diff"] < 1e-4
