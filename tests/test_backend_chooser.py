"""The backend chooser (:mod:`simattn.attention.backends`): each kind's policy from its table, on CPU and on a CUDA
call stated with CPU tensors (the chooser reads the device and the grad, graph and autocast state from its Call), in
inference and training; the one-line refusals of an explicit backend; and every kind with kernels taking
``backend=`` from its module and its model."""
import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the kinds and the models)
from simattn.attention import create_attention
from simattn.attention.backends import POLICIES, Call, choices, choose
from simattn.kernels.cpu import sima as sima_cpu

KERNEL_KINDS = ["sima", "agent", "sigmoid", "relu", "elu", "slab", "flatten", "inline", "polaformer", "xnorm"]
#: the kinds whose kernels have a backward: 'auto' takes them in training too
TRAINED_ON_KERNELS = {"sima", "agent", "sigmoid", "relu", "elu", "slab", "flatten", "inline", "polaformer"}
EAGER = dict(graph=None, autocast=None, capability=None)


def _call(kind: str, device: str = "cpu", grad: bool = False, dtype=torch.float32, d: int = 16,
          activation: str = "relu", order: str = "kv_first", resolved: str = "kv_first", masked: bool = False,
          **state) -> Call:
    """A call of ``kind`` with what its own policy reads: SimA's orders and mask, ReLU's h, Agent's agents."""
    q = torch.zeros(2, 2, 8, d, dtype=dtype)
    extra = {"sima": (order, resolved, masked), "relu": activation}.get(kind)
    params = (q[:, :, :4],) if kind == "agent" else ()
    return Call(q, q, q, device=device, grad=grad, params=params, extra=extra, **{**EAGER, **state})


def test_the_table_names_every_kind_with_kernels_and_its_policy():
    assert sorted(POLICIES) == sorted(KERNEL_KINDS)
    assert all(POLICIES[k].why.startswith("auto: ") for k in KERNEL_KINDS)
    assert choices("sima") == ("auto", "torch", "triton", "cpp")
    assert all(choices(k) == ("auto", "torch", "triton") for k in KERNEL_KINDS if k != "sima")
    assert [k for k in KERNEL_KINDS if POLICIES[k].table] == ["sima"]


@pytest.mark.parametrize("kind", KERNEL_KINDS)
def test_auto_on_cpu_runs_torch_but_sima_the_cpu_kernel_in_inference(kind, monkeypatch):
    monkeypatch.setattr(sima_cpu, "available", lambda: True)
    expected = "cpp" if kind == "sima" else "torch"
    assert choose(kind, "auto", _call(kind)) == expected
    assert choose(kind, "auto", _call(kind, grad=True)) == "torch"  # the CPU kernel has no autograd
    assert choose(kind, "torch", _call(kind)) == "torch"
    monkeypatch.setattr(sima_cpu, "available", lambda: False)
    assert choose(kind, "auto", _call(kind)) == "torch"


@pytest.mark.parametrize("kind", KERNEL_KINDS)
def test_auto_on_cuda_runs_the_kernels_where_they_apply_training_included(kind):
    assert choose(kind, "auto", _call(kind, "cuda")) == "triton"
    assert choose(kind, "auto", _call(kind, "cuda", grad=True)) == ("triton" if kind in TRAINED_ON_KERNELS else "torch")
    assert choose(kind, "auto", _call(kind, "cuda", graph="compile")) == "triton"  # compile sees the custom ops
    assert choose(kind, "auto", _call(kind, "cuda", graph="export")) == "torch"  # other runtimes could not run them
    assert choose(kind, "auto", _call(kind, "cuda", dtype=torch.float64)) == "torch"
    assert choose(kind, "auto", _call(kind, "cuda", d=256)) == "torch"
    assert choose(kind, "auto", _call(kind, "meta")) == "torch"


def test_kind_specific_limits_keep_auto_on_torch():
    assert choose("polaformer", "auto", _call("polaformer", "cuda", d=64)) == "triton"
    assert choose("polaformer", "auto", _call("polaformer", "cuda", d=96)) == "torch"  # polar features: 2d > 128
    assert choose("relu", "auto", _call("relu", "cuda", activation="relu2")) == "torch"
    q = torch.zeros(1, 1, 8, 16)
    many = torch.zeros(1, 1, 144, 16)
    assert choose("agent", "auto", Call(q, q, q, device="cuda", params=(many,), **EAGER)) == "torch"
    # SimA: where 'auto' resolves its order to (q̂k̂ᵀ)v, torch's product is the cheaper
    assert choose("sima", "auto", _call("sima", "cuda", resolved="qk_first")) == "torch"
    assert choose("sima", "triton", _call("sima", "cuda", order="auto", resolved="qk_first")) == "triton"


def test_sima_auto_on_cuda_follows_the_measured_table(monkeypatch):
    from simattn.attention import backends

    points = [dict(capability="sm_90", dtype="float32", head_dim=16, bh=4, tokens=8, triton_ms=2.0, torch_ms=1.0,
                   **{"pass": "fwd"})]
    index = backends.index_points(points)
    monkeypatch.setattr(backends, "backend_table", lambda name: index)
    assert choose("sima", "auto", _call("sima", "cuda", capability="sm_90")) == "torch"  # measured slower
    assert choose("sima", "auto", _call("sima", "cuda", capability="sm_90", grad=True)) == "triton"  # no fwd+bwd point
    assert choose("sima", "auto", _call("sima", "cuda", capability="sm_80")) == "triton"  # GPU not measured
    assert choose("slab", "auto", _call("slab", "cuda", capability="sm_90")) == "triton"  # no table for SLAB


