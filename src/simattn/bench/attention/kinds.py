"""What both sweeps of ``bench attention`` share: the rows timed on each device, derived from the attention registry
and the kernel policies, each row's callable, and the inputs."""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..report import WIDE_SPREAD, spread_warning, write_result_files

LAYOUTS = ("qkv", "contiguous")
#: CPU rows every run includes: the ratios are against them
REQUIRED = ("softmax", "sima_official", "sima_matmuls")
#: GPU rows beside the kinds with kernels: softmax on SDPA's backends and SimA under torch.compile
GPU_EXTRA = ("sdpa_flash", "sdpa_efficient", "sima_compile")
#: the kernel backends that run on CUDA (the others, SimA's ``cpp``, on CPU)
GPU_BACKENDS = ("triton",)


def _kernel_rows() -> Dict[str, Dict[str, Tuple[str, str]]]:
    """Per sweep (cpu, cuda), the rows of the kinds with kernels (:data:`simattn.attention.backends.POLICIES`) as
    ``{row: (kind, backend)}``: on CUDA ``<kind>`` (torch) and ``<kind>_<backend>`` for each GPU
    backend; on CPU ``<kind>`` (auto: its CPU kernel) and ``<kind>_torch`` where it has a CPU backend."""
    from ...attention.backends import POLICIES

    rows: Dict[str, Dict[str, Tuple[str, str]]] = {"cpu": {}, "cuda": {}}
    for kind, policy in POLICIES.items():
        gpu = [b for b in policy.backends if b in GPU_BACKENDS]
        if gpu:
            rows["cuda"].update({kind: (kind, "torch"), **{f"{kind}_{b}": (kind, b) for b in gpu}})
        if len(gpu) < len(policy.backends):
            rows["cpu"].update({kind: (kind, "auto"), f"{kind}_torch": (kind, "torch")})
    return rows


def timed_kinds(device: str) -> List[str]:
    """The rows ``bench attention`` times on ``device`` (cpu, or cuda[:i]), none of them kept by hand: on CPU the
    references (:data:`REQUIRED`), every registered kind that needs no token grid and, beside a kind with a CPU
    kernel, its torch path (``sima_torch``), then SOFT; on CUDA softmax on SDPA's flash and memory-efficient
    backends, SimA compiled, and every kind with GPU kernels in torch (``<kind>``) and on each of them
    (``<kind>_triton``)."""
    from ...attention import get_attention_class, list_attentions

    gpu = torch.device(device).type == "cuda"
    kernels = _kernel_rows()["cuda" if gpu else "cpu"]
    if gpu:
        return list(GPU_EXTRA) + list(kernels)
    rows: List[str] = list(REQUIRED)
    for kind in list_attentions():
        cls = get_attention_class(kind)
        if not (cls.uses_grid or cls.attend_uses_grid):
            rows += [row for row, (owner, _) in kernels.items() if owner == kind] or [kind]
    return list(dict.fromkeys(rows)) + ["soft"]  # SOFT on its own landmark ratio per N (:func:`_soft`)


def _soft(n: int) -> Callable:
    from ...attention import soft_attention

    side = math.isqrt(n - 1) if math.isqrt(n) ** 2 != n else math.isqrt(n)
    ratio = max(1, math.ceil(side / 7))  # ~49 landmarks, as SOFT uses at 224 px
    return lambda q, k, v: soft_attention(q, q, v, ratio=ratio)


def _sima_matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable:
    """SimA's two products alone (no norms, no scaling) on contiguous (B·H, N, d) copies made here, untimed."""
    from ...attention.sima import resolve_sima_order

    B, H, n, d = q.shape
    q3, k3, v3 = [t.reshape(B * H, n, d).contiguous() for t in (q, k, v)]
    kv_first = resolve_sima_order("auto", n, n, d) == "kv_first"

    def fn(*_):
        if kv_first:
            return torch.bmm(q3, torch.bmm(k3.transpose(1, 2), v3)).view(B, H, n, d)
        return torch.bmm(torch.bmm(q3, k3.transpose(1, 2)), v3).view(B, H, n, d)

    return fn


def _sdpa(backend: str) -> Callable:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return fn


def _module_fn(kind: str, backend: Optional[str], heads: int, head_dim: int, device, dtype) -> Callable:
    """A ``kind`` module's attention on (B, H, N, d) q, k, v, no mask, its parameters fixed at their initial values:
    its kernel op (``core``) where the kind has one apart from its grid work, else its ``attend`` (a kind on the
    grid infers it from N)."""
    from ...attention import create_attention

    module = create_attention(kind, heads * head_dim, num_heads=heads, **({"backend": backend} if backend else {}))
    module = module.to(device, dtype).eval()
    module.requires_grad_(False)
    if hasattr(module, "core"):
        return module.core
    return lambda q, k, v: module.attend(q, k, v, None)


def kind_fn(row: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, head_dim: int,
            sweep: str = "cpu") -> Callable:
    """The callable timed for ``row`` (one of :func:`timed_kinds` of the ``sweep``, cpu or cuda) on q, k, v of N
    tokens."""
    from ...attention import sima_attention_reference

    n, device, dtype = q.shape[-2], q.device, q.dtype
    special = {"sima_official": lambda: sima_attention_reference, "sima_matmuls": lambda: _sima_matmuls(q, k, v),
               "soft": lambda: _soft(n), "sdpa_flash": lambda: _sdpa("FLASH_ATTENTION"),
               "sdpa_efficient": lambda: _sdpa("EFFICIENT_ATTENTION"),
               "sima_compile": lambda: torch.compile(_module_fn("sima", "torch", heads, head_dim, device, dtype),
                                                     dynamic=False)}
    if row in special:
        return special[row]()
    kind, backend = _kernel_rows()[sweep].get(row, (row, None))
    return _module_fn(kind, backend, heads, head_dim, device, dtype)


def finish(output: str, meta: Dict, rows: List[dict], table: str, notes: List[str],
           spreads: Optional[Dict[str, Optional[float]]] = None) -> int:
    """Every mode's end: the table and the notes printed (a warning added where ``spreads``, name → relative
    spread, has wide ones), the results written to ``output`` and named."""
    warning = spread_warning(spreads or {}, WIDE_SPREAD)
    notes = notes + ([warning] if warning else [])
    print(table)
    print("\n".join(notes))
    write_result_files(output, {**meta, "wide_spread": WIDE_SPREAD}, rows, notes, csv=False)
    print(f"wrote {output}")
    return 0


def make_qkv(b: int, heads: int, n: int, head_dim: int, layout: str, gen: torch.Generator, device: str,
             dtype: torch.dtype) -> List[torch.Tensor]:
    """q, k, v of shape (B, H, N, d): views of one fused (B, N, 3, H, d) projection, or three contiguous tensors."""
    if layout == "qkv":
        fused = torch.randn(b, n, 3, heads, head_dim, generator=gen).to(device, dtype)
        return list(fused.permute(2, 0, 3, 1, 4).unbind(0))
    return [torch.randn(b, heads, n, head_dim, generator=gen).to(device, dtype) for _ in range(3)]
