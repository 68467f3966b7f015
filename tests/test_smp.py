"""The registered models as encoders of segmentation_models_pytorch (smp) 0.6, through timm's contracts.

smp builds ``tu-<name>`` encoders with ``timm.create_model``, passing the model's own kwargs through, except those
smp itself takes: ``depth`` (smp's ``encoder_depth``) and ``output_stride``. So a ViT/XCiT's block count cannot be
set through smp, and the ViT-like models here keep their registered depth (narrowed to 32 channels, they stay
cheap at 64×64). What each decoder needs:

- DPT (``TimmViTEncoder``): ``forward_intermediates(x, indices=..., intermediates_only=True,
  return_prefix_tokens=True)`` when the model has prefix tokens, giving (spatial map, prefix tokens) pairs, and
  ``feature_info`` with one entry per block. The ViTs (sima_vit, relu_vit), XCiT-SimA and UFO-ViT work.
- UPerNet, FPN and the other ``TimmUniversalEncoder`` decoders: ``features_only=True`` whose ``feature_info``
  reductions are 4, 8, 16, 32 (transformer-style; smp adds an empty 1/2 level) or 2, 4, 8, ... . The SOFT pyramids
  (4 stages, 1/4 to 1/32) work with the defaults; CvT (3 stages, 1/4 to 1/16) needs ``encoder_depth=4`` (smp's
  default 5 asks for a fourth stage) and works with UPerNet, not FPN. The tests named ``..._not_supported_by_smp``
  say what smp lacks; they fail once smp takes these models, so that these notes can be updated.

DeepLabV3(+) and PAN ask for a dilated encoder (``output_stride`` 8 or 16), which none of these models is (their
constructors reject the kwarg). Training-mode UPerNet needs a batch of at least 2 for any encoder: its pyramid
pooling normalizes a 1×1 pooled map with BatchNorm.
"""
import re

import pytest
import timm
import torch

smp = pytest.importorskip("segmentation_models_pytorch")

import simattn.models  # noqa: E402,F401  (registers the models with timm)

CLASSES = 3
SIZE = 64
_VIT = dict(img_size=SIZE, embed_dim=32, num_heads=2)
_DPT = dict(decoder_intermediate_channels=(16, 16, 16, 16), decoder_fusion_channels=16)
_UPERNET = dict(decoder_channels=16)
_FPN = dict(decoder_pyramid_channels=32, decoder_segmentation_channels=32)
_CVT = dict(img_size=SIZE, embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2))
_SOFT = dict(img_size=SIZE, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2),
             stem_chans=8, v_conv_kernels=(3, 3, 3))

# the token attention of the encoder's blocks (XCiT's class-attention blocks do not feed the segmentation maps)
_ATTN_WEIGHT = re.compile(r"(?<!cls_attn_)blocks\.\d+\.attn\..*weight$")


def _segments_and_trains(model: torch.nn.Module, batch: int = 1) -> None:
    """A (batch, 3, 64, 64) input gives (batch, classes, 64, 64) logits, and a backward reaches every attention
    weight of the encoder's blocks."""
    torch.manual_seed(0)
    out = model(torch.randn(batch, 3, SIZE, SIZE))
    assert out.shape == (batch, CLASSES, SIZE, SIZE)
    out.square().mean().backward()
    weights = {n: p for n, p in model.encoder.named_parameters() if _ATTN_WEIGHT.search(n)}
    assert weights
    for name, param in weights.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
        assert torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize("name, readout", [
    ("sima_deit_tiny_patch16_224", "cat"),
    ("relu_vit_small_patch16_224", "cat"),  # class token, tanh pre-logits layer
    ("relu_vit_small_patch16_gap_224", "ignore"),  # no prefix token: DPT reads out nothing
])
def test_vit_with_dpt(name, readout):
    model = smp.DPT(f"tu-{name}", encoder_weights=None, classes=CLASSES, decoder_readout=readout, **_DPT, **_VIT)
    _segments_and_trains(model)


@pytest.mark.parametrize("name", ["sima_nano_12_p16", "ufo_vit_small"])
def test_xcit_layout_with_dpt(name):
    """XCiT-SimA and UFO-ViT (XCiT's layout; single scale, so DPT is their smp decoder). DPT asks for prefix
    tokens since the model has a class token; it joins only in class attention, so the prefix of every block is
    the learned ``cls_token`` and ``decoder_readout='cat'`` adds a learned constant (``'ignore'`` loses nothing)."""
    model = smp.DPT(f"tu-{name}", encoder_weights=None, classes=CLASSES, **_DPT, **_VIT)
    _segments_and_trains(model)


@pytest.mark.parametrize("decoder, kwargs", [(smp.UPerNet, _UPERNET), (smp.FPN, _FPN)], ids=["upernet", "fpn"])
def test_soft_with_upernet_and_fpn(decoder, kwargs):
    model = decoder("tu-soft_tiny", encoder_weights=None, classes=CLASSES, **kwargs, **_SOFT)
    _segments_and_trains(model, batch=2)


def test_cvt_with_upernet_at_encoder_depth_4():
    """CvT's three stages are smp's 1/4, 1/8 and 1/16 levels: ``encoder_depth=4`` (input, empty 1/2 level, 3 stages)
    takes them all; ``encoder_depth=3`` would leave the last stage out."""
    model = smp.UPerNet("tu-sima_cvt_13", encoder_weights=None, classes=CLASSES, encoder_depth=4, **_UPERNET, **_CVT)
    _segments_and_trains(model, batch=2)
    assert model.encoder.out_channels == [3, 0, 16, 32, 64]


