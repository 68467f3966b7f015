"""Graph capture of every registered model (of PVT and Swin, one network per kind of block: below), each compared with eager outputs computed separately: TorchScript
(with a save/load round trip), FX (timm's feature extraction with timm's no-trace lists, then TorchScript, as in
timm's model tests; ``torch.fx.symbolic_trace`` forward and backward), ``torch.export`` with a dynamic batch
(non-strict, as the exporters call it) and ``torch.compile(fullgraph=True)`` (Dynamo in one graph, what strict export
also needs); then export at a fixed input size through
``prepare_for_export``.

Every model runs in its smallest configuration (one block per stage, narrow, 32-64 px, batch 2). Every capture
(each costs seconds: TorchScript, FX, ``torch.export``, ``torch.compile``) runs once per distinct network: models
whose smallest build is the same network (same module tree, shapes and settings, the patch embedding aside; e.g.
``sima_deit_{tiny,small,base}`` or ``flatten_deit_{tiny,small}`` once narrowed, XCiT sizes that differ only in the
layer-scale init, or ``relu_vit_small_patch{8,16,32}_224``) share the first one's result, and fail with its error.
"""
import contextlib
import copy
import functools
import io
from typing import Any, Callable, Dict, Tuple

import pytest
import timm
import torch
from timm.layers import convert_sync_batchnorm
from timm.models import model_entrypoint
from timm.models._features_fx import create_feature_extractor as timm_feature_extractor
from torch.export import Dim, export

from simattn.models import list_models
from simattn.models.export_ready import prepare_for_export, revert_sync_batchnorm
from small_models import small_kwargs as _small
from small_models import structure as _structure

MODELS = list_models()
#: the pyramids of PVT and Swin run the attention modules and the PRepBN captured in the DeiT family: their captures
#: hold the family's own blocks (PVT's spatial reduction, its ratio-1 kind stages; Swin's windows beside whole-grid
#: kind stages, its PRepBN on (B, H, W, C) maps) through one network each, which keeps the suite's time
_PYRAMID_CAPTURES = {"pvt_tiny", "agent_pvt_tiny", "agent_swin_tiny_patch4_window7_224",
                     "slab_swin_tiny_patch4_window7_224"}
CAPTURED = [name for name in MODELS if model_entrypoint(name).__module__.rsplit(".", 1)[-1] not in ("pvt", "swin")
            or name in _PYRAMID_CAPTURES]
TOL = dict(rtol=1e-4, atol=1e-5)

@functools.lru_cache(maxsize=None)
def _built(name: str, overrides: Tuple[Tuple[str, Any], ...]) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**_small(name), **dict(overrides)}).eval()


def _build(name: str, **overrides) -> Tuple[torch.nn.Module, torch.Tensor]:
    """A copy of the model in its smallest configuration (eval mode, fixed seed) and a batch of 2 inputs."""
    size = _small(name)["img_size"]
    torch.manual_seed(1)
    return copy.deepcopy(_built(name, tuple(sorted(overrides.items())))), torch.randn(2, 3, size, size)


def test_every_family_has_a_small_configuration():
    assert len(MODELS) == 41 + 4 + 8 + 2 + 21 + 17  # + agent_deit_{tiny,small}, sigmoid_deit_{tiny,small}
    # + {flatten,inline,slab,polaformer}_deit_{tiny,small}, prepbn_deit_{tiny,small}, the PVT and Swin families
    for name in MODELS:
        _small(name)


# ---- captures that cost seconds run once per distinct network ----------------------------------------------------
_CAPTURED: Dict[Tuple[str, str], Tuple[str, BaseException]] = {}


def _capture_once(path: str, name: str, model: torch.nn.Module, capture: Callable[[], None]) -> None:
    key = (path, _structure(model))
    if key not in _CAPTURED:
        try:
            capture()
        except BaseException as e:
            _CAPTURED[key] = (name, e)
            raise
        _CAPTURED[key] = (name, None)
        return
    first, error = _CAPTURED[key]
    if error is not None:
        pytest.fail(f"{name} builds the same network as {first}, whose {path} failed: {error!r}")


