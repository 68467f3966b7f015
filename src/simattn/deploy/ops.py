"""The one table of exp-like ops, and the audit of a graph's ops against it.

SimA with a ReLU MLP evaluates no exponential at inference; the exp-free audit proves it on what is deployed. One
table serves every naming scheme: ATen ops (a captured program, or the kernels :mod:`simattn.bench.counters` sees
dispatched), ONNX op types (default, ``com.microsoft`` and quantized domains), OpenVINO op types and TFLite builtin
operators. Names are compared without case and underscores (``LogSoftmax`` = ``_log_softmax``); ``hard*`` ops
(piecewise linear) and relu are not exp-like.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

__all__ = ["EXP_LIKE", "FUSED_ATTENTION", "exp_like", "exp_like_ops", "aten_op_counts", "GraphAudit",
           "ExpFreeError"]

#: category → op names that evaluate exp-like functions. ``exp``: explicit exponentials; ``softmax``: softmax,
#: log-sum-exp and attention kernels (:data:`FUSED_ATTENTION` too); ``activation``: erf for exact GELU, tanh for the
#: tanh GELU, and the sigmoid/ELU/softplus family, each one evaluation per output element.
EXP_LIKE: Dict[str, tuple] = {
    "exp": ("exp", "exp2", "expm1", "sinh", "cosh"),
    "softmax": ("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "logsumexp",
                "ReduceLogSumExp", "SoftmaxCrossEntropyLoss", "BiasSoftmax", "QLinearSoftmax", "Attention",
                "MultiHeadAttention", "GroupQueryAttention", "QAttention"),
    "activation": ("erf", "erfc", "gelu", "gelu_backward", "FastGelu", "BiasGelu", "QuickGelu", "GemmFastGelu",
                   "tanh", "sigmoid", "logistic", "QLinearSigmoid", "silu", "swish", "mish", "elu", "celu", "selu",
                   "softplus", "log_sigmoid_forward", "glu"),
}

#: Fused attention kernels (forward and backward): each evaluates B·H·Nq·Nk exps (the backward recomputes them).
FUSED_ATTENTION = frozenset((
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
    "_flash_attention_forward", "_efficient_attention_forward", "_flash_attention_backward",
    "_efficient_attention_backward", "ScaledDotProductAttention",
))


def _key(name: str) -> str:
    return name.replace("_", "").lower()


_INDEX: Dict[str, str] = {_key(n): category for category, names in EXP_LIKE.items() for n in names}
_INDEX.update({_key(n): "softmax" for n in FUSED_ATTENTION})


def exp_like(name: str) -> Optional[str]:
    """The category (``'exp'``, ``'softmax'``, ``'activation'``) of an op name in any of the naming schemes, or
    None when the op evaluates no exp-like function."""
    return _INDEX.get(_key(name))


def exp_like_ops(counts: Mapping[str, int]) -> Dict[str, int]:
    """The exp-like entries of op counts."""
    return {op: n for op, n in counts.items() if exp_like(op)}


def aten_op_counts(program) -> Dict[str, int]:
    """Calls per op (``linear``, ...) in an exported program's graph, overloads merged."""
    counts: Counter = Counter()
    for node in program.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name.split(".")[0]] += 1
    return dict(sorted(counts.items()))


class ExpFreeError(RuntimeError):
    """The graph was required to be exp-free but contains exp-like ops."""


@dataclass
class GraphAudit:
    """Op counts of a whole graph (``kind`` names what the ops are: ONNX, ATen, ...), the exp-like ones, the
    calls of local functions that were expanded (ONNX), and ``scope``: what the counts take in beyond the main
    graph, for the printed heading (empty: the main graph alone)."""

    op_counts: Dict[str, int]
    kind: str = "graph"
    functions: Dict[str, int] = field(default_factory=dict)
    scope: str = ""

    @property
    def exp_like(self) -> Dict[str, int]:
        return dict(sorted(exp_like_ops(self.op_counts).items()))

    @property
    def exp_count(self) -> int:
        return sum(self.exp_like.values())

    @property
    def total_ops(self) -> int:
        return sum(self.op_counts.values())

    def to_dict(self) -> Dict[str, object]:
        return {"ops": self.kind, "total_ops": self.total_ops, "exp_like_count": self.exp_count,
                "exp_like": self.exp_like, "op_counts": self.op_counts, "functions_called": self.functions}

    def format(self) -> str:
        """A small table: op, count, marked '*' when exp-like."""
        width = max((len(op) for op in self.op_counts), default=2)
        exp = self.exp_like
        lines = [f"  {op:<{width}} {n:>5}{'  * exp-like' if op in exp else ''}"
                 for op, n in sorted(self.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        found = f" ({self.describe_exp_like()})" if exp else ""
        lines.append(f"  {'total':<{width}} {self.total_ops:>5}; exp-like ops: {self.exp_count}{found}")
        return "\n".join(lines)

    def describe_exp_like(self) -> str:
        """'Erf×2, Softmax×2' (empty when exp-free)."""
        return ", ".join(f"{op}×{n}" for op, n in self.exp_like.items())

    def require_exp_free(self, what: str = "model") -> None:
        """Raise :class:`ExpFreeError` naming the exp-like ops if there are any."""
        if self.exp_like:
            raise ExpFreeError(f"{what} is not exp-free: the {self.kind} graph contains {self.describe_exp_like()}")