@pytest.mark.parametrize("kind,call,backend,reason", [
    ("slab", dict(dtype=torch.float64), "triton", "takes float32, float16 or bfloat16, got torch.float64, "
                                                           "torch.float64, torch.float64"),
    ("flatten", dict(d=256), "triton", "takes head dims up to 128, got d=256, dv=256"),
    ("polaformer", dict(d=96), "triton", "takes head dims up to 64 (its polar features double them), got d=96"),
    ("xnorm", dict(grad=True), "triton", "has no backward kernel (run it under torch.no_grad() or "
                                         "torch.inference_mode())"),
    ("relu", dict(activation="gelu"), "triton", "computes h = relu or sigmoid, got activation='gelu'"),
    ("sima", dict(order="qk_first"), "triton", "computes q̂(k̂ᵀv) (order 'auto' or 'kv_first'), got order 'qk_first'"),
    ("sima", dict(device="cuda"), "cpp", "runs on CPU tensors only"),
    ("sima", dict(grad=True), "cpp", "has no autograd (run it under torch.no_grad() or torch.inference_mode())"),
    ("sima", dict(masked=True), "cpp", "takes no mask"),
    ("sima", dict(graph="compile"), "cpp", "runs eagerly only (not traced, scripted, compiled or exported)"),
])
def test_an_explicit_backend_that_cannot_take_the_call_says_why_in_one_line(kind, call, backend, reason,
                                                                             monkeypatch):
    monkeypatch.setattr(sima_cpu, "available", lambda: True)
    expected = f"{kind}: backend '{backend}' {reason}; backend 'auto' runs torch there"
    with pytest.raises(ValueError) as info:
        choose(kind, backend, _call(kind, **call))
    assert str(info.value) == expected


@pytest.mark.parametrize("graph", ["compile", "export"])
@pytest.mark.parametrize("backend", ["auto", "cpp"])
def test_a_graph_never_asks_whether_the_cpu_kernel_loads(graph, backend, monkeypatch):
    """Dynamo cannot trace the loader (it takes a lock): a call inside a graph is answered before the loader is
    asked, so ``torch.compile(model, fullgraph=True)`` works in a process that has not run SimA eagerly yet."""
    def asked():
        raise AssertionError("the CPU kernel's loader was asked")

    monkeypatch.setattr(sima_cpu, "available", asked)
    call = _call("sima", graph=graph)
    if backend == "auto":
        assert choose("sima", "auto", call) == "torch"
    else:
        with pytest.raises(ValueError, match="backend 'cpp' runs eagerly only"):
            choose("sima", "cpp", call)


def test_unknown_backends_are_named_with_the_kinds_choices():
    with pytest.raises(ValueError, match=r"^elu: unknown backend 'cpp'; expected one of auto, torch, triton$"):
        choose("elu", "cpp", _call("elu"))
    with pytest.raises(ValueError, match=r"^FLattenAttention: unknown backend 'cuda'; expected one of auto, torch, "
                                         r"triton$"):
        create_attention("flatten", 32, num_heads=2, backend="cuda")


def test_an_unstated_call_reads_the_live_state():
    q = torch.zeros(1, 2, 4, 8, requires_grad=True)
    call = Call(q, q.detach(), q.detach())
    assert (call.device, call.grad, call.graph, call.autocast, call.capability) == ("cpu", True, None, None, None)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert (Call(q, q, q).grad, Call(q, q, q).autocast) == (False, torch.bfloat16)
    gamma = torch.ones(2, requires_grad=True)
    assert Call(q.detach(), q.detach(), q.detach(), params=(1.0, gamma)).grad


@pytest.mark.parametrize("kind", ["flatten", "inline", "slab", "polaformer", "elu", "xnorm", "sigmoid", "relu",
                                  "agent", "sima"])
def test_every_kind_with_kernels_takes_backend_from_its_module_and_its_model(kind, monkeypatch):
    """The module hands its ``backend`` to the chooser on every call, and a model passes it on from
    ``attn_kwargs``."""
    from simattn.attention import backends

    seen = []
    real = backends.choose
    monkeypatch.setattr(backends, "choose",
                        lambda k, b, call, owner=None: seen.append((k, b)) or real(k, b, call, owner))
    module = __import__(f"simattn.attention.{kind}", fromlist=["choose"])
    if hasattr(module, "choose"):  # SimA's calls it; the others through backends.dispatch
        monkeypatch.setattr(module, "choose", backends.choose)
    m = create_attention(kind, 32, num_heads=2, backend="torch")
    assert m.backend == "torch"
    x = torch.randn(1, 64, 32)
    with torch.no_grad():  # SimA with a mask: its op, not the fused path's fp32 shortcut
        m(x, attn_mask=torch.ones(1, 64, dtype=torch.bool) if kind == "sima" else None)
    assert seen and set(seen) == {(kind, "torch")}
    model = timm.create_model("sima_deit_small_patch16_224", attn_type=kind, img_size=32, depth=1,
                              attn_kwargs={"backend": "torch"})
    assert {getattr(a, "backend", None) for a in model.modules() if hasattr(a, "attn_name")} == {"torch"}
