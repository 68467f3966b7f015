"""Dense backbones at the input's size without a rebuild, as the authors' segmentation and detection code runs them:
Agent's ImageNet-shaped biases resized on every forward to the grid and to a downstream agent count, PVT's position
embeddings resized bilinearly per stage, Swin's window blocks padding before they shift, key encodings fixed once for
an export; segmenter logits at the input's size for any shape."""
import sys

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformerBlock

from simattn.attention import create_attention
from simattn.models.export_ready import prepare_for_export
from simattn.models.factory import create_model
from simattn.models.segmentation import FeaturePyramid
from simattn.models.swin import DenseSwinBlock

from test_any_size import TAGS, _family, _layout_state

PVT = dict(embed_dims=(16, 16, 32, 32), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
SWIN = dict(embed_dim=16, depths=(1, 1, 1, 2), num_heads=(1, 1, 2, 2))


def _agent_oracle(module, x, grid, side):
    """Agent's downstream AgentAttention written from its code: biases bilinear to the grid, then bilinear over the
    agents' square to side x side; agents the queries' grid pooled to side x side; two softmax steps; the 3x3 conv
    of V added."""
    B, N, C = x.shape
    h, heads, d = module.num_heads, module.num_heads, C // module.num_heads
    q, k, v = F.linear(x, module.qkv.weight, module.qkv.bias).reshape(B, N, 3, heads, d).permute(2, 0, 3, 1, 4)
    p = module.bias_side

    def bias(block, rows, cols):  # (h, n, ...) -> (h, side², N)
        full = F.interpolate(block, size=grid, mode="bilinear") + F.interpolate(
            (rows[..., :, None] + cols[..., None, :]), size=grid, mode="bilinear")
        full = full.reshape(h, p, p, N).permute(0, 3, 1, 2)
        return F.interpolate(full, size=(side, side), mode="bilinear").reshape(h, N, side * side).transpose(1, 2)

    agent_bias = bias(module.agent_block_bias, module.agent_row_bias, module.agent_col_bias)
    query_bias = bias(module.query_block_bias, module.query_row_bias, module.query_col_bias).transpose(1, 2)
    image = q.transpose(2, 3).reshape(B * heads, d, *grid)
    agents = F.adaptive_avg_pool2d(image, side).reshape(B, heads, d, -1).transpose(2, 3)
    agent_v = ((agents * d ** -0.5) @ k.transpose(-2, -1) + agent_bias).softmax(-1) @ v
    out = ((q * d ** -0.5) @ agents.transpose(-2, -1) + query_bias).softmax(-1) @ agent_v
    out = out.transpose(1, 2).reshape(B, N, C)
    conv = module.dwc(v.transpose(1, 2).reshape(B, N, C).transpose(1, 2).reshape(B, C, *grid))
    return module.proj(out + conv.flatten(2).transpose(1, 2))


@pytest.mark.parametrize("grid", [(12, 12), (10, 17)])
def test_agent_biases_follow_the_grid_and_a_downstream_agent_count(grid):
    """9 agents learned on a 14-wide grid run as 16 agents on another grid, as Agent's downstream backbones (fp64)."""
    torch.manual_seed(0)
    module = create_attention("agent", 32, num_heads=2, agent_num=9, window=14, downstream_agent_num=16,
                              num_prefix_tokens=0).double()
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    x = torch.randn(2, grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        out = module(x, grid_size=grid)
        torch.testing.assert_close(out, _agent_oracle(module, x, grid, 4), rtol=0, atol=1e-12)
        plain = create_attention("agent", 32, num_heads=2, agent_num=9, window=14, num_prefix_tokens=0).double()
        plain.load_state_dict(module.state_dict())  # the same parameters: the count changes no shape
        assert (plain(x, grid_size=grid) - out).abs().max() > 1e-3


def test_agent_models_take_a_downstream_count_per_stage():
    body = create_model("agent_pvt_tiny", num_classes=0, downstream_agents=[16, 16, 4, 4], **PVT)
    assert [s.blocks[0].attn.pool_side for s in body.stages] == [4, 4, 2, 2]
    assert [tuple(f.shape) for f in FeaturePyramid(body)(torch.randn(1, 3, 64, 96))][-1] == (1, 32, 2, 3)
    with pytest.raises(ValueError, match="downstream_agents"):
        create_model("agent_pvt_tiny", num_classes=0, downstream_agents=[16, 16], **PVT)
    with pytest.raises(ValueError, match="square"):
        create_model("agent_swin_tiny_patch4_window7_224", num_classes=0, downstream_agents=[10, 16, 4, 4], **SWIN)


def test_pvt_resizes_each_stages_position_embedding_bilinearly_per_forward():
    """A PVT built at 64 px run at 96x128 equals the one built at 96x128 given the embeddings resized by hand
    (bilinear, align_corners=False, the class token kept: PVT's ``_get_pos_embed``)."""
    torch.manual_seed(0)
    small = create_model("pvt_tiny", num_classes=0, img_size=64, **PVT).double().eval()
    with torch.no_grad():
        for stage in small.stages:
            stage.pos_embed.normal_()
    large = create_model("pvt_tiny", num_classes=0, img_size=(96, 128), **PVT).double().eval()
    state = small.state_dict()
    for i, stage in enumerate(small.stages):
        pos, prefix = stage.pos_embed.detach(), stage.num_prefix_tokens
        (gh, gw), grid = stage.pos_embed_grid, large.stages[i].pos_embed_grid
        image = pos[:, prefix:].reshape(1, gh, gw, -1).permute(0, 3, 1, 2)
        resized = F.interpolate(image, size=grid, mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
        state[f"stages.{i}.pos_embed"] = torch.cat([pos[:, :prefix], resized], dim=1)
    large.load_state_dict(state)
    x = torch.randn(1, 3, 96, 128, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(small(x), large(x), rtol=0, atol=1e-6)  # timm resizes in float32


def test_swin_window_blocks_pad_before_they_shift_in_the_dense_layout():
    """mmseg's Swin pads the map to whole windows, then shifts; timm shifts, then pads. On whole windows both agree."""
    body = create_model("sima_swin_tiny_patch4_window7_224", num_classes=0, attn_type="softmax", **SWIN)
    assert [b.shift_size for b in body.layers[3].blocks] == [(0, 0), (0, 0)]  # the classifier's 7x7 last stage
    FeaturePyramid(body)
    blocks = body.layers[3].blocks
    assert [type(b) for b in blocks] == [DenseSwinBlock] * 2 and blocks[1].shift_size == (3, 3)
    torch.manual_seed(0)
    x = torch.randn(1, 9, 12, 128)  # the last stage: 16 x 8 channels
    with torch.no_grad():
        timm_attn = SwinTransformerBlock._attn(blocks[1], F.pad(x, (0, 0, 0, 2, 0, 5)))[:, :9, :12]
        torch.testing.assert_close(blocks[1]._attn(x), timm_attn)
        assert (SwinTransformerBlock._attn(blocks[1], x) - timm_attn).abs().max() > 1e-3
        whole = torch.randn(1, 14, 7, 128)
        torch.testing.assert_close(blocks[1]._attn(whole), SwinTransformerBlock._attn(blocks[1], whole))


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
