"""Oracles: every attention kind written straight from its paper's (or released code's) formula.

Plain torch operations only, in the inputs' own dtype: nothing here calls a helper of the fast paths (masking,
weighting, kernels, feature maps, key lengths, norms), so a bug in a shared helper cannot hide by changing a fast
path and its oracle alike. The tests run these in fp64 as ground truth; ``simattn bench`` runs
:func:`sima_reference` as the official code's formulation. No input checking: callers pass valid (B, H, N, d) tensors.

Masks are boolean keep-masks of shape (B, N) (True = the token takes part).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

__all__ = [
    "sima_reference", "softmax_reference", "xca_reference", "elu_reference", "relu_reference", "RELU_H",
    "xnorm_reference", "gaussian_kernel_reference", "pool_landmarks_reference", "newton_inverse_reference",
    "soft_reference", "sima_class_attention_reference", "softmax_class_attention_reference",
    "linformer_reference", "linformer_window_matrix_reference", "performer_reference", "nystrom_reference",
    "efficient_reference", "cosformer_reference",
]


def _keep(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    return t if mask is None else t * mask[:, None, :, None].to(t.dtype)


# ---------------------------------------------------------------------------------------------------- SimA
def sima_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, order: str = "auto",
                   mask: Optional[torch.Tensor] = None, q_mask: Optional[torch.Tensor] = None,
                   eps: float = 1e-12) -> torch.Tensor:
    """SimA as the official code writes it: q̂ = ``normalize(q, p=1, dim=-2)`` (q / max(Σ_tokens |q|, eps) per
    channel; likewise k̂), out = q̂ k̂ᵀ v. ``simattn bench`` times it as the official formulation.

    ``order``: 'kv_first' = q̂(k̂ᵀv), 'qk_first' = (q̂k̂ᵀ)v, 'auto' = the official rule (qk_first when Nq < d).
    ``mask`` removes key tokens before the normalization (and query tokens too when the lengths are equal and no
    ``q_mask`` is given); ``q_mask`` removes query tokens.
    """
    if q_mask is None and mask is not None and q.shape[-2] == k.shape[-2]:
        q_mask = mask
    q_hat = F.normalize(_keep(q, q_mask), p=1.0, dim=-2, eps=eps)
    k_hat = F.normalize(_keep(k, mask), p=1.0, dim=-2, eps=eps)
    if order == "auto":
        order = "qk_first" if q.shape[-2] < q.shape[-1] else "kv_first"
    if order == "qk_first":
        return (q_hat @ k_hat.transpose(-2, -1)) @ v
    return q_hat @ (k_hat.transpose(-2, -1) @ v)


def sima_class_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   eps: float = 1e-6) -> torch.Tensor:
    """SimA's class attention (official ``ClassAttention``): l1-normalize q, k of all N tokens over tokens, the CLS
    query (index 0) weights the values by its dot products with every key → (B, H, 1, dv)."""
    q_hat = F.normalize(q, p=1.0, dim=-2, eps=eps)
    k_hat = F.normalize(k, p=1.0, dim=-2, eps=eps)
    weights = (q_hat[:, :, :1] * k_hat).sum(-1)  # (B, H, N)
    return weights.unsqueeze(-2) @ v


# ---------------------------------------------------------------------------------------------------- softmax
def softmax_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                      scale: Optional[float] = None, is_causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ · scale) v, scale = d^-½. ``mask``: (B, Nk) or 4-D boolean keep-mask, or an additive float mask.
    ``is_causal``: query i sees keys j ≤ i (top-left aligned, as SDPA)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        if mask.dim() == 2:
            mask = mask[:, None, None, :]
        logits = logits.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else logits + mask
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        allowed = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None]
        logits = logits.masked_fill(~allowed, -math.inf)
    return torch.softmax(logits, dim=-1) @ v


def softmax_class_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """CaiT/XCiT class attention: softmax(q₀ kᵀ / √d) v with q₀ the CLS query (index 0) → (B, H, 1, dv)."""
    return softmax_reference(q[:, :, :1], k, v)


# ---------------------------------------------------------------------------------------------------- XCA
def xca_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  temperature: Union[float, torch.Tensor] = 1.0, mask: Optional[torch.Tensor] = None,
                  eps: float = 1e-12) -> torch.Tensor:
    """XCiT's XCA: q, k l2-normalized over tokens (divisor max(‖·‖₂, eps)), A = softmax(q̂ᵀk̂ · τ) over key
    channels (d×d), out = (A vᵀ)ᵀ. ``temperature``: float or per-head (H, 1, 1). ``mask`` removes tokens."""
    q, k, v = _keep(q, mask), _keep(k, mask), _keep(v, mask)
    q_hat = q / torch.linalg.vector_norm(q, dim=-2, keepdim=True).clamp_min(eps)
    k_hat = k / torch.linalg.vector_norm(k, dim=-2, keepdim=True).clamp_min(eps)
    attn = torch.softmax((q_hat.transpose(-2, -1) @ k_hat) * temperature, dim=-1)  # (B, H, d, d)
    return (attn @ v.transpose(-2, -1)).transpose(-2, -1)


# ---------------------------------------------------------------------------------------------------- ELU
def elu_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                  eps: float = 1e-6) -> torch.Tensor:
    """Katharopoulos et al.: φ(x) = x + 1 (x > 0), eˣ (x ≤ 0); A = φ(q)φ(k)ᵀ (removed keys: 0), out = A v / (A 1 + eps)."""
    def phi(x):
        # exp of the non-positive part only (no overflow in the unused branch), differentiable at 0 from the left
        return torch.where(x > 0, x + 1, torch.exp(torch.where(x > 0, torch.zeros_like(x), x)))

    attn = phi(q) @ _keep(phi(k), mask).transpose(-2, -1)
    return (attn @ v) / (attn.sum(dim=-1, keepdim=True) + eps)


# ---------------------------------------------------------------------------------------------------- ReLU
def _positive_part(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0) with gradient 0 at x = 0, F.relu's subgradient there (clamp's gradient at its bound is not the same
    in every torch release)."""
    return torch.where(x > 0, x, torch.zeros_like(x))


