"""Autograd against central finite differences, in fp64, for every registered model and every pretrained tag's build
(in their smallest configuration, once per distinct network), for the segmenters on a backbone of each pyramid, and
for one released model of each family loaded at full size through its family's ``checkpoint_filter_fn``.

Each check compares d/dε of a fixed random projection of the logits along a random direction u of one tensor (the
input image, the first and last norms' biases, RepBN's parameters, attention parameters, the head's bias) with
(f(θ + εu) − f(θ − εu)) / 2ε: one backward for all tensors, two forwards per tensor, and an error in any element of
a gradient moves the directional derivative. In eval mode, and in training mode with the same dropout draws in
every call (the seed is set before each) and the buffers (running statistics, PRepBN's schedule) put back.
"""
import contextlib
import functools
import sys
from typing import Dict, List, Optional

import pytest
import timm
import torch
from torch import nn

from simattn.models import list_models
from simattn.models.prepbn import PRepBN
from small_models import family, small_kwargs, structure
from helpers import released_state

MODELS = list_models()
TAGS = sorted(tag for tag in timm.list_pretrained() if tag.split(".")[0] in set(MODELS))
# ε = 1e-8: a ReLU-family kind's kinks crossed within ε move a central difference by O(ε) relative (1e-4 at ε = 1e-6
# for ReLU attention, 1e-8 relative here); rounding then costs about u·|terms of the loss|/ε, the absolute bound
# below (u = 2⁻⁵², 100 ulps). The batch-norm error this guards against is of the gradient's own size.
EPS = 1e-8
RTOL, ULPS = 1e-5, 100
def _targets(model: nn.Module) -> List[str]:
    """The parameters checked: the first and last norm biases and BatchNorm biases, the last RepBN's α and bias,
    the first and last parameters of attention modules that are not their projections, and the last parameter
    (the head's bias)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    norms = [(n, m) for n, m in model.named_modules()
             if isinstance(m, (nn.LayerNorm, nn.modules.batchnorm._BatchNorm, nn.GroupNorm))
             and getattr(m, "bias", None) is not None]
    norm_biases = [f"{n}.bias" for n, _ in norms]
    bn_biases = [f"{n}.bias" for n, m in norms if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    rep = [n for n in names if n.endswith(("norm2.alpha", "norm2.bn.bias"))][-2:]
    attn = [n for n in names if ".attn." in n and not n.endswith((".qkv.weight", ".proj.weight", ".q.weight",
                                                                   ".kv.weight"))]
    picked = norm_biases[:1] + norm_biases[-1:] + bn_biases[:1] + bn_biases[-1:] + rep + attn[:1] + attn[-1:]
    return list(dict.fromkeys(n for n in picked + names[-1:] if n in names))


@contextlib.contextmanager
def _replayable(model: nn.Module, train: bool):
    """``model`` in fp64 whose calls all see the same buffers and random draws. In training mode PRepBN's schedule
    is halfway (λ = 1/2: LayerNorm and RepBN both carry gradient)."""
    model.double().train(train)
    if train:
        for m in model.modules():
            if isinstance(m, PRepBN):
                m.warmup_left.zero_()
                m.steps_left.fill_(m.steps // 2)
    saved = {n: b.clone() for n, b in model.named_buffers()}
    live = dict(model.named_buffers())

    def call(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for n, b in saved.items():
                live[n].copy_(b)
        torch.manual_seed(3)
        out = model(x)  # a segmenter in training mode adds its auxiliary head's logits
        return torch.cat([o.flatten() for o in out]) if isinstance(out, (tuple, list)) else out.flatten()
    yield call


def assert_gradients_match_differences(model: nn.Module, x: torch.Tensor, train: bool,
                                       names: Optional[List[str]] = None) -> None:
    names = _targets(model) if names is None else names
    params = dict(model.named_parameters())
    with _replayable(model, train) as call:
        x = x.double().requires_grad_(True)
        out = call(x)
        gen = torch.Generator().manual_seed(5)
        weights = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        tensors = [("input", x)] + [(n, params[n]) for n in names]
        grads = torch.autograd.grad((out * weights).sum(), [t for _, t in tensors], allow_unused=True)
        atol = ULPS * torch.finfo(torch.float64).eps * (out * weights).abs().sum().item() / EPS
        wrong = []
        for (name, t), grad in zip(tensors, grads):
            u = torch.randn(t.shape, generator=gen, dtype=torch.float64)
            analytic = 0.0 if grad is None else (grad * u).sum().item()
            with torch.no_grad():
                t.add_(EPS * u)
                plus = (call(x) * weights).sum().item()
                t.sub_(2 * EPS * u)
                minus = (call(x) * weights).sum().item()
                t.add_(EPS * u)
            numeric = (plus - minus) / (2 * EPS)
            if abs(analytic - numeric) > atol + RTOL * abs(numeric):
                wrong.append(f"{name}: autograd {analytic:+.6e}, finite difference {numeric:+.6e}")
    assert not wrong, f"{'training' if train else 'eval'} mode: " + "; ".join(wrong)


def _checked_kwargs(name: str) -> dict:
    """The small configuration, SOFT's attention differentiating its Newton iterations: its default backward is by
    design that of the exact inverse the iterations approach (the released code's), not of the iterations."""
    kwargs = small_kwargs(name)
    if "attn_kwargs" in kwargs and family(name) == "soft_vit":
        kwargs["attn_kwargs"] = dict(kwargs["attn_kwargs"], backward="iterative")
    return kwargs


# ---- every registered model and tag, once per distinct network ---------------------------------------------------
@functools.lru_cache(maxsize=None)
def _distinct() -> Dict[str, str]:
    """Every model name and tag → the first name that builds the same small network."""
    first: Dict[str, str] = {}
    out = {}
    for name in MODELS + TAGS:
        torch.manual_seed(0)
        key = structure(timm.create_model(name, **_checked_kwargs(name)))
        out[name] = first.setdefault(key, name)
    return out


def _networks() -> List[str]:
    return sorted(set(_distinct().values()))


def test_every_model_and_tag_reaches_a_checked_network():
    """Every name maps to a network the check runs (models of one network share its result), and the SLAB builds of
    the tags (PRepBN) are among them."""
    distinct = _distinct()
    assert set(distinct) == set(MODELS + TAGS) and set(distinct.values()) <= set(MODELS + TAGS)
    assert any(isinstance(m, PRepBN) for m in timm.create_model(distinct["slab_deit_tiny_patch16_224.in1k"],
                                                                **small_kwargs("slab_deit_tiny_patch16_224")).modules())


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(set(MODELS + TAGS)))
def test_gradients_equal_finite_differences(name, train):
    network = _distinct()[name]
    if network != name:
        pytest.skip(f"the same network as {network}, checked there")
    torch.manual_seed(0)
    kwargs = _checked_kwargs(name)
    model = timm.create_model(name, **kwargs)
    size = kwargs["img_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    assert_gradients_match_differences(model, x, train)


# ---- segmenters -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head,backbone", [("semantic_fpn", "slab_pvt_tiny"),
                                           ("upernet", "slab_swin_tiny_patch4_window7_224")])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_segmenter_gradients_equal_finite_differences(head, backbone, train):
    """The decoders' BatchNorms (UperNet's pooling to 1×1 maps among them) and the backbones' PRepBN on maps."""
    pytest.importorskip("segmentation_models_pytorch")
    small = {k: v for k, v in small_kwargs(backbone).items() if k != "num_classes"}
    if family(backbone) == "swin":
        small.update(img_size=64, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), window_size=2)
    torch.manual_seed(0)
    seg = timm.create_model(head, backbone=backbone, num_classes=3, decoder_channels=32,
                            **({"segmentation_channels": 32} if head == "semantic_fpn" else {}), **small)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    assert_gradients_match_differences(seg, x, train)


# ---- the released layouts, through the family filters ----------------------------------------------------------
RELEASED = {"slab_deit_tiny_patch16_224.in1k": "deit_released", "slab_pvt_tiny.in1k": "pvt_released",
            "slab_swin_tiny_patch4_window7_224.in1k": "swin_released"}


@pytest.mark.parametrize("tag", sorted(RELEASED))
def test_released_layouts_loaded_through_their_filters_have_right_gradients(tag):
    """The released SLAB models of each family (PRepBN in every norm) at their full size, weights in the authors'
    layout through the family's ``checkpoint_filter_fn``, in eval mode (the fine-tuning start)."""
    model = timm.create_model(tag)
    filter_fn = sys.modules[timm.models.model_entrypoint(tag.split(".")[0]).__module__].checkpoint_filter_fn
    model.load_state_dict(filter_fn(released_state(RELEASED[tag], tag), model), strict=True)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    names = _targets(model)
    assert any(n.endswith("norm2.bn.bias") for n in names), names
    assert_gradients_match_differences(model, x, False, names)