# ---- TorchScript ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _plain_torchscript():
    """No autograd and no graph optimization on TorchScript's first calls, which cost seconds per model otherwise
    (the interpreter runs the same graph)."""
    with torch.no_grad(), torch.jit.optimized_execution(False):
        yield


@pytest.mark.parametrize("name", CAPTURED)
def test_torchscript(name):
    model, x = _build(name)

    def capture():
        with _plain_torchscript():
            expected = model(x)
            scripted = torch.jit.script(model)
            torch.testing.assert_close(scripted(x), expected, **TOL)
            buffer = io.BytesIO()
            torch.jit.save(scripted, buffer)  # plain TorchScript: a Python callback would not save
            buffer.seek(0)
            torch.testing.assert_close(torch.jit.load(buffer)(x), expected, **TOL)

    _capture_once("torch.jit.script", name, model, capture)


# ---- FX: timm's model-test contract (its tests/test_models.py) ----------------------------------------------------
@pytest.mark.parametrize("name", CAPTURED)
def test_fx_forward_and_torchscript(name):
    """timm's FX feature extraction (``timm.models._features_fx.create_feature_extractor``, with timm's no-trace
    lists; what ``feature_cls='fx'`` builds on) gives the eager output, and so does its graph scripted."""
    model, x = _build(name)

    def capture():
        with _plain_torchscript():
            expected = model(x)
            fx_model = timm_feature_extractor(model, [model.pretrained_cfg["classifier"]])  # the output node
            out, = fx_model(x).values()
            torch.testing.assert_close(out, expected, **TOL)
            out, = torch.jit.script(fx_model)(x).values()
            torch.testing.assert_close(out, expected, **TOL)

    _capture_once("FX then TorchScript", name, model, capture)


@pytest.mark.parametrize("name", CAPTURED)
def test_fx_symbolic_trace_forward_and_backward(name):
    """Any FX tracer (``torch.fx.symbolic_trace``, FX quantization) takes the models: attention modules record
    themselves as one call. timm's ViT resamples position embeddings per input through a function FX cannot enter
    (timm's own ViT as well), so the ViTs are traced at a fixed size here (``dynamic_img_size=False``)."""
    fixed = {"dynamic_img_size": False} if model_entrypoint(name).__module__.endswith("sima_vit") else {}
    model, x = _build(name, **fixed)

    def capture():
        graph_module = torch.fx.symbolic_trace(model)
        torch.testing.assert_close(graph_module(x), model(x), **TOL)
        model.train()
        model(x).square().mean().backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        graph_module = torch.fx.symbolic_trace(model)  # the training graph (dropout, BatchNorm statistics)
        graph_module(x).square().mean().backward()
        grads = {n: p.grad for n, p in graph_module.named_parameters() if p.grad is not None}
        assert len(grads) == len(expected) == sum(1 for p in model.parameters() if p.requires_grad)
        for n, g in expected.items():
            torch.testing.assert_close(grads[n], g, **TOL, msg=n)

    _capture_once("fx.symbolic_trace", name, model, capture)


# ---- torch.export and torch.compile ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", CAPTURED)
def test_export_dynamic_batch(name):
    """``torch.export`` as every exporter here calls it (non-strict: ``torch.export.export``'s and
    ``torch.onnx.export(dynamo=True)``'s default) with the batch a graph input. What strict export asks beyond it,
    that Dynamo traces the forward in one graph, :func:`test_compile_fullgraph` asks at a fixed size."""
    model, x = _build(name)

    def capture():
        x3 = torch.randn(3, *x.shape[1:])
        expected, expected3 = model(x), model(x3)
        program = export(model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=64)},), strict=False)
        exported = program.module()
        torch.testing.assert_close(exported(x), expected, **TOL)
        torch.testing.assert_close(exported(x3), expected3, **TOL)  # the batch is a graph input, not a constant

    _capture_once("export", name, model, capture)


