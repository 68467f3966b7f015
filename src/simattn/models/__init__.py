"""Backbones registered with timm: importing this package makes ``timm.create_model`` know every model below.

One file per family (names distinct from timm's own module names, which are registry keys):
``sima_vit`` (DeiT/ViT with SimA, ReLU-attention ViTs), ``sima_xcit`` (XCiT with SimA), ``ufo_vit`` (UFO-ViT),
``sima_cvt`` (CvT with SimA), ``soft_vit`` (SOFT pyramids), ``pvt`` (PVT v1 and its released hybrids), ``swin``
(Swin v1 and its released hybrids).

Task packages build, load and start models only through :mod:`simattn.models.factory` (``create_model``,
``load_model``, ``load_initial_weights``, also importable from here); every ``.safetensors`` file carries the record of
:mod:`simattn.models.weights`. :func:`prepare_for_export` lays a model out for export at one input size.

Graph capture: every model scripts with ``torch.jit.script``, traces with ``torch.fx`` (timm's feature extraction
or any other tracer), exports with ``torch.export`` (strict or not, dynamic batch) and compiles with
``torch.compile(fullgraph=True)`` (``tests/test_graph_capture.py``).
"""
from typing import List

import timm
from timm.layers import register_notrace_module

from ..attention import TokenAttention
from . import pvt, segmentation, sima_cvt, sima_vit, sima_xcit, soft_vit, swin, ufo_vit
from .export_ready import prepare_for_export, revert_sync_batchnorm
from .factory import create_model, load_initial_weights, load_model

# timm's FX tracing (feature_cls='fx', create_feature_extractor) keeps attention modules whole: each kind picks
# its matmul order, dtypes and autocast handling from shapes and state in Python.
register_notrace_module(TokenAttention)

FAMILIES = ("sima_vit", "sima_xcit", "ufo_vit", "sima_cvt", "soft_vit", "pvt", "swin")
#: dense-prediction networks on those backbones (``segmentation``: Semantic FPN, UperNet)
SEGMENTERS = ("semantic_fpn", "upernet")


def list_models() -> List[str]:
    """Names of all models this package registers with timm."""
    return sorted(name for family in FAMILIES for name in timm.list_models(module=family))


__all__ = ["FAMILIES", "SEGMENTERS", "list_models", "create_model", "load_model", "load_initial_weights",
           "prepare_for_export", "revert_sync_batchnorm"]
