"""SimA's q̂(k̂ᵀv) order as fused Triton kernels, forward and backward (``sima_attention(..., backend='triton')``).

Forward, per (batch, head):

1. one pass over k and v (and q) accumulates kᵀv, Σ|k| and Σ|q| over tokens in fp32 (:func:`_reduce_kernel`; long
   token axes are split over several programs whose partial sums are added afterwards, in a fixed order);
2. on the d×dv matrix: W = (kᵀv / s_k[:, None]) / s_q[:, None], each norm on its own (never their product);
3. one pass over q writes out = q W (:func:`_apply_kernel`).

Backward, with kvn = k̂ᵀv, G the output gradient and dkvn = q̂ᵀG:

    dq = G (kvn / s_q[:, None])ᵀ − sign(q) · r / s_q,    dk = v (dkvn / s_k[:, None])ᵀ − sign(k) · r / s_k,
    dv = k (dkvn / s_k[:, None]),                         r_c = Σ_e kvn_ce dkvn_ce,

where the sign terms come from differentiating the l1 norms (and vanish for a channel whose norm is clamped to eps)
and r is the same for q and k (SimA is invariant to scaling a channel of q or of k). This takes one reduction pass
over q and G (:func:`_reduce_kernel` again) and one elementwise-plus-matmul pass over each of (q, G) and (k, v)
(:func:`_grad_kernel`).

Precision: sums and norms in fp32 for fp32, fp16 and bf16 inputs. Matmul operands follow the torch path: bf16
work multiplies bf16 operands (rounded from fp32) with fp32 accumulation for the output and the q gradient, while kᵀv
and the k and v gradients run on fp32 values (exact products of the inputs); fp16 work is lifted to fp32 (fp16 has
too little range for the folded scale); fp32 operands use TF32 only where ``torch.backends.cuda.matmul.allow_tf32``
says so. q, k, v are read through their strides, so views of a fused qkv projection are not copied.

Triton is imported with this module, which :mod:`simattn.attention.sima` imports only when the Triton backend is
asked for. ``triton.jit`` decides at decoration time whether a kernel runs compiled or in the interpreter
(``TRITON_INTERPRET=1``, on CPU tensors), so the kernels are decorated on first use, once per mode.
"""
from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

__all__ = ["sima_triton", "interpreting", "check_triton_inputs", "MAX_HEAD_DIM"]

