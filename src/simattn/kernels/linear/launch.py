"""Linear attention with a d×dv state as fused Triton kernels: SimA's q̂(k̂ᵀv) forward and backward
(``sima_attention(..., backend='triton')``), and the kinds that share its skeleton with another prologue (the
feature map on q and k) and epilogue (how the state is folded and applied): ELU linear attention, SLAB and FLatten
forward and backward, UFO's XNorm forward.

Forward, per (batch, head), SimA:

1. over key tiles: kᵀv (d×dv) accumulated in fp32 on tensor cores, Σ|k| and Σ|q| per channel in fp32;
2. on chip: W = (kᵀv / s_k[:, None]) / s_q[:, None], each norm dividing on its own (never their product);
3. over query tiles: out = q W.

Short and medium token axes run this in one launch, one program per (batch, head) holding the state on chip; where
a head's q, k and v fit in one tile they are read once. When there are too few (batch, head) pairs to fill the GPU,
the token axis is split over programs: one launch writes partial sums per token chunk, a second adds them in a fixed
order and applies them to its chunk of queries. The kernels, and how ELU, XNorm and the next kinds plug their
prologue and epilogue into them, are :mod:`simattn.kernels.linear.kernels`; this module launches them.

Backward, with kvn = k̂ᵀv, G the output gradient and dkvn = q̂ᵀG:

    dq = G (kvn / s_q[:, None])ᵀ − sign(q) · r / s_q,    dk = v (dkvn / s_k[:, None])ᵀ − sign(k) · r / s_k,
    dv = k (dkvn / s_k[:, None]),                         r_c = Σ_e kvn_ce dkvn_ce,

where the sign terms come from differentiating the l1 norms (and vanish for a channel whose norm is clamped to eps)
and r is the same for q and k (SimA is invariant to scaling a channel of q or of k). One launch per (batch, head)
accumulates qᵀG and writes dq, dk, dv; a split token axis adds one launch of partial qᵀG.

Backward of a feature kind with a per-row normalizer (ELU, SLAB; FLatten's features made in torch, whose
autograd chains them), with a = φ(q), b = φ(k), S = bᵀv (d×dv) and z = Σ_j b_j saved by the forward:

    out_i = a_i S / den_i,  den_i = a_i·z + eps;    Ĝ_i = G_i / den_i,  t_i = Ĝ_i·out_i,
    da_i = Ĝ_i Sᵀ − t_i z,   dS = aᵀĜ,   dz = −Σ_i t_i a_i,
    db_j = v_j dSᵀ + dz,     dv_j = b_j dS,
    dq = da ⊙ φ'(q),         dk = db ⊙ φ'(k)  (0 for removed keys);

without a normalizer (``'plain'``, out = a S) den = 1 and t = dz = 0.

One launch per (batch, head) runs the queries (dq, and dS, dz accumulated on chip) then the keys; a split token
axis takes two launches, the queries' chunks writing partial dS, dz and the keys' chunks adding them.

Precision (the torch path's rules): sums, norms and the state in fp32. Products on tensor cores: kᵀv and qᵀG multiply
equal half-precision inputs in their own dtype (exact products, fp32 accumulation); with bf16 compute the output
and the q gradient multiply bf16 operands (W rounded to bf16) as the torch path's bf16 matmul does; products with
an fp32 operand take TF32 for half inputs (a half value is exact in TF32, the fp32 operand keeps TF32's 10-bit
mantissa with fp32's range, so fp16 never overflows the folded scale) and follow
``torch.backends.cuda.matmul.allow_tf32`` for fp32 inputs. q, k, v are read through their strides, so views of a
fused qkv projection are not copied.

Host path (:mod:`simattn.kernels.host`'s plan cache, launch modes and direct launches). A call's signature (shapes, strides, dtypes, masks present, flags, device) decides everything but the
data: the token-axis plan, grids, constexprs, the outputs' shapes and, once a GPU has tuned it, the launch
configuration. The first call at a signature builds that (:class:`_ForwardCall`, :class:`_BackwardCall`) and a
repeat call looks it up, allocates its outputs and launches: it checks nothing (the caller, ``sima_attention`` or
the ELU/XNorm functions, checked the inputs once) and launches a tuned kernel directly, not through Triton's
autotuner. Eagerly, SimA's autograd is a ``torch.autograd.Function`` (a few microseconds); while compiling,
exporting or tracing, and on tensor subclasses or under dispatch modes, the same calls run behind torch custom ops
(``simattn::linear_attn_fwd``, ``simattn::linear_attn_bwd``; their dispatch measured several times the
Function's) with fake implementations and registered autograd, all made by :func:`simattn.kernels.host.op`, so
``torch.compile(fullgraph=True)`` and ``torch.export`` see one op each way, and CUDA graphs capture either. On a
GPU, tile sizes, warps and pipeline depth are autotuned once per (tokens per program rounded to a power of two, d,
dv, dtypes, path) in the process
(``SIMATTN_TRITON_AUTOTUNE=0``: the first configuration, untimed).

:func:`simattn.kernels.host.dry_run` runs that whole path with the launches skipped, on CPU tensors as if they were
a GPU's: what a call costs the host, measurable without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import triton

from .. import host
from . import kernels as K

__all__ = ["sima_triton", "linear_triton", "LinearKind", "KINDS", "FEATURE_KINDS", "ONE_TILE_ELEMENTS"]


@dataclass(frozen=True)
class LinearKind:
    """What a kind sets in the kernels' skeleton (:mod:`~simattn.kernels.linear.kernels`): the constexpr flags of
    its prologue and epilogue, which per-channel sums its fold or normalizer reads (Σ|φ(k)|, Σ|q|), whether φ(k)ᵀv
    may multiply half inputs in their own dtype (not after a prologue that makes fp32 features), and whether the
    kernels have its backward."""

    flags: Dict[str, bool]
    key_sums: bool
    query_sums: bool
    half_products: bool
    backward: bool = False


_NO_FLAGS = dict(FEATURE_ELU=False, FEATURE_RELU=False, FOLD_L1=False, FOLD_COLS_L2=False, NORM_DOT=False,
                 NORM_ROWS_L2=False)
#: the kinds the kernels compute, by name
KINDS = {
    "sima": LinearKind(dict(_NO_FLAGS, FOLD_L1=True), key_sums=True, query_sums=True, half_products=True,
                       backward=True),
    "elu": LinearKind(dict(_NO_FLAGS, FEATURE_ELU=True, NORM_DOT=True), key_sums=True, query_sums=False,
                      half_products=False, backward=True),
    "xnorm": LinearKind(dict(_NO_FLAGS, FOLD_COLS_L2=True, NORM_ROWS_L2=True), key_sums=False, query_sums=False,
                        half_products=True),
    # SLAB: relu features, each row over relu(q)·Σrelu(k) (Σ|φ(k)| = Σφ(k) as φ ≥ 0)
    "slab": LinearKind(dict(_NO_FLAGS, FEATURE_RELU=True, NORM_DOT=True), key_sums=True, query_sums=False,
                       half_products=False, backward=True),
    # features made by the caller (FLatten's focused map, whose norms span every head of a token), non-negative:
    # φ(q)(φ(k)ᵀv) / (φ(q)·Σφ(k) + eps) on them
    "features": LinearKind(dict(_NO_FLAGS, NORM_DOT=True), key_sums=True, query_sums=False, half_products=False,
                           backward=True),
    # q(kᵀv) itself, on operands made by the caller (InLine's centered keys)
    "plain": LinearKind(dict(_NO_FLAGS), key_sums=False, query_sums=False, half_products=False, backward=True),
}
#: the kinds whose backward is the feature kinds' one (the others': SimA's)
FEATURE_KINDS = ("elu", "slab", "features", "plain")
#: largest tile (tokens × max(d, dv), padded to powers of two) for which a head's q, k, v are held whole on chip
ONE_TILE_ELEMENTS = 256 * 64


def _plan(bh: int, n: int, d: int, e: int, sms: int, least: int) -> Tuple[int, bool]:
    """(programs per (batch, head) along the tokens, whether one tile holds a head). One program per head when
    there are enough heads to fill the GPU (about 2 programs per multiprocessor, ``sms``) or too few tokens to
    share; else the token axis is split so that about that many programs run, each with at least ``least`` tokens.
    The interpreter counts 2 multiprocessors and 32 tokens, so small tests take every path."""
    splits = min(triton.cdiv(2 * sms, bh), triton.cdiv(n, least))
    if splits > 1:
        return splits, False
    return 1, host.block(n) * max(host.block(d), host.block(e)) <= ONE_TILE_ELEMENTS


def _features(flags: dict) -> dict:
    """The prologue's flags (the feature map) among a kind's, False where not given."""
    return {name: flags.get(name, False) for name in ("FEATURE_ELU", "FEATURE_RELU")}


class _Partials:
    """The partial-sum launch of a split token axis (:func:`~simattn.kernels.linear.kernels.stats_kernel`):
    partial φ(x)ᵀy (B·H·splits, d, e) and, with ``norms``, Σ|φ(x)| and Σ|z| (z given), all fp32."""

    def __init__(self, x, y, z, x_mask, z_mask, splits, chunk, features, norms, native, prec, mode):
        B, H, n_x, d = x.shape
        e = y.shape[-1]
        bh = B * H
        self.has_z, self.norms = z is not None, norms
        self.shapes = ((bh * splits, d, e), (bh * splits, d))
        zz = z if z is not None else x
        self.tail = (H, n_x, zz.shape[-2] if z is not None else 0, d, e, chunk, host.block(chunk),
                     host.block(bh * splits),
                     *x.stride(), *y.stride(), *zz.stride(), *host.mask_strides(x_mask), *host.mask_strides(z_mask))
        self.launch = host.Launch(K.stats_kernel, (bh, splits), dict(
            HAS_XM=x_mask is not None, HAS_ZM=z_mask is not None, NORMS=norms, HAS_Z=z is not None,
            **_features(features), NATIVE=native, UPCAST=mode.interpret, PREC=prec, BLOCK_D=host.block(d),
            BLOCK_E=host.block(e)), mode)

    def __call__(self, x, y, z, x_mask, z_mask):
        f32 = {"device": x.device, "dtype": torch.float32}
        part = torch.empty(self.shapes[0], **f32)
        s_x = torch.empty(self.shapes[1], **f32) if self.norms else part
        s_z = torch.empty(self.shapes[1], **f32) if self.has_z else part
        self.launch(x, y, z if self.has_z else x, host.mask_bytes(x_mask, x), host.mask_bytes(z_mask, x), part, s_x,
                    s_z, *self.tail)
        return part, s_x, s_z


class _ForwardCall:
    """A forward at one signature: out (B, H, Nq, dv) and, with ``save`` (SimA), the backward's state: k̂ᵀv
    (B·H, d, dv), s_q and s_k (B·H, d), else placeholders."""

    def __init__(self, kind: str, q, k, v, mask, q_mask, eps: float, bf16: bool, out_dtype: torch.dtype,
                 save: bool, mode: host.Mode):
        spec = KINDS[kind]
        B, H, n_q, d = q.shape
        n_k, e = k.shape[-2], v.shape[-1]
        bh = B * H
        self.mode, self.save = mode, save
        self.out_shape, self.out_dtype = (B, H, n_q, e), out_dtype
        self.state_shapes = ((bh, d, e), (bh, d))
        splits, one_tile = _plan(bh, max(n_q, n_k), d, e, mode.sms, mode.least)
        native = spec.half_products and host.native(k, v)
        prec = host.precision(q)
        flags = dict(HAS_QM=q_mask is not None, HAS_KM=mask is not None, SAVE=save, **spec.flags,
                     KEY_SUMS=spec.key_sums, QUERY_SUMS=spec.query_sums, NATIVE=native, BF16_OUT=bf16,
                     UPCAST=mode.interpret, PREC=prec, BLOCK_D=host.block(d), BLOCK_E=host.block(e))
        strides = (*q.stride(), *k.stride(), *v.stride(), *host.mask_strides(q_mask), *host.mask_strides(mask))
        self.partials, self.one_tile = None, one_tile
        if one_tile:
            block = host.block(max(n_q, n_k))
            self.tail = (H, n_q, n_k, d, e, eps, block, host.block(bh), *strides)
            self.launch = host.Launch(K.fwd_one_tile_kernel, (bh,), dict(flags, BLOCK=block), mode)
            return
        chunk = triton.cdiv(max(n_q, n_k), splits)
        if splits > 1:
            self.partials = _Partials(k, v, q if spec.query_sums else None, mask, q_mask if spec.query_sums else None,
                                      splits, chunk, spec.flags, spec.key_sums, native, prec, mode)
        self.tail = (H, n_q, n_k, d, e, splits, chunk, eps, host.block(chunk), host.block(bh * splits), *strides)
        self.launch = host.Launch(K.fwd_kernel, (bh, splits), dict(flags, SPLIT=splits > 1), mode)

    def __call__(self, q, k, v, mask, q_mask, gamma):
        out = torch.empty(self.out_shape, device=q.device, dtype=self.out_dtype)
        if self.save:
            f32 = {"device": q.device, "dtype": torch.float32}
            kv = torch.empty(self.state_shapes[0], **f32)
            s_q, s_k = torch.empty(self.state_shapes[1], **f32), torch.empty(self.state_shapes[1], **f32)
        else:
            kv = s_q = s_k = out
        qm, km = host.mask_bytes(q_mask, q), host.mask_bytes(mask, q)
        gamma = out if gamma is None else gamma
        with self.mode.device():
            if self.one_tile:
                self.launch(q, k, v, qm, km, gamma, out, kv, s_q, s_k, *self.tail)
            else:
                part = psk = psq = out
                if self.partials is not None:
                    query_sums = self.partials.has_z
                    part, psk, psq = self.partials(k, v, q if query_sums else None, mask,
                                                   q_mask if query_sums else None)
                self.launch(q, k, v, qm, km, gamma, part, psk, psq, out, kv, s_q, s_k, *self.tail)
        return out, kv, s_q, s_k


def _backward_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: host.Mode) -> Tuple[int, ...]:
    """A backward's sizes and token split: (H, n_q, n_k, d, e, B·H, programs per head, tokens per program); the split
    covers the longer of the two token axes, which the backward walks both of."""
    B, H, n_q, d = q.shape
    n_k, e = k.shape[-2], v.shape[-1]
    splits, _ = _plan(B * H, max(n_q, n_k), d, e, mode.sms, mode.least)
    return H, n_q, n_k, d, e, B * H, splits, triton.cdiv(max(n_q, n_k), splits)


class _BackwardCall:
    """SimA's backward at one signature: dq, dk, dv (contiguous, in q's, k's, v's dtypes) from the output gradient
    g and the forward's state."""

    def __init__(self, g, q, k, v, mask, q_mask, eps: float, bf16: bool, mode: host.Mode):
        H, n_q, n_k, d, e, bh, splits, chunk = _backward_plan(q, k, v, mode)
        self.mode = mode
        native, prec = host.native(q, g), host.precision(q)
        self.partials = None
        if splits > 1:
            self.partials = _Partials(q, g, None, q_mask, None, splits, chunk, {}, False, native, prec, mode)
        self.tail = (H, n_q, n_k, d, e, splits, chunk, eps, host.block(chunk), host.block(bh * splits),
                     *q.stride(), *k.stride(), *v.stride(), *g.stride(), *host.mask_strides(q_mask),
                     *host.mask_strides(mask))
        self.launch = host.Launch(K.bwd_kernel, (bh, splits), dict(
            HAS_QM=q_mask is not None, HAS_KM=mask is not None, SPLIT=splits > 1, NATIVE=native, BF16_DQ=bf16,
            UPCAST=mode.interpret, PREC=prec, BLOCK_D=host.block(d), BLOCK_E=host.block(e)), mode)

    def __call__(self, g, q, k, v, mask, q_mask, kvn, s_q, s_k):
        dq = host.grad_like(q)
        dk = host.grad_like(k)
        dv = host.grad_like(v)
        with self.mode.device():
            part = kvn
            if self.partials is not None:
                part, _, _ = self.partials(q, g, None, q_mask, None)
            self.launch(q, k, v, g, host.mask_bytes(q_mask, q), host.mask_bytes(mask, q), kvn, s_q, s_k, part, dq, dk,
                        dv, *self.tail)
        return dq, dk, dv


