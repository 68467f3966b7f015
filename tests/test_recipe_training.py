"""Every shipped classification recipe with an auto-augment policy trains: two updates on the digits with the
recipe's augmentation, mixup, EMA, clipping and schedule options, through ``simattn.train`` in-process."""
from __future__ import annotations

import math

import pytest

from simattn.train import TrainConfig, list_recipes, load_config, train

RECIPES = [name for name in list_recipes(TrainConfig) if load_config(name).aa]


def smallest_model(model: str):
    """model_kwargs for the recipe's network at its cheapest: one narrow block (per stage), an input of 2x2 patches
    (SOFT's pyramid: 2x2 tokens at its last, stride-32 stage)."""
    if model.startswith("soft_"):
        return {"img_size": 64, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 32, 32], "num_heads": [1, 1, 2, 2],
                "stem_chans": 8}
    return {"img_size": 32, "depth": 1, "embed_dim": 48}  # 48: a multiple of every recipe's head count


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_two_updates_on_the_digits(recipe, tmp_path):
    shipped = load_config(recipe)
    kwargs = smallest_model(shipped.model)
    # amp off: the recipes' float16 autocast is for GPUs, emulated slowly on a CPU (test_train runs it)
    cfg = load_config(recipe, {"dataset": "digits", "img_size": kwargs["img_size"], "model_kwargs": kwargs,
                               "batch_size": 16, "max_updates": 2, "workers": 0, "device": "cpu", "threads": 1,
                               "amp": False, "log_interval": 0, "output": str(tmp_path / "run")})
    assert (cfg.aa, cfg.reprob, cfg.mixup, cfg.model_ema) == (shipped.aa, shipped.reprob, shipped.mixup,
                                                              shipped.model_ema)
    summary = train(cfg).summary
    assert summary["updates"] == 2
    assert math.isfinite(summary["history"][-1]["train_loss"]) and math.isfinite(summary["final"]["loss"])
