"""The Triton kernels of Agent attention, forward and backward: n agents (A, n×d, n ≤ 128: one tile) held per
program, the N tokens streamed through them, no n×N tensor in memory but the biases (inputs) and, where a bias
needs a gradient, that gradient per example (summed over the batch by the host, as autograd sums a broadcast
bias's). c = 1/√d.

**Aggregation**, W = V_A = softmax(c A Kᵀ + B₁) V (n×dv, a softmax over the N keys per agent): each program
streams a chunk of the keys with a running maximum per agent, as flash attention's queries do, and writes its
chunk's normalized W and log-sum-exp, which the host merges (:func:`gather_fwd_kernel`). Backward, with dW the
gradient of W, D = rowsum(dW ∘ W) (from the host) and P recomputed from the log-sum-exp (:func:`gather_bwd_kernel`):

    dv = Pᵀ dW,   dX = P ∘ (dW vᵀ − D),   dk = c dXᵀ A,   dA = c dX k,   dB₁ = dX,

dv, dk (and dB₁) written per key tile, dA summed per chunk.

**Broadcast**, O = softmax(c Q Aᵀ + B₂) W: the state (A and W) is fixed per (batch, head), like linear attention's
d×dv state; each program loads it once and streams its queries through it, the row softmax over the n agents whole
within a tile (no running maximum). Forward (:func:`broadcast_fwd_kernel`, one tile of queries per program):
X = c q Aᵀ + B, P = softmax(X) over the agents, O = P W. Backward (:func:`broadcast_bwd_kernel`), with G the
output gradient:

    dW = Pᵀ G,   dX = P ∘ (G Wᵀ − rowsum(P ∘ G Wᵀ)),   dq = c dX A,   dA = c dXᵀ q,   dB = dX,

each program holding the state and streaming a chunk of the queries: dq (and dB, when B needs a gradient) is
written per tile, dA and dW are summed over the chunk on chip and written once per chunk, and the host adds the
chunks' partial sums (a fixed order: no atomics, run-to-run identical).

Precision: logits, softmax and every accumulator in fp32, W in fp32. q Aᵀ and A kᵀ multiply equal half inputs in
their own dtype (exact products); the weights meet W, v and the gradients, and dX meets A, q and k, as fp32 at
``PREC``. Padded agents get weight 0, keys past the chunk weight 0. The tile and product helpers are
:mod:`simattn.kernels.tiles`'; decorated in the mode of ``TRITON_INTERPRET`` at first import
(:data:`simattn.kernels.host.INTERPRETER`). The host side is :mod:`simattn.kernels.agent.launch`.
"""
import triton
import triton.language as tl

from ..host import INTERPRETER, tuned
from ..tiles import SUM, mm, tile

__all__ = ["CHUNK_CONFIGS", "FWD_BLOCK", "FWD_CONFIGS", "TUNE_KEYS", "broadcast_fwd_kernel", "broadcast_bwd_kernel",
           "gather_fwd_kernel", "gather_bwd_kernel"]

#: queries per forward program on a GPU (the host sizes the grid by it)
FWD_BLOCK = 64
#: (tokens per tile, warps, pipeline stages) tried on a GPU; the first is the untuned default. FWD_CONFIGS: the
#: broadcast forward's (one tile per program); CHUNK_CONFIGS: the kernels whose programs stream a chunk of tokens.
FWD_CONFIGS = ((FWD_BLOCK, 4, 2), (FWD_BLOCK, 8, 2), (FWD_BLOCK, 4, 3))
CHUNK_CONFIGS = ((64, 4, 2), (32, 4, 2), (128, 8, 2), (64, 8, 3))
# What the tuned configuration depends on: tokens (a power of two, unused in the bodies), head dims, agents.
TUNE_KEYS = ["n_bucket", "d", "e", "BLOCK_A"]


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


# The interpreter takes numpy's maximum for triton's own combiner (see :data:`simattn.kernels.tiles.SUM`)
_MAX = tl.standard._elementwise_max if INTERPRETER else _larger


def _tuned(tried):
    """:func:`~simattn.kernels.host.tuned` over ``tried``, on :data:`TUNE_KEYS`."""
    return tuned([triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
                  for block, warps, stages in tried], TUNE_KEYS)


@triton.jit
def _weights(q, agents, bias_ptr, offs_m, offs_a, rows, a_ok, sbn, sba, c,
             HAS_BIAS: tl.constexpr, QA_NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_A: tl.constexpr):
    """P = softmax(c q Aᵀ + B) over the agents (fp32, BLOCK_M × BLOCK_A), 0 on padded agents."""
    x = mm(q, tl.trans(agents), tl.zeros([BLOCK_M, BLOCK_A], dtype=tl.float32), QA_NATIVE, UPCAST, PREC) * c
    if HAS_BIAS:
        x += tl.load(bias_ptr + offs_m.to(tl.int64)[:, None] * sbn + offs_a[None, :] * sba,
                     mask=rows[:, None] & a_ok[None, :], other=0.0).to(tl.float32)
    x = tl.where(a_ok[None, :], x, float("-inf"))
    p = tl.exp(x - tl.reduce(x, 1, _MAX)[:, None])
    return p / tl.reduce(p, 1, SUM)[:, None]