class _FeatureBackwardCall:
    """A feature kind's backward at one signature (:func:`~simattn.kernels.linear.kernels.feature_bwd_kernel`):
    dq, dk, dv (contiguous, in q's, k's, v's dtypes) from the output gradient g and the forward's S and z. A split
    token axis takes two launches: the queries' stage writes partial dS, dz per chunk, the keys' stage adds them."""

    def __init__(self, kind: str, g, q, k, v, mask, eps: float, mode: host.Mode):
        H, n_q, n_k, d, e, bh, splits, chunk = _backward_plan(q, k, v, mode)
        self.mode = mode
        self.part_shapes = ((bh * splits, d, e), (bh * splits, d)) if splits > 1 else None
        self.tail = (H, n_q, n_k, d, e, splits, chunk, eps, host.block(chunk), host.block(bh * splits),
                     *q.stride(), *k.stride(), *v.stride(), *g.stride(), *host.mask_strides(mask))
        consts = dict(HAS_KM=mask is not None, **_features(KINDS[kind].flags),
                      NORM_DOT=KINDS[kind].flags["NORM_DOT"], UPCAST=mode.interpret,
                      PREC=host.precision(q), BLOCK_D=host.block(d), BLOCK_E=host.block(e))
        sides = (dict(QUERY_SIDE=True, KEY_SIDE=False), dict(QUERY_SIDE=False, KEY_SIDE=True)) if splits > 1 \
            else (dict(QUERY_SIDE=True, KEY_SIDE=True),)
        self.launches = [host.Launch(K.feature_bwd_kernel, (bh, splits), dict(consts, **side), mode)
                         for side in sides]

    def __call__(self, g, q, k, v, mask, s, z):
        dq = host.grad_like(q)
        dk = host.grad_like(k)
        dv = host.grad_like(v)
        part = pz = s
        if self.part_shapes is not None:
            part = torch.empty(self.part_shapes[0], device=q.device, dtype=torch.float32)
            pz = torch.empty(self.part_shapes[1], device=q.device, dtype=torch.float32)
        with self.mode.device():
            for launch in self.launches:
                launch(q, k, v, g, host.mask_bytes(mask, q), s, z, part, pz, dq, dk, dv, *self.tail)
        return dq, dk, dv


