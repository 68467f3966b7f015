"""The module skeleton shared by every attention kind: timm's ``Attention`` layout with a pluggable weighting step.

Parameter names (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``, ``proj``) and the constructor signature follow
``timm.models.vision_transformer.Attention``, so ``VisionTransformer(attn_layer=SomeKind)`` builds and timm
checkpoints map across. Subclasses implement :meth:`attend` on (B, H, N, d) tensors; the kinds on the 2-D token
grid subclass :class:`GridAttention`, which holds their flags, their ``num_prefix_tokens`` and finding their grid.

Graph capture: ``torch.compile`` and ``torch.export`` trace every kind's fast path. Under TorchScript each kind's
:meth:`attend` takes a plain path (its formula in fp32, no hook points), since the fast paths pick dtypes, autocast
handling and matmul order in Python. FX tracing keeps these modules whole: timm's tracer because ``simattn.models``
puts them on timm's no-trace list, any other tracer because ``forward`` records itself as one call. The class flags
below are TorchScript constants, so only the calls a kind makes are compiled.
"""
from typing import Optional, Tuple, Type

import torch
from torch import nn

from ._common import check_count, check_device, fx_call_whole, fx_tracing
from .grid import infer_grid, scripted_grid

__all__ = ["TokenAttention", "GridAttention", "GridReducedAttention"]


