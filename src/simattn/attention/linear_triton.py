"""Linear attention with a d×dv state as fused Triton kernels: SimA's q̂(k̂ᵀv) forward and backward
(``sima_attention(..., backend='triton')``), and the forward of ELU linear attention and UFO's XNorm, which share
the skeleton with another prologue (the feature map on q and k) and epilogue (how the state is folded and applied).

Forward, per (batch, head), SimA:

1. over key tiles: kᵀv (d×dv) accumulated in fp32 on tensor cores, Σ|k| and Σ|q| per channel in fp32;
2. on chip: W = (kᵀv / s_k[:, None]) / s_q[:, None], each norm dividing on its own (never their product);
3. over query tiles: out = q W.

Short and medium token axes run this in one launch, one program per (batch, head) holding the state on chip
(:func:`_fwd_kernel`); where a head's q, k and v fit in one tile they are read once (:func:`_fwd_one_tile_kernel`).
When there are too few (batch, head) pairs to fill the GPU, the token axis is split over programs: one launch writes
partial sums per token chunk (:func:`_stats_kernel`), a second adds them in a fixed order and applies them to its
chunk of queries (:func:`_fwd_kernel` with ``SPLIT``).

Backward, with kvn = k̂ᵀv, G the output gradient and dkvn = q̂ᵀG:

    dq = G (kvn / s_q[:, None])ᵀ − sign(q) · r / s_q,    dk = v (dkvn / s_k[:, None])ᵀ − sign(k) · r / s_k,
    dv = k (dkvn / s_k[:, None]),                         r_c = Σ_e kvn_ce dkvn_ce,

where the sign terms come from differentiating the l1 norms (and vanish for a channel whose norm is clamped to eps)
and r is the same for q and k (SimA is invariant to scaling a channel of q or of k). One launch per (batch, head)
accumulates qᵀG and writes dq, dk, dv (:func:`_bwd_kernel`); a split token axis adds one launch of partial qᵀG.

Precision (the torch path's rules): sums, norms and the state in fp32. Products on tensor cores: kᵀv and qᵀG multiply
equal half-precision inputs in their own dtype (exact products, fp32 accumulation); with bf16 compute the output
and the q gradient multiply bf16 operands (W rounded to bf16) as the torch path's bf16 matmul does; products with
an fp32 operand take TF32 for half inputs (a half value is exact in TF32, the fp32 operand keeps TF32's 10-bit
mantissa with fp32's range, so fp16 never overflows the folded scale) and follow
``torch.backends.cuda.matmul.allow_tf32`` for fp32 inputs. q, k, v are read through their strides, so views of a
fused qkv projection are not copied.

The kernels run behind torch custom ops (``simattn::linear_attn_fwd``, ``simattn::sima_bwd``) with fake
implementations and registered autograd, so ``torch.compile(fullgraph=True)`` traces through them and CUDA graphs
capture them. On a GPU, tile sizes, warps and pipeline depth are autotuned once per (tokens per program rounded to a
power of two, d, dv, dtypes, path) in the process, which holds one GPU's results: steady-state calls pay no tuning.

``triton.jit`` decides at decoration time whether a kernel runs compiled or in the interpreter
(``TRITON_INTERPRET=1``, on CPU tensors), so kernels and their helpers are decorated on first use, once per mode,
each mode with its own globals.
"""
from __future__ import annotations

import contextlib
import functools
import os
import types
from types import SimpleNamespace
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

__all__ = ["sima_triton", "linear_triton", "interpreting", "check_triton_inputs", "MAX_HEAD_DIM", "KINDS"]

#: the largest head dimension (of q/k and of v) the kernels take: a d×dv fp32 state lives in registers
MAX_HEAD_DIM = 128
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the attention kinds the forward kernel computes, by their prologue/epilogue code
KINDS = {"sima": 0, "elu": 1, "xnorm": 2}
#: largest tile (tokens × max(d, dv), padded to powers of two) for which a head's q, k, v are held whole on chip
ONE_TILE_ELEMENTS = 256 * 64
#: fewest tokens per program when the token axis is split over programs (GPU; the interpreter uses 32)
SPLIT_MIN_TOKENS = 512
_INTERPRETER_BLOCK = 32  # tokens per tile in the interpreter: small, so short test inputs span several tiles