def _forward(kind: str, q, k, v, mask, q_mask, gamma, eps: float, bf16: bool, out_dtype: torch.dtype, save: bool):
    """The forward's outputs (:class:`_ForwardCall`), planned once per signature."""
    call = host.plan(kind, (kind, eps, bf16, out_dtype, save), (q, k, v, mask, q_mask, gamma),
                     lambda mode: _ForwardCall(kind, q, k, v, mask, q_mask, eps, bf16, out_dtype, save, mode))
    return call(q, k, v, mask, q_mask, gamma)


def _backward(g, q, k, v, mask, q_mask, kvn, s_q, s_k, eps: float, bf16: bool):
    """SimA's gradients (:class:`_BackwardCall`), planned once per signature."""
    call = host.plan("sima", ("sima backward", eps, bf16), (q, k, v, mask, q_mask, g),
                     lambda mode: _BackwardCall(g, q, k, v, mask, q_mask, eps, bf16, mode))
    return call(g, q, k, v, mask, q_mask, kvn, s_q, s_k)


def _feature_backward(kind: str, g, q, k, v, mask, s, z, eps: float):
    """A feature kind's gradients (:class:`_FeatureBackwardCall`), planned once per signature."""
    call = host.plan(kind, (kind, "backward", eps), (q, k, v, mask, g),
                     lambda mode: _FeatureBackwardCall(kind, g, q, k, v, mask, eps, mode))
    return call(g, q, k, v, mask, s, z)