@pytest.mark.parametrize("name", CAPTURED)
def test_compile_fullgraph(name):
    """Dynamo traces the whole forward as one graph (``fullgraph=True``: a graph break raises), which
    ``torch.compile`` and strict ``torch.export`` both need; the batch as a graph input is
    :func:`test_export_dynamic_batch`'s question. The compiled call comes first, as in a process that has not run
    the model eagerly yet (the CPU kernel's loader, asked once, is not traced: test_backend_chooser.py)."""
    model, x = _build(name)

    def capture():
        torch._dynamo.reset()  # models share forward code: start each from a clean cache
        compiled = torch.compile(model, fullgraph=True, backend="eager")  # fullgraph: a graph break raises
        out = compiled(x)
        torch.testing.assert_close(out, model(x), **TOL)

    _capture_once("compile(fullgraph=True)", name, model, capture)


# ---- export at a fixed input size --------------------------------------------------------------------------------
def _call_targets(program) -> set:
    return {str(node.target) for node in program.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("name, size", [("sima_deit_tiny_patch16_224", 96), ("ufo_vit_tiny", 48), ("soft_tiny", 48)])
def test_prepare_for_export_leaves_no_resampling_in_the_graph(name, size):
    """Models that resample learned position embeddings per input (``dynamic_img_size``) export with an antialiased
    bicubic resample op; laid out for one size they export without one, with the same outputs."""
    model, _ = _build(name)
    x = torch.randn(2, 3, size, size)
    expected = model(x)
    batch = ({0: Dim("batch", min=1, max=64)},)
    before = export(model, (x,), dynamic_shapes=batch, strict=False)
    assert any(t.startswith("aten._upsample_bicubic2d_aa") for t in _call_targets(before))

    prepared = prepare_for_export(model, size)
    assert not prepared.training
    program = export(prepared, (x,), dynamic_shapes=batch, strict=False)
    assert not [t for t in _call_targets(program) if "upsample" in t or "interpolate" in t]
    torch.testing.assert_close(program.module()(x), expected, **TOL)
    x3 = torch.randn(3, 3, size, size)
    torch.testing.assert_close(program.module()(x3), model(x3), **TOL)
    with pytest.raises((ValueError, AssertionError)):  # the size is now fixed
        prepared(torch.randn(1, 3, size + 32, size + 32))


def test_prepare_for_export_reverts_sync_batchnorm():
    """The official SimA layout trains with SyncBatchNorm (conv stem, LPI): exported with BatchNorm2d, same outputs."""
    model, x = _build("sima_small_12_p16")
    model.train()
    model(torch.randn(4, *x.shape[1:]))  # running statistics that are not the initial ones
    model.eval()
    expected = model(x)
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert sum(isinstance(m, torch.nn.SyncBatchNorm) for m in synced.modules()) == n_bn > 0
    prepared = prepare_for_export(synced, x.shape[-1])
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in prepared.modules())
    assert sum(type(m) is torch.nn.BatchNorm2d for m in prepared.modules()) == n_bn
    torch.testing.assert_close(prepared(x), expected)
    program = export(prepared, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=64)},), strict=False)
    torch.testing.assert_close(program.module()(x), expected, **TOL)


def test_revert_sync_batchnorm_keeps_timm_norm_act():
    """timm's BatchNormAct2d (SOFT's conv stems) converts to SyncBatchNormAct and back with its activation."""
    model, x = _build("soft_tiny")
    expected = model(x)
    synced = convert_sync_batchnorm(model)
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in synced.modules())
    reverted = revert_sync_batchnorm(synced)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in reverted.modules())
    torch.testing.assert_close(reverted(x), expected)
    bn = torch.nn.SyncBatchNorm(4)
    assert type(revert_sync_batchnorm(bn)) is torch.nn.BatchNorm2d


def test_revert_sync_batchnorm_gives_repbn_its_token_batchnorm_back():
    """SLAB's RepBN normalizes (B, C, N) tokens with a BatchNorm1d: SyncBatchNorm and back, same outputs."""
    model, x = _build("slab_pvt_tiny")
    expected = model(x)
    reverted = revert_sync_batchnorm(convert_sync_batchnorm(model))
    kinds = {type(m.bn) for m in reverted.modules() if type(m).__name__ == "RepBN"}
    assert kinds == {torch.nn.BatchNorm1d}
    torch.testing.assert_close(reverted(x), expected)
