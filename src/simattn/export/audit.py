"""Graph audit: count every op in an ONNX model and list the ones that compute an exponential.

SimA with a ReLU MLP has no exp at inference; this audit proves it on the deployed artifact rather than on the
Python source. Ops are counted inside ONNX local functions (expanded at each call site) and inside control-flow
subgraphs (If/Loop/Scan bodies), so nothing hides behind a function call.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Union

__all__ = ["EXP_LIKE_OPS", "GraphAudit", "audit_onnx", "ExpFreeError"]

#: Op types whose evaluation involves exp (directly or through tanh/sigmoid/erf-style kernels), in the default,
#: ``com.microsoft`` and quantized domains.
EXP_LIKE_OPS = frozenset({
    "Exp", "Softmax", "LogSoftmax", "ReduceLogSumExp", "SoftmaxCrossEntropyLoss",
    "Erf", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "GemmFastGelu",
    "Tanh", "Sigmoid", "Swish", "Mish", "Softplus", "Elu", "Selu", "Celu", "Sinh", "Cosh",
    "BiasSoftmax", "Attention", "MultiHeadAttention", "GroupQueryAttention", "QLinearSigmoid", "QLinearSoftmax",
    "QAttention",
})


class ExpFreeError(RuntimeError):
    """The graph was required to be exp-free but contains exp-like ops."""


@dataclass
class GraphAudit:
    """Op counts of a whole ONNX model (functions expanded, subgraphs included)."""

    op_counts: Dict[str, int]
    exp_like: Dict[str, int]
    functions: Dict[str, int] = field(default_factory=dict)

    @property
    def exp_count(self) -> int:
        return sum(self.exp_like.values())

    @property
    def total_ops(self) -> int:
        return sum(self.op_counts.values())

    def to_dict(self) -> Dict[str, object]:
        return {"total_ops": self.total_ops, "exp_like_count": self.exp_count, "exp_like": self.exp_like,
                "op_counts": self.op_counts, "functions_called": self.functions}

    def format(self) -> str:
        """A small table: op, count, marked '*' when exp-like."""
        width = max((len(op) for op in self.op_counts), default=2)
        lines = [f"  {op:<{width}} {n:>5}{'  * exp-like' if op in self.exp_like else ''}"
                 for op, n in sorted(self.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        found = f" ({self.describe_exp_like()})" if self.exp_like else ""
        lines.append(f"  {'total':<{width}} {self.total_ops:>5}; exp-like ops: {self.exp_count}{found}")
        return "\n".join(lines)

    def describe_exp_like(self) -> str:
        """'Erf×2, Softmax×2' (empty when exp-free)."""
        return ", ".join(f"{op}×{n}" for op, n in sorted(self.exp_like.items()))

    def require_exp_free(self, what: str = "model") -> None:
        """Raise :class:`ExpFreeError` naming the exp-like ops if there are any."""
        if self.exp_like:
            raise ExpFreeError(f"{what} is not exp-free: the ONNX graph contains {self.describe_exp_like()}")


def audit_onnx(model: Union[str, Path, Any]) -> GraphAudit:
    """Count the ops of an ONNX model (a path or an ``onnx.ModelProto``); local functions are expanded at each
    call."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False) if isinstance(model, (str, Path)) else model
    local_functions = {(f.domain, f.name): f for f in proto.functions}
    counts: Counter = Counter()
    calls: Counter = Counter()

    def visit(nodes, stack=()):
        for node in nodes:
            key = (node.domain, node.op_type)
            if key in local_functions:
                if key in stack:  # ONNX forbids recursion; guard anyway rather than loop forever
                    raise ValueError(f"recursive ONNX function {node.op_type}")
                calls[node.op_type] += 1
                visit(local_functions[key].node, stack + (key,))
                continue
            counts[node.op_type] += 1
            for attr in node.attribute:  # control-flow bodies
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g.node, stack)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        visit(g.node, stack)

    visit(proto.graph.node)
    exp_like = {op: n for op, n in counts.items() if op in EXP_LIKE_OPS}
    return GraphAudit(op_counts=dict(sorted(counts.items())), exp_like=dict(sorted(exp_like.items())),
                      functions=dict(sorted(calls.items())))
