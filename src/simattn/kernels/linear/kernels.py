"""The Triton kernels of linear attention with a d×dv state, φ(q)(φ(k)ᵀv): one skeleton, and each kind's prologue
and epilogue as named functions that the skeleton calls under named constexpr flags. The host side (launch plans,
the custom ops, the entry points) is :mod:`simattn.kernels.linear.launch`, whose docstring gives the maths.

The skeleton, per (batch, head):

1. over key tiles (:func:`_stats`): φ(k)ᵀv (d×dv) in fp32 on tensor cores and, where the kind needs them, Σ|φ(k)|
   and Σ|q| per channel; the **prologue** φ (:func:`_prologue`) maps each key tile as it is read;
2. on chip, the **fold** (:func:`_fold`): the state made into the d×dv matrix W that queries are multiplied with;
3. over query tiles, the **application** (:func:`_apply`): φ(q) W, then the kind's normalizer of each output row.

:func:`fwd_kernel` runs this with one program per (batch, head), or per chunk of the token axis when the sums of
step 1 come from :func:`stats_kernel`'s partials (``SPLIT``); :func:`fwd_one_tile_kernel` holds a whole head in
one tile. :func:`bwd_kernel` is SimA's backward; :func:`feature_bwd_kernel` that of the kinds with a feature
map and a per-row normalizer, whose chain through φ is the prologue's derivative (:func:`_feature_slope`).

The kinds, by their flags (each a ``tl.constexpr``; the host's ``LinearKind`` records name them per kind):

- SimA: no feature map; ``FOLD_L1`` (W = (kᵀv / s_k) / s_q, :func:`_l1_fold`); needs Σ|k| and Σ|q|.
- ELU: ``FEATURE_ELU`` (φ = elu + 1 on q and k, :func:`_elu_features`); ``NORM_DOT`` (each row over φ(q)·Σφ(k),
  :func:`_dot_normalizer`); needs Σ|φ(k)| = Σφ(k).
- SLAB: ``FEATURE_RELU`` (φ = relu on q and k, :func:`_relu_features`) and ``NORM_DOT``; its backward and ELU's
  are :func:`feature_bwd_kernel`'s. FLatten: ``NORM_DOT`` alone, on features made by the caller (its focused map's
  norms span every head of a token, more than one program holds).
- XNorm: ``FOLD_COLS_L2`` (columns of kᵀv over their l2 norm, times γ, :func:`_cols_l2_fold`); ``NORM_ROWS_L2``
  (each row over ‖q‖₂, :func:`_rows_l2_normalizer`).

Adding a kind (InLine, PolaFormer ...): write its prologue and/or epilogue here as
``@triton.jit`` functions, give each a flag parameter on :func:`_prologue`, :func:`_fold` or :func:`_apply` (and on
the kernels, which pass it through), branch on it there, and add a ``LinearKind`` record in ``launch.KINDS``
that sets the flags and says which sums it needs; a new feature map with a per-row normalizer gets its backward
by adding its derivative to :func:`_feature_slope`. A kind that needs more than d×dv state or per-channel sums
needs a new skeleton.

Every function is decorated where it is written. ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates, so
this module runs in Triton's interpreter (CPU tensors) or compiled (CUDA) as the variable was when the kernels were
first imported (:data:`simattn.kernels.host.INTERPRETER`); the test suite sets it before that on machines without
CUDA. The tile, mask and product helpers are :mod:`simattn.kernels.tiles`'. Only builtins of
``triton.language`` are called: its own jit'd helpers (``tl.sum``) take the mode of triton's import, which can
differ.
"""
import triton
import triton.language as tl

from ..host import tuned
from ..tiles import SUM, keep_rows, mm, tile

__all__ = ["LOOP_CONFIGS", "ONE_TILE_WARPS", "TUNE_KEYS", "stats_kernel", "fwd_kernel", "fwd_one_tile_kernel",
           "bwd_kernel", "feature_bwd_kernel"]

