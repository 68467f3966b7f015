"""Agent Attention (Han et al., ECCV 2024): softmax attention through a small set of agent tokens.

Agents A (n per head, n = 49 in the paper) are the queries' grid average-pooled to √n×√n. The agents first gather
from the keys, then the queries read from the agents, each step a softmax over n or N entries:

    V_A = softmax(A Kᵀ/√d + B₁) V,    O = softmax(Q Aᵀ/√d + B₂) V_A,

linear in N for a fixed n (2·N·n exps per head: SimA's Table 2 class HN). The agent biases B₁ (n×N) and B₂ (N×n)
carry the tokens' positions, each the sum of the paper's three parts: a block bias of 7×7 per agent,
bilinearly resized to the token grid, a row bias and a column bias per agent (one value per grid row and column,
``window`` of them; resized linearly when the grid differs). A depthwise 3×3 conv of V on the grid is added to the
output, restoring the diversity a rank-n summary loses. Prefix (class) tokens take part as queries and keys but
not in the pooling or the conv; their bias is one learned value per head and agent (``prefix_bias``), as the
released DeiT code's class-token bias. All of the attention runs in fp32 (fp64 for fp64 inputs) under autocast;
every output row is a convex combination of V_A's rows, which are convex combinations of V's, so it stays in V's
range in any float format. ``backend='triton'`` (``'auto'`` on CUDA) runs both steps on Triton kernels, forward
and backward, with no n×N tensor in memory but the biases and their gradients
(:mod:`simattn.kernels.agent.launch`).

Released code (LeapLabTHU/Agent-Attention, ``agent_transformer/models/agent_deit.py`` ``AgentAttention``): run on
fixed inputs (B 2, N 197 = 1 + 14×14, dim 48, 3 heads, 49 agents, window 14, fp64) with its parameters copied
into this module (its biases moved off their init by a random offset): max |ours − released| = 2.2e-16 on the
module output, of magnitude 1 (the reference, from the same parameters: 4.4e-16). Its forward reads the grid as √N × √N with N counting the class token
(int(√197) = 14), so it takes square grids with exactly one class token only; this module takes any grid.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import agent as agent_kernels
from ._common import check_count, check_qkv, matmul_dtype, no_autocast
from ._registry import register_attention
from .backends import TRITON_MAX_AGENTS, Call, check_backend, choose
from .base import GridAttention
from .grid import add_heads_image, head_images, head_tokens, heads_image, infer_grid
from .reference import agent_reference as agent_attention_reference

__all__ = ["agent_attention", "agent_attention_reference", "pool_agents", "AgentAttention", "TRITON_MAX_AGENTS"]

def _pool_side(name: str, agent_num: int) -> int:
    side = math.isqrt(agent_num) if isinstance(agent_num, int) and agent_num > 0 else 0
    if isinstance(agent_num, bool) or side * side != agent_num:
        raise ValueError(f"{name}: agent_num={agent_num!r}; allowed: a square number >= 1 (the agents are pooled "
                         f"to a square, e.g. 49 = 7x7)")
    return side


def pool_agents(q: torch.Tensor, grid_size: Tuple[int, int], pool_side: int, num_prefix_tokens: int = 0) -> torch.Tensor:
    """The agents: the grid tokens of q (B, H, N, d) adaptively average-pooled to pool_side² → (B, H, pool_side², d)."""
    return head_tokens(F.adaptive_avg_pool2d(head_images(q, grid_size, num_prefix_tokens), pool_side), q.shape[1])


def _aggregate(k: torch.Tensor, v: torch.Tensor, agents: torch.Tensor, agent_bias: Optional[torch.Tensor],
               acc: torch.dtype) -> torch.Tensor:
    """V_A = softmax(A Kᵀ/√d + B₁) V in ``acc``; no checks (TorchScript runs this too)."""
    gather = (agents.to(acc) * k.shape[-1] ** -0.5) @ k.to(acc).transpose(-2, -1)  # (B, H, n, Nk)
    if agent_bias is not None:
        gather = gather + agent_bias.to(acc)
    return gather.softmax(dim=-1) @ v.to(acc)


def _agent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, agents: torch.Tensor, agent_bias: Optional[torch.Tensor],
           query_bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The two softmax steps in fp32 (fp64 for fp64 inputs); no checks (TorchScript runs this too)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    agent_v = _aggregate(k, v, agents, agent_bias, acc)
    read = (q.to(acc) * q.shape[-1] ** -0.5) @ agents.to(acc).transpose(-2, -1)  # (B, H, Nq, n)
    if query_bias is not None:
        read = read + query_bias.to(acc)
    return read.softmax(dim=-1) @ agent_v


def _check_bias(name: str, bias: Optional[torch.Tensor], rows: int, cols: int, q: torch.Tensor) -> None:
    if bias is None:
        return
    if bias.dim() < 2 or bias.dim() > 4 or tuple(bias.shape[-2:]) != (rows, cols):
        raise ValueError(f"agent: {name} must end in ({rows}, {cols}) and broadcast against (B, H, {rows}, {cols}), "
                         f"got {tuple(bias.shape)}")
    if bias.device != q.device:
        raise ValueError(f"agent: {name} is on {bias.device} but q is on {q.device}; allowed: one device")


def agent_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    grid_size: Optional[Tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None,
                    agent_num: int = 49, agents: Optional[torch.Tensor] = None,
                    agent_bias: Optional[torch.Tensor] = None, query_bias: Optional[torch.Tensor] = None,
                    backend: str = "auto") -> torch.Tensor:
    """Agent attention on q (B, H, Nq, d), k, v (B, H, Nk, ·), without the depthwise conv (the module adds it).

    Agents default to the grid tokens of q pooled to √agent_num×√agent_num (``grid_size`` (H, W) or a square grid
    after 0 or 1 prefix tokens, as SOFT's); pass ``agents`` (B, H, n, d) to use others. ``agent_bias`` (…, n, Nk)
    is added to the agents' logits over the keys, ``query_bias`` (…, Nq, n) to the queries' logits over the agents.
    Returns the autocast dtype under autocast, else v's. ``backend``: 'auto' (on CUDA both steps on their Triton
    kernels where they take the call, torch elsewhere and in exported graphs), 'torch' or 'triton'
    (:mod:`~simattn.kernels.agent.launch`).
    """
    check_qkv(q, k, v, "agent")
    if agents is None:
        side = _pool_side("agent", agent_num)
        grid, prefix = infer_grid(q.shape[-2], grid_size, num_prefix_tokens, name="agent")
        agents = pool_agents(q, grid, side, prefix)
    elif agents.dim() != 4 or agents.shape[:2] != q.shape[:2] or agents.shape[-1] != q.shape[-1]:
        raise ValueError(f"agent: agents must have shape (B, H, n, d) = ({q.shape[0]}, {q.shape[1]}, n, "
                         f"{q.shape[-1]}), got {tuple(agents.shape)}")
    _check_bias("agent_bias", agent_bias, agents.shape[-2], k.shape[-2], q)
    _check_bias("query_bias", query_bias, q.shape[-2], agents.shape[-2], q)
    dt = matmul_dtype(v)
    with no_autocast(q):
        if choose("agent", backend, Call(q, k, v, agents=agents)) == "triton":
            agent_v = agent_kernels.agent_gather_triton(agents, k, v, agent_bias)
            return agent_kernels.agent_broadcast_triton(q, agents, agent_v, query_bias, out_dtype=dt)
        out = _agent(q, k, v, agents, agent_bias, query_bias)
    return out.to(dt)


def _resize(bias: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """(…, h, w) → (…, size): bilinear, align_corners=False (the same values where the size is unchanged)."""
    if (bias.shape[-2], bias.shape[-1]) == (size[0], size[1]):
        return bias
    flat = bias.reshape(-1, 1, bias.shape[-2], bias.shape[-1])
    out = F.interpolate(flat, size=size, mode="bilinear", align_corners=False)
    return out.reshape(list(bias.shape[:-2]) + [size[0], size[1]])


@register_attention("agent")
class AgentAttention(GridAttention):
    """Agent attention with timm's ``Attention`` signature: ``qkv`` and ``proj`` as timm's, plus the agent biases
    and the depthwise conv ``dwc``.

    Options: ``agent_num`` (n, a square; 49 as Agent-DeiT), ``window`` (rows and columns of the row and column
    biases: the grid they are learned for, 14 at 224 px with 16 px patches), ``downstream_agent_num`` (m, a square;
    None = n: the agents pooled at run time; the biases, learned for n agents laid out √n×√n, are resized bilinearly
    to √m×√m, as Agent's downstream segmentation and detection backbones do), ``block_bias_size`` (7),
    ``dwc_kernel`` (3; 0 = no conv), ``num_prefix_tokens`` (None = infer 0 or 1), ``backend`` ('auto' | 'torch' |
    'triton', :func:`agent_attention`). ``forward(x, grid_size=(H, W))``
    for non-square grids. No masks (the agents pool the whole grid); ``attn_drop > 0`` is rejected.
    Biases: ``agent_*_bias`` (n×N, the agents over the keys) and ``query_*_bias`` (N×n, the queries over the agents),
    each ``block`` (H, n, 7, 7), ``row`` and ``col`` (H, n, window) and ``prefix`` (H, n, 1), truncated-normal init
    (std 0.02) as the released code.
    """

    exp_complexity = "HN"
    layout_options = ("num_prefix_tokens",)

    def __init__(self, dim: int, num_heads: int = 8, *, agent_num: int = 49, window: int = 14,
                 downstream_agent_num: Optional[int] = None, block_bias_size: int = 7, dwc_kernel: int = 3,
                 backend: str = "auto", **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        name = type(self).__name__
        self.bias_side = _pool_side(name, agent_num)
        self.agent_num = agent_num
        self.downstream_agent_num = agent_num if downstream_agent_num is None else downstream_agent_num
        self.pool_side = _pool_side(name, self.downstream_agent_num)
        self.window = check_count(name, "window", window)
        check_count(name, "block_bias_size", block_bias_size)
        check_count(name, "dwc_kernel", dwc_kernel, low=0)
        self.backend = check_backend(name, "agent", backend)
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        h, n, b = num_heads, agent_num, block_bias_size

        def bias(*shape):
            return nn.Parameter(nn.init.trunc_normal_(torch.empty(*shape, **dd), std=0.02))

        self.agent_block_bias, self.query_block_bias = bias(h, n, b, b), bias(h, n, b, b)
        self.agent_row_bias, self.agent_col_bias = bias(h, n, window), bias(h, n, window)
        self.query_row_bias, self.query_col_bias = bias(h, n, window), bias(h, n, window)
        with_prefix = self.num_prefix_tokens is None or self.num_prefix_tokens > 0
        self.agent_prefix_bias = bias(h, n, 1) if with_prefix else None
        self.query_prefix_bias = bias(h, n, 1) if with_prefix else None
        self.dwc = nn.Conv2d(dim, dim, dwc_kernel, padding=dwc_kernel // 2, groups=dim, **dd) if dwc_kernel else None

    def biases(self, grid: Tuple[int, int], prefix: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The agent bias B₁ (1, H, m, N) and the query bias B₂ (1, H, N, m) for a grid after ``prefix`` tokens: on
        each side the block bias resized to the grid + the row and column biases, the prefix tokens' in front (both
        sides resized in one call each: fewer ops to run and to trace), then resized over the agents' square where
        the run pools m ≠ n agents."""
        gh, gw = grid
        block = _resize(torch.stack([self.agent_block_bias, self.query_block_bias]), grid)
        rows = _resize(torch.stack([self.agent_row_bias, self.query_row_bias]).unsqueeze(-2), (1, gh)).squeeze(-2)
        cols = _resize(torch.stack([self.agent_col_bias, self.query_col_bias]).unsqueeze(-2), (1, gw)).squeeze(-2)
        both = (block + rows.unsqueeze(-1) + cols.unsqueeze(-2)).flatten(-2)  # (2, H, n, gh·gw)
        if prefix > 0:
            assert self.agent_prefix_bias is not None and self.query_prefix_bias is not None, \
                "built with num_prefix_tokens=0"
            front = torch.stack([self.agent_prefix_bias, self.query_prefix_bias]).expand(-1, -1, -1, prefix)
            both = torch.cat([front, both], dim=-1)
        if self.pool_side != self.bias_side:  # (2, H, n, N) → each token's n values as a √n×√n image → √m×√m
            p, m = self.bias_side, self.pool_side
            images = both.reshape(-1, p, p, both.shape[-1]).permute(0, 3, 1, 2)
            both = _resize(images, (m, m)).flatten(-2).transpose(-2, -1).reshape(2, -1, m * m, both.shape[-1])
        return both[:1], both[1:].transpose(-2, -1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
               grid_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        grid, prefix = self.token_grid(q.shape[-2], grid_size)
        agent_bias, query_bias = self.biases(grid, prefix)
        agents = pool_agents(q, grid, self.pool_side, prefix)
        if torch.jit.is_scripting():  # autocast handling is Python
            out = _agent(q, k, v, agents, agent_bias, query_bias).to(v.dtype)
        else:
            out = agent_attention(q, k, v, agents=agents, agent_bias=agent_bias, query_bias=query_bias,
                                  backend=self.backend)
        if self.dwc is not None:  # depthwise conv of V on the grid, added to the grid tokens' outputs
            out = add_heads_image(out, self.dwc(heads_image(v, grid, prefix)), prefix)
        return out

    def extra_repr(self) -> str:
        run = f", downstream_agent_num={self.downstream_agent_num}" if self.pool_side != self.bias_side else ""
        return f"{super().extra_repr()}, agent_num={self.agent_num}, window={self.window}{run}"