#: the largest head dimension (of q/k and of v) the kernels take: a d×dv fp32 accumulator lives in registers
MAX_HEAD_DIM = 128
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_N = 64  # tokens per tile


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), read now."""
    return bool(triton.knobs.runtime.interpret)


def check_triton_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One-line ValueErrors for inputs the kernels do not take."""
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"sima: backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1, to run the kernels in "
                         f"Triton's interpreter on CPU), got {q.device.type} tensors")
    if not (q.device == k.device == v.device):
        raise ValueError(f"sima: q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if t.dtype not in _DTYPES:
            raise ValueError(f"sima: backend 'triton' takes float32, float16 or bfloat16, got {name} {t.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"sima: backend 'triton' takes head dims up to {MAX_HEAD_DIM}, got d={q.shape[-1]}, "
                         f"dv={v.shape[-1]}")


# ------------------------------------------------------------------------------------------------ kernels
# Plain functions here, decorated by _kernels(): triton.jit reads TRITON_INTERPRET when it decorates. Only builtins
# of triton.language are called: its jit'd helpers (tl.sum, tl.zeros) are decorated when triton is imported and so
# run only in the mode of that import. Sums go through tl.reduce with triton's own sum combiner, which the
# interpreter maps to numpy's sum.
_SUM = tl.standard._sum_combine

def _reduce_kernel(x_ptr, y_ptr, z_ptr, xm_ptr, zm_ptr, xty_ptr, sx_ptr, sz_ptr,
                   H, n_x, n_z, d, e, chunk,
                   sxb, sxh, sxn, sxd, syb, syh, syn, sye, szb, szh, szn, szd, smxb, smxn, smzb, smzn,
                   HAS_XM: tl.constexpr, HAS_Z: tl.constexpr, HAS_ZM: tl.constexpr, NORMS: tl.constexpr,
                   HALF_DOT: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """Partial sums over one token chunk of one (batch, head): xᵀy (d×e) and, with NORMS, Σ|x| and Σ|z| (per
    channel; z is q in the forward pass, of its own length). Rows where a keep-mask is False count as zero."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    d_ok = offs_d < d
    e_ok = offs_e < e
    x_base = x_ptr + b * sxb + h * sxh
    y_base = y_ptr + b * syb + h * syh
    acc = tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32)
    s_x = tl.full((BLOCK_D,), 0.0, tl.float32)
    s_z = tl.full((BLOCK_D,), 0.0, tl.float32)
    start = split * chunk
    for n0 in range(start, start + chunk, BLOCK):
        offs_n = n0 + tl.arange(0, BLOCK)
        rows = offs_n < n_x
        if HAS_XM:
            rows = rows & (tl.load(xm_ptr + b * smxb + offs_n.to(tl.int64) * smxn, mask=rows, other=0) != 0)
        offs_n64 = offs_n.to(tl.int64)
        x = tl.load(x_base + offs_n64[:, None] * sxn + offs_d[None, :] * sxd, mask=rows[:, None] & d_ok[None, :],
                    other=0.0)
        y = tl.load(y_base + offs_n64[:, None] * syn + offs_e[None, :] * sye, mask=rows[:, None] & e_ok[None, :],
                    other=0.0)
        if HALF_DOT:  # equal half dtypes: their products are exact in the fp32 accumulator
            acc = tl.dot(tl.trans(x), y, acc)
        else:
            acc = tl.dot(tl.trans(x.to(tl.float32)), y.to(tl.float32), acc, input_precision=PRECISION)
        if NORMS:
            s_x += tl.reduce(tl.abs(x.to(tl.float32)), 0, _SUM)
            if HAS_Z:
                z_rows = offs_n < n_z
                if HAS_ZM:
                    z_rows = z_rows & (tl.load(zm_ptr + b * smzb + offs_n64 * smzn, mask=z_rows, other=0) != 0)
                z = tl.load(z_ptr + b * szb + h * szh + offs_n64[:, None] * szn + offs_d[None, :] * szd,
                            mask=z_rows[:, None] & d_ok[None, :], other=0.0)
                s_z += tl.reduce(tl.abs(z.to(tl.float32)), 0, _SUM)
    part = (bh * n_split + split).to(tl.int64)
    tl.store(xty_ptr + part * d * e + offs_d[:, None] * e + offs_e[None, :], acc, mask=d_ok[:, None] & e_ok[None, :])
    if NORMS:
        tl.store(sx_ptr + part * d + offs_d, s_x, mask=d_ok)
        if HAS_Z:
            tl.store(sz_ptr + part * d + offs_d, s_z, mask=d_ok)


def _apply_kernel(x_ptr, w_ptr, xm_ptr, o_ptr, H, n, d, e, sxb, sxh, sxn, sxd, smb, smn,
                  HAS_XM: tl.constexpr, BF16_DOT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """out = x W for one token tile of one (batch, head); W (d×e, fp32, or bf16 with BF16_DOT) holds both norms;
    masked rows are 0."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_n64 = offs_n.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    d_ok = offs_d < d
    e_ok = offs_e < e
    in_range = offs_n < n
    rows = in_range
    if HAS_XM:
        rows = rows & (tl.load(xm_ptr + b * smb + offs_n64 * smn, mask=in_range, other=0) != 0)
    bh64 = bh.to(tl.int64)
    w = tl.load(w_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], mask=d_ok[:, None] & e_ok[None, :],
                other=0.0)
    x = tl.load(x_ptr + b * sxb + h * sxh + offs_n64[:, None] * sxn + offs_d[None, :] * sxd,
                mask=rows[:, None] & d_ok[None, :], other=0.0)
    if BF16_DOT:
        x = x.to(tl.bfloat16)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns as integers: the same values in fp32
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        out = tl.dot(x, w)
    else:
        out = tl.dot(x.to(tl.float32), w, input_precision=PRECISION)
    tl.store(o_ptr + bh64 * n * e + offs_n64[:, None] * e + offs_e[None, :], out.to(o_ptr.dtype.element_ty),
             mask=in_range[:, None] & e_ok[None, :])


def _grad_kernel(x_ptr, y_ptr, w_ptr, t_ptr, xm_ptr, dx_ptr, dy_ptr, H, n, d, e,
                 sxb, sxh, sxn, sxd, syb, syh, syn, sye, smb, smn,
                 HAS_XM: tl.constexpr, HAS_DY: tl.constexpr, BF16_DOT: tl.constexpr, UPCAST: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """dx = y Wᵀ − sign(x) t and, with HAS_DY, dy = x W, for one token tile of one (batch, head); rows where the
    keep-mask is False get zero gradients (those tokens were zeroed before the norms). BF16_DOT: y Wᵀ multiplies
    bf16 operands (W given in bf16), as the torch path's bf16 matmul does."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_n64 = offs_n.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    d_ok = offs_d < d
    e_ok = offs_e < e
    in_range = offs_n < n
    rows = in_range
    if HAS_XM:
        rows = rows & (tl.load(xm_ptr + b * smb + offs_n64 * smn, mask=in_range, other=0) != 0)
    w = tl.load(w_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], mask=d_ok[:, None] & e_ok[None, :],
                other=0.0)
    t = tl.load(t_ptr + bh64 * d + offs_d, mask=d_ok, other=0.0)
    x = tl.load(x_ptr + b * sxb + h * sxh + offs_n64[:, None] * sxn + offs_d[None, :] * sxd,
                mask=rows[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    y = tl.load(y_ptr + b * syb + h * syh + offs_n64[:, None] * syn + offs_e[None, :] * sye,
                mask=rows[:, None] & e_ok[None, :], other=0.0)
    if BF16_DOT:
        y = y.to(tl.bfloat16)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns as integers: the same values in fp32
            y = y.to(tl.float32)
            w = w.to(tl.float32)
        g = tl.dot(y, tl.trans(w))
    else:
        g = tl.dot(y.to(tl.float32), tl.trans(w), input_precision=PRECISION)
    sign = tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))
    dx = g - sign * t[None, :]
    tl.store(dx_ptr + bh64 * n * d + offs_n64[:, None] * d + offs_d[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=in_range[:, None] & d_ok[None, :])
    if HAS_DY:
        dy = tl.dot(x, w.to(tl.float32), input_precision=PRECISION)
        tl.store(dy_ptr + bh64 * n * e + offs_n64[:, None] * e + offs_e[None, :], dy.to(dy_ptr.dtype.element_ty),
                 mask=in_range[:, None] & e_ok[None, :])


@functools.lru_cache(maxsize=None)
def _kernels(interpret: bool) -> SimpleNamespace:
    """The kernels decorated under the current mode (``interpret`` is the cache key: it is what the mode is)."""
    del interpret
    return SimpleNamespace(reduce=triton.jit(_reduce_kernel), apply=triton.jit(_apply_kernel),
                           grad=triton.jit(_grad_kernel))


# ------------------------------------------------------------------------------------------------ launchers


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot needs every dimension >= 16


def _warps(d: int, e: int) -> int:
    return 8 if _block(d) * _block(e) > 64 * 64 else 4


def _precision(t: torch.Tensor) -> str:
    return "tf32" if t.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _mask_u8(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if mask is None else mask.to(torch.uint8)


# The interpreter rounds fp32 to bf16 by truncation (a GPU rounds to nearest), which doubles the rounding error:
# under it, operands are rounded to bf16 by torch before the kernel and bf16 results are written in fp32 and
# rounded by torch after it.
def _bf16_operand(t: torch.Tensor, bf16: bool) -> torch.Tensor:
    return t.to(torch.bfloat16) if bf16 and interpreting() and t.dtype != torch.bfloat16 else t


def _result(shape, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    store = torch.float32 if interpreting() and dtype == torch.bfloat16 else dtype
    return torch.empty(shape, device=like.device, dtype=store)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _splits(bh: int, n: int, device: torch.device) -> int:
    """Programs per (batch, head) along the tokens of a reduction: about 4 per multiprocessor in all when B·H is
    small, each with at least 4 tiles. The interpreter gets up to 8 programs of any size, so the tests cover it."""
    tiles = triton.cdiv(n, BLOCK_N)
    if interpreting() or device.type != "cuda":
        return max(1, min(8 // bh, tiles))
    return max(1, min(4 * _multiprocessors(device) // bh, triton.cdiv(tiles, 4)))


def _reduce(x, y, x_mask, z=None, z_mask=None, norms=True):
    """Σ_n x_nᵀ y_n (B·H, d, e) and, with ``norms``, Σ|x| and Σ|z| (B·H, d), all fp32."""
    B, H, n_x, d = x.shape
    e = y.shape[-1]
    n_z = z.shape[-2] if z is not None else 0
    n = max(n_x, n_z)
    bh = B * H
    S = _splits(bh, n, x.device)
    chunk = triton.cdiv(triton.cdiv(n, S), BLOCK_N) * BLOCK_N
    S = triton.cdiv(n, chunk)
    f32 = {"device": x.device, "dtype": torch.float32}
    xty = torch.empty(bh, S, d, e, **f32)
    s_x = torch.empty(bh, S, d, **f32) if norms else xty
    s_z = torch.empty(bh, S, d, **f32) if norms and z is not None else xty
    zz = z if z is not None else x
    xm, zm = _mask_u8(x_mask), _mask_u8(z_mask)
    half = x.dtype == y.dtype and x.dtype in (torch.float16, torch.bfloat16) and not (
        interpreting() and x.dtype == torch.bfloat16)  # the interpreter cannot multiply bf16 (see _apply_kernel)
    _kernels(interpreting()).reduce[(bh, S)](
        x, y, zz, xm if xm is not None else x, zm if zm is not None else x, xty, s_x, s_z,
        H, n_x, n_z, d, e, chunk, *x.stride(), *y.stride(), *zz.stride(),
        *(xm.stride() if xm is not None else (0, 0)), *(zm.stride() if zm is not None else (0, 0)),
        HAS_XM=xm is not None, HAS_Z=z is not None, HAS_ZM=zm is not None, NORMS=norms, HALF_DOT=half,
        PRECISION=_precision(x), BLOCK=BLOCK_N, BLOCK_D=_block(d), BLOCK_E=_block(e), num_warps=_warps(d, e))
    xty = xty.sum(1)
    if not norms:
        return xty, None, None
    return xty, s_x.sum(1), (s_z.sum(1) if z is not None else None)


def _apply(x, w, x_mask, out_dtype, bf16):
    B, H, n, d = x.shape
    e = w.shape[-1]
    x, w = _bf16_operand(x, bf16), w.to(torch.bfloat16) if bf16 else w
    out = _result((B, H, n, e), x, out_dtype)
    xm = _mask_u8(x_mask)
    _kernels(interpreting()).apply[(B * H, triton.cdiv(n, BLOCK_N))](
        x, w, xm if xm is not None else x, out, H, n, d, e, *x.stride(),
        *(xm.stride() if xm is not None else (0, 0)),
        HAS_XM=xm is not None, BF16_DOT=bf16, UPCAST=interpreting(), PRECISION=_precision(x),
        BLOCK=BLOCK_N, BLOCK_D=_block(d), BLOCK_E=_block(e), num_warps=_warps(d, e))
    return out.to(out_dtype)


def _grad(x, y, w, t, x_mask, bf16, with_dy):
    """dx (in x's dtype) and, with ``with_dy``, dy (in y's dtype); ``bf16``: y Wᵀ in bf16 (the q gradient)."""
    B, H, n, d = x.shape
    e = y.shape[-1]
    x_dtype, y_dtype = x.dtype, y.dtype
    y, w = _bf16_operand(y, bf16), w.to(torch.bfloat16) if bf16 else w
    dx = _result((B, H, n, d), x, x_dtype)
    dy = _result((B, H, n, e), x, y_dtype) if with_dy else dx
    xm = _mask_u8(x_mask)
    _kernels(interpreting()).grad[(B * H, triton.cdiv(n, BLOCK_N))](
        x, y, w, t, xm if xm is not None else x, dx, dy, H, n, d, e, *x.stride(), *y.stride(),
        *(xm.stride() if xm is not None else (0, 0)),
        HAS_XM=xm is not None, HAS_DY=with_dy, BF16_DOT=bf16, UPCAST=interpreting(), PRECISION=_precision(x),
        BLOCK=BLOCK_N, BLOCK_D=_block(d), BLOCK_E=_block(e), num_warps=_warps(d, e))
    return dx.to(x_dtype), (dy.to(y_dtype) if with_dy else None)


class _SimATriton(torch.autograd.Function):
    """q̂(k̂ᵀv) with the kernels above; saves q, k, v (the views given, no copies) and d×dv fp32 statistics."""

    @staticmethod
    def forward(ctx, q, k, v, mask, q_mask, eps, bf16, out_dtype):
        kv, s_k_raw, s_q_raw = _reduce(k, v, mask, z=q, z_mask=q_mask)
        s_q, s_k = s_q_raw.clamp_min(eps), s_k_raw.clamp_min(eps)
        kvn = kv / s_k[..., None]  # k̂ᵀv
        out = _apply(q, kvn / s_q[..., None], q_mask, out_dtype, bf16)
        ctx.save_for_backward(q, k, v, mask, q_mask, kvn, s_q_raw, s_k_raw)
        ctx.eps, ctx.bf16 = eps, bf16
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with _on(grad_out.device):
            return _SimATriton._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        q, k, v, mask, q_mask, kvn, s_q_raw, s_k_raw = ctx.saved_tensors
        eps, bf16 = ctx.eps, ctx.bf16
        s_q, s_k = s_q_raw.clamp_min(eps), s_k_raw.clamp_min(eps)
        qg, _, _ = _reduce(q, grad_out, q_mask, norms=False)
        dkvn = qg / s_q[..., None]  # q̂ᵀG
        r = (kvn * dkvn).sum(-1)  # (B·H, d): Σ_n dq̂·q̂ = Σ_j dk̂·k̂
        # a norm clamped to eps is a constant: no sign term (clamp_min's gradient)
        t_q = torch.where(s_q_raw >= eps, r / s_q, 0.0)
        t_k = torch.where(s_k_raw >= eps, r / s_k, 0.0)
        dq = dk = dv = None
        if ctx.needs_input_grad[0]:
            dq, _ = _grad(q, grad_out, kvn / s_q[..., None], t_q, q_mask, bf16, with_dy=False)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # fp32 products, as the torch path's fp32 kᵀv differentiates
            dk, dv = _grad(k, v, dkvn / s_k[..., None], t_k, mask, False, with_dy=True)
        return dq, dk, dv, None, None, None, None, None


def sima_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                q_mask: Optional[torch.Tensor] = None, eps: float = 1e-12,
                compute_dtype: torch.dtype = torch.float32, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """q̂(k̂ᵀv) on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) with the fused kernels → (B, H, Nq, dv).

    ``mask`` / ``q_mask``: validated (B, Nk) / (B, Nq) keep-masks (:func:`~simattn.attention._common.resolve_masks`).
    ``compute_dtype``: bf16 multiplies bf16 operands, anything else fp32 (the torch path's ``range_safe_dtype``).
    ``out_dtype``: the output's dtype (default q's). Called by :func:`simattn.attention.sima.sima_attention`.
    """
    check_triton_inputs(q, k, v)
    with _on(q.device):
        return _SimATriton.apply(q, k, v, mask, q_mask, eps, compute_dtype == torch.bfloat16, out_dtype or q.dtype)


def _on(device: torch.device):
    """Launches go to the current CUDA device: make it the tensors' one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