@torch.compiler.assume_constant_result
def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), read now."""
    return bool(triton.knobs.runtime.interpret)


def check_triton_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str = "sima") -> None:
    """One-line ValueErrors for inputs the kernels do not take."""
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"{name}: backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1, to run the kernels "
                         f"in Triton's interpreter on CPU), got {q.device.type} tensors")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    for t, tn in ((q, "q"), (k, "k"), (v, "v")):
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: backend 'triton' takes float32, float16 or bfloat16, got {tn} {t.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"{name}: backend 'triton' takes head dims up to {MAX_HEAD_DIM}, got d={q.shape[-1]}, "
                         f"dv={v.shape[-1]}")


# ------------------------------------------------------------------------------------------------ kernels
# Plain functions here, decorated by _kernels() in its own copy of this module's globals: triton.jit reads
# TRITON_INTERPRET when it decorates, and a kernel calls the helpers decorated in its own mode. Only builtins of
# triton.language are called (its jit'd helpers such as tl.sum are decorated in the mode of triton's import): sums go
# through tl.reduce with triton's own sum combiner.
_SUM = tl.standard._sum_combine


def _keep(m_ptr, b, smb, smn, offs, lim, HAS_M: tl.constexpr):
    """Rows of a tile that take part: below ``lim`` and kept by the (B, N) keep-mask."""
    rows = offs < lim
    if HAS_M:
        rows = rows & (tl.load(m_ptr + b * smb + offs.to(tl.int64) * smn, mask=rows, other=0) != 0)
    return rows


def _tile(base, offs_n, offs_c, sn, sc, rows, c_ok):
    """A (tokens × channels) tile through its strides; rows that do not take part read as 0."""
    return tl.load(base + offs_n.to(tl.int64)[:, None] * sn + offs_c[None, :] * sc,
                   mask=rows[:, None] & c_ok[None, :], other=0.0)


def _mm(a, b, acc, NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """acc + a b on tensor cores: NATIVE multiplies a and b in their own (equal, half) dtype, else fp32 operands
    at PREC. UPCAST: the interpreter multiplies bf16 bit patterns as integers, so it gets the same values in fp32."""
    if NATIVE:
        if UPCAST:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        return tl.dot(a, b, acc)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)


def _features(x, rows, KIND: tl.constexpr):
    """The prologue on q and k: ELU's φ(x) = elu(x) + 1 (fp32, 0 on rows that take no part); x itself otherwise."""
    # one return: the compiler types every return of a function alike, constexpr branches included
    if KIND == 1:
        xf = x.to(tl.float32)
        phi = tl.where(rows[:, None], tl.where(xf > 0, xf + 1.0, tl.exp(xf)), 0.0)
    else:
        phi = x
    return phi


