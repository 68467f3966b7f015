"""The Triton kernels of point-wise activation attention, out = s · h(c q kᵀ + b) v, flash-style: one tile of
queries (or keys) per program and the other axis streamed through in tiles, so no N×N tensor is ever in memory.

h is relu (``SIGMOID`` False, the ``relu`` kind) or the logistic sigmoid (``SIGMOID``: the ``sigmoid`` kind, and the
``relu`` kind's ``activation='sigmoid'``); c = 1/√d; b a number, minus log n with ``LOG_N_BIAS`` (sigmoid
attention's b = −log n); s = 1, or L^(-a) with ``LENGTH_SCALE`` (the relu kind's), where n = L is the number of kept
keys, counted per example from the key mask (:func:`_kept_keys`). Unlike softmax there is no row maximum and no
normalizer: each weight depends on its own score only, so a tile's weights are final as soon as its scores are, and
the forward is one pass of fp32 accumulation, acc += h(c q kᵀ + b) v, over key tiles (:func:`fwd_kernel`).

Backward, with G the output gradient and x = c q kᵀ + b:

    dv = Pᵀ G,   dS = (G vᵀ) ∘ s h'(x) c,   dq = dS k,   dk = dSᵀ q,

with P = s h(x), h'(x) = σ(x)(1 − σ(x)) for the sigmoid and 1[x > 0] for relu (0 at 0, as F.relu). With no
normalizer there is no row term (FlashAttention's D = rowsum(dO ∘ O)), so the two gradients need nothing from each
other: :func:`dkdv_kernel` holds a key tile and streams the queries (dk, dv), :func:`dq_kernel` holds a query tile
and streams the keys (dq). Each recomputes the scores it needs, so every gradient is written once by one program, in
a fixed order: no atomics, run-to-run identical, and no fp32 N×d scratch for dq (FlashAttention-2's atomic dq
split would save one recomputation of q kᵀ for that).

Precision: scores, h, the scale and every accumulator in fp32. q kᵀ multiplies equal half inputs in their own dtype
(exact products); the weights meet v (and G, for dv) in bf16 when those are bf16 (P rounded to bf16, as flash
attention's P is; bf16 has fp32's range), and dS meets k and q in bf16 when they are bf16 (``BF16_DS``), otherwise
as fp32 at ``PREC`` (TF32 for fp16: fp16 cannot hold the relu kind's weights, which are not bounded). Masked keys read as zero rows and get zero weight.

The tiles, product and mask helpers are :mod:`simattn.kernels.tiles`'. Decorated where written, in the
mode of ``TRITON_INTERPRET`` at first import (:data:`simattn.kernels.host.INTERPRETER`); the host side is :mod:`simattn.kernels.pointwise.launch`.
"""
import triton
import triton.language as tl

from ..host import tuned
from ..tiles import SUM, keep_rows, mm, tile

__all__ = ["CONFIGS", "TUNE_KEYS", "fwd_kernel", "dkdv_kernel", "dq_kernel"]

#: (streamed tokens per tile, warps, pipeline stages) tried on a GPU; the first is the untuned default
CONFIGS = ((64, 4, 2), (32, 4, 3), (64, 8, 3), (128, 8, 2))
# What the tuned configuration depends on: streamed tokens (a power of two, unused in the bodies), head dims, h.
TUNE_KEYS = ["n_bucket", "d", "e", "SIGMOID"]


#: :func:`~simattn.kernels.host.tuned` over :data:`CONFIGS`
_tuned = tuned([triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages) for block, warps, stages in CONFIGS],
               TUNE_KEYS)


@triton.jit
def _kept_keys(m_ptr, b, smb, smn, n_k, n_keys, HAS_KM: tl.constexpr, BLOCK: tl.constexpr):
    """n: the keys example ``b`` keeps (at least 1), in fp32; ``n_keys`` (n_k as a float) without a mask."""
    if HAS_KM:
        count = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_k, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            keep = tl.load(m_ptr + b * smb + offs.to(tl.int64) * smn, mask=offs < n_k, other=0)
            count += (keep != 0).to(tl.float32)
        n = tl.maximum(tl.reduce(count, 0, SUM), 1.0)
    else:
        n = n_keys
    return n


