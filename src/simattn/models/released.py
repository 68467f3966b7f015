"""The peers' released DeiT checkpoints: their files read safely and their key layouts mapped onto the models here.

Agent-DeiT (LeapLabTHU/Agent-Attention), InLine-DeiT (LeapLabTHU/InLine), SLAB-DeiT and the PRepBN softmax DeiTs
(xinghaochen/SLAB) are saved by Swin-style training scripts as ``{'model', 'optimizer', 'lr_scheduler',
'max_accuracy', 'epoch', 'config'}``, ``config`` a yacs ``CfgNode``. Differences from the models here, all in the
key names and axes, none in the math:

- Agent: the agent biases ``an``/``na`` (block, (H, n, 7, 7)), ``ah``/``aw`` (rows and columns of the agents over
  the keys, (1, H, n, w, 1) and (1, H, n, 1, w)), ``ha``/``wa`` (of the queries over the agents, (1, H, w, 1, n) and
  (1, H, 1, w, n): agent axis last) and ``ac``/``ca`` (the class token's, (1, H, n, 1) and (1, H, 1, n)).
- PRepBN (``LinearNorm``): the counters ``warm`` and ``iter`` are ``warmup_left`` and ``steps_left`` here; its
  ``total_step`` is the model's ``steps`` (an attribute here, not a tensor) and is dropped.
- SLAB-DeiT stores a ``cls_token`` its forward never uses.
- InLine: the same names.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Mapping

import torch
from torch import nn

__all__ = ["ConfigStandIn", "unwrap", "released_to_simattn"]


class ConfigStandIn:
    """An inert stand-in for the yacs ``CfgNode`` the released files carry beside the weights, allowed to
    ``torch.load(weights_only=True)`` under the name ``yacs.config.CfgNode`` only (every other pickled object stays
    refused). Unpickling makes an ``OrderedDict`` of the config's items instead (nested configs likewise, yacs'
    flags in its ``__dict__``): the only container whose items and attributes the weights-only unpickler sets;
    none of yacs' code runs."""

    def __new__(cls, *args: Any) -> "OrderedDict[str, Any]":  # type: ignore[misc]
        return OrderedDict()


# process-wide, so timm's own loader (which calls torch.load itself) reads the released files too
torch.serialization.add_safe_globals([(ConfigStandIn, "yacs.config.CfgNode")])

_WRAPPERS = ("model", "state_dict")


def unwrap(state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """The tensors of a training checkpoint: inside ``model`` or ``state_dict`` where present, ``module.`` (DDP)
    prefixes removed."""
    for key in _WRAPPERS:
        if isinstance(state_dict.get(key), Mapping):
            state_dict = state_dict[key]
            break
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state_dict.items()}


def _agent_biases(prefix: str, sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """One released AgentAttention's biases (keys under ``prefix``) in this module's names and axes."""
    heads, agents = sd[prefix + "an_bias"].shape[:2]

    def agents_first(name: str) -> torch.Tensor:  # (…, w, n) with the agent axis last → (H, n, w)
        bias = sd.pop(prefix + name)
        return bias.reshape(heads, -1, agents).transpose(1, 2).contiguous()

    out = {
        "agent_block_bias": sd.pop(prefix + "an_bias"),
        "query_block_bias": sd.pop(prefix + "na_bias"),
        "agent_row_bias": sd.pop(prefix + "ah_bias").reshape(heads, agents, -1),
        "agent_col_bias": sd.pop(prefix + "aw_bias").reshape(heads, agents, -1),
        "query_row_bias": agents_first("ha_bias"),
        "query_col_bias": agents_first("wa_bias"),
        "agent_prefix_bias": sd.pop(prefix + "ac_bias").reshape(heads, agents, 1),
        "query_prefix_bias": sd.pop(prefix + "ca_bias").reshape(heads, agents, 1),
    }
    return {prefix + k: v for k, v in out.items()}


def released_to_simattn(state_dict: Mapping[str, Any], model: nn.Module) -> Dict[str, Any]:
    """A released DeiT state dict (module docstring) in the key layout of ``model``; keys already in simattn's
    layout pass through unchanged, so the function is safe on any checkpoint."""
    sd = unwrap(state_dict)
    for key in [k for k in sd if k.endswith(".an_bias")]:
        sd.update(_agent_biases(key[:-len("an_bias")], sd))
    for key in [k for k in sd if k.endswith(".total_step")]:
        prefix = key[:-len("total_step")]
        if prefix + "norm2.alpha" in sd:  # a PRepBN (LinearNorm) of SLAB's code
            del sd[key]
            sd[prefix + "warmup_left"] = sd.pop(prefix + "warm")
            sd[prefix + "steps_left"] = sd.pop(prefix + "iter")
    if "cls_token" in sd and getattr(model, "cls_token", None) is None:
        del sd["cls_token"]  # SLAB-DeiT's, never used by its forward
    return sd