class TokenAttention(nn.Module):
    """Multi-head self-attention over tokens; subclasses define how q, k, v are combined.

    ``forward(x, attn_mask=None, is_causal=False, grid_size=None)`` takes ``x`` of shape (B, N, C). ``attn_mask``
    is a boolean keep-mask of shape (B, N) (True = the token takes part); kinds that cannot honour a mask raise a
    ValueError. ``grid_size`` is the (H, W) grid of the tokens after any prefix tokens, for kinds that use it
    (``uses_grid``); the others ignore it.
    """

    # constants in TorchScript, so only the branches a kind takes are compiled
    __constants__ = ["supports_mask", "supports_cross_length", "supports_causal", "separate_qk", "supports_attn_drop",
                     "uses_grid", "attend_uses_grid"]

    attn_name: str = "base"
    #: Whether ``attend`` can take a (B, N) token mask.
    supports_mask: bool = True
    #: Whether ``attend`` takes keys/values of another length than the queries (e.g. CvT's strided keys).
    supports_cross_length: bool = True
    #: Whether ``is_causal=True`` is honoured (timm's blocks pass the flag).
    supports_causal: bool = False
    #: Whether q and k come out of the projection (False for SOFT, whose q = k).
    separate_qk: bool = True
    #: Whether ``attn_drop`` is applied (to an explicit attention weight matrix). Kinds without one reject
    #: ``attn_drop > 0`` at construction rather than ignore it.
    supports_attn_drop: bool = False
    #: Whether ``forward`` uses the 2-D token grid: models pass ``grid_size=(H, W)`` to modules with this flag.
    uses_grid: bool = False
    #: Whether ``attend`` takes that grid as ``grid_size`` (SOFT pools its landmarks on it).
    attend_uses_grid: bool = False
    #: Whether :meth:`attend_fused` may compute the attention from ``x`` itself, past :meth:`project` (eager only).
    fuses_projection: bool = False
    #: Whether the constructor takes ``ratio``: a ratio×ratio reduction of the key grid (SOFT's and Nyströmformer's
    #: landmarks, Linformer's key projection); the SOFT pyramid sets it per stage, as SOFT's Table 1 does.
    takes_reduction_ratio: bool = False
    #: Constructor options a model fills in from its token layout, whichever kind it was built for:
    #: ``num_prefix_tokens`` (the class and register tokens before the grid), ``pos_grid`` (the grid a learned key
    #: encoding is made for, where the model has one).
    layout_options: Tuple[str, ...] = ()
    #: How many exp-like evaluations one call makes, in SimA's Table 2 classes for H heads, N tokens, D = H·d
    #: channels: ``'HN²'`` (every query-key pair), ``'HN'`` (every token against a fixed number of landmarks or
    #: projected keys), ``'ND'`` (one per token and channel or random feature), ``'Hd²'`` (per head, the d×d channel
    #: matrix: independent of N), ``'0'`` (none). Read by the comparison tables; the export audit counts the ops.
    exp_complexity: str = "HN²"

    def __init__(
            self,
            dim: int,
            num_heads: int = 8,
            qkv_bias: bool = False,
            qk_norm: bool = False,
            scale_norm: bool = False,
            proj_bias: bool = True,
            gated: bool = False,
            attn_drop: float = 0.,
            proj_drop: float = 0.,
            norm_layer: Optional[Type[nn.Module]] = None,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_count(name, "dim", dim)
        check_count(name, "num_heads", num_heads)
        if dim % num_heads != 0:
            raise ValueError(f"{type(self).__name__}: dim ({dim}) must be a positive multiple of num_heads ({num_heads})")
        if not 0 <= attn_drop < 1 or (attn_drop > 0 and not self.supports_attn_drop):
            allowed = "0 <= attn_drop < 1" if self.supports_attn_drop else \
                f"only 0: {self.attn_name} attention has no weight matrix to drop"
            raise ValueError(f"{type(self).__name__}: attn_drop={attn_drop} is not supported; allowed: {allowed}")
        check_device(name, device)
        norm_layer = norm_layer or nn.LayerNorm
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        n_proj = 3 if self.separate_qk else 2
        self.qkv = nn.Linear(dim, dim * n_proj, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm and self.separate_qk else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, N, C) → q, k, v each (B, H, N, d)."""
        B, N, _ = x.shape
        n_proj = 3 if self.separate_qk else 2
        qkv = self.qkv(x).reshape(B, N, n_proj, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.separate_qk:
            q, k, v = qkv.unbind(0)
            return self.q_norm(q), self.k_norm(k), v
        q, v = qkv.unbind(0)
        q = self.q_norm(q)
        return q, q, v

    def project_grid(self, x: torch.Tensor,
                     grid_size: Optional[Tuple[int, int]]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection hook of :meth:`forward`: x (B, N, C) on the token grid ``grid_size`` (None where the model
        passes none) → q (B, H, Nq, d), k, v (B, H, Nk, ·); :meth:`project` here. A pyramid stage that makes its
        keys another way (PVT's spatial reduction, CvT's convolutional projection) overrides this, sets
        ``fuses_projection = False`` and, for inputs it cannot take, extends :meth:`check_call`."""
        return self.project(x)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: Optional[torch.Tensor]) -> torch.Tensor:  # pragma: no cover - abstract
        """Combine q, k, v (B, H, N, d) into the (B, H, N, d) output; ``mask`` is a (B, N) keep-mask or None."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """x (B, N, C) → (B, N, C)."""
        if not torch.jit.is_scripting():
            traced = fx_call_whole(self, (x,), dict(attn_mask=attn_mask, is_causal=is_causal, grid_size=grid_size))
            if traced is not None:
                return traced
            self.check_call(x, attn_mask, is_causal, grid_size)
            if self.fuses_projection and attn_mask is None:
                fused = self.attend_fused(x)
                if fused is not None:
                    return self._output(fused, x)
        return self._forward(x, attn_mask, is_causal, grid_size)

    def _forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                 grid_size: Optional[Tuple[int, int]]) -> torch.Tensor:
        """:meth:`forward` past its checks: project (:meth:`project_grid`), attend, merge the heads; a kind whose
        attention also reads x itself (InLine's local branch) replaces this step only."""
        q, k, v = self.project_grid(x, grid_size)
        return self._output(self._attend(q, k, v, attn_mask, is_causal, grid_size), x)

    def attend_fused(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The (B, H, N, d) attention output straight from x (B, N, C) without a mask, for kinds that gain from seeing
        the fused projection (``fuses_projection``); None where the kind's fused path does not apply."""
        return None

    def _output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The attention output (B, H, N, d) → heads merged, normed, gated and projected (B, N, C)."""
        out = self.norm(self._merge_heads(out, x))
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(out))

    def _merge_heads(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) → (B, N, C); a kind with a gate of its own before the norm (PolaFormer) replaces this."""
        B, N, C = x.shape
        return out.transpose(1, 2).reshape(B, N, C)

    def check_call(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                   grid_size: Optional[Tuple[int, int]] = None) -> None:
        """ValueError for an input or an option this kind cannot take (skipped while FX traces and in TorchScript);
        a subclass that takes less extends it."""
        if fx_tracing():
            return
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__}: expected x of shape (B, N, {self.dim}), got {tuple(x.shape)}")
        if attn_mask is not None and not self.supports_mask:
            raise ValueError(f"{type(self).__name__} does not support attention masks")
        if is_causal and not self.supports_causal:
            raise ValueError(f"{type(self).__name__} does not support causal attention")

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                is_causal: bool, grid_size: Optional[Tuple[int, int]]) -> torch.Tensor:
        """:meth:`attend` with the options this kind takes (its class flags, constants in TorchScript)."""
        if self.attend_uses_grid:
            return self.attend(q, k, v, mask, grid_size=grid_size)
        if self.supports_causal:
            return self.attend(q, k, v, mask, is_causal=is_causal)
        return self.attend(q, k, v, mask)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"


