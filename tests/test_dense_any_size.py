"""Dense backbones at the input's size without a rebuild, as the authors' segmentation and detection code runs them:
segmenter logits at the input's size for any shape, key encodings and position embeddings fixed once for an export,
every PVT and Swin tag filling a segmenter's backbone, the Agent ADE20K recipes taking another kind, a detector
starting from a tag. (Agent's downstream agent grids, PVT's bilinear position embeddings and Swin's pad-before-shift
are held to the authors' code in test_segment_released.py.)"""
import sys

import pytest
import timm
import torch

from simattn.models.export_ready import prepare_for_export
from simattn.models.factory import create_model

from test_any_size import TAGS, _family, _layout_state

PVT = dict(embed_dims=(16, 16, 32, 32), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
SWIN = dict(embed_dim=16, depths=(1, 1, 1, 2), num_heads=(1, 1, 2, 2))


@pytest.mark.parametrize("backbone, kwargs", [("agent_pvt_tiny", PVT), ("flatten_pvt_tiny", PVT),
                                              ("agent_swin_tiny_patch4_window7_224", SWIN)])
def test_a_segmenter_gives_logits_at_any_input_shape(backbone, kwargs):
    model = create_model("semantic_fpn", backbone=backbone, num_classes=3, decoder_channels=16,
                         segmentation_channels=32, **kwargs).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 86)).shape == (1, 3, 64, 86)


def test_an_export_fixes_key_encodings_and_position_embeddings_once():
    """Laid out for one size, the backbone holds no resampling op and gives the dynamic model's features."""
    torch.manual_seed(0)
    body = create_model("flatten_pvt_tiny", num_classes=0, img_size=64, **PVT).eval()
    with torch.no_grad():
        for name, param in body.named_parameters():
            if name.endswith(("positional_encoding", "pos_embed")):
                param.normal_()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        expected = body.forward_intermediates(x, intermediates_only=True)
    prepare_for_export(body, (96, 128))
    assert body.stages[0].blocks[0].attn.pos_grid == (24, 32)
    program = torch.export.export(body, (x,), strict=False)
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not [t for t in ops if "upsample" in t or "interpolate" in t], ops
    with torch.no_grad():
        got = body.forward_intermediates(x, intermediates_only=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


DENSE_TAGS = [t for t in TAGS if _family(t) in ("pvt", "swin")]


@pytest.mark.parametrize("tag", DENSE_TAGS)
def test_every_pvt_and_swin_tag_fills_a_segmenters_backbone(tag):
    """What ``simattn segment --initial-checkpoint TAG`` loads (meta device: keys and shapes): the tag's released
    layout through its family's filter covers the backbone the segmenter keeps, at the shape it has."""
    filter_fn = sys.modules[timm.models.model_entrypoint(tag.split(".")[0]).__module__].checkpoint_filter_fn
    head = "semantic_fpn" if _family(tag) == "pvt" else "upernet"
    with torch.device("meta"):
        backbone = create_model(head, backbone=tag.split(".")[0], num_classes=150).backbone
    own = backbone.state_dict()
    mapped = filter_fn(_layout_state(tag), backbone)
    assert not set(own) - set(mapped), sorted(set(own) - set(mapped))[:5]
    assert all(mapped[k].shape == own[k].shape for k in own)


@pytest.mark.parametrize("recipe", ["seg_fpn_agent_pvt_tiny_ade20k", "seg_upernet_agent_swin_tiny_ade20k"])
@pytest.mark.parametrize("kind", ["sima", "softmax"])
def test_the_released_recipes_take_another_kind(recipe, kind):
    from simattn.segment.config import SegmentConfig
    from simattn.utils.recipe import load_recipe
    cfg = load_recipe(SegmentConfig, recipe, {"model_kwargs": {"attn_type": kind}})
    with torch.device("meta"):
        model = create_model(cfg.model, **cfg.model_kwargs)
    assert model.attn_type == kind


def test_a_detector_starts_its_backbone_from_a_tag(tmp_path, monkeypatch):
    """``simattn detect`` with ``backbone_weights: TAG`` (a stand-in of the released file where its download is
    cached, no network): Mask R-CNN over the released width at an image whose sides fit no stride. (The Swin tags
    take the same path: the segmentation recipe test starts Agent-Swin-T from its tag.)"""
    tag = "agent_pvt_tiny.in1k"
    pytest.importorskip("pycocotools")
    from simattn.detect import build_mask_rcnn
    from simattn.models import sources
    from test_any_size import write_stand_in
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(sources, "_resolves", lambda host: False)
    state = write_stand_in(tag, sources.tag_cache_path(tag))
    heads = {"rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 20}
    model = build_mask_rcnn({"backbone": tag.split(".")[0], "backbone_kwargs": {}, "backbone_weights": tag,
                             "backbone_weights_partial": False, "drop_path_rate": 0.0, "out_indices": [0, 1, 2, 3],
                             "strides": [4, 8, 16, 32], "fpn_channels": 16, "box_head_dim": 32,
                             "mask_head_channels": 8, "min_size": 100, "max_size": 133, "maskrcnn": heads}, 3).eval()
    body = model.backbone.body
    assert torch.equal(body.stages[0].patch_embed.proj.weight, state["patch_embed1.proj.weight"])
    with torch.no_grad():
        out = model([torch.rand(3, 100, 133)])
    assert set(out[0]) >= {"boxes", "labels", "scores", "masks"}