@triton.jit
def _state(a_ptr, w_ptr, a_base, w_base, san, sad, swn, swe, n_a, d, e,
           BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """The (batch, head)'s agents A (BLOCK_A × BLOCK_D) and their values W (BLOCK_A × BLOCK_E), and lane masks."""
    offs_a, offs_d, offs_e = tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E)
    a_ok, d_ok, e_ok = offs_a < n_a, offs_d < d, offs_e < e
    agents = tile(a_ptr + a_base, offs_a, offs_d, san, sad, a_ok, d_ok)
    w = tile(w_ptr + w_base, offs_a, offs_e, swn, swe, a_ok, e_ok).to(tl.float32)
    return agents, w, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok


@_tuned(FWD_CONFIGS)
@triton.jit
def broadcast_fwd_kernel(q_ptr, a_ptr, w_ptr, bias_ptr, o_ptr, n_q, n_a, d, e, c,
                          sqb, sqh, sqn, sqd, sab, sah, san, sad, swb, swh, swn, swe, sbb, sbh, sbn, sba,
                          sob, soh, son, soe, n_bucket,
                          HAS_BIAS: tl.constexpr, QA_NATIVE: tl.constexpr, UPCAST: tl.constexpr,
                          PREC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                          BLOCK: tl.constexpr):
    """One tile of BLOCK queries of one (batch, head): O = softmax(c q Aᵀ + B) W."""
    b, h = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    agents, w, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok = _state(
        a_ptr, w_ptr, b * sab + h * sah, b * swb + h * swh, san, sad, swn, swe, n_a, d, e, BLOCK_A, BLOCK_D, BLOCK_E)
    offs_m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rows = offs_m < n_q
    q = tile(q_ptr + b * sqb + h * sqh, offs_m, offs_d, sqn, sqd, rows, d_ok)
    p = _weights(q, agents, bias_ptr + b * sbb + h * sbh, offs_m, offs_a, rows, a_ok, sbn, sba, c,
                 HAS_BIAS, QA_NATIVE, UPCAST, PREC, BLOCK, BLOCK_A)
    out = mm(p, w, tl.zeros([BLOCK, BLOCK_E], dtype=tl.float32), False, UPCAST, PREC)
    tl.store(o_ptr + b * sob + h * soh + offs_m.to(tl.int64)[:, None] * son + offs_e[None, :] * soe,
             out.to(o_ptr.dtype.element_ty), mask=rows[:, None] & e_ok[None, :])


