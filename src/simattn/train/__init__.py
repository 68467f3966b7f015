"""Training: ``simattn train`` (YAML recipes, DDP, AMP, exact resume), the command on the classification task of
the engine (:mod:`simattn.classify`).

Python use::

    from simattn.train import load_config, train
    result = train(load_config("digits_cpu", {"epochs": 2, "output": "runs/try"}))
    result.summary["final"]["top1"]
"""
from ..classify import TrainConfig, Trainer, TrainResult, find_recipe, list_recipes, load_config, scaled_lr, train

__all__ = ["TrainConfig", "Trainer", "TrainResult", "find_recipe", "list_recipes", "load_config", "scaled_lr", "train"]
