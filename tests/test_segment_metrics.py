"""Segmentation scores against torchmetrics (the oracle), and the inference modes against each other."""
import pytest
import torch

from simattn.segment.inference import predict, predict_logits
from simattn.segment.metrics import confusion_matrix, scores


@pytest.fixture(scope="module")
def tm():
    """torchmetrics' classification metrics, imported by the tests that use them (a second of every worker's
    collection otherwise)."""
    return pytest.importorskip("torchmetrics.classification")


def _labels(seed, n=6, shape=(3, 17, 23), ignore_share=0.1):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, n, shape, generator=g)
    target[torch.rand(shape, generator=g) < ignore_share] = 255
    # predictions agree with the ground truth on about half the pixels
    pred = torch.where(torch.rand(shape, generator=g) < 0.5, target.clamp(max=n - 1),
                       torch.randint(0, n, shape, generator=g))
    return pred, target


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_match_torchmetrics(seed, tm):
    n = 6
    pred, target = _labels(seed, n)
    result = scores(confusion_matrix(pred, target, n))
    iou = tm.MulticlassJaccardIndex(num_classes=n, average="none", ignore_index=255)(pred, target)
    acc = tm.MulticlassAccuracy(num_classes=n, average="none", ignore_index=255)(pred, target)
    aacc = tm.MulticlassAccuracy(num_classes=n, average="micro", ignore_index=255)(pred, target)
    ours_iou = torch.tensor([result["per_class"][str(c)]["iou"] for c in range(n)], dtype=torch.float64)
    ours_acc = torch.tensor([result["per_class"][str(c)]["acc"] for c in range(n)], dtype=torch.float64)
    torch.testing.assert_close(ours_iou, iou.double() * 100, atol=1e-3, rtol=0)
    torch.testing.assert_close(ours_acc, acc.double() * 100, atol=1e-3, rtol=0)
    assert result["miou"] == pytest.approx(float(iou.mean()) * 100, abs=1e-3)
    assert result["aacc"] == pytest.approx(float(aacc) * 100, abs=1e-3)
    assert result["pixels"] == int((target != 255).sum())


def test_summed_matrix_is_not_a_mean_of_image_means(tm):
    n = 4
    pred, target = _labels(5, n, shape=(4, 9, 11))
    whole = scores(confusion_matrix(pred, target, n))["miou"]
    parts = [confusion_matrix(pred[i], target[i], n) for i in range(4)]
    assert scores(sum(parts))["miou"] == pytest.approx(whole, abs=1e-9)
    oracle = tm.MulticlassJaccardIndex(num_classes=n, average="macro", ignore_index=255)(pred, target)
    assert whole == pytest.approx(float(oracle) * 100, abs=1e-3)


def test_class_absent_everywhere_is_left_out_and_predicted_absent_class_scores_zero():
    target = torch.tensor([[0, 0, 1, 1]])
    pred = torch.tensor([[0, 0, 1, 2]])  # class 2 predicted but absent; class 3 neither
    result = scores(confusion_matrix(pred, target, 4))
    assert result["per_class"]["3"]["iou"] is None
    assert result["per_class"]["2"]["iou"] == 0.0
    assert result["per_class"]["1"]["iou"] == 50.0
    assert result["miou"] == pytest.approx((100 + 50 + 0) / 3, abs=1e-3)
    assert result["aacc"] == pytest.approx(75.0)


def test_label_outside_the_classes_is_an_error():
    with pytest.raises(ValueError, match="label 7 is outside the 4 classes"):
        confusion_matrix(torch.zeros(2, 2, dtype=torch.long), torch.tensor([[0, 7], [1, 255]]), 4)


def _pointwise(num_classes=3):
    conv = torch.nn.Conv2d(3, num_classes, 1)
    torch.nn.init.normal_(conv.weight, generator=torch.Generator().manual_seed(0))
    return conv.eval()


def test_slide_equals_whole_for_a_pointwise_network():
    fn = _pointwise()
    image = torch.randn(1, 3, 37, 50, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = predict_logits(fn, image, 3)
        slide = predict_logits(fn, image, 3, mode="slide", crop=(16, 16), stride=(11, 11))
        small = predict_logits(fn, image[..., :10, :12], 3, mode="slide", crop=(16, 16), stride=(8, 8))
    torch.testing.assert_close(slide, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(small, whole[..., :10, :12], atol=1e-5, rtol=1e-5)


def test_slide_windows_each_take_the_crop_size():
    seen = []

    def fn(x):
        seen.append(tuple(x.shape[-2:]))
        return x[:, :2]
    predict(fn, torch.randn(1, 3, 30, 45), 2, mode="slide", crop=(16, 20), stride=(10, 10))
    assert set(seen) == {(16, 20)} and len(seen) == 3 * 4


def test_flip_and_scales_average_probabilities_and_fixed_input_size_is_honoured():
    fn = _pointwise()
    image = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = predict_logits(fn, image, 3).softmax(1)
        flipped = predict_logits(fn, image, 3, flip=True)
        torch.testing.assert_close(flipped, base, atol=1e-5, rtol=1e-5)  # a pointwise net is flip-equivariant
        sizes = []
        predict(lambda x: sizes.append(tuple(x.shape[-2:])) or fn(x), image, 3, scales=(0.5, 1.5),
                input_size=(8, 8))
    assert sizes == [(8, 8), (8, 8)]
    with pytest.raises(ValueError, match="unknown inference mode"):
        predict(fn, image, 3, mode="tiles")


def test_the_iou_figure_draws_and_labels_the_miou_of_its_title(tmp_path, monkeypatch):
    """The dashed line is the evaluation's mIoU, labelled to the title's precision (a class left out of the bars,
    or a rounding to one decimal, made the two disagree)."""
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    from simattn.segment.report import plot_class_iou
    drawn = []
    real = matplotlib.axes.Axes.axvline
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline",
                        lambda self, x=0, **kw: drawn.append((x, kw.get("label"))) or real(self, x, **kw))
    per_class = {"background": {"iou": 0.94}, "digit": {"iou": 1.0}, "unseen": {"iou": None}}
    assert plot_class_iou(per_class, tmp_path / "iou.png", title="fpn: mIoU 0.97", miou=0.97) == tmp_path / "iou.png"
    assert drawn == [(0.97, "mIoU 0.97")]
