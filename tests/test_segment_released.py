"""The released ADE20K segmenters by tag (Agent Attention's Semantic FPN with Agent-PVT-T/S/L and UperNet with
Agent-Swin-T): each tag builds the network of its mmseg config, and a file saved as mmseg saves one
(``{'meta', 'state_dict'}``, mmseg's names: ``backbone.*``, ``neck.*``, ``decode_head.*``, ``auxiliary_head.*``)
loads onto it with no key left over or missing. The key names and shapes are the authors' model's, built from
their configs (``data/seg_released/<tag>.json``); the logits were measured against that model in a temp folder
(README, "The released ADE20K models")."""
import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import timm
import torch
import torch.nn.functional as F

import simattn  # noqa: F401  (registers the segmenters and their tags)
from simattn.attention.agent import AgentAttention
from simattn.attention.reference import agent_reference
from simattn.cli import main as simattn_main
from simattn.models import segmentation

LAYOUTS = Path(__file__).parent / "data" / "seg_released"
TAGS = sorted(t for t in timm.list_pretrained() if t.split(".")[0] in segmentation.HEADS)


def _layout(tag):
    return json.loads((LAYOUTS / f"{tag}.json").read_text())


def test_every_released_segmenter_is_a_tag_with_a_layout(capsys):
    assert sorted(p.stem for p in LAYOUTS.glob("*.json")) == TAGS and len(TAGS) == 4
    for tag in TAGS:
        cfg = timm.models.get_pretrained_cfg(tag).to_dict()
        assert cfg["url"] and Path(urlparse(cfg["url"]).path).name and cfg["num_classes"] == 150, tag
        assert cfg["input_size"] == (3, 512, 512) and "mIoU" in cfg["notes"][0] and cfg["paper_ids"], tag
    assert timm.models.get_pretrained_cfg("semantic_fpn").url == ""  # the untagged names ask for no weights
    assert simattn_main(["list", "pretrained", "upernet*"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:4] == ["upernet.agent_swin_tiny_ade20k", "-", "512",
                                                                   "none"]
    with pytest.raises(ValueError, match="no pretrained weights: name a tag"):
        timm.create_model("semantic_fpn", backbone="agent_pvt_tiny", pretrained=True)


@pytest.mark.parametrize("tag", TAGS)
def test_the_mmseg_layout_maps_with_no_missing_or_unexpected_key(tag):
    """mmseg's state dict (names and shapes of the authors' model) maps onto the tag's network, every tensor to one
    of the same shape, and the parameter counts agree."""
    layout = _layout(tag)
    with torch.device("meta"):
        model = timm.create_model(tag)
        released = {k: torch.empty(shape, dtype=getattr(torch, dtype)) for k, (shape, dtype) in
                    layout["keys"].items()}
    mapped = segmentation.checkpoint_filter_fn({"meta": {}, "state_dict": released}, model)
    own = model.state_dict()
    assert sorted(set(own) - set(mapped)) == [] and sorted(set(mapped) - set(own)) == []
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in own.items()}
    assert sum(p.numel() for p in model.parameters()) == layout["params"]


def test_mmseg_tensors_land_where_the_forward_reads_them():
    """UPerHead's convs run fine to coarse, smp's decoder coarse to fine; Swin's output norms are the levels'."""
    tag = "upernet.agent_swin_tiny_ade20k"
    names = ("decode_head.lateral_convs.0.conv.weight", "decode_head.fpn_convs.2.bn.running_var",
             "backbone.norm3.bias", "auxiliary_head.conv_seg.weight", "backbone.layers.0.blocks.1.attn.an_bias",
             "decode_head.psp_modules.3.1.bn.weight", "decode_head.conv_seg.bias")
    shapes = _layout(tag)["keys"]
    state = {k: torch.randn(shapes[k][0]) for k in names}
    with torch.device("meta"):
        model = timm.create_model(tag)
    mapped = segmentation.checkpoint_filter_fn({"meta": {}, "state_dict": state}, model)
    where = {k: next(m for m, v in mapped.items() if v is state[k] or torch.equal(v, state[k])) for k in names}
    assert where == {"decode_head.lateral_convs.0.conv.weight": "decoder.fpn_lateral_blocks.2.conv_norm_relu.0.weight",
                     "decode_head.fpn_convs.2.bn.running_var": "decoder.fpn_conv_blocks.0.1.running_var",
                     "backbone.norm3.bias": "decoder.feature_norms.3.bias",
                     "auxiliary_head.conv_seg.weight": "aux_head.2.weight",
                     "backbone.layers.0.blocks.1.attn.an_bias": "neck.body.layers.0.blocks.1.attn.agent_block_bias",
                     "decode_head.psp_modules.3.1.bn.weight": "decoder.psp.blocks.3.1.1.weight",
                     "decode_head.conv_seg.bias": "classifier.1.bias"}


