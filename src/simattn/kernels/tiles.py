"""The Triton helpers every kernel family shares: which rows of a tile take part (:func:`keep_rows`), a tile read
through its strides (:func:`tile`), a product on tensor cores in the family's precision (:func:`mm`), and the sum
combiner :data:`SUM` in the mode of the kernels.

Decorated where written, in the mode of ``TRITON_INTERPRET`` when :mod:`simattn.kernels.host` was first imported
(:data:`~simattn.kernels.host.INTERPRETER`). Only builtins of ``triton.language`` are called: its own jit'd helpers
(``tl.sum``) take the mode of triton's import, which can differ.
"""
import triton
import triton.language as tl

from .host import INTERPRETER

__all__ = ["SUM", "keep_rows", "mm", "tile"]


@triton.jit
def _add(a, b):
    return a + b


# The interpreter sums with numpy for triton's own combiner and loops over elements for any other; compiled, a
# combiner decorated in this module's mode.
SUM = tl.standard._sum_combine if INTERPRETER else _add


@triton.jit
def keep_rows(m_ptr, b, smb, smn, offs, lim, HAS_M: tl.constexpr):
    """Rows of a tile that take part: below ``lim`` and kept by the (B, N) keep-mask."""
    rows = offs < lim
    if HAS_M:
        rows = rows & (tl.load(m_ptr + b * smb + offs.to(tl.int64) * smn, mask=rows, other=0) != 0)
    return rows


@triton.jit
def tile(base, offs_n, offs_c, sn, sc, rows, c_ok):
    """A (tokens × channels) tile through its strides; rows that do not take part read as 0."""
    return tl.load(base + offs_n.to(tl.int64)[:, None] * sn + offs_c[None, :] * sc,
                   mask=rows[:, None] & c_ok[None, :], other=0.0)


@triton.jit
def mm(a, b, acc, NATIVE: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """acc + a b on tensor cores: NATIVE multiplies a and b in their own (equal, half) dtype, else fp32 operands
    at PREC. UPCAST: the interpreter multiplies bf16 bit patterns as integers, so it gets the same values in fp32."""
    if NATIVE:
        if UPCAST:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        return tl.dot(a, b, acc)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)