#: h of "Replacing softmax with ReLU in Vision Transformers", each from its definition.
RELU_H = {
    "relu": _positive_part,
    "relu2": lambda x: _positive_part(x) ** 2,
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "softplus": lambda x: torch.logaddexp(x, torch.zeros_like(x)),
    "identity": lambda x: x,
    "relu6": lambda x: torch.where(x < 6, _positive_part(x), torch.full_like(x, 6.0)),
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
}


def relu_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, activation: str = "relu",
                   alpha: float = 1.0, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """α_ij = L^(-a) · h(q_iᵀk_j / √d), out = α v, with L the number of (kept) keys; removed keys get α = 0."""
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = RELU_H[activation](logits)
    if mask is None:
        length = torch.full((q.shape[0], 1, 1, 1), float(k.shape[-2]), dtype=q.dtype, device=q.device)
    else:
        length = mask.sum(dim=-1).clamp_min(1).to(q.dtype).reshape(-1, 1, 1, 1)
        weights = weights * mask[:, None, None, :].to(weights.dtype)
    return (weights * length ** -alpha) @ v


# ---------------------------------------------------------------------------------------------------- XNorm
def xnorm_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gamma_q: Union[float, torch.Tensor] = 1.0,
                    gamma_kv: Union[float, torch.Tensor] = 1.0, mask: Optional[torch.Tensor] = None,
                    eps: float = 1e-6) -> torch.Tensor:
    """UFO-ViT: XN(a) = γ a / (‖a‖₂ + eps); out = XN(Q) over each token's channels · XN(KᵀV) over each column's
    key channels. ``mask`` removes keys."""
    kv = _keep(k, mask).transpose(-2, -1) @ v  # (B, H, d, dv)
    q_n = gamma_q * q / (torch.linalg.vector_norm(q, dim=-1, keepdim=True) + eps)
    kv_n = gamma_kv * kv / (torch.linalg.vector_norm(kv, dim=-2, keepdim=True) + eps)
    return q_n @ kv_n