@triton.jit
def _bias_scale(n, bias, alpha, LOG_N_BIAS: tl.constexpr, LENGTH_SCALE: tl.constexpr):
    """(b, s) of an example with n kept keys: b = bias (− log n), s = n^(-alpha) or 1."""
    if LOG_N_BIAS:
        b = bias - tl.log(n)
    else:
        b = bias + 0.0 * n
    if LENGTH_SCALE:
        s = tl.exp(-alpha * tl.log(n))
    else:
        s = 1.0 + 0.0 * n
    return b, s


@triton.jit
def _activation(x, SIGMOID: tl.constexpr):
    """h(x) in fp32, and h'(x): the logistic sigmoid with ``SIGMOID``, else relu."""
    if SIGMOID:
        w = 1.0 / (1.0 + tl.exp(-x))
        dw = w * (1.0 - w)
    else:
        w = tl.maximum(x, 0.0)
        dw = (x > 0).to(tl.float32)
    return w, dw


@triton.jit
def _head_offsets(sb, sh):
    """(batch, offset of the (batch, head) this program owns): the grid is (tiles, B, H)."""
    b = tl.program_id(1).to(tl.int64)
    return b, b * sb + tl.program_id(2).to(tl.int64) * sh


@triton.jit
def _rows_and_channels(d, e, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The BLOCK_M rows of tile ``program_id(0)`` and the channel offsets with their in-range masks."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d, offs_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E)
    return offs_m, offs_d, offs_e, offs_d < d, offs_e < e


@triton.jit
def _query_tile(q_ptr, m_ptr, sqb, sqh, sqn, sqd, skb, skh, svb, svh, smb, smn, n_q, n_k, n_keys, d, e, bias,
                alpha, HAS_KM: tl.constexpr, LOG_N_BIAS: tl.constexpr, LENGTH_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    """What a program that holds a query tile and streams the keys starts from: its batch b, the offsets of its
    head in k and v, rows and channels with their masks, the tile of q, and the example's (bias, scale)."""
    b, q_base = _head_offsets(sqb, sqh)
    _, k_base = _head_offsets(skb, skh)
    _, v_base = _head_offsets(svb, svh)
    offs_m, offs_d, offs_e, d_ok, e_ok = _rows_and_channels(d, e, BLOCK_M, BLOCK_D, BLOCK_E)
    rows_q = offs_m < n_q
    q = tile(q_ptr + q_base, offs_m, offs_d, sqn, sqd, rows_q, d_ok)
    bias_b, scale = _bias_scale(_kept_keys(m_ptr, b, smb, smn, n_k, n_keys, HAS_KM, BLOCK), bias, alpha, LOG_N_BIAS,
                                LENGTH_SCALE)
    return b, k_base, v_base, offs_m, offs_d, offs_e, d_ok, e_ok, rows_q, q, bias_b, scale


@triton.jit
def _key_tile(q, k_head, v_head, m_ptr, b, smb, smn, start, n_k, offs_d, offs_e, d_ok, e_ok, skn, skd, svn, sve, c,
              bias_b, SIGMOID: tl.constexpr, HAS_KM: tl.constexpr, QK_NATIVE: tl.constexpr, UPCAST: tl.constexpr,
              PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """The key tile at ``start`` of a query tile's stream: k, v (removed and out-of-range keys read as zero rows, so
    they add nothing through v nor, in dq, through G vᵀ) and h(x), h'(x) of its scores x = c q kᵀ + b."""
    offs_n = start + tl.arange(0, BLOCK)
    rows_k = keep_rows(m_ptr, b, smb, smn, offs_n, n_k, HAS_KM)
    k = tile(k_head, offs_n, offs_d, skn, skd, rows_k, d_ok)
    v = tile(v_head, offs_n, offs_e, svn, sve, rows_k, e_ok)
    s = mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32), QK_NATIVE, UPCAST, PREC)
    w, dw = _activation(s * c + bias_b, SIGMOID)
    return k, v, w, dw


@_tuned
@triton.jit
def fwd_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, H, n_q, n_k, n_keys, d, e, c, bias, alpha,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sob, soh, son, soe, smb, smn, n_bucket,
                SIGMOID: tl.constexpr, HAS_KM: tl.constexpr, LOG_N_BIAS: tl.constexpr, LENGTH_SCALE: tl.constexpr,
                QK_NATIVE: tl.constexpr, PV_NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """One tile of BLOCK_M queries of one (batch, head): out = s Σ over key tiles h(c q kᵀ + b) v."""
    b, k_base, v_base, offs_m, offs_d, offs_e, d_ok, e_ok, rows_q, q, bias_b, scale = _query_tile(
        q_ptr, m_ptr, sqb, sqh, sqn, sqd, skb, skh, svb, svh, smb, smn, n_q, n_k, n_keys, d, e, bias, alpha, HAS_KM,
        LOG_N_BIAS, LENGTH_SCALE, BLOCK_M, BLOCK_D, BLOCK_E, BLOCK)
    _, o_base = _head_offsets(sob, soh)
    acc = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    for start in range(0, n_k, BLOCK):
        _k, v, w, _dw = _key_tile(q, k_ptr + k_base, v_ptr + v_base, m_ptr, b, smb, smn, start, n_k, offs_d, offs_e,
                                  d_ok, e_ok, skn, skd, svn, sve, c, bias_b, SIGMOID, HAS_KM, QK_NATIVE, UPCAST, PREC,
                                  BLOCK_M, BLOCK)
        if PV_NATIVE:
            acc = mm(w.to(v.dtype), v, acc, True, UPCAST, PREC)
        else:
            acc = mm(w, v, acc, False, UPCAST, PREC)
    out = acc * scale
    tl.store(o_ptr + o_base + offs_m.to(tl.int64)[:, None] * son + offs_e[None, :] * soe,
             out.to(o_ptr.dtype.element_ty), mask=rows_q[:, None] & e_ok[None, :])


@_tuned
@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, g_ptr, m_ptr, dk_ptr, dv_ptr, H, n_q, n_k, n_keys, d, e, c, bias, alpha,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sgb, sgh, sgn, sge, smb, smn, n_bucket,
                 SIGMOID: tl.constexpr, HAS_KM: tl.constexpr, LOG_N_BIAS: tl.constexpr, LENGTH_SCALE: tl.constexpr,
                 QK_NATIVE: tl.constexpr, PV_NATIVE: tl.constexpr, VG_NATIVE: tl.constexpr, BF16_DS: tl.constexpr,
                 UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK: tl.constexpr):
    """One tile of BLOCK_M keys of one (batch, head): dv = Pᵀ G and dk = dSᵀ q over query tiles (contiguous
    outputs)."""
    b, q_base = _head_offsets(sqb, sqh)
    _, k_base = _head_offsets(skb, skh)
    _, v_base = _head_offsets(svb, svh)
    _, g_base = _head_offsets(sgb, sgh)
    bh = tl.program_id(1).to(tl.int64) * H + tl.program_id(2)
    offs_m, offs_d, offs_e, d_ok, e_ok = _rows_and_channels(d, e, BLOCK_M, BLOCK_D, BLOCK_E)
    rows_k = keep_rows(m_ptr, b, smb, smn, offs_m, n_k, HAS_KM)
    k = tile(k_ptr + k_base, offs_m, offs_d, skn, skd, rows_k, d_ok)
    v = tile(v_ptr + v_base, offs_m, offs_e, svn, sve, rows_k, e_ok)
    bias_b, scale = _bias_scale(_kept_keys(m_ptr, b, smb, smn, n_k, n_keys, HAS_KM, BLOCK), bias, alpha, LOG_N_BIAS,
                                LENGTH_SCALE)
    dk = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    for start in range(0, n_q, BLOCK):
        offs_n = start + tl.arange(0, BLOCK)
        rows_q = offs_n < n_q
        q = tile(q_ptr + q_base, offs_n, offs_d, sqn, sqd, rows_q, d_ok)
        g = tile(g_ptr + g_base, offs_n, offs_e, sgn, sge, rows_q, e_ok)  # rows past n_q: zero, no gradient
        s_t = mm(k, tl.trans(q), tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32), QK_NATIVE, UPCAST, PREC)
        w, dw = _activation(s_t * c + bias_b, SIGMOID)
        w = tl.where(rows_k[:, None], w, 0.0)  # a removed key's zero row would still get h(b) > 0
        if PV_NATIVE:
            dv = mm(w.to(g.dtype), g, dv, True, UPCAST, PREC)
        else:
            dv = mm(w, g, dv, False, UPCAST, PREC)
        dp_t = mm(v, tl.trans(g), tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32), VG_NATIVE, UPCAST, PREC)
        if QK_NATIVE and BF16_DS:
            dk = mm((dp_t * dw).to(q.dtype), q, dk, True, UPCAST, PREC)
        else:
            dk = mm(dp_t * dw, q, dk, False, UPCAST, PREC)
    rows = offs_m.to(tl.int64)[:, None]
    ok = offs_m[:, None] < n_k
    tl.store(dk_ptr + bh * n_k * d + rows * d + offs_d[None, :], (dk * (scale * c)).to(dk_ptr.dtype.element_ty),
             mask=ok & d_ok[None, :])
    tl.store(dv_ptr + bh * n_k * e + rows * e + offs_e[None, :], (dv * scale).to(dv_ptr.dtype.element_ty),
             mask=ok & e_ok[None, :])


