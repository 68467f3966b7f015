"""The released checkpoints at other sizes: each tag's layout loads into the model built at 288 and 384 px (PVT and
Swin also at 512) through its family's filter, with one line saying what was resampled;
the resampling is the authors' (bicubic without antialiasing for position embeddings and key encodings resized at
load, bilinear where the authors resize per forward, linear for Agent's row and column biases)."""
import json
import logging
import sys
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F

import simattn
from simattn.models import resample

DATA = Path(__file__).parent / "data"
_FOLDERS = {"sima_vit": "deit_released", "pvt": "pvt_released", "swin": "swin_released"}
TAGS = sorted(t for t in timm.list_pretrained() if t.split(".")[0] in set(simattn.list_models()))


def _family(tag):
    return timm.models.model_entrypoint(tag.split(".")[0]).__module__.rsplit(".", 1)[-1]


def _layout_state(tag):
    """The tag's released layout with uninitialized values (shapes are what is checked)."""
    folder = DATA / _FOLDERS[_family(tag)]
    path = folder / f"{tag}.json" if (folder / f"{tag}.json").exists() else folder / f"{tag.split('.')[0]}.json"
    return {k: torch.empty(shape, dtype=getattr(torch, dtype)) for k, (shape, dtype) in
            json.loads(path.read_text())["keys"].items()}


def write_stand_in(tag, path):
    """A file in the tag's released layout, seeded values (counters small positive integers), saved as the authors'
    training scripts save theirs (``model``): the file a test puts where the tag's download would be cached."""
    gen = torch.Generator().manual_seed(0)
    state = {k: (torch.randint(1, 100, v.shape, generator=gen) if v.dtype == torch.int64 else
                 (torch.randn(v.shape, generator=gen) * 0.02).to(v.dtype)) for k, v in _layout_state(tag).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state}, path)
    return state


def _sizes(tag):
    return (288, 384, 512) if _family(tag) in ("pvt", "swin") else (288, 384)


@pytest.mark.parametrize("tag", TAGS)
def test_every_tag_loads_at_every_size_its_family_takes(tag, caplog):
    """Built on the meta device (shapes only), the filter's output has the model's keys and shapes at each size."""
    filter_fn = sys.modules[timm.models.model_entrypoint(tag.split(".")[0]).__module__].checkpoint_filter_fn
    state = _layout_state(tag)
    with torch.device("meta"):
        trained = {k: v.shape for k, v in timm.create_model(tag).state_dict().items()}
    for size in _sizes(tag):
        with torch.device("meta"):
            model = timm.create_model(tag, img_size=size)
        own = model.state_dict()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="simattn.models"):
            mapped = filter_fn(dict(state), model)
        assert sorted(mapped) == sorted(own), (size, sorted(set(mapped) ^ set(own))[:5])
        wrong = [k for k in own if mapped[k].shape != own[k].shape]
        assert not wrong, (size, [(k, tuple(mapped[k].shape), tuple(own[k].shape)) for k in wrong[:3]])
        notes = [r.getMessage() for r in caplog.records if "resampled" in r.getMessage()]
        if any(own[k].shape != trained[k] for k in own):  # one line where a grid changed, none where none did
            assert len(notes) == 1 and notes[0].startswith("note: the checkpoint's grids resampled to the model's")
            assert " -> " in notes[0], notes
        else:
            assert notes == [], notes


def test_position_embeddings_are_resized_without_antialiasing_and_keep_the_class_token():
    """Bicubic (a = -0.75, align_corners=False): the same values as interpolating the grid by hand, not timm's
    antialiased resize (a = -0.5), and the class token untouched."""
    torch.manual_seed(0)
    pos = torch.randn(1, 1 + 14 * 14, 8, dtype=torch.float64)
    out = resample.resample_pos_embed(pos, (18, 18), 1, "bicubic")
    grid = pos[:, 1:].reshape(1, 14, 14, 8).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(18, 18), mode="bicubic", align_corners=False)
    assert torch.equal(out[:, :1], pos[:, :1])
    torch.testing.assert_close(out[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 324, 8), rtol=0, atol=0)
    from timm.layers import resample_abs_pos_embed
    assert not torch.allclose(resample_abs_pos_embed(pos, [18, 18], num_prefix_tokens=1), out)


def test_agent_biases_are_resized_linearly_along_the_grid():
    torch.manual_seed(0)
    bias = torch.randn(2, 49, 14, dtype=torch.float64)
    out = resample.resample_agent_axis(bias, 18)
    # linear, align_corners=False: position i of 18 samples source coordinate (i + 0.5) * 14 / 18 - 0.5, clamped
    x = ((torch.arange(18, dtype=torch.float64) + 0.5) * 14 / 18 - 0.5).clamp(min=0)
    left = x.floor().long().clamp(max=13)
    right = (left + 1).clamp(max=13)
    w = x - left
    torch.testing.assert_close(out, bias[..., left] * (1 - w) + bias[..., right] * w)


def test_pos_embed_mode_follows_the_tags_authors():
    with torch.device("meta"):
        modes = {t: resample.pos_embed_mode(timm.create_model(t)) for t in
                 ("agent_pvt_tiny.in1k", "inline_pvt_tiny.in1k", "pvt_tiny.in1k", "flatten_pvt_tiny.in1k",
                  "slab_pvt_tiny.in1k", "polaformer_pvt_tiny.in1k")}
    assert modes == {"agent_pvt_tiny.in1k": "bicubic", "inline_pvt_tiny.in1k": "bicubic", "pvt_tiny.in1k": "bilinear",
                     "flatten_pvt_tiny.in1k": "bilinear", "slab_pvt_tiny.in1k": "bilinear",
                     "polaformer_pvt_tiny.in1k": "bilinear"}


def test_the_mode_goes_with_the_model_not_its_tag():
    """A backbone built without a tag (a segmenter's) resizes as its authors do, as the tag would."""
    with torch.device("meta"):
        assert resample.pos_embed_mode(timm.create_model("agent_pvt_tiny")) == "bicubic"
        assert resample.pos_embed_mode(timm.create_model("sima_pvt_tiny")) == "bilinear"


def test_a_larger_window_resizes_swins_tables_bicubic_as_the_authors():
    """agent_swin at 384 px with the authors' softmax window 12: the 13x13 tables become 23x23, each head's map
    bicubic (align_corners=False), not timm's own interpolator."""
    torch.manual_seed(0)
    table = torch.randn(169, 3, dtype=torch.float64)
    out = resample.resample_rel_pos_table(table, 23 * 23)
    maps = F.interpolate(table.t().reshape(1, 3, 13, 13), size=(23, 23), mode="bicubic", align_corners=False)
    torch.testing.assert_close(out, maps.reshape(3, 529).t(), rtol=0, atol=0)
    state = _layout_state("agent_swin_tiny_patch4_window7_224.in1k")
    key = "layers.3.blocks.0.attn.relative_position_bias_table"
    state[key] = torch.randn(state[key].shape)
    with torch.device("meta"):
        model = timm.create_model("agent_swin_tiny_patch4_window7_224.in1k", img_size=384, window_size=12)
    mapped = sys.modules[type(model).__module__].checkpoint_filter_fn(dict(state), model)
    torch.testing.assert_close(mapped[key], resample.resample_rel_pos_table(state[key], 529), rtol=0, atol=0)
