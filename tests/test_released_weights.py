"""The peers' released DeiT checkpoints as timm tags, without their code or their files.

``tests/data/deit_released/<tag>.json`` lists each released file's keys with shapes and dtypes, taken from the released
model code (their training scripts save ``model.state_dict()`` under ``model``). Files in that layout, filled with
seeded random values, must map through the family's ``checkpoint_filter_fn`` onto the tag's model with no missing
or unexpected key, and load through timm's own pretrained path (``pretrained_cfg_overlay=dict(file=...)``) with
the training script's wrapper, a ``module.`` prefix and a pickled yacs config beside the weights. Logits against
the released code itself were checked outside the test suite (the code carries no license).
"""
import json
import pickle
import sys
import types
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlparse

import pytest
import timm
import torch

import simattn
from simattn.models import sima_vit
from simattn.models.released import RELEASED_GLOBALS, released_files_readable
from simattn.utils.io import CheckpointError, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUTS = Path(__file__).parent / "data" / "deit_released"
FAST = dict(weight_init="skip")  # the weights are overwritten or only their names and shapes read: skip the init
#: every simattn tag with weights; this file holds the DeiT family's, test_models_swin.py and test_models_pvt.py the
#: Swin and PVT families'
_MODELS = set(simattn.list_models())
ALL_TAGS = sorted(tag for tag in timm.list_pretrained() if tag.split(".")[0] in _MODELS)
TAGS = [tag for tag in ALL_TAGS if timm.models.model_entrypoint(tag.split(".")[0]).__module__ == sima_vit.__name__]
SWIN_LAYOUTS = LAYOUTS.parent / "swin_released"
PVT_LAYOUTS = LAYOUTS.parent / "pvt_released"


def _filter(tag: str):
    """The checkpoint_filter_fn of the tag's family (the module that registers its model)."""
    return sys.modules[timm.models.model_entrypoint(tag.split(".")[0]).__module__].checkpoint_filter_fn


def _layout(tag: str) -> dict:
    return json.loads((LAYOUTS / f"{tag}.json").read_text())


def _released_state(tag: str) -> dict:
    """Seeded random tensors in the released file's layout (counters as small positive integers)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for key, (shape, dtype) in _layout(tag)["keys"].items():
        if dtype == "int64":
            out[key] = torch.randint(1, 100, shape, generator=gen)
        else:
            out[key] = torch.randn(shape, generator=gen, dtype=getattr(torch, dtype)) * 0.02
    return out


def test_every_tag_has_a_layout():
    assert TAGS, "no pretrained tags registered"
    assert sorted(p.name[:-len(".json")] for p in LAYOUTS.glob("*.json")) == TAGS
    swin = {p.stem for p in SWIN_LAYOUTS.glob("*.json")}
    pvt = {p.stem for p in PVT_LAYOUTS.glob("*.json")}
    assert [tag for tag in ALL_TAGS if tag not in set(TAGS) | pvt and tag.split(".")[0] not in swin] == []


@pytest.mark.parametrize("tag", TAGS)
def test_layout_maps_onto_the_model(tag):
    model = timm.create_model(tag, **FAST)
    cfg = model.pretrained_cfg
    assert (cfg.get("url") or cfg.get("hf_hub_id")) and cfg["num_classes"] == 1000 and cfg["paper_ids"]
    # timm caches a download under the URL's last path segment: it must name a file
    assert not cfg.get("url") or Path(urlparse(cfg["url"]).path).name
    mapped = _filter(tag)(_released_state(tag), model)
    ours = model.state_dict()
    assert sorted(mapped) == sorted(ours), (set(mapped) ^ set(ours))
    wrong = {k: (tuple(v.shape), tuple(ours[k].shape)) for k, v in mapped.items() if v.shape != ours[k].shape}
    assert not wrong


def _fake_yacs(monkeypatch):
    """A module named ``yacs.config`` whose ``CfgNode`` pickles under the real name (yacs is not installed)."""
    yacs, config = types.ModuleType("yacs"), types.ModuleType("yacs.config")
    node = type("CfgNode", (dict,), {"__module__": "yacs.config"})
    config.CfgNode, yacs.config = node, config
    monkeypatch.setitem(sys.modules, "yacs", yacs)
    monkeypatch.setitem(sys.modules, "yacs.config", config)
    return node


@pytest.mark.parametrize("tag", TAGS)
def test_released_file_loads_through_timm(tag, tmp_path, monkeypatch):
    """The training script's file: wrapped in ``model`` (here also with DDP's ``module.``), a yacs config beside."""
    state = _released_state(tag)
    node = _fake_yacs(monkeypatch)
    config = node(MODEL=node(NAME=_layout(tag)["released_model"]), DATA=node(IMG_SIZE=224))
    path = tmp_path / "released.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "optimizer": {}, "epoch": 299,
                "config": config}, path)
    monkeypatch.delitem(sys.modules, "yacs.config")
    monkeypatch.delitem(sys.modules, "yacs")

    model = timm.create_model(tag, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **FAST)
    expected = _filter(tag)(state, model)
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(expected)
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())


def test_config_stand_in_is_inert_and_narrow(tmp_path, monkeypatch):
    node = _fake_yacs(monkeypatch)
    path = tmp_path / "config.pth"
    torch.save({"config": node(MODEL=node(NAME="x"))}, path)
    with released_files_readable():
        config = torch.load(path, weights_only=True)["config"]
    assert type(config) is OrderedDict and config == {"MODEL": {"NAME": "x"}}
    other = type("Other", (dict,), {"__module__": "yacs.config"})
    sys.modules["yacs.config"].Other = other
    torch.save({"config": other()}, path)
    with pytest.raises(pickle.UnpicklingError), released_files_readable():  # only CfgNode has a stand-in
        torch.load(path, weights_only=True)


def test_a_config_that_is_not_plain_data_is_refused_in_one_line(tmp_path, monkeypatch):
    """The unpickler sets a stand-in config's attributes from the file: yacs' own flags load, a field that would
    shadow a mapping method (``items``) for every later reader is refused, naming it."""
    node = _fake_yacs(monkeypatch)
    path = tmp_path / "config.pth"
    config = node(MODEL=node(NAME="x"))
    config.__immutable__, config.__new_allowed__ = False, False
    torch.save({"model": {"w": torch.zeros(2)}, "config": config}, path)
    assert load_checkpoint(path, safe_globals=RELEASED_GLOBALS)["config"] == {"MODEL": {"NAME": "x"}}

    class Shadowing(node):  # pickled as a CfgNode whose attributes hold an ``items`` field
        def __reduce_ex__(self, protocol):
            return node, (), {"items": 1j}, None, iter(dict(self).items())

    torch.save({"model": {"w": torch.zeros(2)}, "config": node(MODEL=Shadowing(NAME="x"))}, path)
    with pytest.raises(CheckpointError, match="sets the attribute 'items', which is not plain data"):
        load_checkpoint(path, safe_globals=RELEASED_GLOBALS)


def test_agent_biases_keep_their_axes():
    """Agent's query biases are stored agent-axis last ((1, H, w, 1, n), (1, H, 1, w, n)); here (H, n, w)."""
    tag = "agent_deit_tiny_patch16_224.in1k"
    state = _released_state(tag)
    mapped = sima_vit.checkpoint_filter_fn(dict(state), timm.create_model(tag, **FAST))
    p = "blocks.3.attn."
    h, r, a = 2, 5, 17
    assert mapped[p + "query_row_bias"][h, a, r] == state[p + "ha_bias"][0, h, r, 0, a]
    assert mapped[p + "query_col_bias"][h, a, r] == state[p + "wa_bias"][0, h, 0, r, a]
    assert mapped[p + "agent_row_bias"][h, a, r] == state[p + "ah_bias"][0, h, a, r, 0]
    assert mapped[p + "agent_col_bias"][h, a, r] == state[p + "aw_bias"][0, h, a, 0, r]
    assert mapped[p + "query_prefix_bias"][h, a, 0] == state[p + "ca_bias"][0, h, 0, a]
    assert mapped[p + "agent_prefix_bias"][h, a, 0] == state[p + "ac_bias"][0, h, a, 0]


