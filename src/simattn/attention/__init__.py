"""Attention kinds: one file each, a functional op and a timm-compatible module; ``reference`` holds the oracles.

>>> from simattn.attention import create_attention, list_attentions
>>> attn = create_attention("sima", dim=384, num_heads=6)
"""
from ._common import HookPoint, check_count, eager, fx_call_whole, fx_tracing, no_autocast
from ._registry import attention_class, create_attention, get_attention_class, list_attentions, register_attention
from .base import GridAttention, TokenAttention
from .agent import AgentAttention, agent_attention, agent_attention_reference
from .cosformer import CosFormerAttention, cosformer_attention, cosformer_attention_reference
from .efficient import EfficientAttention, efficient_attention, efficient_attention_reference
from .elu import ELUAttention, elu_attention, elu_attention_reference
from .flatten import FLattenAttention, flatten_attention, flatten_attention_reference
from .inline import InLineAttention, inline_attention, inline_attention_reference
from .linformer import LinformerAttention, linformer_attention, linformer_attention_reference
from .nystrom import NystromAttention, nystrom_attention, nystrom_attention_reference
from .performer import (PerformerAttention, orthogonal_random_features, performer_attention,
                        performer_attention_reference)
from .polaformer import PolaFormerAttention, polaformer_attention, polaformer_attention_reference
from .relu import ReLUAttention, relu_attention, relu_attention_reference
from .sima import SimAAttention, sima_attention, sima_attention_reference, sima_normalize
from .slab import SLABAttention, slab_attention, slab_attention_reference
from .soft import SoftAttention, pinv_residual, soft_attention
from .sigmoid import SigmoidAttention, sigmoid_attention, sigmoid_attention_reference
from .softmax import SoftmaxAttention, softmax_attention, softmax_attention_reference
from .xca import XCAttention, xca_attention, xca_attention_reference
from .xnorm import XNormAttention, xnorm_attention, xnorm_attention_reference

__all__ = [
    "HookPoint", "TokenAttention", "GridAttention", "attention_class", "create_attention", "get_attention_class",
    "list_attentions", "register_attention",
    # what the models share with the kinds: checks, the graph-capture tests, fp32 regions
    "check_count", "eager", "fx_call_whole", "fx_tracing", "no_autocast",
    "SimAAttention", "sima_attention", "sima_attention_reference", "sima_normalize",
    "SoftmaxAttention", "softmax_attention", "softmax_attention_reference",
    "XCAttention", "xca_attention", "xca_attention_reference",
    "ELUAttention", "elu_attention", "elu_attention_reference",
    "ReLUAttention", "relu_attention", "relu_attention_reference",
    "XNormAttention", "xnorm_attention", "xnorm_attention_reference",
    "SoftAttention", "soft_attention", "pinv_residual",
    "LinformerAttention", "linformer_attention", "linformer_attention_reference",
    "PerformerAttention", "performer_attention", "performer_attention_reference",
    "orthogonal_random_features",
    "NystromAttention", "nystrom_attention", "nystrom_attention_reference",
    "EfficientAttention", "efficient_attention", "efficient_attention_reference",
    "CosFormerAttention", "cosformer_attention", "cosformer_attention_reference",
    "AgentAttention", "agent_attention", "agent_attention_reference",
    "SigmoidAttention", "sigmoid_attention", "sigmoid_attention_reference",
    "FLattenAttention", "flatten_attention", "flatten_attention_reference",
    "InLineAttention", "inline_attention", "inline_attention_reference",
    "SLABAttention", "slab_attention", "slab_attention_reference",
    "PolaFormerAttention", "polaformer_attention", "polaformer_attention_reference",
]
