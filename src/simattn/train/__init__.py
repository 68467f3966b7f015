"""Training: ``simattn train`` (YAML recipes, DDP, AMP, exact resume) as the classification task of the engine.

Python use::

    from simattn.train import load_config, train
    result = train(load_config("digits_cpu", {"epochs": 2, "output": "runs/try"}))
    result.summary["final"]["top1"]
"""
from .config import TrainConfig, find_recipe, list_recipes, load_config, scaled_lr
from .task import Trainer, TrainResult, train

__all__ = ["TrainConfig", "Trainer", "TrainResult", "find_recipe", "list_recipes", "load_config", "scaled_lr", "train"]