def test_a_file_saved_as_mmseg_saves_one_loads_by_tag(tmp_path):
    tag = "semantic_fpn.agent_pvt_tiny_ade20k"
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(shape, generator=gen).to(getattr(torch, dtype)) for k, (shape, dtype) in
             _layout(tag)["keys"].items()}
    path = tmp_path / "fpn_agent_pvt_t.pth"
    torch.save({"meta": {"mmseg_version": "0.28.0"}, "state_dict": state}, path)
    model = timm.create_model(tag, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    loaded = model.state_dict()
    assert torch.equal(loaded["decoder.fpn.layer_blocks.3.0.weight"], state["neck.fpn_convs.3.conv.weight"])
    assert torch.equal(loaded["decoder.head.scale_heads.3.4.1.running_mean"],
                       state["decode_head.scale_heads.3.4.bn.running_mean"])
    assert torch.equal(loaded["neck.body.stages.2.blocks.1.attn.qkv.weight"],
                       torch.cat([state["backbone.block3.1.attn.q.weight"], state["backbone.block3.1.attn.kv.weight"]]))
    assert model.backbone.stages[0].blocks[0].attn.agent_grid == (12, 12)


def _authors_bias(block, row_col, grid, agents, side):
    """Agent's downstream code: each part resized to the token grid, then its agent axis (side×side) to ``agents``."""
    heads = block.shape[0]
    out = 0
    for part in (block, row_col):
        x = F.interpolate(part, size=grid, mode="bilinear")
        x = x.reshape(heads, side, side, grid[0] * grid[1]).permute(0, 3, 1, 2)
        x = F.interpolate(x, size=agents, mode="bilinear")
        out = out + x.reshape(heads, grid[0] * grid[1], -1).permute(0, 2, 1)
    return out  # (H, n', N)


def test_agent_grid_pools_more_agents_and_resizes_the_biases_agent_axis_as_the_authors_code():
    torch.manual_seed(0)
    attn = AgentAttention(16, num_heads=2, agent_num=9, agent_grid=(4, 5), window=6, num_prefix_tokens=0,
                          backend="torch").double().eval()
    for p in attn.parameters():
        p.data.normal_()
    grid = (8, 10)
    q, k, v = torch.randn(3, 1, 2, 80, 8, dtype=torch.float64)
    agent_bias, query_bias = attn.biases(grid, 0)
    expected_agent = _authors_bias(attn.agent_block_bias, (attn.agent_row_bias.unsqueeze(-1)
                                                           + attn.agent_col_bias.unsqueeze(-2)), grid, (4, 5), 3)
    expected_query = _authors_bias(attn.query_block_bias, (attn.query_row_bias.unsqueeze(-1)
                                                           + attn.query_col_bias.unsqueeze(-2)), grid, (4, 5), 3)
    torch.testing.assert_close(agent_bias[0], expected_agent, rtol=0, atol=1e-13)
    torch.testing.assert_close(query_bias[0], expected_query.transpose(-2, -1), rtol=0, atol=1e-13)
    out = attn.attend(q, k, v, None, grid_size=grid)
    agents = F.adaptive_avg_pool2d(q.transpose(-2, -1).reshape(2, 8, *grid), (4, 5)).flatten(2).transpose(-2, -1)
    plain = agent_reference(q, k, v, grid, agents=agents[None], agent_bias=expected_agent[None],
                            query_bias=expected_query.transpose(-2, -1)[None])
    conv = attn.dwc(v.transpose(-2, -1).reshape(1, 16, *grid)).reshape(1, 2, 8, 80).transpose(-2, -1)
    torch.testing.assert_close(out, plain + conv, rtol=0, atol=1e-12)
    default = AgentAttention(16, num_heads=2, agent_num=9, window=6, num_prefix_tokens=0)
    assert default.agent_grid == (3, 3) and "agent_grid" not in repr(default)


def test_pvt_position_embeddings_follow_the_input_grid_bilinearly_in_their_own_dtype():
    """As PVT's dense-prediction code (``_get_pos_embed``): bilinear, align_corners=False, no antialiasing; fp64
    stays fp64 (timm's resampler works in fp32)."""
    model = timm.create_model("pvt_tiny", img_size=64, num_classes=0, embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1),
                              depths=(1, 1, 1, 1)).double().eval()
    stage = model.stages[0]
    seen = {}
    stage.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    x = torch.randn(1, 3, 96, 128, dtype=torch.float64)
    with torch.no_grad():
        tokens, grid = stage.patch_embed(x)
        model.forward_features(x)
    pos = stage.pos_embed.reshape(1, 16, 16, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(pos, size=grid, mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(seen["x"] - tokens, expected, rtol=0, atol=1e-15)


def test_swin_windows_are_padded_before_the_shift_as_the_authors_dense_backbones():
    """Where a stage grid is no multiple of the window (Swin-T's 16×16 last stage at 512 px), the block pads the map
    to whole windows and then shifts it (mmseg's and mmdet's Swin): timm's window attention on the zero-padded map,
    cropped; where no padding is needed, timm's block itself."""
    from timm.models.swin_transformer import SwinTransformerBlock
    from simattn.models.swin import PaddedWindowBlock

    torch.manual_seed(0)
    block = SwinTransformerBlock(8, (10, 10), num_heads=2, window_size=5, shift_size=2, always_partition=True,
                                 dynamic_mask=True).double().eval()
    padded = PaddedWindowBlock(8, (10, 10), num_heads=2, window_size=5, shift_size=2, always_partition=True,
                               dynamic_mask=True).double().eval()
    padded.load_state_dict(block.state_dict())
    fits, odd = torch.randn(2, 10, 10, 8, dtype=torch.float64), torch.randn(2, 12, 12, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(padded._attn(fits), block._attn(fits))
        expected = block._attn(F.pad(odd, (0, 0, 0, 3, 0, 3)))[:, :12, :12]
        torch.testing.assert_close(padded._attn(odd), expected, rtol=0, atol=1e-14)
        assert not torch.allclose(block._attn(odd), expected)  # timm shifts first, then pads
