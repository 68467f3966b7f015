"""Self-supervised pretraining (DINO) of any registered backbone, with k-NN and linear-probe evaluation.

``simattn ssl train|eval`` is the command line (:mod:`simattn.ssl.cli`); :func:`pretrain` and
:func:`evaluate_backbone` are the library entry points, :class:`SslConfig` (read with
``load_recipe(SslConfig, "ssl_digits", overrides)``) their options. lightly is imported only when pretraining runs.
"""
from .config import SslConfig
from .dino import pretrain
from .evaluate import evaluate_backbone, extract_features, knn_classify, linear_probe
from ..utils.recipe import load_recipe

__all__ = ["SslConfig", "pretrain", "evaluate_backbone", "extract_features", "knn_classify", "linear_probe",
           "load_recipe"]
