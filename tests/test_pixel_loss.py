"""The per-pixel cross-entropy in chunks (:mod:`simattn.engine.losses`), with a stand-in limit: the value and
gradient of torch's one call, and a one-line refusal where no chunk fits."""
import pytest
import torch
import torch.nn.functional as F

from simattn.engine import losses
from simattn.engine.losses import PixelCrossEntropy, loss_chunks, pixel_cross_entropy

B, C, H, W = 3, 5, 6, 7
IGNORE = 255


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, C, H, W, generator=g)
    target = torch.randint(C, (B, H, W), generator=g)
    target[0, :2] = IGNORE  # ignored pixels in the first chunk and rows
    target[2, 3, 1:5] = IGNORE
    return logits, target


@pytest.mark.parametrize("limit, chunks", [(2 * C * H * W, 2),  # two images, then one
                                           (C * H * W - 1, B * 2)])  # one image too large: 5 rows, then 1
@pytest.mark.parametrize("options", [{}, {"weight": torch.tensor([0.5, 2.0, 1.0, 0.1, 3.0])},
                                     {"weight": torch.tensor([0.5, 2.0, 1.0, 0.1, 3.0]), "label_smoothing": 0.2}])
def test_chunked_loss_has_the_value_and_gradient_of_one_call(monkeypatch, limit, chunks, options):
    logits, target = _inputs()
    whole = logits.clone().requires_grad_()
    expected = F.cross_entropy(whole.float(), target, ignore_index=IGNORE, **options)
    expected.backward()

    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", limit)
    assert len(loss_chunks(tuple(logits.shape))) == chunks
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda x, *a, **k: calls.append(x.numel()) or real(x, *a, **k))
    chunked = logits.clone().requires_grad_()
    loss = PixelCrossEntropy(ignore_index=IGNORE, **options)(chunked, target)
    loss.backward()
    assert len(calls) == chunks and max(calls) <= limit and sum(calls) == logits.numel()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked.grad, whole.grad, rtol=1e-5, atol=1e-7)


def test_all_ignored_pixels_give_torchs_nan(monkeypatch):
    logits, target = _inputs()
    target[:] = IGNORE
    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", C * H * W)
    assert torch.isnan(pixel_cross_entropy(logits, target, ignore_index=IGNORE))
    assert torch.isnan(F.cross_entropy(logits.float(), target, ignore_index=IGNORE))


def test_a_row_over_the_limit_is_refused_before_any_work(monkeypatch):
    logits, target = _inputs()
    monkeypatch.setattr(losses, "MAX_LOSS_ELEMENTS", C * W - 1)
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: pytest.fail("computed a loss"))
    with pytest.raises(ValueError) as refused:
        pixel_cross_entropy(logits.requires_grad_(), target)
    message = str(refused.value)
    assert "\n" not in message and f"a row of {C} classes × {W} px holds {C * W} logits" in message
    assert f"over the {C * W - 1} one cross-entropy call can take" in message
    with pytest.raises(ValueError, match=r"logits \(B, C, H, W\) and targets \(B, H, W\)"):
        pixel_cross_entropy(logits, target[0])