def test_cvt_at_smps_default_depth_names_the_missing_stage():
    """smp's default ``encoder_depth=5`` asks a transformer-style encoder for stages 0-3; CvT has 0-2: one line naming
    out_indices and the levels there are."""
    with pytest.raises(ValueError, match=r"sima_cvt_13: out_indices=\(0, 1, 2, 3\) names a feature level the model "
                                         r"does not have; allowed: levels 0..2"):
        smp.UPerNet("tu-sima_cvt_13", encoder_weights=None, classes=CLASSES, **_CVT)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_cvt_with_fpn_is_not_supported_by_smp():
    """smp's FPN decoder always fuses the last four features (its p2-p5 at 1/4-1/32). For a transformer-style
    encoder with fewer than four stages (CvT: 1/4-1/16, at ``encoder_depth=4``) the fourth from the end is smp's
    empty (0-channel) 1/2 level, so the lateral convolution of p2 gets no channels; timm's own ConvNeXt fails the
    same way at ``encoder_depth=4``. smp would need its FPN to build the pyramid from the levels the encoder has
    (skipping empty ones and upsampling from the finest real level); CvT has no 1/32 stage to offer."""
    model = smp.FPN("tu-sima_cvt_13", encoder_weights=None, classes=CLASSES, encoder_depth=4, **_FPN, **_CVT)
    with pytest.raises(RuntimeError, match=r"must match the size of tensor b \(0\)"):
        model(torch.randn(2, 3, SIZE, SIZE))


@pytest.mark.parametrize("decoder", [smp.UPerNet, smp.FPN], ids=["upernet", "fpn"])
@pytest.mark.parametrize("name", ["sima_deit_tiny_patch16_224", "sima_nano_12_p16", "ufo_vit_small"])
def test_single_scale_models_with_pyramid_decoders_are_not_supported_by_smp(name, decoder):
    """The ViT-like models give every block at one stride (the patch size), and smp's ``TimmUniversalEncoder``
    accepts only encoders whose ``feature_info`` reductions double from 1, 2 or 4 ("Unsupported model
    downsampling pattern"), for timm's own ViTs too. smp would need a simple feature pyramid for them (as in
    ViTDet, or DPT's reassemble stage: deconvolutions to 1/4 and 1/8, identity at 1/16, pooling to 1/32 from
    chosen blocks) in front of its UPerNet/FPN decoders; ``simattn.detect`` builds such a neck for torchvision's
    detectors."""
    with pytest.raises(ValueError, match="Unsupported model downsampling pattern"):
        decoder(f"tu-{name}", encoder_weights=None, classes=CLASSES, **_VIT)


# ---- timm's forward_intermediates contract with prefix tokens -----------------------------------------------------
_TINY_VIT = dict(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2)


@pytest.mark.parametrize("name, prefix", [
    ("sima_deit_tiny_patch16_224", 1),
    ("relu_vit_small_patch16_224", 1),
    ("relu_vit_small_patch16_gap_224", 0),
    ("sima_nano_12_p16", 1),
    ("ufo_vit_small", 1),
])
def test_forward_intermediates_return_prefix_tokens(name, prefix):
    """timm ViT's contract: with ``return_prefix_tokens=True`` each intermediate is a (spatial, prefix) pair
    ((B, C, H, W) or (B, H·W, C), and (B, P, C)); without prefix tokens the intermediates stay tensors."""
    torch.manual_seed(0)
    model = timm.create_model(name, **_TINY_VIT).eval()
    assert model.num_prefix_tokens == prefix
    x = torch.randn(2, 3, 64, 48)
    plain = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    final, pairs = model.forward_intermediates(x, indices=[0, 1], return_prefix_tokens=True)
    torch.testing.assert_close(final, model.forward_features(x))
    nlc = model.forward_intermediates(x, indices=1, return_prefix_tokens=True, norm=True, output_fmt="NLC",
                                      intermediates_only=True)
    if not prefix:
        for got, want in zip(pairs, plain):
            torch.testing.assert_close(got, want)
        assert nlc[0].shape == (2, 12, 32)
        return
    assert len(pairs) == 2 and len(nlc) == 1
    for (spatial, tokens), want in zip(pairs, plain):
        torch.testing.assert_close(spatial, want)
        assert spatial.shape == (2, 32, 4, 3) and tokens.shape == (2, prefix, 32)
    spatial, tokens = nlc[0]
    assert spatial.shape == (2, 12, 32) and tokens.shape == (2, prefix, 32)
    if name.startswith(("sima_nano", "ufo")):  # the class token skips the blocks: its state is the parameter
        torch.testing.assert_close(pairs[0][1], model.cls_token.expand(2, -1, -1))
        torch.testing.assert_close(tokens, model.norm(model.cls_token).expand(2, -1, -1))


def test_xcit_without_class_token_returns_plain_intermediates():
    """Once the class-attention head is pruned (features only) there is no prefix token to return."""
    model = timm.create_model("sima_nano_12_p16", **_TINY_VIT).eval()
    model.prune_intermediate_layers([0, 1])
    feats = model.forward_intermediates(torch.randn(1, 3, 32, 32), return_prefix_tokens=True, intermediates_only=True)
    assert [f.shape for f in feats] == [(1, 32, 2, 2)] * 2
