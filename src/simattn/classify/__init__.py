"""Image classification as a task of the engine, shared by ``simattn train`` and ``simattn convert``: the options
(:class:`~simattn.classify.config.TrainConfig`), the datasets and timm's transforms and Mixup (``transforms``), the
top-1/top-5 evaluation pass (``evaluation``, also ``simattn validate``'s) and the :class:`~simattn.classify.task.Trainer`
task, which conversion's stages extend.
"""
from .config import TrainConfig, find_recipe, list_recipes, load_config, scaled_lr
from .task import Trainer, TrainResult, train

__all__ = ["TrainConfig", "Trainer", "TrainResult", "find_recipe", "list_recipes", "load_config", "scaled_lr", "train"]