def _stats(x_base, y_base, z_base, xm_ptr, zm_ptr, b, start, lim_x, lim_z, sxn, sxd, syn, sye, szn, szd,
           smxb, smxn, smzb, smzn, offs_d, offs_e, d_ok, e_ok,
           HAS_XM: tl.constexpr, HAS_ZM: tl.constexpr, NORMS: tl.constexpr, HAS_Z: tl.constexpr,
           KIND: tl.constexpr, NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
           BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """Over tokens [start, max(lim_x, lim_z)): φ(x)ᵀy (d×e) and, with NORMS, Σ|φ(x)| and (HAS_Z) Σ|z| per channel,
    all fp32. x, y end at lim_x, z at lim_z."""
    acc = tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32)
    s_x = tl.full((BLOCK_D,), 0.0, tl.float32)
    s_z = tl.full((BLOCK_D,), 0.0, tl.float32)
    for n0 in range(start, tl.maximum(lim_x, lim_z), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = _keep(xm_ptr, b, smxb, smxn, offs, lim_x, HAS_XM)
        x = _features(_tile(x_base, offs, offs_d, sxn, sxd, rows, d_ok), rows, KIND)
        y = _tile(y_base, offs, offs_e, syn, sye, rows, e_ok)
        acc = _mm(tl.trans(x), y, acc, NATIVE, UPCAST, PREC)
        if NORMS:
            s_x += tl.reduce(tl.abs(x.to(tl.float32)), 0, _SUM)
            if HAS_Z:
                z_rows = _keep(zm_ptr, b, smzb, smzn, offs, lim_z, HAS_ZM)
                z = _tile(z_base, offs, offs_d, szn, szd, z_rows, d_ok)
                s_z += tl.reduce(tl.abs(z.to(tl.float32)), 0, _SUM)
    return acc, s_x, s_z


def _sum_parts(part_ptr, sx_ptr, sz_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
               NORMS: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The partial sums :func:`_stats_kernel` wrote for one (batch, head), added in a fixed order."""
    acc = tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32)
    s_x = tl.full((BLOCK_D,), 0.0, tl.float32)
    s_z = tl.full((BLOCK_D,), 0.0, tl.float32)
    for s in range(n_split):
        part = bh64 * n_split + s
        acc += tl.load(part_ptr + part * d * e + offs_d[:, None] * e + offs_e[None, :],
                       mask=d_ok[:, None] & e_ok[None, :], other=0.0)
        if NORMS:
            s_x += tl.load(sx_ptr + part * d + offs_d, mask=d_ok, other=0.0)
            if HAS_Z:
                s_z += tl.load(sz_ptr + part * d + offs_d, mask=d_ok, other=0.0)
    return acc, s_x, s_z


def _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, KIND: tl.constexpr):
    """The state applied to queries: SimA (kᵀv / s_k) / s_q, each norm on its own; XNorm γ · columns of kᵀv over
    their l2 norm + eps; ELU kᵀv itself (its normalizer s_k is applied per query row)."""
    if KIND == 0:
        return kv / tl.maximum(s_k, eps)[:, None] / tl.maximum(s_q, eps)[:, None]
    if KIND == 2:
        norm = tl.sqrt(tl.reduce(kv * kv, 0, _SUM)) + eps
        return kv / norm[None, :] * tl.load(gamma_ptr + bh64)
    return kv


def _apply(q, rows, w, z, eps, KIND: tl.constexpr, BF16_OUT: tl.constexpr, UPCAST: tl.constexpr,
           PREC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    """The epilogue on one query tile: q W (bf16 operands with BF16_OUT, W given in bf16); ELU φ(q)W / (φ(q)·z + eps);
    XNorm qW / (‖q‖₂ + eps) per row."""
    zero = tl.full((BLOCK, BLOCK_E), 0.0, tl.float32)
    if KIND == 1:
        phi = _features(q, rows, KIND)
        den = tl.reduce(phi * z[None, :], 1, _SUM) + eps
        return _mm(phi, w, zero, False, UPCAST, PREC) / den[:, None]
    if BF16_OUT:
        return _mm(q.to(tl.bfloat16), w, zero, True, UPCAST, PREC)
    out = _mm(q, w, zero, False, UPCAST, PREC)
    if KIND == 2:
        qf = q.to(tl.float32)
        out = out / (tl.sqrt(tl.reduce(qf * qf, 1, _SUM)) + eps)[:, None]
    return out


def _head(H):
    """(batch, head, flat index as int64) of the (batch, head) that ``program_id(0)`` owns."""
    bh = tl.program_id(0)
    return (bh // H).to(tl.int64), (bh % H).to(tl.int64), bh.to(tl.int64)


def _channels(d, e, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The channel lanes of q/k (``d``) and of v (``e``), and which of them are real."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    return offs_d, offs_e, offs_d < d, offs_e < e


def _stats_kernel(x_ptr, y_ptr, z_ptr, xm_ptr, zm_ptr, part_ptr, sx_ptr, sz_ptr, H, n_x, n_z, d, e, chunk,
                  n_bucket, p_bucket,
                  sxb, sxh, sxn, sxd, syb, syh, syn, sye, szb, szh, szn, szd, smxb, smxn, smzb, smzn,
                  HAS_XM: tl.constexpr, HAS_ZM: tl.constexpr, NORMS: tl.constexpr, HAS_Z: tl.constexpr,
                  KIND: tl.constexpr, NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                  BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """Partial sums (:func:`_stats`) over token chunk ``program_id(1)`` of (batch, head) ``program_id(0)``."""
    b, h, bh64 = _head(H)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    start = split * chunk
    acc, s_x, s_z = _stats(x_ptr + b * sxb + h * sxh, y_ptr + b * syb + h * syh, z_ptr + b * szb + h * szh,
                           xm_ptr, zm_ptr, b, start, tl.minimum(n_x, start + chunk), tl.minimum(n_z, start + chunk),
                           sxn, sxd, syn, sye, szn, szd, smxb, smxn, smzb, smzn, offs_d, offs_e, d_ok, e_ok,
                           HAS_XM, HAS_ZM, NORMS, HAS_Z, KIND, NATIVE, UPCAST, PREC, BLOCK, BLOCK_D, BLOCK_E)
    part = bh64 * n_split + split
    tl.store(part_ptr + part * d * e + offs_d[:, None] * e + offs_e[None, :], acc, mask=d_ok[:, None] & e_ok[None, :])
    if NORMS:
        tl.store(sx_ptr + part * d + offs_d, s_x, mask=d_ok)
        if HAS_Z:
            tl.store(sz_ptr + part * d + offs_d, s_z, mask=d_ok)


def _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps):
    """What SimA's backward reads: k̂ᵀv (fp32) and the unclamped norms."""
    kvn = kv / tl.maximum(s_k, eps)[:, None]
    tl.store(kv_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], kvn, mask=d_ok[:, None] & e_ok[None, :])
    tl.store(sq_ptr + bh64 * d + offs_d, s_q, mask=d_ok)
    tl.store(sk_ptr + bh64 * d + offs_d, s_k, mask=d_ok)


def _fwd_kernel(q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, gamma_ptr, part_ptr, psk_ptr, psq_ptr, o_ptr, kv_ptr, sq_ptr,
                sk_ptr, H, n_q, n_k, d, e, n_split, chunk, eps, n_bucket, p_bucket,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sqmb, sqmn, skmb, skmn,
                HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, SPLIT: tl.constexpr, SAVE: tl.constexpr,
                KIND: tl.constexpr, NATIVE: tl.constexpr, BF16_OUT: tl.constexpr, UPCAST: tl.constexpr,
                PREC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One (batch, head) ``program_id(0)``: the state over every token (or, with SPLIT, the sum of the partials of
    :func:`_stats_kernel`), folded on chip, applied to the queries of chunk ``program_id(1)``."""
    b, h, bh64 = _head(H)
    split = tl.program_id(1)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    q_base = q_ptr + b * sqb + h * sqh
    if SPLIT:
        kv, s_k, s_q = _sum_parts(part_ptr, psk_ptr, psq_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
                                  KIND != 2, KIND == 0, BLOCK_D, BLOCK_E)
    else:
        kv, s_k, s_q = _stats(k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh, q_base, km_ptr, qm_ptr, b, 0,
                              n_k, n_q, skn, skd, svn, sve, sqn, sqd, skmb, skmn, sqmb, sqmn, offs_d, offs_e, d_ok,
                              e_ok, HAS_KM, HAS_QM, KIND != 2, KIND == 0, KIND, NATIVE, UPCAST, PREC,
                              BLOCK, BLOCK_D, BLOCK_E)
    if SAVE:
        if split == 0:
            _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps)
    w = _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, KIND)
    if BF16_OUT:
        w = w.to(tl.bfloat16)
    start = split * chunk
    for n0 in range(start, tl.minimum(n_q, start + chunk), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = _keep(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
        q = _tile(q_base, offs, offs_d, sqn, sqd, rows, d_ok)
        out = _apply(q, rows, w, s_k, eps, KIND, BF16_OUT, UPCAST, PREC, BLOCK, BLOCK_E)
        tl.store(o_ptr + bh64 * n_q * e + offs.to(tl.int64)[:, None] * e + offs_e[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=(offs < n_q)[:, None] & e_ok[None, :])


def _fwd_one_tile_kernel(q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, gamma_ptr, o_ptr, kv_ptr, sq_ptr, sk_ptr,
                         H, n_q, n_k, d, e, eps, n_bucket, p_bucket,
                         sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sqmb, sqmn, skmb, skmn,
                         HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, SAVE: tl.constexpr, KIND: tl.constexpr,
                         NATIVE: tl.constexpr, BF16_OUT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                         BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """:func:`_fwd_kernel` for a head whose tokens fit one tile (BLOCK ≥ n_q, n_k): q, k, v are read once."""
    b, h, bh64 = _head(H)
    offs = tl.arange(0, BLOCK)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    k_rows = _keep(km_ptr, b, skmb, skmn, offs, n_k, HAS_KM)
    q_rows = _keep(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
    k = _features(_tile(k_ptr + b * skb + h * skh, offs, offs_d, skn, skd, k_rows, d_ok), k_rows, KIND)
    v = _tile(v_ptr + b * svb + h * svh, offs, offs_e, svn, sve, k_rows, e_ok)
    q = _tile(q_ptr + b * sqb + h * sqh, offs, offs_d, sqn, sqd, q_rows, d_ok)
    kv = _mm(tl.trans(k), v, tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32), NATIVE, UPCAST, PREC)
    s_k = tl.reduce(tl.abs(k.to(tl.float32)), 0, _SUM)
    s_q = tl.reduce(tl.abs(q.to(tl.float32)), 0, _SUM)
    if SAVE:
        _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps)
    w = _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, KIND)
    if BF16_OUT:
        w = w.to(tl.bfloat16)
    out = _apply(q, q_rows, w, s_k, eps, KIND, BF16_OUT, UPCAST, PREC, BLOCK, BLOCK_E)
    tl.store(o_ptr + bh64 * n_q * e + offs.to(tl.int64)[:, None] * e + offs_e[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(offs < n_q)[:, None] & e_ok[None, :])


def _bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, qm_ptr, km_ptr, kv_ptr, sq_ptr, sk_ptr, part_ptr, dq_ptr, dk_ptr, dv_ptr,
                H, n_q, n_k, d, e, n_split, chunk, eps, n_bucket, p_bucket,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sgb, sgh, sgn, sge, sqmb, sqmn, skmb, skmn,
                HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, SPLIT: tl.constexpr, NATIVE: tl.constexpr,
                BF16_DQ: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """SimA's gradients (module docstring) for (batch, head) ``program_id(0)``: qᵀG over every token (SPLIT: the
    partials' sum), then dq, dk, dv for the tokens of chunk ``program_id(1)``."""
    b, h, bh64 = _head(H)
    split = tl.program_id(1)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    de_ok = d_ok[:, None] & e_ok[None, :]
    q_base, g_base = q_ptr + b * sqb + h * sqh, g_ptr + b * sgb + h * sgh
    if SPLIT:
        qg, _, _ = _sum_parts(part_ptr, part_ptr, part_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
                              False, False, BLOCK_D, BLOCK_E)
    else:
        qg, _, _ = _stats(q_base, g_base, q_base, qm_ptr, qm_ptr, b, 0, n_q, 0, sqn, sqd, sgn, sge, sqn, sqd,
                          sqmb, sqmn, sqmb, sqmn, offs_d, offs_e, d_ok, e_ok, HAS_QM, False, False, False, 0,
                          NATIVE, UPCAST, PREC, BLOCK, BLOCK_D, BLOCK_E)
    kvn = tl.load(kv_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], mask=de_ok, other=0.0)
    s_q_raw = tl.load(sq_ptr + bh64 * d + offs_d, mask=d_ok, other=1.0)
    s_k_raw = tl.load(sk_ptr + bh64 * d + offs_d, mask=d_ok, other=1.0)
    s_q, s_k = tl.maximum(s_q_raw, eps), tl.maximum(s_k_raw, eps)
    dkvn = qg / s_q[:, None]  # q̂ᵀG
    r = tl.reduce(kvn * dkvn, 1, _SUM)  # Σ_n dq̂·q̂ = Σ_j dk̂·k̂
    t_q = tl.where(s_q_raw >= eps, r / s_q, 0.0)  # a norm clamped to eps is a constant: no sign term
    t_k = tl.where(s_k_raw >= eps, r / s_k, 0.0)
    w_q = tl.trans(kvn / s_q[:, None])
    if BF16_DQ:
        w_q = w_q.to(tl.bfloat16)
    w_k = dkvn / s_k[:, None]
    w_kt = tl.trans(w_k)
    zero_d = tl.full((BLOCK, BLOCK_D), 0.0, tl.float32)
    start = split * chunk
    for n0 in range(start, tl.minimum(n_q, start + chunk), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = _keep(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
        g = _tile(g_base, offs, offs_e, sgn, sge, rows, e_ok)
        x = _tile(q_base, offs, offs_d, sqn, sqd, rows, d_ok).to(tl.float32)
        if BF16_DQ:
            gw = _mm(g.to(tl.bfloat16), w_q, zero_d, True, UPCAST, PREC)
        else:
            gw = _mm(g, w_q, zero_d, False, UPCAST, PREC)
        dq = gw - tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)) * t_q[None, :]
        tl.store(dq_ptr + bh64 * n_q * d + offs.to(tl.int64)[:, None] * d + offs_d[None, :],
                 dq.to(dq_ptr.dtype.element_ty), mask=(offs < n_q)[:, None] & d_ok[None, :])
    for n0 in range(start, tl.minimum(n_k, start + chunk), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = _keep(km_ptr, b, skmb, skmn, offs, n_k, HAS_KM)
        y = _tile(v_ptr + b * svb + h * svh, offs, offs_e, svn, sve, rows, e_ok)
        x = _tile(k_ptr + b * skb + h * skh, offs, offs_d, skn, skd, rows, d_ok).to(tl.float32)
        dk = _mm(y, w_kt, zero_d, False, UPCAST, PREC) - tl.where(
            x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)) * t_k[None, :]
        dv = _mm(x, w_k, tl.full((BLOCK, BLOCK_E), 0.0, tl.float32), False, UPCAST, PREC)
        in_range = (offs < n_k)[:, None]
        tl.store(dk_ptr + bh64 * n_k * d + offs.to(tl.int64)[:, None] * d + offs_d[None, :],
                 dk.to(dk_ptr.dtype.element_ty), mask=in_range & d_ok[None, :])
        tl.store(dv_ptr + bh64 * n_k * e + offs.to(tl.int64)[:, None] * e + offs_e[None, :],
                 dv.to(dv_ptr.dtype.element_ty), mask=in_range & e_ok[None, :])


_HELPERS = (_head, _channels, _keep, _tile, _mm, _features, _stats, _sum_parts, _fold, _apply, _save_state)
# What the tuned configuration depends on: tokens per program and programs (n_bucket, p_bucket: powers of two, unused
# in the kernels' bodies), head dims and the path; triton adds the tensor arguments' dtypes.
_TUNE_KEYS = {"stats": ["n_bucket", "p_bucket", "d", "e", "KIND", "NORMS", "HAS_Z"],
              "fwd": ["n_bucket", "p_bucket", "d", "e", "KIND", "SPLIT", "BF16_OUT"],
              "one": ["n_bucket", "p_bucket", "d", "e", "KIND", "BF16_OUT"],
              "bwd": ["n_bucket", "p_bucket", "d", "e", "SPLIT", "BF16_DQ"]}


#: (tokens per tile, warps, pipeline stages) tried for the looping kernels. The first is the untuned default: the
#: smallest tile, whose shared memory fits every head size up to 128 on an H100/H200 (the backward at d = dv = 128 in
#: fp16 needs 136 KiB at 32 tokens and more than the 227 KiB there are at 64, measured on an H200).
_LOOP_CONFIGS = ((32, 4, 3), (64, 4, 3), (64, 8, 2), (128, 8, 2))
_ONE_TILE_WARPS = (8, 4, 16)


def _tuning() -> bool:
    """Whether launch configurations are autotuned on a GPU: yes unless ``SIMATTN_TRITON_AUTOTUNE=0``, which runs
    each kernel in its first configuration without timing any (quick checks and tests, which compile each shape
    once instead of once per configuration)."""
    return os.environ.get("SIMATTN_TRITON_AUTOTUNE", "1") != "0"


@functools.lru_cache(maxsize=None)
def _kernels(interpret: bool, tune: bool) -> SimpleNamespace:
    """The kernels decorated under the current mode and tuning (the cache key; both are given, so one mode never
    gets two sets of kernels through a defaulted argument). On a GPU the token tile, warps and stages are autotuned
    per :data:`_TUNE_KEYS` (``tune``; else the first configuration); the one-tile kernel tunes its warps only (its
    tile is the whole head)."""
    scope = dict(globals())

    def jit(fn):
        copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        # the compiler reads tl.constexpr parameters from the annotations, which FunctionType does not carry over
        copy.__annotations__, copy.__module__, copy.__qualname__ = fn.__annotations__, fn.__module__, fn.__qualname__
        return triton.jit(copy)

    for helper in _HELPERS:
        scope[helper.__name__] = jit(helper)
    stats, fwd, one, bwd = (jit(f) for f in (_stats_kernel, _fwd_kernel, _fwd_one_tile_kernel, _bwd_kernel))
    if not interpret:
        loop = [triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
                for block, warps, stages in _LOOP_CONFIGS[:None if tune else 1]]
        stats, fwd, bwd = (triton.autotune(loop, key=_TUNE_KEYS[name])(f)
                           for name, f in (("stats", stats), ("fwd", fwd), ("bwd", bwd)))
        warps = [triton.Config({}, num_warps=w) for w in _ONE_TILE_WARPS[:None if tune else 1]]
        one = triton.autotune(warps, key=_TUNE_KEYS["one"])(one)
    return SimpleNamespace(stats=stats, fwd=fwd, one=one, bwd=bwd)


def _ks() -> SimpleNamespace:
    return _kernels(interpreting(), _tuning())


# ------------------------------------------------------------------------------------------------ launchers


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot needs every dimension >= 16


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _plan(bh: int, n: int, d: int, e: int, device: torch.device) -> Tuple[int, bool]:
    """(programs per (batch, head) along the tokens, whether one tile holds a head). One program per head when
    there are enough heads to fill the GPU (about 2 programs per multiprocessor) or too few tokens to share; else
    the token axis is split so that about that many programs run, each with at least SPLIT_MIN_TOKENS tokens. The
    interpreter counts 2 multiprocessors and 32 tokens, so small tests take every path."""
    interp = interpreting() or device.type != "cuda"
    sms, least = (2, _INTERPRETER_BLOCK) if interp else (_multiprocessors(device), SPLIT_MIN_TOKENS)
    splits = min(triton.cdiv(2 * sms, bh), triton.cdiv(n, least))
    if splits > 1:
        return splits, False
    return 1, _block(n) * max(_block(d), _block(e)) <= ONE_TILE_ELEMENTS


def _precision(t: torch.Tensor) -> str:
    """Products with an fp32 operand: TF32 for half inputs (exact in TF32), else as torch's flag says."""
    tf32 = t.dtype != torch.float32 or (t.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)
    return "tf32" if tf32 else "ieee"


def _u8(mask: Optional[torch.Tensor], like: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """A bool keep-mask as bytes (a view, no copy) and its strides; a placeholder pointer and zero strides for
    none."""
    return (like, (0, 0)) if mask is None else (mask.view(torch.uint8), mask.stride())


def _launch(kernel, grid, args, consts, block: int) -> None:
    """Interpreter: fixed small tiles; GPU: the autotuned tile, warps and stages."""
    if interpreting():
        kernel[grid](*args, **consts, BLOCK=block)
    else:
        kernel[grid](*args, **consts)


def _partials(x, y, z, x_mask, z_mask, splits, chunk, kind, norms, native, prec, bucket):
    """Launch :func:`_stats_kernel` over (B·H, splits): partial φ(x)ᵀy (B·H·splits, d, e) and, with ``norms``,
    Σ|φ(x)| and Σ|z| (z given), all fp32."""
    B, H, n_x, d = x.shape
    e = y.shape[-1]
    has_z = z is not None
    f32 = {"device": x.device, "dtype": torch.float32}
    part = torch.empty(B * H * splits, d, e, **f32)
    s_x = torch.empty(B * H * splits, d, **f32) if norms else part
    s_z = torch.empty(B * H * splits, d, **f32) if has_z else part
    zz = z if has_z else x
    xm, xms = _u8(x_mask, x)
    zm, zms = _u8(z_mask, x)
    _launch(_ks().stats, (B * H, splits),
            (x, y, zz, xm, zm, part, s_x, s_z, H, n_x, zz.shape[-2] if has_z else 0, d, e, chunk, bucket,
             _block(B * H * splits),
             *x.stride(), *y.stride(), *zz.stride(), *xms, *zms),
            dict(HAS_XM=x_mask is not None, HAS_ZM=z_mask is not None, NORMS=norms, HAS_Z=has_z, KIND=kind,
                 NATIVE=native, UPCAST=interpreting(), PREC=prec, BLOCK_D=_block(d), BLOCK_E=_block(e)),
            _INTERPRETER_BLOCK)
    return part, s_x, s_z


def _native(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a product of a and b runs in their own dtype: equal half dtypes, whose products are exact in fp32."""
    return a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16)


def _forward(q, k, v, mask, q_mask, gamma, eps: float, kind: int, bf16: bool, out_dtype: torch.dtype, save: bool):
    """out (B, H, Nq, dv) and, with ``save`` (SimA), the backward's state: k̂ᵀv (B·H, d, dv), s_q and s_k (B·H, d)."""
    B, H, n_q, d = q.shape
    n_k, e = k.shape[-2], v.shape[-1]
    bh = B * H
    splits, one_tile = _plan(bh, max(n_q, n_k), d, e, q.device)
    f32 = {"device": q.device, "dtype": torch.float32}
    out = torch.empty(B, H, n_q, e, device=q.device, dtype=out_dtype)
    kv = torch.empty(bh, d, e, **f32) if save else out
    s_q, s_k = (torch.empty(bh, d, **f32), torch.empty(bh, d, **f32)) if save else (out, out)
    qm, qms = _u8(q_mask, q)
    km, kms = _u8(mask, q)
    gamma = gamma if gamma is not None else out
    native = kind != KINDS["elu"] and _native(k, v)
    prec = _precision(q)
    flags = dict(HAS_QM=q_mask is not None, HAS_KM=mask is not None, SAVE=save, KIND=kind, NATIVE=native,
                 BF16_OUT=bf16, UPCAST=interpreting(), PREC=prec, BLOCK_D=_block(d), BLOCK_E=_block(e))
    strides = (*q.stride(), *k.stride(), *v.stride(), *qms, *kms)
    ks = _ks()
    if one_tile:
        block = _block(max(n_q, n_k))
        ks.one[(bh,)](q, k, v, qm, km, gamma, out, kv, s_q, s_k, H, n_q, n_k, d, e, eps, block, _block(bh),
                      *strides, **flags, BLOCK=block)
        return out, kv, s_q, s_k
    chunk = triton.cdiv(max(n_q, n_k), splits)
    bucket = _block(chunk)
    part = psk = psq = out
    if splits > 1:
        sima = kind == KINDS["sima"]
        part, psk, psq = _partials(k, v, q if sima else None, mask, q_mask if sima else None, splits, chunk, kind,
                                   kind != KINDS["xnorm"], native, prec, bucket)
    _launch(ks.fwd, (bh, splits), (q, k, v, qm, km, gamma, part, psk, psq, out, kv, s_q, s_k, H, n_q, n_k, d, e,
                                   splits, chunk, eps, bucket, _block(bh * splits), *strides),
            dict(flags, SPLIT=splits > 1), _INTERPRETER_BLOCK)
    return out, kv, s_q, s_k


def _backward(g, q, k, v, mask, q_mask, kvn, s_q, s_k, eps: float, bf16: bool):
    """dq, dk, dv (contiguous, in q's, k's, v's dtypes) from the output gradient g and the forward's state."""
    B, H, n_q, d = q.shape
    n_k, e = k.shape[-2], v.shape[-1]
    bh = B * H
    splits, _ = _plan(bh, max(n_q, n_k), d, e, q.device)
    chunk = triton.cdiv(max(n_q, n_k), splits)
    bucket = _block(chunk)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=q.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=q.device, dtype=v.dtype)
    native, prec = _native(q, g), _precision(q)
    part = kvn
    if splits > 1:
        part, _, _ = _partials(q, g, None, q_mask, None, splits, chunk, KINDS["sima"], False, native, prec,
                               bucket)
    qm, qms = _u8(q_mask, q)
    km, kms = _u8(mask, q)
    _launch(_ks().bwd, (bh, splits),
            (q, k, v, g, qm, km, kvn, s_q, s_k, part, dq, dk, dv, H, n_q, n_k, d, e, splits, chunk, eps, bucket,
             _block(bh * splits),
             *q.stride(), *k.stride(), *v.stride(), *g.stride(), *qms, *kms),
            dict(HAS_QM=q_mask is not None, HAS_KM=mask is not None, SPLIT=splits > 1, NATIVE=native, BF16_DQ=bf16,
                 UPCAST=interpreting(), PREC=prec, BLOCK_D=_block(d), BLOCK_E=_block(e)),
            _INTERPRETER_BLOCK)
    return dq, dk, dv


# ------------------------------------------------------------------------------------------------ custom ops
# Registered for CUDA and, for the interpreter, CPU tensors (the public entry points refuse CPU tensors otherwise).


@torch.library.custom_op("simattn::linear_attn_fwd", mutates_args=(), device_types=("cuda", "cpu"))
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            q_mask: Optional[torch.Tensor], gamma: Optional[torch.Tensor], eps: float, kind: int, bf16: bool,
            out_dtype: torch.dtype, save: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    with _on(q.device):
        out, kv, s_q, s_k = _forward(q, k, v, mask, q_mask, gamma, eps, kind, bf16, out_dtype, save)
    if not save:  # outputs of a custom op may not alias each other
        kv, s_q, s_k = (q.new_empty(0, dtype=torch.float32) for _ in range(3))
    return out, kv, s_q, s_k


@_fwd_op.register_fake
def _fwd_fake(q, k, v, mask, q_mask, gamma, eps, kind, bf16, out_dtype, save):
    B, H, n_q, d = q.shape
    e = v.shape[-1]
    out = q.new_empty(B, H, n_q, e, dtype=out_dtype)
    if not save:
        return (out, *(q.new_empty(0, dtype=torch.float32) for _ in range(3)))
    return out, q.new_empty(B * H, d, e, dtype=torch.float32), *(q.new_empty(B * H, d, dtype=torch.float32)
                                                                 for _ in range(2))


@torch.library.custom_op("simattn::sima_bwd", mutates_args=(), device_types=("cuda", "cpu"))
def _bwd_op(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            q_mask: Optional[torch.Tensor], kvn: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor, eps: float,
            bf16: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with _on(q.device):
        return _backward(g, q, k, v, mask, q_mask, kvn, s_q, s_k, eps, bf16)


@_bwd_op.register_fake
def _bwd_fake(g, q, k, v, mask, q_mask, kvn, s_q, s_k, eps, bf16):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, q_mask, _, eps, kind, bf16, _, save = inputs
    _, kvn, s_q, s_k = output
    ctx.save_for_backward(q, k, v, mask, q_mask, kvn, s_q, s_k)
    ctx.eps, ctx.bf16, ctx.differentiable = eps, bf16, kind == KINDS["sima"] and save
    ctx.mark_non_differentiable(kvn, s_q, s_k)


def _grads(ctx, grad_out, *_):
    if not ctx.differentiable:
        raise RuntimeError("simattn::linear_attn_fwd: only SimA run with save=True has a backward")
    q, k, v, mask, q_mask, kvn, s_q, s_k = ctx.saved_tensors
    dq, dk, dv = _bwd_op(grad_out, q, k, v, mask, q_mask, kvn, s_q, s_k, ctx.eps, ctx.bf16)
    return dq, dk, dv, None, None, None, None, None, None, None, None


_fwd_op.register_autograd(_grads, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------ entry points


def sima_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                q_mask: Optional[torch.Tensor] = None, eps: float = 1e-12,
                compute_dtype: torch.dtype = torch.float32, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """q̂(k̂ᵀv) on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) with the fused kernels → (B, H, Nq, dv).

    ``mask`` / ``q_mask``: validated (B, Nk) / (B, Nq) keep-masks (:func:`~simattn.attention._common.resolve_masks`).
    ``compute_dtype``: bf16 multiplies q and W in bf16, anything else with fp32 operands (the torch path's
    ``range_safe_dtype``). ``out_dtype``: the output's dtype (default q's). Called by
    :func:`simattn.attention.sima.sima_attention`.
    """
    check_triton_inputs(q, k, v)
    save = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _fwd_op(q, k, v, mask, q_mask, None, eps, KINDS["sima"], compute_dtype == torch.bfloat16,
                   out_dtype or q.dtype, save)[0]


def linear_triton(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  mask: Optional[torch.Tensor] = None, gamma: Optional[torch.Tensor] = None, eps: float = 1e-6,
                  out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The forward of ELU linear attention (``kind='elu'``) or XNorm (``'xnorm'``, ``gamma`` = γ_q γ_kv as a
    (B·H,) fp32 tensor) with the fused kernel, all in fp32 as their torch paths; ``mask`` (B, Nk) removes keys.
    Forward only: :func:`simattn.attention.elu.elu_attention` and :func:`~simattn.attention.xnorm.xnorm_attention`
    call it where nothing needs a gradient."""
    check_triton_inputs(q, k, v, kind)
    return _fwd_op(q, k, v, mask, None, gamma, eps, KINDS[kind], False, out_dtype or q.dtype, False)[0]


def _on(device: torch.device):
    """Launches go to the current CUDA device: make it the tensors' one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
