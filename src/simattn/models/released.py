"""The peers' released checkpoints: their files read safely, and their key names mapped onto the modules here (the
one mapping of Agent's biases, FLatten's and PolaFormer's feature scale and SLAB's counters, for every family).

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

import re
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import torch
from torch import nn

__all__ = ["ConfigStandIn", "RELEASED_GLOBALS", "released_files_readable", "PAPERS", "TSINGHUA", "SLAB_RELEASES",
           "POLAFORMER_HUB", "tag_top1", "with_tag_args", "downstream_agents", "unwrap", "released_names",
           "released_to_simattn"]


class ConfigStandIn:
    """An inert stand-in for the yacs ``CfgNode`` the released files carry beside the weights, allowed to
    ``torch.load(weights_only=True)`` under the name ``yacs.config.CfgNode`` only (every other pickled object stays
    refused). Unpickling makes an ``OrderedDict`` of the config's items instead (nested configs likewise, yacs'
    flags in its ``__dict__``): the only container whose items and attributes the weights-only unpickler sets;
    none of yacs' code runs."""

    def __new__(cls, *args: Any) -> "OrderedDict[str, Any]":  # type: ignore[misc]
        return OrderedDict()


#: what a weights-only load of a released file may unpickle beside the tensors (nothing of the user's process changes:
#: simattn's loads pass it, and the families build inside :func:`released_files_readable`)
RELEASED_GLOBALS = [(ConfigStandIn, "yacs.config.CfgNode")]


@contextmanager
def released_files_readable() -> Iterator[None]:
    """Inside the block, ``torch.load(weights_only=True)`` also reads the released files' yacs configs (as
    :class:`ConfigStandIn`), so timm's own loader, called by a family's build with ``pretrained=True``, reads them;
    torch's allowed globals are as they were outside it."""
    with torch.serialization.safe_globals(RELEASED_GLOBALS):
        yield

#: paper → (paper_ids, paper_name, origin_url) of the tags made from its released checkpoints
PAPERS = {
    "agent": ("arXiv:2312.08874", "Agent Attention: On the Integration of Softmax and Linear Attention",
              "https://github.com/LeapLabTHU/Agent-Attention"),
    "flatten": ("arXiv:2308.00442", "FLatten Transformer: Vision Transformer using Focused Linear Attention",
                "https://github.com/LeapLabTHU/FLatten-Transformer"),
    "polaformer": ("arXiv:2501.15061", "PolaFormer: Polarity-aware Linear Attention for Vision Transformers",
                   "https://github.com/ZacharyMeng/PolaFormer"),
    "pvt": ("arXiv:2102.12122", "Pyramid Vision Transformer: A Versatile Backbone for Dense Prediction without "
            "Convolutions", "https://github.com/whai362/PVT"),
    "inline": ("arXiv:2412.06590", "Bridging the Divide: Reconsidering Softmax and Linear Attention",
               "https://github.com/LeapLabTHU/InLine"),
    "slab": ("arXiv:2405.11582", "SLAB: Efficient Transformers with Simplified Linear Attention and Progressive "
             "Re-parameterized Batch Normalization", "https://github.com/xinghaochen/SLAB"),
}
# Their READMEs link Tsinghua Cloud as /f/<id>/?dl=1. timm and torch.hub name the cached file after the URL's last
# path segment, empty there (the cache folder itself would be read as the file): written here without the slash
# before the query, which seahub (a Django app, APPEND_SLASH) is expected to redirect to the README's form; not
# tried from this repository's machines, which have no network.
TSINGHUA = "https://cloud.tsinghua.edu.cn/f/{}?dl=1"
SLAB_RELEASES = "https://github.com/xinghaochen/SLAB/releases/download/ckpts/{}"
# PolaFormer's weights are on the Hugging Face Hub. Its README links the repository, not its files: the tags name
# each file after its training config's model name (``pola_pvt_tiny.pth``, ``pola_swin_tiny_patch4_224.pth``), not
# checked against the repository, which no network reaches from here.
POLAFORMER_HUB = "ZachMeng/PolaFormer"