#: (tokens per tile, warps, pipeline stages) tried for the looping kernels. The first is the untuned default: the
#: smallest tile, whose shared memory fits every head size up to 128 on an H100/H200 (the backward at d = dv = 128 in
#: fp16 needs 136 KiB at 32 tokens and more than the 227 KiB there are at 64, measured on an H200).
LOOP_CONFIGS = ((32, 4, 3), (64, 4, 3), (64, 8, 2), (128, 8, 2))
#: warps tried for the one-tile kernel (its tile is the whole head); the first is the untuned default
ONE_TILE_WARPS = (8, 4, 16)
# What the tuned configuration depends on: tokens per program and programs (n_bucket, p_bucket: powers of two, unused
# in the kernels' bodies), head dims and the path; triton adds the tensor arguments' dtypes.
TUNE_KEYS = {"stats": ["n_bucket", "p_bucket", "d", "e", "FEATURE_ELU", "FEATURE_RELU", "NORMS", "HAS_Z"],
             "fwd": ["n_bucket", "p_bucket", "d", "e", "FEATURE_ELU", "FEATURE_RELU", "FOLD_L1", "FOLD_COLS_L2",
                     "SPLIT", "BF16_OUT"],
             "one": ["n_bucket", "p_bucket", "d", "e", "FEATURE_ELU", "FEATURE_RELU", "FOLD_L1", "FOLD_COLS_L2",
                     "BF16_OUT"],
             "bwd": ["n_bucket", "p_bucket", "d", "e", "SPLIT", "BF16_DQ"],
             "feature_bwd": ["n_bucket", "p_bucket", "d", "e", "FEATURE_ELU", "FEATURE_RELU", "NORM_DOT",
                             "QUERY_SIDE", "KEY_SIDE"]}


def _loop_tuned(name):
    """:func:`~simattn.kernels.host.tuned` over :data:`LOOP_CONFIGS`, on the tune keys of kernel ``name``."""
    return tuned([triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
                  for block, warps, stages in LOOP_CONFIGS], TUNE_KEYS[name])


def _warps_tuned(name):
    """:func:`_loop_tuned` for the one-tile kernel: warps only."""
    return tuned([triton.Config({}, num_warps=w) for w in ONE_TILE_WARPS], TUNE_KEYS[name])


