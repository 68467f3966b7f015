"""``simattn viz`` on segmentation weights: per image of the recorded dataset, the image, the predicted mask and the
ground truth overlaid in the dataset's palette side by side, listed in viz.json; options of the other kind of viz
are one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("segmentation_models_pytorch")

import simattn  # noqa: E402,F401  (registers the models)
from simattn.cli import main as simattn_main  # noqa: E402

from cli_inputs import one_line_error  # noqa: E402
from test_segment_deploy import make_weights  # noqa: E402


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_weights(tmp_path_factory.mktemp("segviz") / "final.safetensors")


def test_panels_show_image_prediction_and_truth_side_by_side(weights, tmp_path, capsys):
    from PIL import Image

    from simattn.data.segmentation import color_palette
    from simattn.viz.segmentation import blend, colorize

    out = tmp_path / "viz"
    code = simattn_main(["viz", "--weights", str(weights), "--split", "val", "--count", "3", "--out", str(out),
                         "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "viz.json").read_text())
    assert (summary["task"], summary["dataset"], summary["split"], summary["runtime"]) == \
        ("semantic_segmentation", "digits", "val", "torch")
    assert [r["image"] for r in summary["images"]] == ["val_00000", "val_00001", "val_00002"]
    for record in summary["images"]:
        with Image.open(record["panel"]) as img:
            panel = np.asarray(img.convert("RGB"))
        assert [panel.shape[1], panel.shape[0]] == record["panel_size"] and panel.shape[1] > 2 * panel.shape[0]
        assert "background" in record["classes_shown"] and 0 <= record["pixel_accuracy"] <= 100
        # the legend's colours are the palette's: each class shown has its colour in the panel
        palette = color_palette(11)
        for name in record["classes_shown"]:
            colour = np.array(palette[["background", *map(str, range(10))].index(name)])
            assert (np.abs(panel.astype(int) - colour).sum(-1) <= 6).any(), name
    # the overlay paints labelled pixels only, in the palette's colours
    image = np.full((2, 2, 3), 100, np.uint8)
    labels = np.array([[0, 1], [255, 2]])
    painted = blend(image, labels, [(0, 0, 0), (200, 0, 0), (0, 200, 0)], alpha=1.0)
    assert painted.tolist() == [[[0, 0, 0], [200, 0, 0]], [[100, 100, 100], [0, 200, 0]]]
    assert colorize(labels, [(1, 2, 3)] * 3)[1].tolist() == [[True, True], [False, True]]


@pytest.mark.parametrize("args, message", [
    (["--image", "skimage:camera"], "--image applies to attention maps of classifiers"),
    (["--block", "0", "--cmap", "viridis"], "--block, --cmap applies to attention maps of classifiers"),
    (["--count", "0"], "option '--count': got 0"),
    (["--split", "test"], "digits split 'test'"),
])
def test_segmentation_viz_errors(weights, tmp_path, capsys, args, message):
    code = simattn_main(["viz", "--weights", str(weights), "--out", str(tmp_path / "viz"), *args])
    assert message in one_line_error(capsys, code)
    assert not (tmp_path / "viz" / "viz.json").exists()


def test_segmentation_options_on_a_classifier_viz_are_refused(tmp_path, capsys):
    code = simattn_main(["viz", "--model", "sima_deit_tiny_patch16_224", "--model-kwargs", "img_size=16",
                         "patch_size=4", "embed_dim=32", "depth=1", "num_heads=2", "--count", "2",
                         "--out", str(tmp_path / "viz")])
    assert "--count applies to segmentation weights only" in one_line_error(capsys, code)
    assert not (tmp_path / "viz").exists()