@_tuned(CHUNK_CONFIGS)
@triton.jit
def broadcast_bwd_kernel(q_ptr, a_ptr, w_ptr, bias_ptr, g_ptr, dq_ptr, db_ptr, da_ptr, dw_ptr, H, n_q, n_a, d, e,
                          c, chunk, sqb, sqh, sqn, sqd, sab, sah, san, sad, swb, swh, swn, swe, sbb, sbh, sbn, sba,
                          sgb, sgh, sgn, sge, n_bucket,
                          HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, QA_NATIVE: tl.constexpr,
                          UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of ``chunk`` queries of one (batch, head): dq and dB of its queries (contiguous, (B, H, N, ·)),
    and its partial sums of dA and dW (contiguous, (chunks, B, H, n, ·), fp32)."""
    part, b, h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    bh = b * H + h
    agents, w, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok = _state(
        a_ptr, w_ptr, b * sab + h * sah, b * swb + h * swh, san, sad, swn, swe, n_a, d, e, BLOCK_A, BLOCK_D, BLOCK_E)
    q_base, g_base, b_base = b * sqb + h * sqh, b * sgb + h * sgh, b * sbb + h * sbh
    da = tl.zeros([BLOCK_A, BLOCK_D], dtype=tl.float32)
    dw = tl.zeros([BLOCK_A, BLOCK_E], dtype=tl.float32)
    first = part * chunk
    end = tl.minimum(first + chunk, n_q)
    for start in range(first, end, BLOCK):
        offs_m = start + tl.arange(0, BLOCK)
        rows = offs_m < end
        q = tile(q_ptr + q_base, offs_m, offs_d, sqn, sqd, rows, d_ok)
        g = tile(g_ptr + g_base, offs_m, offs_e, sgn, sge, rows, e_ok)  # rows past the chunk: zero, no gradient
        p = _weights(q, agents, bias_ptr + b_base, offs_m, offs_a, rows, a_ok, sbn, sba, c,
                     HAS_BIAS, QA_NATIVE, UPCAST, PREC, BLOCK, BLOCK_A)
        dw = mm(tl.trans(p), g, dw, False, UPCAST, PREC)
        dp = mm(g, tl.trans(w), tl.zeros([BLOCK, BLOCK_A], dtype=tl.float32), False, UPCAST, PREC)
        dx = p * (dp - tl.reduce(p * dp, 1, SUM)[:, None])
        da = mm(tl.trans(dx), q, da, False, UPCAST, PREC)
        dq = mm(dx, agents, tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32), False, UPCAST, PREC)
        at = offs_m.to(tl.int64)[:, None]
        tl.store(dq_ptr + bh * n_q * d + at * d + offs_d[None, :], (dq * c).to(dq_ptr.dtype.element_ty),
                 mask=rows[:, None] & d_ok[None, :])
        if BIAS_GRAD:
            tl.store(db_ptr + bh * n_q * n_a + at * n_a + offs_a[None, :], dx, mask=rows[:, None] & a_ok[None, :])
    at = offs_a.to(tl.int64)[:, None]
    parts = (part * tl.num_programs(1) * H + bh) * n_a
    tl.store(da_ptr + (parts + at) * d + offs_d[None, :], da * c, mask=a_ok[:, None] & d_ok[None, :])
    tl.store(dw_ptr + (parts + at) * e + offs_e[None, :], dw, mask=a_ok[:, None] & e_ok[None, :])


@triton.jit
def _chunk_agents(a_ptr, sab, sah, san, sad, n_a, d, e, n_k, chunk,
                  BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """(chunk, batch, head) of a program over (chunks, B, H), its chunk's first and end key, its head's agents A
    (BLOCK_A × BLOCK_D), and the lanes of agents, d and dv with which of them are real."""
    part, b, h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    first = part * chunk
    offs_a, offs_d, offs_e = tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_E)
    a_ok, d_ok, e_ok = offs_a < n_a, offs_d < d, offs_e < e
    agents = tile(a_ptr + b * sab + h * sah, offs_a, offs_d, san, sad, a_ok, d_ok)
    return part, b, h, first, tl.minimum(first + chunk, n_k), agents, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok


@triton.jit
def _key_logits(agents, k_head, v_head, bias_head, start, end, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok,
                skn, skd, svn, sve, sba, sbn, c, HAS_BIAS: tl.constexpr, AK_NATIVE: tl.constexpr,
                UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK: tl.constexpr):
    """The tile of keys and values from ``start`` (``cols``: those before ``end``, the others read as zero rows) and
    the agents' logits over it, c A kᵀ + B₁ (fp32): (offs_n, cols, k, v, x)."""
    offs_n = start + tl.arange(0, BLOCK)
    cols = offs_n < end
    k = tile(k_head, offs_n, offs_d, skn, skd, cols, d_ok)
    v = tile(v_head, offs_n, offs_e, svn, sve, cols, e_ok)
    x = mm(agents, tl.trans(k), tl.zeros([BLOCK_A, BLOCK], dtype=tl.float32), AK_NATIVE, UPCAST, PREC) * c
    if HAS_BIAS:
        x += tl.load(bias_head + offs_a[:, None] * sba + offs_n.to(tl.int64)[None, :] * sbn,
                     mask=a_ok[:, None] & cols[None, :], other=0.0).to(tl.float32)
    return offs_n, cols, k, v, x


@_tuned(CHUNK_CONFIGS)
@triton.jit
def gather_fwd_kernel(a_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, lse_ptr, H, n_k, n_a, d, e, c, chunk,
                       sab, sah, san, sad, skb, skh, skn, skd, svb, svh, svn, sve, sbb, sbh, sba, sbn, n_bucket,
                       HAS_BIAS: tl.constexpr, AK_NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
                       BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of ``chunk`` keys of one (batch, head): the chunk's softmax(c A kᵀ + B₁) v and its log-sum-exp per
    agent (contiguous, (chunks, B, H, n, ·), fp32)."""
    part, b, h, first, end, agents, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok = _chunk_agents(
        a_ptr, sab, sah, san, sad, n_a, d, e, n_k, chunk, BLOCK_A, BLOCK_D, BLOCK_E)
    k_head, v_head, bias_head = k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh, bias_ptr + b * sbb + h * sbh
    top = tl.full([BLOCK_A], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_A], dtype=tl.float32)
    acc = tl.zeros([BLOCK_A, BLOCK_E], dtype=tl.float32)
    for start in range(first, end, BLOCK):
        offs_n, cols, k, v, x = _key_logits(agents, k_head, v_head, bias_head, start, end, offs_a, offs_d, offs_e, a_ok,
                                            d_ok, e_ok, skn, skd, svn, sve, sba, sbn, c, HAS_BIAS, AK_NATIVE, UPCAST,
                                            PREC, BLOCK_A, BLOCK)
        x = tl.where(cols[None, :], x, float("-inf"))
        new_top = tl.maximum(top, tl.reduce(x, 1, _MAX))
        p = tl.exp(x - new_top[:, None])
        shrink = tl.exp(top - new_top)
        total = total * shrink + tl.reduce(p, 1, SUM)
        acc = mm(p, v, acc * shrink[:, None], False, UPCAST, PREC)
        top = new_top
    rows = ((part * tl.num_programs(1) + b) * H + h) * n_a + offs_a.to(tl.int64)
    tl.store(o_ptr + rows[:, None] * e + offs_e[None, :], acc / total[:, None], mask=a_ok[:, None] & e_ok[None, :])
    tl.store(lse_ptr + rows, top + tl.log(total), mask=a_ok)


@_tuned(CHUNK_CONFIGS)
@triton.jit
def gather_bwd_kernel(a_ptr, k_ptr, v_ptr, bias_ptr, lse_ptr, gw_ptr, dd_ptr, dk_ptr, dv_ptr, db_ptr, da_ptr,
                       H, n_k, n_a, d, e, c, chunk,
                       sab, sah, san, sad, skb, skh, skn, skd, svb, svh, svn, sve, sbb, sbh, sba, sbn, n_bucket,
                       HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, AK_NATIVE: tl.constexpr,
                       UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of ``chunk`` keys of one (batch, head): dk, dv (and dB₁) of its keys (contiguous, (B, H, ·, ·)) and
    its partial sum of dA (contiguous, (chunks, B, H, n, d), fp32). Reads the log-sum-exp per agent, dW and D
    (contiguous, fp32)."""
    part, b, h, first, end, agents, offs_a, offs_d, offs_e, a_ok, d_ok, e_ok = _chunk_agents(
        a_ptr, sab, sah, san, sad, n_a, d, e, n_k, chunk, BLOCK_A, BLOCK_D, BLOCK_E)
    bh = b * H + h
    state = bh * n_a + offs_a.to(tl.int64)
    lse = tl.load(lse_ptr + state, mask=a_ok, other=0.0)
    dd = tl.load(dd_ptr + state, mask=a_ok, other=0.0)
    gw = tl.load(gw_ptr + state[:, None] * e + offs_e[None, :], mask=a_ok[:, None] & e_ok[None, :], other=0.0)
    k_head, v_head, bias_head = k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh, bias_ptr + b * sbb + h * sbh
    da = tl.zeros([BLOCK_A, BLOCK_D], dtype=tl.float32)
    for start in range(first, end, BLOCK):
        offs_n, cols, k, v, x = _key_logits(agents, k_head, v_head, bias_head, start, end, offs_a, offs_d, offs_e, a_ok,
                                            d_ok, e_ok, skn, skd, svn, sve, sba, sbn, c, HAS_BIAS, AK_NATIVE, UPCAST,
                                            PREC, BLOCK_A, BLOCK)
        p = tl.where(a_ok[:, None] & cols[None, :], tl.exp(x - lse[:, None]), 0.0)
        dv = mm(tl.trans(p), gw, tl.zeros([BLOCK, BLOCK_E], dtype=tl.float32), False, UPCAST, PREC)
        dx = p * (mm(gw, tl.trans(v), tl.zeros([BLOCK_A, BLOCK], dtype=tl.float32), False, UPCAST, PREC)
                  - dd[:, None])
        dk = mm(tl.trans(dx), agents, tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32), False, UPCAST, PREC)
        da = mm(dx, k, da, False, UPCAST, PREC)
        at = offs_n.to(tl.int64)[:, None]
        tl.store(dk_ptr + bh * n_k * d + at * d + offs_d[None, :], (dk * c).to(dk_ptr.dtype.element_ty),
                 mask=cols[:, None] & d_ok[None, :])
        tl.store(dv_ptr + bh * n_k * e + at * e + offs_e[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=cols[:, None] & e_ok[None, :])
        if BIAS_GRAD:
            tl.store(db_ptr + (bh * n_a + offs_a.to(tl.int64)[:, None]) * n_k + offs_n[None, :], dx,
                     mask=a_ok[:, None] & cols[None, :])
    parts = (part * tl.num_programs(1) * H + bh) * n_a + offs_a.to(tl.int64)[:, None]
    tl.store(da_ptr + parts * d + offs_d[None, :], da * c, mask=a_ok[:, None] & d_ok[None, :])