@triton.jit
def _head(H):
    """(batch, head, flat index as int64) of the (batch, head) that ``program_id(0)`` owns."""
    bh = tl.program_id(0)
    return (bh // H).to(tl.int64), (bh % H).to(tl.int64), bh.to(tl.int64)


@triton.jit
def _channels(d, e, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The channel lanes of q/k (``d``) and of v (``e``), and which of them are real."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    return offs_d, offs_e, offs_d < d, offs_e < e


# ------------------------------------------------------------------------------------------------ prologues
@triton.jit
def _elu_features(x, rows):
    """ELU's φ(x) = elu(x) + 1 in fp32, 0 on rows that take no part."""
    xf = x.to(tl.float32)
    return tl.where(rows[:, None], tl.where(xf > 0, xf + 1.0, tl.exp(xf)), 0.0)


@triton.jit
def _relu_features(x, rows):
    """SLAB's φ(x) = relu(x) in fp32, 0 on rows that take no part."""
    return tl.where(rows[:, None], tl.maximum(x.to(tl.float32), 0.0), 0.0)


@triton.jit
def _prologue(x, rows, FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr):
    """The feature map on a tile of q or k: the kind's (FEATURE_*), else x itself."""
    # one return: the compiler types every return of a function alike, constexpr branches included
    if FEATURE_ELU:
        phi = _elu_features(x, rows)
    elif FEATURE_RELU:
        phi = _relu_features(x, rows)
    else:
        phi = x
    return phi


@triton.jit
def _feature_slope(x, FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr):
    """φ'(x) of the prologue, elementwise in fp32 (1 without a feature map)."""
    xf = x.to(tl.float32)
    if FEATURE_ELU:
        slope = tl.where(xf > 0, 1.0, tl.exp(xf))
    elif FEATURE_RELU:
        slope = tl.where(xf > 0, 1.0, 0.0)
    else:
        slope = tl.where(xf == xf, 1.0, 1.0)
    return slope


# ------------------------------------------------------------------------------------------------ epilogues
@triton.jit
def _l1_fold(kv, s_k, s_q, eps):
    """SimA: (kᵀv / s_k[:, None]) / s_q[:, None], each norm dividing on its own (never their product)."""
    return kv / tl.maximum(s_k, eps)[:, None] / tl.maximum(s_q, eps)[:, None]


@triton.jit
def _cols_l2_fold(kv, gamma, eps):
    """XNorm: γ · each column of kᵀv over its l2 norm + eps."""
    norm = tl.sqrt(tl.reduce(kv * kv, 0, SUM)) + eps
    return kv / norm[None, :] * gamma


@triton.jit
def _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, FOLD_L1: tl.constexpr, FOLD_COLS_L2: tl.constexpr,
          BF16_OUT: tl.constexpr):
    """The state made into W, by the kind's fold flag; kᵀv itself without one (ELU: its normalizer is per row). In
    bf16 with BF16_OUT, as :func:`_apply` takes it."""
    if FOLD_L1:
        w = _l1_fold(kv, s_k, s_q, eps)
    else:
        if FOLD_COLS_L2:
            w = _cols_l2_fold(kv, tl.load(gamma_ptr + bh64), eps)
        else:
            w = kv
    if BF16_OUT:
        w = w.to(tl.bfloat16)
    return w


@triton.jit
def _store_out(o_ptr, out, bh64, n_q, e, offs, offs_e, e_ok):
    """One query tile's output rows ``offs`` of head ``bh64`` (contiguous (B, H, n_q, e)), in the output's dtype."""
    tl.store(o_ptr + bh64 * n_q * e + offs.to(tl.int64)[:, None] * e + offs_e[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(offs < n_q)[:, None] & e_ok[None, :])


@triton.jit
def _dot_normalizer(out, phi, z, eps):
    """ELU: each output row over φ(q)·z + eps, z = Σ φ(k) per channel."""
    return out / (tl.reduce(phi * z[None, :], 1, SUM) + eps)[:, None]


@triton.jit
def _rows_l2_normalizer(out, q, eps):
    """XNorm: each output row over ‖q‖₂ + eps."""
    qf = q.to(tl.float32)
    return out / (tl.sqrt(tl.reduce(qf * qf, 1, SUM)) + eps)[:, None]


@triton.jit
def _apply(q, rows, w, z, eps, FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr, NORM_DOT: tl.constexpr,
           NORM_ROWS_L2: tl.constexpr,
           BF16_OUT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK: tl.constexpr,
           BLOCK_E: tl.constexpr):
    """One query tile: φ(q) W (bf16 operands with BF16_OUT, W given in bf16), then the kind's row normalizer."""
    zero = tl.full((BLOCK, BLOCK_E), 0.0, tl.float32)
    x = _prologue(q, rows, FEATURE_ELU, FEATURE_RELU)
    if BF16_OUT:
        out = mm(x.to(tl.bfloat16), w, zero, True, UPCAST, PREC)
    else:
        out = mm(x, w, zero, False, UPCAST, PREC)
    if NORM_DOT:
        out = _dot_normalizer(out, x, z, eps)
    if NORM_ROWS_L2:
        out = _rows_l2_normalizer(out, q, eps)
    return out


# ------------------------------------------------------------------------------------------------ the skeleton
@triton.jit
def _stats(x_base, y_base, z_base, xm_ptr, zm_ptr, b, start, lim_x, lim_z, sxn, sxd, syn, sye, szn, szd,
           smxb, smxn, smzb, smzn, offs_d, offs_e, d_ok, e_ok,
           HAS_XM: tl.constexpr, HAS_ZM: tl.constexpr, NORMS: tl.constexpr, HAS_Z: tl.constexpr,
           FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr, NATIVE: tl.constexpr, UPCAST: tl.constexpr,
           PREC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """Over tokens [start, max(lim_x, lim_z)): φ(x)ᵀy (d×e) and, with NORMS, Σ|φ(x)| and (HAS_Z) Σ|z| per channel,
    all fp32. x, y end at lim_x, z at lim_z."""
    acc = tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32)
    s_x = tl.full((BLOCK_D,), 0.0, tl.float32)
    s_z = tl.full((BLOCK_D,), 0.0, tl.float32)
    for n0 in range(start, tl.maximum(lim_x, lim_z), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = keep_rows(xm_ptr, b, smxb, smxn, offs, lim_x, HAS_XM)
        x = _prologue(tile(x_base, offs, offs_d, sxn, sxd, rows, d_ok), rows, FEATURE_ELU, FEATURE_RELU)
        y = tile(y_base, offs, offs_e, syn, sye, rows, e_ok)
        acc = mm(tl.trans(x), y, acc, NATIVE, UPCAST, PREC)
        if NORMS:
            s_x += tl.reduce(tl.abs(x.to(tl.float32)), 0, SUM)
            if HAS_Z:
                z_rows = keep_rows(zm_ptr, b, smzb, smzn, offs, lim_z, HAS_ZM)
                z = tile(z_base, offs, offs_d, szn, szd, z_rows, d_ok)
                s_z += tl.reduce(tl.abs(z.to(tl.float32)), 0, SUM)
    return acc, s_x, s_z


@triton.jit
def _sum_parts(part_ptr, sx_ptr, sz_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
               NORMS: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The partial sums :func:`stats_kernel` wrote for one (batch, head), added in a fixed order."""
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


@triton.jit
def _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps,
                FOLD_L1: tl.constexpr):
    """What the backward reads, fp32: SimA's (FOLD_L1) k̂ᵀv and the unclamped norms; a feature kind's φ(k)ᵀv and
    z = Σφ(k) (in ``sk_ptr``)."""
    if FOLD_L1:
        kvn = kv / tl.maximum(s_k, eps)[:, None]
    else:
        kvn = kv
    tl.store(kv_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], kvn, mask=d_ok[:, None] & e_ok[None, :])
    tl.store(sq_ptr + bh64 * d + offs_d, s_q, mask=d_ok)
    tl.store(sk_ptr + bh64 * d + offs_d, s_k, mask=d_ok)


@_loop_tuned("stats")
@triton.jit
def stats_kernel(x_ptr, y_ptr, z_ptr, xm_ptr, zm_ptr, part_ptr, sx_ptr, sz_ptr, H, n_x, n_z, d, e, chunk,
                  n_bucket, p_bucket,
                  sxb, sxh, sxn, sxd, syb, syh, syn, sye, szb, szh, szn, szd, smxb, smxn, smzb, smzn,
                  HAS_XM: tl.constexpr, HAS_ZM: tl.constexpr, NORMS: tl.constexpr, HAS_Z: tl.constexpr,
                  FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr, NATIVE: tl.constexpr,
                  UPCAST: tl.constexpr, PREC: tl.constexpr,
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
                           HAS_XM, HAS_ZM, NORMS, HAS_Z, FEATURE_ELU, FEATURE_RELU, NATIVE, UPCAST, PREC, BLOCK,
                           BLOCK_D, BLOCK_E)
    part = bh64 * n_split + split
    tl.store(part_ptr + part * d * e + offs_d[:, None] * e + offs_e[None, :], acc, mask=d_ok[:, None] & e_ok[None, :])
    if NORMS:
        tl.store(sx_ptr + part * d + offs_d, s_x, mask=d_ok)
        if HAS_Z:
            tl.store(sz_ptr + part * d + offs_d, s_z, mask=d_ok)


@_loop_tuned("fwd")
@triton.jit
def fwd_kernel(q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, gamma_ptr, part_ptr, psk_ptr, psq_ptr, o_ptr, kv_ptr, sq_ptr,
                sk_ptr, H, n_q, n_k, d, e, n_split, chunk, eps, n_bucket, p_bucket,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sqmb, sqmn, skmb, skmn,
                HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, SPLIT: tl.constexpr, SAVE: tl.constexpr,
                FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr, KEY_SUMS: tl.constexpr,
                QUERY_SUMS: tl.constexpr,
                FOLD_L1: tl.constexpr, FOLD_COLS_L2: tl.constexpr, NORM_DOT: tl.constexpr,
                NORM_ROWS_L2: tl.constexpr, NATIVE: tl.constexpr, BF16_OUT: tl.constexpr, UPCAST: tl.constexpr,
                PREC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One (batch, head) ``program_id(0)``: the state over every token (or, with SPLIT, the sum of the partials of
    :func:`stats_kernel`), folded on chip, applied to the queries of chunk ``program_id(1)``."""
    b, h, bh64 = _head(H)
    split = tl.program_id(1)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    q_base = q_ptr + b * sqb + h * sqh
    if SPLIT:
        kv, s_k, s_q = _sum_parts(part_ptr, psk_ptr, psq_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
                                  KEY_SUMS, QUERY_SUMS, BLOCK_D, BLOCK_E)
    else:
        kv, s_k, s_q = _stats(k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh, q_base, km_ptr, qm_ptr, b, 0,
                              n_k, n_q, skn, skd, svn, sve, sqn, sqd, skmb, skmn, sqmb, sqmn, offs_d, offs_e, d_ok,
                              e_ok, HAS_KM, HAS_QM, KEY_SUMS, QUERY_SUMS, FEATURE_ELU, FEATURE_RELU, NATIVE, UPCAST,
                              PREC, BLOCK, BLOCK_D, BLOCK_E)
    if SAVE:
        if split == 0:
            _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps,
                        FOLD_L1)
    w = _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, FOLD_L1, FOLD_COLS_L2, BF16_OUT)
    start = split * chunk
    for n0 in range(start, tl.minimum(n_q, start + chunk), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = keep_rows(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
        q = tile(q_base, offs, offs_d, sqn, sqd, rows, d_ok)
        out = _apply(q, rows, w, s_k, eps, FEATURE_ELU, FEATURE_RELU, NORM_DOT, NORM_ROWS_L2, BF16_OUT, UPCAST, PREC,
                     BLOCK, BLOCK_E)
        _store_out(o_ptr, out, bh64, n_q, e, offs, offs_e, e_ok)


@_warps_tuned("one")
@triton.jit
def fwd_one_tile_kernel(q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, gamma_ptr, o_ptr, kv_ptr, sq_ptr, sk_ptr,
                         H, n_q, n_k, d, e, eps, n_bucket, p_bucket,
                         sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sqmb, sqmn, skmb, skmn,
                         HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, SAVE: tl.constexpr,
                         FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr, KEY_SUMS: tl.constexpr,
                         QUERY_SUMS: tl.constexpr,
                         FOLD_L1: tl.constexpr, FOLD_COLS_L2: tl.constexpr, NORM_DOT: tl.constexpr,
                         NORM_ROWS_L2: tl.constexpr, NATIVE: tl.constexpr, BF16_OUT: tl.constexpr,
                         UPCAST: tl.constexpr, PREC: tl.constexpr,
                         BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """:func:`fwd_kernel` for a head whose tokens fit one tile (BLOCK ≥ n_q, n_k): q, k, v are read once.
    (KEY_SUMS and QUERY_SUMS: the sums are taken from the tile in registers whatever they say.)"""
    b, h, bh64 = _head(H)
    offs = tl.arange(0, BLOCK)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    k_rows = keep_rows(km_ptr, b, skmb, skmn, offs, n_k, HAS_KM)
    q_rows = keep_rows(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
    k = _prologue(tile(k_ptr + b * skb + h * skh, offs, offs_d, skn, skd, k_rows, d_ok), k_rows, FEATURE_ELU,
                  FEATURE_RELU)
    v = tile(v_ptr + b * svb + h * svh, offs, offs_e, svn, sve, k_rows, e_ok)
    q = tile(q_ptr + b * sqb + h * sqh, offs, offs_d, sqn, sqd, q_rows, d_ok)
    kv = mm(tl.trans(k), v, tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32), NATIVE, UPCAST, PREC)
    s_k = tl.reduce(tl.abs(k.to(tl.float32)), 0, SUM)
    s_q = tl.reduce(tl.abs(q.to(tl.float32)), 0, SUM)
    if SAVE:
        _save_state(kv_ptr, sq_ptr, sk_ptr, kv, s_k, s_q, bh64, d, e, offs_d, offs_e, d_ok, e_ok, eps, FOLD_L1)
    w = _fold(kv, s_k, s_q, gamma_ptr, bh64, eps, FOLD_L1, FOLD_COLS_L2, BF16_OUT)
    out = _apply(q, q_rows, w, s_k, eps, FEATURE_ELU, FEATURE_RELU, NORM_DOT, NORM_ROWS_L2, BF16_OUT, UPCAST, PREC,
                 BLOCK, BLOCK_E)
    _store_out(o_ptr, out, bh64, n_q, e, offs, offs_e, e_ok)


@_loop_tuned("bwd")
@triton.jit
def bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, qm_ptr, km_ptr, kv_ptr, sq_ptr, sk_ptr, part_ptr, dq_ptr, dk_ptr, dv_ptr,
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
                          sqmb, sqmn, sqmb, sqmn, offs_d, offs_e, d_ok, e_ok, HAS_QM, False, False, False, False, False,
                          NATIVE, UPCAST, PREC, BLOCK, BLOCK_D, BLOCK_E)
    kvn = tl.load(kv_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], mask=de_ok, other=0.0)
    s_q_raw = tl.load(sq_ptr + bh64 * d + offs_d, mask=d_ok, other=1.0)
    s_k_raw = tl.load(sk_ptr + bh64 * d + offs_d, mask=d_ok, other=1.0)
    s_q, s_k = tl.maximum(s_q_raw, eps), tl.maximum(s_k_raw, eps)
    dkvn = qg / s_q[:, None]  # q̂ᵀG
    r = tl.reduce(kvn * dkvn, 1, SUM)  # Σ_n dq̂·q̂ = Σ_j dk̂·k̂
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
        rows = keep_rows(qm_ptr, b, sqmb, sqmn, offs, n_q, HAS_QM)
        g = tile(g_base, offs, offs_e, sgn, sge, rows, e_ok)
        x = tile(q_base, offs, offs_d, sqn, sqd, rows, d_ok).to(tl.float32)
        if BF16_DQ:
            gw = mm(g.to(tl.bfloat16), w_q, zero_d, True, UPCAST, PREC)
        else:
            gw = mm(g, w_q, zero_d, False, UPCAST, PREC)
        dq = gw - tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)) * t_q[None, :]
        tl.store(dq_ptr + bh64 * n_q * d + offs.to(tl.int64)[:, None] * d + offs_d[None, :],
                 dq.to(dq_ptr.dtype.element_ty), mask=(offs < n_q)[:, None] & d_ok[None, :])
    for n0 in range(start, tl.minimum(n_k, start + chunk), BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = keep_rows(km_ptr, b, skmb, skmn, offs, n_k, HAS_KM)
        y = tile(v_ptr + b * svb + h * svh, offs, offs_e, svn, sve, rows, e_ok)
        x = tile(k_ptr + b * skb + h * skh, offs, offs_d, skn, skd, rows, d_ok).to(tl.float32)
        dk = mm(y, w_kt, zero_d, False, UPCAST, PREC) - tl.where(
            x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)) * t_k[None, :]
        dv = mm(x, w_k, tl.full((BLOCK, BLOCK_E), 0.0, tl.float32), False, UPCAST, PREC)
        in_range = (offs < n_k)[:, None]
        tl.store(dk_ptr + bh64 * n_k * d + offs.to(tl.int64)[:, None] * d + offs_d[None, :],
                 dk.to(dk_ptr.dtype.element_ty), mask=in_range & d_ok[None, :])
        tl.store(dv_ptr + bh64 * n_k * e + offs.to(tl.int64)[:, None] * e + offs_e[None, :],
                 dv.to(dv_ptr.dtype.element_ty), mask=in_range & e_ok[None, :])



# ------------------------------------------------------------------------------------------------ feature backward
@triton.jit
def _feature_query_grads(q_base, g_base, dq_base, s, z, start, stop, d, eps, sqn, sqd, sgn, sge, offs_d,
                         offs_e, d_ok, e_ok, FEATURE_ELU: tl.constexpr, FEATURE_RELU: tl.constexpr,
                         NORM_DOT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """dq of queries [start, stop) (written contiguous at ``dq_base``) and their parts of dS = φ(q)ᵀĜ and
    dz = −φ(q)ᵀt, fp32: Ĝ = G / den, t = Σ_e Ĝ ⊙ out per row (without NORM_DOT: den = 1, t = 0)."""
    ds = tl.full((BLOCK_D, BLOCK_E), 0.0, tl.float32)
    dz = tl.full((BLOCK_D,), 0.0, tl.float32)
    s_t = tl.trans(s)
    for n0 in range(start, stop, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        rows = offs < stop  # the chunk's own: a tile past its end is the next chunk's
        x = tile(q_base, offs, offs_d, sqn, sqd, rows, d_ok)
        a = _prologue(x, rows, FEATURE_ELU, FEATURE_RELU).to(tl.float32)
        g_hat = tile(g_base, offs, offs_e, sgn, sge, rows, e_ok).to(tl.float32)
        da = tl.full((BLOCK, BLOCK_D), 0.0, tl.float32)
        if NORM_DOT:
            den = tl.reduce(a * z[None, :], 1, SUM) + eps
            g_hat = g_hat / den[:, None]
            out = mm(a, s, tl.full((BLOCK, BLOCK_E), 0.0, tl.float32), False, UPCAST, PREC) / den[:, None]
            t = tl.reduce(g_hat * out, 1, SUM)
            da -= t[:, None] * z[None, :]
            dz -= tl.reduce(a * t[:, None], 0, SUM)
        da = mm(g_hat, s_t, da, False, UPCAST, PREC)
        dq = da * _feature_slope(x, FEATURE_ELU, FEATURE_RELU)
        tl.store(dq_base + offs.to(tl.int64)[:, None] * d + offs_d[None, :],
                 dq.to(dq_base.dtype.element_ty), mask=rows[:, None] & d_ok[None, :])
        ds = mm(tl.trans(a), g_hat, ds, False, UPCAST, PREC)
    return ds, dz


@triton.jit
def _feature_key_grads(k_base, v_base, km_ptr, dk_base, dv_base, ds, dz, b, start, stop, d, e, skn, skd, svn,
                       sve, skmb, skmn, offs_d, offs_e, d_ok, e_ok, HAS_KM: tl.constexpr, FEATURE_ELU: tl.constexpr,
                       FEATURE_RELU: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """dk = (v dSᵀ + dz) ⊙ φ'(k) and dv = φ(k) dS of keys [start, stop), contiguous; 0 for removed keys."""
    ds_t = tl.trans(ds)
    for n0 in range(start, stop, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        in_range = offs < stop
        rows = keep_rows(km_ptr, b, skmb, skmn, offs, stop, HAS_KM)
        x = tile(k_base, offs, offs_d, skn, skd, rows, d_ok)
        phi = _prologue(x, rows, FEATURE_ELU, FEATURE_RELU).to(tl.float32)
        y = tile(v_base, offs, offs_e, svn, sve, rows, e_ok).to(tl.float32)
        db = mm(y, ds_t, tl.full((BLOCK, BLOCK_D), 0.0, tl.float32), False, UPCAST, PREC) + dz[None, :]
        dk = tl.where(rows[:, None], db * _feature_slope(x, FEATURE_ELU, FEATURE_RELU), 0.0)
        dv = mm(phi, ds, tl.full((BLOCK, BLOCK_E), 0.0, tl.float32), False, UPCAST, PREC)
        tl.store(dk_base + offs.to(tl.int64)[:, None] * d + offs_d[None, :], dk.to(dk_base.dtype.element_ty),
                 mask=in_range[:, None] & d_ok[None, :])
        tl.store(dv_base + offs.to(tl.int64)[:, None] * e + offs_e[None, :], dv.to(dv_base.dtype.element_ty),
                 mask=in_range[:, None] & e_ok[None, :])


@_loop_tuned("feature_bwd")
@triton.jit
def feature_bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, km_ptr, s_ptr, z_ptr, part_ptr, pz_ptr, dq_ptr, dk_ptr, dv_ptr,
                        H, n_q, n_k, d, e, n_split, chunk, eps, n_bucket, p_bucket,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, sve, sgb, sgh, sgn, sge, skmb, skmn,
                        HAS_KM: tl.constexpr, QUERY_SIDE: tl.constexpr, KEY_SIDE: tl.constexpr,
                        FEATURE_ELU: tl.constexpr,
                        FEATURE_RELU: tl.constexpr, NORM_DOT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                        BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The gradients of a feature kind, with the per-row normalizer (NORM_DOT) or without (``launch``'s
    docstring), for (batch, head)
    ``program_id(0)``, from the forward's S = φ(k)ᵀv and z = Σφ(k). Whole, one program per head does the queries'
    side (dq, and dS, dz) then the keys' (dk, dv). A split token axis takes two launches over chunk
    ``program_id(1)``: QUERY_SIDE alone writes the queries' dq and partial dS, dz; KEY_SIDE alone adds the partials
    in a fixed order and writes the keys' dk, dv."""
    b, h, bh64 = _head(H)
    split = tl.program_id(1)
    offs_d, offs_e, d_ok, e_ok = _channels(d, e, BLOCK_D, BLOCK_E)
    de_ok = d_ok[:, None] & e_ok[None, :]
    start = split * chunk
    if not QUERY_SIDE:
        ds, dz, _ = _sum_parts(part_ptr, pz_ptr, pz_ptr, bh64, n_split, d, e, offs_d, offs_e, d_ok, e_ok,
                               True, False, BLOCK_D, BLOCK_E)
    else:
        s = tl.load(s_ptr + bh64 * d * e + offs_d[:, None] * e + offs_e[None, :], mask=de_ok, other=0.0)
        z = tl.load(z_ptr + bh64 * d + offs_d, mask=d_ok, other=0.0)
        ds, dz = _feature_query_grads(q_ptr + b * sqb + h * sqh, g_ptr + b * sgb + h * sgh, dq_ptr + bh64 * n_q * d,
                                      s, z, start, tl.minimum(n_q, start + chunk), d, eps, sqn, sqd, sgn, sge,
                                      offs_d, offs_e, d_ok, e_ok, FEATURE_ELU, FEATURE_RELU, NORM_DOT, UPCAST, PREC,
                                      BLOCK, BLOCK_D, BLOCK_E)
    if not KEY_SIDE:
        part = bh64 * n_split + split
        tl.store(part_ptr + part * d * e + offs_d[:, None] * e + offs_e[None, :], ds, mask=de_ok)
        tl.store(pz_ptr + part * d + offs_d, dz, mask=d_ok)
    else:
        _feature_key_grads(k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh, km_ptr, dk_ptr + bh64 * n_k * d,
                           dv_ptr + bh64 * n_k * e, ds, dz, b, start, tl.minimum(n_k, start + chunk), d, e,
                           skn, skd, svn, sve, skmb, skmn, offs_d, offs_e, d_ok, e_ok, HAS_KM, FEATURE_ELU,
                           FEATURE_RELU, UPCAST, PREC, BLOCK, BLOCK_D, BLOCK_E)
