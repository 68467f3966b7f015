"""The segmenters (Semantic FPN, UperNet) over each backbone family: the four levels' strides, outputs, gradients,
and rebuilding from a weights file."""
import pytest
import torch

from simattn.models.factory import create_model, load_model
from simattn.models.segmentation import FeaturePyramid, evenly_spaced_blocks

pytest.importorskip("segmentation_models_pytorch")

TINY_VIT = dict(img_size=64, patch_size=16, embed_dim=32, depth=4, num_heads=2)
BACKBONES = {
    "sima_deit_tiny_patch16_224": TINY_VIT,
    "sima_nano_12_p16": dict(img_size=64, embed_dim=32, depth=4, num_heads=2),
    "sima_cvt_13": dict(img_size=64, embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2)),
    "soft_tiny": dict(img_size=64, embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
}


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_levels_have_strides_4_to_32(backbone):
    body = create_model(backbone, num_classes=0, **BACKBONES[backbone])
    levels = FeaturePyramid(body)(torch.randn(1, 3, 64, 64))
    assert [tuple(level.shape[-2:]) for level in levels] == [(16, 16), (8, 8), (4, 4), (2, 2)]


@pytest.mark.parametrize("head", ["semantic_fpn", "upernet"])
@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_segmenter_logits_and_gradients(head, backbone):
    torch.manual_seed(0)
    model = create_model(head, backbone=backbone, num_classes=5, decoder_channels=16, segmentation_channels=32,
                         aux_channels=8, **BACKBONES[backbone])
    x = torch.randn(2, 3, 64, 64)
    out = model.train()(x)
    if head == "upernet":  # the auxiliary head's logits come along while training
        assert isinstance(out, tuple) and out[1].shape == (2, 5, 64, 64)
        out = out[0] + out[1]
    assert out.shape == (2, 5, 64, 64)
    out.square().mean().backward()
    attn = [p for n, p in model.named_parameters() if "attn" in n and p.requires_grad]
    assert attn and all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn)
    assert model.eval()(x).shape == (2, 5, 64, 64)


def test_attn_type_reaches_the_backbone():
    sima = create_model("semantic_fpn", backbone="sima_deit_tiny_patch16_224", num_classes=3, **TINY_VIT)
    soft = create_model("semantic_fpn", backbone="sima_deit_tiny_patch16_224", num_classes=3, attn_type="softmax",
                        **TINY_VIT)
    assert (sima.attn_type, soft.attn_type) == ("sima", "softmax")


def test_plain_backbone_taps_evenly_spaced_blocks():
    assert evenly_spaced_blocks(12) == [2, 5, 8, 11]
    assert evenly_spaced_blocks(4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="at least 4 blocks"):
        evenly_spaced_blocks(3)


def test_bad_head_options_are_one_line_errors():
    with pytest.raises(ValueError, match="out_indices"):
        create_model("semantic_fpn", backbone="sima_deit_tiny_patch16_224", num_classes=3, out_indices=[0, 1],
                     **TINY_VIT)
    with pytest.raises(ValueError, match="needs backbone"):
        create_model("upernet", num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        create_model("upernet", backbone="sima_deit_tiny_patch16_224", num_classes=0, **TINY_VIT)


def test_weights_file_rebuilds_the_segmenter(tmp_path):
    from simattn.models.weights import save_weights, weights_metadata
    kwargs = dict(backbone="sima_deit_tiny_patch16_224", num_classes=4, attn_type="softmax", **TINY_VIT)
    model = create_model("semantic_fpn", **kwargs).eval()
    path = tmp_path / "seg.safetensors"
    save_weights(model, path, weights_metadata("semantic_fpn", kwargs, producer="simattn segment"))
    loaded, spec = load_model(weights=path)
    x = torch.randn(1, 3, 64, 64)
    assert spec["model"] == "semantic_fpn" and loaded.attn_type == "softmax"
    torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize("head", ["semantic_fpn", "upernet"])
def test_channels_last_levels_change_speed_not_values(head):
    # Eager forwards run the levels and decoder channels-last; the logits must equal the NCHW forward's (values and
    # gradients), come back NCHW, and an exported graph must carry no layout conversion.
    torch.manual_seed(0)
    model = create_model(head, backbone="sima_deit_tiny_patch16_224", num_classes=5, decoder_channels=16,
                         segmentation_channels=32, aux_head=False, **TINY_VIT).eval()
    assert model.neck.channels_last
    x = torch.randn(2, 3, 64, 64, requires_grad=True)
    fast = model(x)
    levels = model.neck(x)
    assert all(level.is_contiguous(memory_format=torch.channels_last) for level in levels)
    assert fast.is_contiguous()
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), x)
    model.neck.channels_last = False
    plain = model(x)
    (grad_plain,) = torch.autograd.grad(plain.square().sum(), x)
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5)
    # fp32 sums in another order: a bound relative to the gradient's scale
    torch.testing.assert_close(grad_fast, grad_plain, rtol=1e-3, atol=1e-4 * float(grad_plain.abs().max()))
    model.neck.channels_last = True
    program = torch.export.export(model, (torch.randn(1, 3, 64, 64),))
    assert not any("memory_format" in str(node.kwargs) for node in program.graph.nodes)


@pytest.mark.parametrize("head", ["semantic_fpn", "upernet"])
def test_any_input_size_is_padded_to_the_stride_and_cropped_back(head):
    """A 70x83 image gives 70x83 logits (and auxiliary logits): the logits of the image padded with zeros at the
    bottom and right to 96x96 (mmseg's size_divisor 32), cropped; an input that fits is not padded."""
    torch.manual_seed(0)
    model = create_model(head, backbone="pvt_tiny", num_classes=3, decoder_channels=32, segmentation_channels=32,
                         aux_channels=8, img_size=64, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                         num_heads=(1, 2, 2, 4), mlp_ratios=(2, 2, 2, 2)).eval()
    x = torch.randn(1, 3, 70, 83)
    with torch.no_grad():
        out = model(x)
        padded = model(torch.nn.functional.pad(x, (0, 13, 0, 26)))
    assert out.shape == (1, 3, 70, 83) and padded.shape == (1, 3, 96, 96)
    torch.testing.assert_close(out, padded[..., :70, :83], rtol=0, atol=0)
    if head == "upernet":
        logits, aux = model.train()(torch.cat([x, x]))  # BatchNorm in training takes more than one value
        assert logits.shape == aux.shape == (2, 3, 70, 83)