#: Agent-Attention's bias names → AgentAttention's, and the index that takes each to (H, n, …) with the agent axis
#: second (its query biases store the agent axis last)
_AGENT_BIASES = {
    "an_bias": ("agent_block_bias", lambda v: v),  # (H, n, 7, 7)
    "na_bias": ("query_block_bias", lambda v: v),
    "ah_bias": ("agent_row_bias", lambda v: v[0, :, :, :, 0]),  # (1, H, n, w, 1)
    "aw_bias": ("agent_col_bias", lambda v: v[0, :, :, 0, :]),  # (1, H, n, 1, w)
    "ha_bias": ("query_row_bias", lambda v: v[0, :, :, 0, :].transpose(-2, -1)),  # (1, H, w, 1, n)
    "wa_bias": ("query_col_bias", lambda v: v[0, :, 0, :, :].transpose(-2, -1)),  # (1, H, 1, w, n)
    "ac_bias": ("agent_prefix_bias", lambda v: v[0]),  # (1, H, n, 1): the class token's
    "ca_bias": ("query_prefix_bias", lambda v: v[0].transpose(-2, -1)),  # (1, H, 1, n)
}
#: SLAB's LinearNorm counters → PRepBN's (None: its total, this model's ``steps`` attribute, is left out)
_PREPBN_COUNTERS = {"warm": "warmup_left", "iter": "steps_left", "total_step": None}


_TOP1 = re.compile(r"top-1 ([0-9.]+) on ImageNet-1k")


def tag_top1(cfg: Mapping[str, Any]) -> Optional[float]:
    """The authors' top-1 a tag's ``pretrained_cfg`` (as a dict) carries in its notes, or None."""
    for note in cfg.get("notes") or ():
        found = _TOP1.search(note)
        if found:
            return float(found[1])
    return None


def with_tag_args(variant: str, kwargs: Dict[str, Any], asked: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """``kwargs`` with what the tag asks for (``asked``: tag → the arguments of the model its weights were trained
    in) where not given; timm passes a tag to the model's function as ``pretrained_cfg``."""
    tag = kwargs.get("pretrained_cfg")
    return {**(asked.get(f"{variant}.{tag}", {}) if isinstance(tag, str) else {}), **kwargs}


def downstream_agents(variant: str, counts: Optional[Sequence[int]], stages: int) -> List[Dict[str, Any]]:
    """Each stage's ``downstream_agent_num`` option from an Agent model's ``downstream_agents`` (one count per stage,
    as the ``downstream_agent_shapes`` of Agent's segmentation and detection configs: 144, 256, 784, 784 for
    Agent-PVT, 81, 144, 196, 49 for Agent-Swin); empty options for None."""
    if counts is None:
        return [{} for _ in range(stages)]
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) != stages:
        raise ValueError(f"{variant}: downstream_agents={counts!r}; allowed: {stages} square numbers, one per stage "
                         "(e.g. [144, 256, 784, 784])")
    return [{"downstream_agent_num": count} for count in counts]


def unwrap(state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """The tensors of a training checkpoint: inside ``model`` or ``state_dict`` where present, ``module.`` (DDP)
    prefixes removed."""
    for key in ("model", "state_dict"):
        if isinstance(state_dict.get(key), Mapping):
            state_dict = state_dict[key]
            break
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state_dict.items()}


def released_names(state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """The peers' per-module names in a released file of any family (DeiT, PVT, Swin) as the modules here name
    them: Agent's biases (``<attn>.an_bias`` … , axes as :data:`_AGENT_BIASES` says), FLatten's and PolaFormer's
    feature ``scale`` (``feature_scale``), SLAB's LinearNorm counters (PRepBN's). Everything else passes
    unchanged, so this is safe on any checkpoint; a family's own layout (stage names, fused projections) is its
    filter's."""
    out: Dict[str, Any] = {}
    for key, value in unwrap(state_dict).items():
        head, _, name = key.rpartition(".")
        if head.endswith("attn") and name in _AGENT_BIASES:
            name, value = _AGENT_BIASES[name][0], _AGENT_BIASES[name][1](value).contiguous()
        elif head.endswith("attn") and name == "scale":
            name = "feature_scale"
        elif name in _PREPBN_COUNTERS and isinstance(value, torch.Tensor) and value.dim() == 0:
            if _PREPBN_COUNTERS[name] is None:
                continue
            name = _PREPBN_COUNTERS[name]
        out[f"{head}.{name}" if head else name] = value
    return out


def released_to_simattn(state_dict: Mapping[str, Any], model: nn.Module) -> Dict[str, Any]:
    """A released DeiT state dict (module docstring) in the key layout of ``model``; keys already in simattn's
    layout pass through unchanged, so the function is safe on any checkpoint."""
    sd = released_names(state_dict)
    if "cls_token" in sd and getattr(model, "cls_token", None) is None:
        del sd["cls_token"]  # SLAB-DeiT's, never used by its forward
    return sd