@_tuned
@triton.jit
def dq_kernel(q_ptr, k_ptr, v_ptr, g_ptr, m_ptr, dq_ptr, H, n_q, n_k, n_keys, d, e, c, bias, alpha,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sgb, sgh, sgn, sge, smb, smn, n_bucket,
               SIGMOID: tl.constexpr, HAS_KM: tl.constexpr, LOG_N_BIAS: tl.constexpr, LENGTH_SCALE: tl.constexpr,
               QK_NATIVE: tl.constexpr, VG_NATIVE: tl.constexpr, BF16_DS: tl.constexpr, UPCAST: tl.constexpr,
               PREC: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """One tile of BLOCK_M queries of one (batch, head): dq = dS k over key tiles (contiguous output)."""
    b, k_base, v_base, offs_m, offs_d, offs_e, d_ok, e_ok, rows_q, q, bias_b, scale = _query_tile(
        q_ptr, m_ptr, sqb, sqh, sqn, sqd, skb, skh, svb, svh, smb, smn, n_q, n_k, n_keys, d, e, bias, alpha, HAS_KM,
        LOG_N_BIAS, LENGTH_SCALE, BLOCK_M, BLOCK_D, BLOCK_E, BLOCK)
    _, g_base = _head_offsets(sgb, sgh)
    bh = tl.program_id(1).to(tl.int64) * H + tl.program_id(2)
    g = tile(g_ptr + g_base, offs_m, offs_e, sgn, sge, rows_q, e_ok)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, n_k, BLOCK):
        k, v, _w, dw = _key_tile(q, k_ptr + k_base, v_ptr + v_base, m_ptr, b, smb, smn, start, n_k, offs_d, offs_e,
                                 d_ok, e_ok, skn, skd, svn, sve, c, bias_b, SIGMOID, HAS_KM, QK_NATIVE, UPCAST, PREC,
                                 BLOCK_M, BLOCK)
        dp = mm(g, tl.trans(v), tl.zeros([BLOCK_M, BLOCK], dtype=tl.float32), VG_NATIVE, UPCAST, PREC)
        if QK_NATIVE and BF16_DS:
            dq = mm((dp * dw).to(k.dtype), k, dq, True, UPCAST, PREC)
        else:
            dq = mm(dp * dw, k, dq, False, UPCAST, PREC)
    tl.store(dq_ptr + bh * n_q * d + offs_m.to(tl.int64)[:, None] * d + offs_d[None, :],
             (dq * (scale * c)).to(dq_ptr.dtype.element_ty), mask=rows_q[:, None] & d_ok[None, :])