def test_prepbn_counters_and_tag_builds():
    """SLAB's LinearNorm counters become PRepBN's; the tags build the models the weights were trained in."""
    tag = "slab_deit_tiny_patch16_224.in1k"
    state = _released_state(tag)
    model = timm.create_model(tag, **FAST)
    assert model.norm.steps == 60000 and model.cls_token is None
    mapped = sima_vit.checkpoint_filter_fn(dict(state), model)
    assert torch.equal(mapped["norm.steps_left"], state["norm.iter"])
    assert torch.equal(mapped["blocks.0.norm1.warmup_left"], state["blocks.0.norm1.warm"])
    # the untagged names stay the recipes' models
    assert type(timm.create_model("slab_deit_tiny_patch16_224", **FAST).norm).__name__ == "LayerNorm"
    assert timm.create_model("inline_deit_small_patch16_224", **FAST).pos_embed.shape[1] == 197
    assert timm.create_model("inline_deit_small_patch16_224.in1k_288", **FAST).pos_embed.shape[1] == 325


def test_import_simattn_leaves_torch_safe_globals_as_they_were(tmp_path, monkeypatch):
    """A released file (a yacs config beside the weights) loads through simattn, while the user's own
    ``torch.load(weights_only=True)`` of it is refused as it is without simattn: importing simattn allows nothing."""
    import subprocess
    node = _fake_yacs(monkeypatch)
    path = tmp_path / "released.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "config": node(MODEL=node(NAME="x"))}, path)
    monkeypatch.delitem(sys.modules, "yacs.config")
    script = (
        "import sys, torch, simattn\n"
        "from simattn.models.released import RELEASED_GLOBALS\n"
        "from simattn.utils.io import load_checkpoint\n"
        "def ours():  # torch's own modules register theirs on import (DTensor, ...); none may be simattn's\n"
        "    return [g for g in torch.serialization.get_safe_globals()\n"
        "            if 'simattn' in getattr(g[0] if isinstance(g, tuple) else g, '__module__', '')]\n"
        "assert not ours(), ours()\n"
        "try:\n"
        "    torch.load(sys.argv[1], weights_only=True)\n"
        "except Exception as e:\n"
        "    assert 'yacs.config.CfgNode' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('the user load took the yacs config')\n"
        "assert list(load_checkpoint(sys.argv[1], safe_globals=RELEASED_GLOBALS)['model']) == ['w']\n"
        "assert not ours(), ours()\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