class GridAttention(TokenAttention):
    """The kinds that work on the 2-D grid of the tokens after any prefix tokens (Agent, SOFT, Nyströmformer,
    Linformer, CosFormer, the grid-linear kinds). ``forward(x, grid_size=(H, W))`` passes the grid to
    :meth:`attend`; without it the grid is a square after ``num_prefix_tokens`` tokens (a constructor option; None
    = 0 or 1, whichever fits), found by :meth:`token_grid`, whose error for a token count that fits no grid is one
    line. The prefix tokens (class, register tokens) take part in the attention but not in what works on the grid
    (pooling, convolutions, encodings: :mod:`~simattn.attention.grid` splits them off and adds back). A token mask
    or keys of another length fit no grid; a kind that takes them says so in its flags."""

    supports_mask = False
    supports_cross_length = False
    uses_grid = True
    attend_uses_grid = True

    def __init__(self, dim: int, num_heads: int = 8, *, num_prefix_tokens: Optional[int] = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if num_prefix_tokens is not None:
            check_count(type(self).__name__, "num_prefix_tokens", num_prefix_tokens, low=0)
        self.num_prefix_tokens = num_prefix_tokens

    def token_grid(self, n: int, grid_size: Optional[Tuple[int, int]]) -> Tuple[Tuple[int, int], int]:
        """((H, W), number of prefix tokens) of n tokens, ``grid_size`` where given."""
        if torch.jit.is_scripting():  # the kind's name, for the eager path's errors, is not a TorchScript attribute
            return scripted_grid(n, grid_size, self.num_prefix_tokens)
        else:
            return infer_grid(n, grid_size, self.num_prefix_tokens, name=self.attn_name)


class GridReducedAttention(GridAttention):
    """The kinds that reduce the keys ratio×ratio on the 2-D token grid (SOFT's and Nyströmformer's pooled landmarks,
    Linformer's key projection): the constructor takes ``ratio`` (2 by default)."""

    takes_reduction_ratio = True
    # N/ratio² reduced keys at a fixed ratio (as the SOFT pyramid's stages have) make N·N/ratio² exps: they grow as
    # N². SimA's Table 2 lists Linformer and Nyströmformer as HN, which holds for a fixed reduced length instead.
    exp_complexity = "HN²"

    def __init__(self, dim: int, num_heads: int = 8, *, ratio: int = 2, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.ratio = check_count(type(self).__name__, "ratio", ratio)