# ------------------------------------------------------------------------------------------------ the op


def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
         q_mask: Optional[torch.Tensor], gamma: Optional[torch.Tensor], eps: float, kind: str, bf16: bool,
         out_dtype: torch.dtype, save: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """out and, with ``save``, the backward's state (:class:`_ForwardCall`), else placeholders."""
    return _forward(kind, q, k, v, mask, q_mask, gamma, eps, bf16, out_dtype, save)


def _fwd_fake(q, k, v, mask, q_mask, gamma, eps, kind, bf16, out_dtype, save):
    B, H, n_q, d = q.shape
    e = v.shape[-1]
    out = q.new_empty(B, H, n_q, e, dtype=out_dtype)
    if not save:
        return (out, *(q.new_empty(0, dtype=torch.float32) for _ in range(3)))
    return out, q.new_empty(B * H, d, e, dtype=torch.float32), *(q.new_empty(B * H, d, dtype=torch.float32)
                                                                 for _ in range(2))


def _bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
         q_mask: Optional[torch.Tensor], gamma: Optional[torch.Tensor], kvn: torch.Tensor, s_q: torch.Tensor,
         s_k: torch.Tensor, eps: float, kind: str, bf16: bool, out_dtype: torch.dtype,
         save: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv: SimA's backward, or the feature kinds' (S = kvn, z = s_k)."""
    if not (KINDS[kind].backward and save):
        raise RuntimeError("simattn::linear_attn: only the kinds with a backward, run with save=True, have one")
    if kind in FEATURE_KINDS:
        return _feature_backward(kind, g, q, k, v, mask, kvn, s_k, eps)
    return _backward(g, q, k, v, mask, q_mask, kvn, s_q, s_k, eps, bf16)


# Registered for CUDA and, for the interpreter, CPU tensors.
_call = host.op("simattn::linear_attn", _fwd, _bwd, _fwd_fake, tensors=6, grads=3)


# ------------------------------------------------------------------------------------------------ entry points


def sima_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                q_mask: Optional[torch.Tensor] = None, eps: float = 1e-12,
                compute_dtype: torch.dtype = torch.float32, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """q̂(k̂ᵀv) on q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, dv) with the fused kernels → (B, H, Nq, dv).

    ``mask`` / ``q_mask``: validated (B, Nk) / (B, Nq) keep-masks (:func:`~simattn.attention._common.resolve_masks`).
    ``compute_dtype``: bf16 multiplies q and W in bf16, anything else with fp32 operands (the torch path's
    ``range_safe_dtype``). ``out_dtype``: the output's dtype (default q's). Called by
    :func:`simattn.attention.sima.sima_attention`, which has checked the inputs (shapes, devices,
    the backend chooser, :mod:`simattn.attention.backends`); a device the kernels cannot run on is refused here.
    """
    bf16 = compute_dtype == torch.bfloat16
    out_dtype = out_dtype or q.dtype
    save = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _call(q, save, q, k, v, mask, q_mask, None, eps, "sima", bf16, out_dtype, save)


def linear_triton(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  mask: Optional[torch.Tensor] = None, gamma: Optional[torch.Tensor] = None, eps: float = 1e-6,
                  out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A linear kind other than SimA with the fused kernels, all in fp32 as their torch paths; ``mask`` (B, Nk)
    removes keys. ``kind``: ``'elu'`` (ELU linear attention), ``'xnorm'`` (XNorm, ``gamma`` = γ_q γ_kv as a (B·H,)
    fp32 tensor), ``'slab'`` (relu features), ``'features'`` (q and k are non-negative features made by the caller,
    e.g. FLatten's focused map, PolaFormer's polar parts), ``'plain'`` (q(kᵀv), no normalizer: InLine's core).
    All but XNorm have a backward (:data:`FEATURE_KINDS`'s, SimA's skeleton); XNorm runs forward only.
    Called by the kinds' functional ops with checked inputs."""
    out_dtype = out_dtype or q.dtype
    save = (KINDS[kind].backward and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad))
    return _call(q, save, q, k, v, mask, None, gamma, eps, kind, False, out_dtype, save)
