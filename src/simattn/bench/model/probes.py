"""What a row measures beside its timings: the attention share of the eager forward, the linear floor (the model's
``nn.Linear`` layers alone), and the profiled shares of an exported runtime's time."""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ...utils.timing import sync
from .runner import Runner

def attention_share(model: nn.Module, fn, device: torch.device, repeats: int,
                    max_time: float = float("inf")) -> Dict[str, Any]:
    """The share of ``fn()``'s (a forward of ``model``) wall time spent inside its attention modules, measured.

    Forward pre/post hooks on every outermost attention module
    (:func:`simattn.bench.counters.attention_module_names`: simattn's ``TokenAttention`` kinds, timm's attention
    classes) and on their Linear/Conv layers add up the time spent in them during each call (CUDA: the device is
    synchronized at every hook, so each span is the work done, not the launch); the share is that time over the
    call's own, in the same call. ``attn_share``: the whole module (qkv and output projections included);
    ``attn_core_share``: without the projections, i.e. what the attention kind changes (q kᵀ, softmax or SimA's
    normalization, the weighted sum). Medians over ``repeats`` calls (at least one; fewer once ``max_time`` s are
    spent). The hooks cost a few µs per module call, which this timing includes and the latency rows do not.
    Empty when the model has no attention module."""
    from ..counters import attention_module_names

    modules = dict(model.named_modules())
    outer = [modules[name] for name in attention_module_names(model)]
    if not outer:
        return {}
    projections = [sub for m in outer for sub in m.modules() if isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd))]
    spent = {"attn": 0.0, "proj": 0.0}
    started: Dict[int, float] = {}

    def enter(module, args):
        sync(device)
        started[id(module)] = time.perf_counter()

    def leave(kind):
        def hook(module, args, out):
            sync(device)
            spent[kind] += time.perf_counter() - started.pop(id(module))
        return hook

    handles = [m.register_forward_pre_hook(enter) for m in outer + projections]
    handles += [m.register_forward_hook(leave("attn")) for m in outer]
    handles += [m.register_forward_hook(leave("proj")) for m in projections]
    shares, cores = [], []
    try:
        start = time.perf_counter()
        while len(shares) < max(1, repeats) and (not shares or time.perf_counter() - start < max_time):
            spent.update(attn=0.0, proj=0.0)
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            total = time.perf_counter() - t0
            shares.append(spent["attn"] / total)
            cores.append((spent["attn"] - spent["proj"]) / total)
    finally:
        for handle in handles:
            handle.remove()
    return {"attn_share": statistics.median(shares), "attn_core_share": statistics.median(cores),
            "attn_share_runs": len(shares)}


# ------------------------------------------------------------------------------------------------ the linear floor


def linear_calls(model: nn.Module, x: torch.Tensor) -> List[Dict[str, Any]]:
    """Every ``nn.Linear`` call of one eager forward of ``model`` on ``x``, in call order (forward hooks): ``name``,
    ``input_shape`` (batch first, as the layer saw it), ``in_features``, ``out_features``, ``bias``. A layer called
    twice is listed twice; linears applied as ``F.linear`` outside an ``nn.Linear`` call are not seen."""
    calls: List[Dict[str, Any]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, args, out):
        calls.append({"name": names[module], "input_shape": tuple(args[0].shape), "in_features": module.in_features,
                      "out_features": module.out_features, "bias": module.bias is not None})

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        with torch.inference_mode():
            model.eval()(x)
    finally:
        for handle in handles:
            handle.remove()
    return calls


class LinearFloor(nn.Module):
    """The linear layers of a model alone: one ``nn.Linear`` per call :func:`linear_calls` saw (same in/out
    features and bias), each applied to an input of the shape that call saw, batch as given.

    It takes the model's input (a batch of images), so that a runtime exports, calibrates and runs it exactly as
    it does the model. The layers run in the model's order, each on the previous one's output where the shapes
    agree (DeiT: proj → fc1 → fc2 → the next block's qkv), else on it flattened and cut (repeated if short) to the
    shape the layer saw (image → first layer, qkv → proj, last layer → head): a chain, so no layer is dead code a
    runtime could drop, and no sums or concatenations are added. Weights are fresh with std 1/√in_features and
    zero bias, so that activations keep their scale along the chain (no vanishing values, no denormals; timing
    does not depend on the weights' values)."""

    def __init__(self, calls: Sequence[Dict[str, Any]]) -> None:
        super().__init__()
        if not calls:
            raise ValueError("the model runs no nn.Linear layer: it has no linear floor")
        self.shapes = [tuple(int(v) for v in c["input_shape"][1:]) for c in calls]
        self.layers = nn.ModuleList(nn.Linear(c["in_features"], c["out_features"], bias=c["bias"]) for c in calls)
        with torch.no_grad():
            for layer in self.layers:
                nn.init.normal_(layer.weight, std=layer.in_features ** -0.5)
                if layer.bias is not None:
                    layer.bias.zero_()

    @staticmethod
    def _fit(h: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
        if tuple(h.shape[1:]) == shape:
            return h
        need = math.prod(shape)
        flat = h.reshape(h.shape[0], -1)
        have = math.prod(h.shape[1:])
        if have < need:
            flat = flat.repeat(1, -(-need // have))
        return flat[:, :need].reshape(-1, *shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for shape, layer in zip(self.shapes, self.layers):
            h = layer(self._fit(h, shape))
        return h


def linear_floor(model: nn.Module, x: torch.Tensor) -> LinearFloor:
    """:class:`LinearFloor` of ``model``'s linear layers as one forward on ``x`` (its batch) calls them."""
    return LinearFloor(linear_calls(model, x))


# ------------------------------------------------------------------------------------------------ runtime profiles

def runtime_profile(runtime: str, path: Union[str, Path], x: torch.Tensor, threads: int,
                    work_dir: Optional[str] = None) -> Dict[str, Any]:
    """The profiled shares of an exported file's time in its runtime (the format's
    :meth:`~simattn.deploy.base.Format.profile`), from runs of their own (profiling slows the calls it records), or
    a ``profile_note`` saying why there are none; empty for runtimes that cannot say."""
    from ... import deploy

    return deploy.get(runtime).profile(path, x, threads, work_dir=work_dir)



def time_floor(run: Runner, work_dir: str) -> Dict[str, Any]:
    """The linear floor of ``run``'s model (:func:`linear_floor` at the latency batch), run as ``run`` runs the
    model (eager, compiled, or exported, quantized and opened by the same registry entry at the same threads),
    timed the same way: ``floor_ms`` (p50), ``floor_p10_ms``, ``floor_p90_ms`` and ``floor_linears``."""
    spec = run.spec
    b1 = spec.latency_batch
    with torch.random.fork_rng(devices=[]), torch.no_grad(), run.autocast():  # the same fresh weights every run
        torch.manual_seed(0)
        floor = linear_floor(run.model, run.inputs(b1))
    floor_run = Runner(spec, work_dir, model=floor, like=run, stem="floor")
    t = floor_run.time(floor_run.infer_fn(b1))
    return {"floor_ms": t["median_ms"], "floor_p10_ms": t["p10_ms"], "floor_p90_ms": t["p90_ms"],
            "floor_linears": len(floor.layers)}