# ---------------------------------------------------------------------------------------------------- SOFT
def gaussian_kernel_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(-‖a_i − b_j‖² / (2√d)) from the explicit differences (B, H, Na, Nb, d)."""
    diff = a.unsqueeze(-2) - b.unsqueeze(-3)
    return torch.exp(-diff.square().sum(-1) / (2 * math.sqrt(a.shape[-1])))


def pool_landmarks_reference(x: torch.Tensor, grid_size: Tuple[int, int], ratio: int,
                             num_prefix_tokens: int = 0) -> torch.Tensor:
    """Mean of the grid tokens in each ratio×ratio window (windows clipped at the grid's edge), row-major."""
    gh, gw = grid_size
    grid = x[:, :, num_prefix_tokens:]
    out = []
    for top in range(0, gh, ratio):
        for left in range(0, gw, ratio):
            idx = [r * gw + c for r in range(top, min(top + ratio, gh)) for c in range(left, min(left + ratio, gw))]
            out.append(grid[:, :, idx].mean(dim=-2))
    return torch.stack(out, dim=-2)


def newton_inverse_reference(m: torch.Tensor, num_iters: int = 20, init: str = "released") -> torch.Tensor:
    """Newton–Raphson inverse V ← 2V − V P V of SOFT's landmark kernel M (symmetric, entries ≥ 0).

    ``init='released'`` (the released code's ``newton_inv``): P = M + 0.01·I, V₀ = αP with
    α = 0.9·2 / (max row sum of M)² per matrix. ``init='paper'``: P = M, V₀ = αM with α = 2βⁿ/‖M‖₁², β = ½, n the
    smallest integer ≥ 0 with ‖I − αM‖₁ ≤ 1 (‖·‖₁ = max column sum), searched up to n = 10.
    """
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    if init == "released":
        p = m + 0.01 * eye
        alpha = 0.9 * 2 / m.sum(dim=-1).max(dim=-1).values ** 2
        v = alpha[..., None, None] * p
    else:
        p = m
        norm1 = m.abs().sum(dim=-2).max(dim=-1).values
        flat_m = m.reshape(-1, *m.shape[-2:])
        alphas = []
        for mi, ni in zip(flat_m, norm1.reshape(-1)):
            for n in range(11):
                a = 2 * 0.5 ** n / ni ** 2
                if (eye - a * mi).abs().sum(dim=-2).max() <= 1 or n == 10:
                    alphas.append(a)
                    break
        v = torch.stack(alphas).reshape(m.shape[:-2])[..., None, None] * m
    for _ in range(num_iters):
        v = 2 * v - v @ p @ v
    return v


def soft_reference(q: torch.Tensor, v: torch.Tensor, grid_size: Tuple[int, int], *, ratio: int = 2,
                   num_prefix_tokens: int = 0, landmarks: Optional[torch.Tensor] = None,
                   num_iters: Optional[int] = 20, init: str = "released") -> torch.Tensor:
    """SOFT with Q = K: Ŝ = exp(Q⊖K̃) · inv(exp(Q̃⊖K̃)) · exp(Q̃⊖K), out = Ŝ V (quadratic, materialized).

    Landmarks Q̃ = K̃: ratio×ratio average pooling of the grid tokens, or ``landmarks`` (B, H, m, d) given in the
    kernel's unscaled space. The inverse: ``num_iters`` Newton–Raphson steps (:func:`newton_inverse_reference`),
    or with ``num_iters=None`` the exact inverse of what the iteration converges to (``torch.linalg.inv`` of
    M + 0.01·I for 'released', ``torch.linalg.pinv`` of M for 'paper').
    """
    lm = pool_landmarks_reference(q, grid_size, ratio, num_prefix_tokens) if landmarks is None else landmarks
    core = gaussian_kernel_reference(lm, lm)
    if num_iters is None:
        if init == "released":
            inv = torch.linalg.inv(core + 0.01 * torch.eye(core.shape[-1], dtype=core.dtype, device=core.device))
        else:
            inv = torch.linalg.pinv(core)
    else:
        inv = newton_inverse_reference(core, num_iters, init)
    s_hat = gaussian_kernel_reference(q, lm) @ inv @ gaussian_kernel_reference(lm, q)
    return s_hat @ v


# ---------------------------------------------------------------------------------------------------- Linformer
def linformer_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, proj_k: torch.Tensor,
                        proj_v: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Wang et al.: head = softmax(Q (E K)ᵀ / √d) (F V) with E, F (m, Nk) (or one per head, (H, m, Nk)) projecting
    the keys and values to m tokens; F = E when ``proj_v`` is None (key-value sharing)."""
    proj_v = proj_k if proj_v is None else proj_v
    k_proj = torch.matmul(proj_k, k)
    v_proj = torch.matmul(proj_v, v)
    weights = torch.exp((q @ k_proj.transpose(-2, -1)) / math.sqrt(q.shape[-1]))
    return (weights / weights.sum(-1, keepdim=True)) @ v_proj


def linformer_window_matrix_reference(grid_size: Tuple[int, int], ratio: int, weights: torch.Tensor,
                                      num_prefix_tokens: int = 0) -> torch.Tensor:
    """The (P + m, P + H·W) matrix E of a window projection: prefix tokens kept, then one row per ratio×ratio window
    of the grid (row-major, clipped at the edge) holding ``weights[r, c]`` at the window's token (r, c)."""
    gh, gw = grid_size
    rows = []
    n = num_prefix_tokens + gh * gw
    for p in range(num_prefix_tokens):
        row = torch.zeros(n, dtype=weights.dtype, device=weights.device)
        row[p] = 1
        rows.append(row)
    for top in range(0, gh, ratio):
        for left in range(0, gw, ratio):
            parts = []
            for r in range(top, min(top + ratio, gh)):
                for c in range(left, min(left + ratio, gw)):
                    onehot = torch.zeros(n, dtype=weights.dtype, device=weights.device)
                    onehot[num_prefix_tokens + r * gw + c] = 1
                    parts.append(weights[r - top, c - left] * onehot)
            rows.append(torch.stack(parts).sum(0))
    return torch.stack(rows)


# ---------------------------------------------------------------------------------------------------- Performer
def performer_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, features: torch.Tensor, *,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Choromanski et al., FAVOR+: with x' = x / d^¼ and random features w_1..w_m (rows of ``features``),
    φ(x) = exp(−‖x'‖²/2) / √m · (exp(w_1ᵀx'), …, exp(w_mᵀx')); A = φ(Q) φ(K)ᵀ (removed keys: 0), out = D⁻¹ A V with
    D = diag(A 1)."""
    def phi(x):
        x = x / x.shape[-1] ** 0.25
        logits = x @ features.transpose(-2, -1) - (x * x).sum(-1, keepdim=True) / 2
        return torch.exp(logits) / math.sqrt(features.shape[0])

    attn = phi(q) @ _keep(phi(k), mask).transpose(-2, -1)
    return (attn @ v) / attn.sum(-1, keepdim=True)


# ---------------------------------------------------------------------------------------------------- Nyströmformer
def _nystrom_pinv_reference(a: torch.Tensor, num_iters: int) -> torch.Tensor:
    """Razavi et al.'s iteration as the Nyströmformer paper writes it: Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞),
    Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(-2).max(-1).values  # max column sum
    norm_inf = a.abs().sum(-1).max(-1).values  # max row sum
    z = a.transpose(-2, -1) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(num_iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid_size: Tuple[int, int], *,
                      ratio: int = 2, num_prefix_tokens: int = 0, num_iters: int = 6) -> torch.Tensor:
    """Xiong et al. with SOFT's 2-D landmarks: Q̃, K̃ = ratio×ratio average pooling of the grid tokens of Q, K;
    out = softmax(QK̃ᵀ/√d) · pinv(softmax(Q̃K̃ᵀ/√d)) · softmax(Q̃Kᵀ/√d) · V, the pseudo-inverse by ``num_iters``
    steps of the paper's iteration."""
    def softmax_rows(logits):
        e = torch.exp(logits - logits.max(-1, keepdim=True).values)
        return e / e.sum(-1, keepdim=True)

    scale = 1 / math.sqrt(q.shape[-1])
    q_lm = pool_landmarks_reference(q, grid_size, ratio, num_prefix_tokens)
    k_lm = pool_landmarks_reference(k, grid_size, ratio, num_prefix_tokens)
    f = softmax_rows(q @ k_lm.transpose(-2, -1) * scale)
    a = softmax_rows(q_lm @ k_lm.transpose(-2, -1) * scale)
    b = softmax_rows(q_lm @ k.transpose(-2, -1) * scale)
    return f @ _nystrom_pinv_reference(a, num_iters) @ b @ v


# ---------------------------------------------------------------------------------------------------- Efficient
def efficient_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Shen et al.: E(Q, K, V) = ρ_q(Q) (ρ_k(K)ᵀ V), ρ_q a softmax over each query's channels, ρ_k a softmax over
    the (kept) tokens of each key channel."""
    eq = torch.exp(q - q.max(-1, keepdim=True).values)
    rho_q = eq / eq.sum(-1, keepdim=True)
    ek = torch.exp(k - k.max(-2, keepdim=True).values)
    if mask is not None:
        ek = ek * mask[:, None, :, None].to(ek.dtype)
    rho_k = ek / ek.sum(-2, keepdim=True)
    return rho_q @ (rho_k.transpose(-2, -1) @ v)


# ---------------------------------------------------------------------------------------------------- CosFormer
def _cosformer_angles(n: int, grid_size: Tuple[int, int], num_prefix_tokens: int,
                      dtype: torch.dtype, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column angles π/2 · (index + 1) / (H or W) of each token (prefix tokens: 0)."""
    gh, gw = grid_size
    rows = [0.0] * num_prefix_tokens + [math.pi / 2 * (t // gw + 1) / gh for t in range(gh * gw)]
    cols = [0.0] * num_prefix_tokens + [math.pi / 2 * (t % gw + 1) / gw for t in range(gh * gw)]
    assert len(rows) == n
    return torch.tensor(rows, dtype=dtype, device=device), torch.tensor(cols, dtype=dtype, device=device)


def cosformer_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        grid_size: Optional[Tuple[int, int]] = None, num_prefix_tokens: int = 0,
                        mask: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """Qin et al. with ReLU feature maps: A_ij = relu(q_i)·relu(k_j) (removed keys: 0); with ``grid_size`` the 2-D
    re-weighting of SimA's appendix A.4, A_ij · cos(α_i − α_j) · cos(β_i − β_j) with the row and column angles
    α, β = π/2 · index / (H or W) (1-based, as CosFormer's π i / 2M); out = A V / max(A 1, eps)."""
    attn = _positive_part(q) @ _keep(_positive_part(k), mask).transpose(-2, -1)
    if grid_size is not None:
        a, b = _cosformer_angles(q.shape[-2], grid_size, num_prefix_tokens, q.dtype, q.device)
        attn = attn * torch.cos(a[:, None] - a[None, :]) * torch.cos(b[:, None] - b[None, :])
    return (attn @ v) / attn.sum(-1, keepdim=True).clamp_min(eps)


# ---------------------------------------------------------------------------------------------------- Agent
__all__ += ["agent_pool_reference", "agent_bias_reference", "agent_reference", "sigmoid_reference"]


def _adaptive_windows(n_in: int, n_out: int):
    """Adaptive average pooling's windows: output i averages inputs ⌊i·n_in/n_out⌋ … ⌈(i+1)·n_in/n_out⌉ − 1."""
    return [(i * n_in // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def agent_pool_reference(x: torch.Tensor, grid_size: Tuple[int, int], pool_side: int,
                         num_prefix_tokens: int = 0) -> torch.Tensor:
    """Agent tokens: the grid tokens of x (B, H, N, d) averaged over adaptive windows into a pool_side×pool_side
    grid (overlapping windows where the token grid is smaller), row-major → (B, H, pool_side², d)."""
    gh, gw = grid_size
    grid = x[:, :, num_prefix_tokens:]
    out = []
    for r0, r1 in _adaptive_windows(gh, pool_side):
        for c0, c1 in _adaptive_windows(gw, pool_side):
            idx = [r * gw + c for r in range(r0, r1) for c in range(c0, c1)]
            out.append(grid[:, :, idx].mean(dim=-2))
    return torch.stack(out, dim=-2)


def _linear_resize_matrix(n_in: int, n_out: int, like: torch.Tensor) -> torch.Tensor:
    """(n_out, n_in) linear interpolation with half-pixel centres: output i samples the input at
    x = (i + ½)·n_in/n_out − ½ (at least 0), weighting its two neighbours by distance."""
    m = torch.zeros(n_out, n_in, dtype=like.dtype, device=like.device)
    for i in range(n_out):
        x = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
        lo = int(math.floor(x))
        hi = min(lo + 1, n_in - 1)
        m[i, lo] += 1 - (x - lo)
        m[i, hi] += x - lo
    return m


def agent_bias_reference(block: torch.Tensor, row: torch.Tensor, col: torch.Tensor,
                         prefix_bias: Optional[torch.Tensor], grid_size: Tuple[int, int],
                         num_prefix_tokens: int = 0) -> torch.Tensor:
    """One side's agent bias (H, n, P + gh·gw), the paper's three parts: at grid token (r, c) the block bias
    (H, n, b, b) bilinearly resized to the grid, plus the row bias at r and the column bias at c ((H, n, window),
    linearly resized to gh and gw); ``prefix_bias`` (H, n, 1) at each of the P prefix tokens."""
    gh, gw = grid_size
    block = _linear_resize_matrix(block.shape[-2], gh, block) @ block \
        @ _linear_resize_matrix(block.shape[-1], gw, block).transpose(0, 1)
    rows = row @ _linear_resize_matrix(row.shape[-1], gh, row).transpose(0, 1)
    cols = col @ _linear_resize_matrix(col.shape[-1], gw, col).transpose(0, 1)
    grid = torch.stack([block[..., r, c] + rows[..., r] + cols[..., c] for r in range(gh) for c in range(gw)], -1)
    return torch.cat([prefix_bias] * num_prefix_tokens + [grid], dim=-1)


def agent_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid_size: Tuple[int, int], *,
                    pool_side: int = 7, num_prefix_tokens: int = 0, agents: Optional[torch.Tensor] = None,
                    agent_bias: Optional[torch.Tensor] = None, query_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Han et al.: agents A = adaptive average pooling of Q's grid to pool_side² tokens (or ``agents``);
    V_A = σ(A Kᵀ/√d + B₁) V, out = σ(Q Aᵀ/√d + B₂) V_A with σ the softmax of each row, B₁ = ``agent_bias`` (n × Nk),
    B₂ = ``query_bias`` (Nq × n), 0 when None."""
    def softmax_rows(logits):
        e = torch.exp(logits - logits.max(-1, keepdim=True).values)
        return e / e.sum(-1, keepdim=True)

    a = agent_pool_reference(q, grid_size, pool_side, num_prefix_tokens) if agents is None else agents
    scale = 1 / math.sqrt(q.shape[-1])
    b1 = 0 if agent_bias is None else agent_bias
    b2 = 0 if query_bias is None else query_bias
    agent_v = softmax_rows(a @ k.transpose(-2, -1) * scale + b1) @ v
    return softmax_rows(q @ a.transpose(-2, -1) * scale + b2) @ agent_v


# ---------------------------------------------------------------------------------------------------- Sigmoid
def sigmoid_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[float] = None,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Ramapuram et al.: out = σ(Q Kᵀ/√d + b) V with σ(x) = 1 / (1 + e⁻ˣ) on every entry and b = −log n, n the
    number of (kept) keys, unless ``bias`` gives b; removed keys get weight 0."""
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if bias is None:
        n = torch.full((q.shape[0],), float(k.shape[-2]), dtype=q.dtype, device=q.device) if mask is None \
            else mask.sum(dim=-1).clamp_min(1).to(q.dtype)
        bias = -torch.log(n).reshape(-1, 1, 1, 1)
    weights = 1 / (1 + torch.exp(-(logits + bias)))
    if mask is not None:
        weights = weights * mask[:, None, None, :].to(weights.dtype)
    return weights @ v


# ---------------------------------------------------------------------------------------------------- FLatten, InLine, SLAB, PolaFormer
__all__ += ["flatten_reference", "inline_reference", "slab_reference", "polaformer_reference"]


def flatten_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, focusing_factor: float = 3.0,
                      scale: Union[float, torch.Tensor] = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """Han et al. (ICCV 2023): φ(x) = f_p((ReLU(x) + 1e-6) / s), f_p(y) = ‖y‖ / ‖y^p‖ · y^p with the norms over all
    H·d channels of a token (the released code's layout); A = φ(Q)φ(K)ᵀ, out = A V / (A 1 + N·eps), which is the
    released φ(q)(φ(K)ᵀV)/N / (φ(q)·mean φ(K) + eps). ``scale``: a number or (1, H, 1, d)."""
    def phi(x):
        y = (_positive_part(x) + 1e-6) / scale
        B, H, N, d = y.shape
        tokens = y.transpose(1, 2).reshape(B, N, H * d)
        powered = tokens ** focusing_factor
        mapped = powered * torch.linalg.vector_norm(tokens, dim=-1, keepdim=True) \
            / torch.linalg.vector_norm(powered, dim=-1, keepdim=True)
        return mapped.reshape(B, N, H, d).transpose(1, 2)

    attn = phi(q) @ phi(k).transpose(-2, -1)
    return (attn @ v) / (attn.sum(-1, keepdim=True) + k.shape[-2] * eps)


def inline_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     scale: Optional[float] = None) -> torch.Tensor:
    """Han et al. (NeurIPS 2024), injective linear attention with φ(x) = x·√(s/N), s = d^-½ (the released DeiT's):
    w_ij = φ(q_i)ᵀφ(k_j) − 1/N Σ_m φ(q_i)ᵀφ(k_m) + 1/N (each row sums to 1), out = W V. Without the local branch."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    n = k.shape[-2]
    logits = (q @ k.transpose(-2, -1)) * (s / n)
    return (logits - logits.mean(-1, keepdim=True) + 1.0 / n) @ v


def slab_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Guo et al. (ICML 2024), simplified linear attention without its conv: A = ReLU(Q)ReLU(K)ᵀ,
    out = A V / (A 1 + eps)."""
    attn = _positive_part(q) @ _positive_part(k).transpose(-2, -1)
    return (attn @ v) / (attn.sum(-1, keepdim=True) + eps)


def polaformer_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, power: Union[float, torch.Tensor],
                         scale: Union[float, torch.Tensor] = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """Meng et al. (ICLR 2025), polarity-aware linear attention without its conv and gate: with q, k divided by s,
    x⁺ = max(x, 0)^p and x⁻ = max(−x, 0)^p (p per channel), the same-sign weights A_s = q⁺k⁺ᵀ + q⁻k⁻ᵀ weight the
    first half of V's channels, the opposite-sign A_o = q⁺k⁻ᵀ + q⁻k⁺ᵀ the second; each out = A V / (A 1 + N·eps),
    the released φ(q)(φ(K)ᵀV)/N / (φ(q)·mean φ(K) + eps). ``power``, ``scale``: numbers or (1, H, 1, d)."""
    q, k = q / scale, k / scale
    q_pos, q_neg = _positive_part(q) ** power, _positive_part(-q) ** power
    k_pos, k_neg = _positive_part(k) ** power, _positive_part(-k) ** power
    same = q_pos @ k_pos.transpose(-2, -1) + q_neg @ k_neg.transpose(-2, -1)
    opposite = q_pos @ k_neg.transpose(-2, -1) + q_neg @ k_pos.transpose(-2, -1)
    n, half = k.shape[-2], v.shape[-1] // 2
    out_same = (same @ v[..., :half]) / (same.sum(-1, keepdim=True) + n * eps)
    out_opposite = (opposite @ v[..., half:]) / (opposite.sum(-1, keepdim=True) + n * eps)
    return torch.cat([out_same, out_opposite], dim=-1)
