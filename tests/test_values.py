"""The one KEY=VALUE mini-language of --set, --model-kwargs and --attn-kwargs."""
from __future__ import annotations

import pytest
import yaml

from simattn.utils.values import deep_merge, parse_assignments


def test_values_are_yaml_with_exponent_floats():
    got = parse_assignments(["epochs=3", "lr=1e-3", "wd=5E-2", "betas=[0.9, 1e-3]", "amp=true", "img_size=null",
                             "name=sima_small", "act_layer=relu"])
    assert got == {"epochs": 3, "lr": 0.001, "wd": 0.05, "betas": [0.9, 0.001], "amp": True, "img_size": None,
                   "name": "sima_small", "act_layer": "relu"}
    assert isinstance(got["epochs"], int) and isinstance(got["lr"], float)
    # the exponent rule is local to the mini-language: PyYAML's own loader is unchanged
    assert yaml.safe_load("1e-3") == "1e-3"


def test_dotted_keys_nest_and_merge():
    got = parse_assignments(["train.epochs=3", "train.lr=0.1", "attn_kwargs={order: kv_first}",
                             "attn_kwargs.eps=0.5"])
    assert got == {"train": {"epochs": 3, "lr": 0.1}, "attn_kwargs": {"order": "kv_first", "eps": 0.5}}


def test_later_item_wins():
    assert parse_assignments(["a=1", "a=2"]) == {"a": 2}
    assert parse_assignments(["a.b=1", "a=3"]) == {"a": 3}


@pytest.mark.parametrize("item", ["epochs", "=3", "a..b=1", ".a=1", "a.=1"])
def test_bad_items_name_the_item(item):
    with pytest.raises(ValueError, match="is not KEY=VALUE") as info:
        parse_assignments([item], what="--set item")
    assert repr(item) in str(info.value) and "\n" not in str(info.value)


def test_deep_merge_leaves_inputs_alone():
    base = {"a": {"b": 1, "c": 2}}
    assert deep_merge(base, {"a": {"b": 5}}) == {"a": {"b": 5, "c": 2}}
    assert base == {"a": {"b": 1, "c": 2}}
