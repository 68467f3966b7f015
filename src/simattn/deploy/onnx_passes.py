"""Rewrites of an exported ONNX graph into the forms onnxruntime runs fastest, each a pass on one
:class:`GraphIndex`. Every pass keeps the standard ops and the values (up to rounding) and returns how many places
it rewrote; :func:`run_passes` runs them all in order, with one onnx shape inference for the whole run.

- :func:`order_gelu_for_onnxruntime`: exact GELU in the order onnxruntime's Gelu fusion recognizes;
- :func:`linears_as_gemm`: ``MatMul(x, W) + b`` as one Gemm with its bias;
- :func:`fused_projection_as_three_gemms`: a fused q/k/v projection unbound into three heads as three Gemms.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

__all__ = ["GraphIndex", "PASSES", "run_passes", "order_gelu_for_onnxruntime", "linears_as_gemm",
           "fused_projection_as_three_gemms"]


class GraphIndex:
    """An ONNX model's main graph, indexed for rewriting: the node that makes each tensor (``producers``), the
    initializers by name, the nodes that read each tensor (``readers``), the graph's outputs, and each tensor's
    dims as onnx shape inference knows them (``dims``, inferred once, on first use). A pass that changes the nodes
    calls :meth:`replace` or :meth:`refresh`, so the next one reads a current index; the inferred dims are those of
    the graph as exported, which the passes only ask of tensors the export made."""

    def __init__(self, proto) -> None:
        self.proto, self.graph = proto, proto.graph
        self._dims: Optional[Dict[str, List[Optional[int]]]] = None
        self.refresh()

    def refresh(self) -> None:
        """Index the graph's nodes again (after a pass changed them)."""
        graph = self.graph
        self.producers = {out: node for node in graph.node for out in node.output}
        self.initializers = {init.name: init for init in graph.initializer}
        self.readers: Dict[str, List[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}

    @property
    def dims(self) -> Dict[str, List[Optional[int]]]:
        """Each tensor's dims as onnx shape inference knows them (None where a dim is symbolic); empty when
        inference fails, as the passes that ask only use what it knows."""
        if self._dims is None:
            import onnx

            try:
                # data_prop: shapes computed from Shape/Concat (dynamic-size exports) become known where their
                # parts are
                inferred = onnx.shape_inference.infer_shapes(self.proto, data_prop=True).graph
            except Exception:
                self._dims = {}
            else:
                self._dims = {v.name: [d.dim_value if d.HasField("dim_value") else None
                                       for d in v.type.tensor_type.shape.dim]
                              for v in [*inferred.value_info, *inferred.input] if v.type.tensor_type.HasField("shape")}
        return self._dims

    def constant(self, name: Optional[str]):
        """The value of a tensor that is an initializer or a Constant node's output, else None."""
        from onnx import numpy_helper

        if name is None:
            return None
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producers.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def input_constant(self, node, j: int):
        """The constant value of ``node``'s j-th input, None where it has none or it is not constant."""
        return self.constant(node.input[j]) if len(node.input) > j and node.input[j] else None

    def only_reader(self, name: str, op_type: str, keep_outputs: bool = False):
        """The node that alone reads tensor ``name``, if it is an ``op_type`` (and, ``keep_outputs``, ``name`` is
        not a graph output, which a rewrite must leave as it is); else None."""
        nodes = self.readers.get(name, [])
        if keep_outputs and name in self.outputs:
            return None
        return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op_type else None

    def add_constant(self, value: np.ndarray, name: str) -> str:
        from onnx import numpy_helper

        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def replace(self, replaced: Dict[int, List[Any]], dropped: set) -> None:
        """Put each node's replacement list in its place (keeping the topological order), leave out ``dropped``,
        and index the graph again."""
        graph = self.graph
        nodes = [n for node in graph.node if id(node) not in dropped for n in replaced.get(id(node), [node])]
        del graph.node[:]
        graph.node.extend(nodes)
        self.refresh()

    def drop_unread(self) -> None:
        """Remove the nodes whose outputs nothing reads (the graph's outputs count as read), then the initializers
        nothing reads that are not graph inputs."""
        graph = self.graph
        read = set(self.outputs)
        kept = []
        for node in reversed(graph.node):
            if any(out in read for out in node.output):
                kept.append(node)
                read |= _names_read(node)
        kept.reverse()
        inputs = {i.name for i in graph.input}
        initializers = [init for init in graph.initializer if init.name in read or init.name in inputs]
        del graph.node[:]
        graph.node.extend(kept)
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        self.refresh()


def _names_read(node) -> set:
    """The tensor names ``node`` reads, its subgraphs' (If/Loop/Scan bodies) included."""
    from onnx import AttributeProto

    names = set(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == AttributeProto.GRAPH else \
                attr.graphs if attr.type == AttributeProto.GRAPHS else []:
            for inner in sub.node:
                names |= _names_read(inner)
    return names


def order_gelu_for_onnxruntime(index: GraphIndex) -> int:
    """Reorder exact GELU, written ``x · (0.5 · (1 + erf(x / √2)))`` by the exporter, as
    ``(x · (1 + erf(x / √2))) · 0.5``, the order onnxruntime's Gelu fusion recognizes (it then runs one Gelu or
    BiasGelu kernel instead of five elementwise passes; the same standard ops, the same value up to one rounding).
    Returns how many were reordered."""
    count = 0
    for erf in [node for node in index.graph.node if node.op_type == "Erf"]:
        div = index.producers.get(erf.input[0])
        add = index.only_reader(erf.output[0], "Add")
        half = add and index.only_reader(add.output[0], "Mul")
        outer = half and index.only_reader(half.output[0], "Mul")
        if div is None or div.op_type != "Div" or outer is None or div.input[0] not in outer.input:
            continue
        other = [name for name in half.input if name != add.output[0]]
        value = index.constant(other[0]) if len(other) == 1 else None
        if value is None or value.size != 1 or float(value.reshape(())) != 0.5:
            continue
        half.input[:] = [div.input[0], add.output[0]]  # x · (1 + erf)
        outer.input[:] = [half.output[0], other[0]]  # · 0.5
        count += 1
    if count:
        index.refresh()
    return count


def linears_as_gemm(index: GraphIndex) -> int:
    """Rewrite each linear layer the exporter wrote as ``MatMul(x, W) + b`` (W a 2-D constant, b a 1-D constant,
    x of any rank) as ``Reshape(Gemm(Flatten(x), W, b), x's leading dims + [out])``: one GEMM with its bias instead
    of a product and a separate pass over the output to add the bias. Static int8 then quantizes it into
    onnxruntime's QGemm, which adds the bias inside the int8 kernel (MatMulIntegerToFloat, made from a quantized
    MatMul, leaves the add as its own pass). Returns how many were rewritten."""
    from onnx import helper

    dims = index.dims  # inferred before the rewrite below adds to the graph
    replaced: Dict[int, List[Any]] = {}  # id(MatMul node) → the nodes in its place; the Add goes
    dropped = set()
    for node in index.graph.node:
        if node.op_type != "MatMul" or node.output[0] in index.outputs:
            continue
        weight = index.constant(node.input[1])
        add = index.only_reader(node.output[0], "Add")
        if weight is None or weight.ndim != 2 or add is None:
            continue
        bias_name = next((i for i in add.input if i != node.output[0]), None)
        bias = index.constant(bias_name)
        if bias is None or bias.shape != (weight.shape[1],) or list(add.input).count(node.output[0]) != 1:
            continue
        base = node.output[0]
        rewritten = [
            helper.make_node("Flatten", [node.input[0]], [f"{base}_2d"], name=f"{node.name}_flatten", axis=-1),
            helper.make_node("Gemm", [f"{base}_2d", node.input[1], bias_name], [f"{base}_gemm"],
                             name=f"{node.name}_gemm")]
        # x's leading dims: a fixed-size export reshapes to constants, no Shape/Concat
        lead = dims.get(node.input[0])
        if lead and len(lead) >= 2 and None not in lead[1:-1]:  # only the first dim unknown: -1 stands for it
            index.add_constant(np.array([-1, *lead[1:-1], weight.shape[1]], np.int64), f"{base}_shape")
        else:
            index.add_constant(np.array([weight.shape[1]], np.int64), f"{base}_out")
            rewritten += [
                helper.make_node("Shape", [node.input[0]], [f"{base}_lead"], name=f"{node.name}_lead", end=-1),
                helper.make_node("Concat", [f"{base}_lead", f"{base}_out"], [f"{base}_shape"],
                                 name=f"{node.name}_shape", axis=0)]
        replaced[id(node)] = rewritten + [helper.make_node("Reshape", [f"{base}_gemm", f"{base}_shape"],
                                                           [add.output[0]], name=f"{node.name}_reshape")]
        dropped.add(id(add))
    if replaced:
        index.replace(replaced, dropped)
    return len(replaced)


def _head_pieces(index: GraphIndex, tensor: str) -> Optional[Dict[int, Tuple[List[Any], str]]]:
    """How a (3, ...) tensor is unbound along axis 0, as the exporters write ``unbind(0)``: for each index i, the
    nodes that take piece i (Slice [i, i+1) then Squeeze, or Gather of the scalar i) and the name of piece i with
    the axis dropped. None unless the tensor's only readers take pieces 0, 1 and 2 once each."""
    pieces: Dict[int, Tuple[List[Any], str]] = {}
    for node in index.readers.get(tensor, []):
        if node.op_type == "Gather" and node.input[0] == tensor:
            position = index.input_constant(node, 1)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if position is None or position.ndim != 0 or axis != 0:
                return None
            nodes, out, i = [node], node.output[0], int(position)
        elif node.op_type == "Slice" and node.input[0] == tensor and len(node.input) in (4, 5):
            start, end, axes = (index.input_constant(node, j) for j in (1, 2, 3))
            step = index.input_constant(node, 4) if len(node.input) == 5 else np.ones(1, np.int64)
            squeeze = index.only_reader(node.output[0], "Squeeze")
            dropped = index.input_constant(squeeze, 1) if squeeze is not None else None
            if any(v is None or v.size != 1 for v in (start, end, axes, step, dropped)):
                return None
            i = int(start.reshape(()))
            if (int(axes.reshape(())), int(end.reshape(())), int(step.reshape(())), int(dropped.reshape(()))) \
                    != (0, i + 1, 1, 0):
                return None
            nodes, out = [node, squeeze], squeeze.output[0]
        else:
            return None
        if i in pieces:
            return None
        pieces[i] = (nodes, out)
    return pieces if sorted(pieces) == [0, 1, 2] else None


def _fused_projection(index: GraphIndex, gemm) -> Optional[Tuple[Any, ...]]:
    """(weight, bias, flat, split, permute, heads, 5-D shape or None, pieces) when ``gemm`` is a fused q/k/v
    projection that is reshaped back to x's leading dims, to (B, N, 3, H, d), permuted (2, 0, 3, 1, 4) and
    unbound; else None."""
    if gemm.op_type != "Gemm" or len(gemm.input) != 3 or gemm.attribute:
        return None
    weight, bias = index.constant(gemm.input[1]), index.constant(gemm.input[2])
    if weight is None or bias is None or weight.ndim != 2 or weight.shape[1] % 3 or bias.shape != (weight.shape[1],):
        return None
    flat = index.only_reader(gemm.output[0], "Reshape", keep_outputs=True)  # back to x's leading dims (B, N, 3C)
    split = flat and index.only_reader(flat.output[0], "Reshape", keep_outputs=True)  # (B, N, 3, H, d)
    permute = split and index.only_reader(split.output[0], "Transpose", keep_outputs=True)
    perm = permute and next((list(a.ints) for a in permute.attribute if a.name == "perm"), None)
    if perm != [2, 0, 3, 1, 4]:
        return None
    shape = index.constant(split.input[1])
    heads = list(shape[2:]) if shape is not None and shape.shape == (5,) else index.dims.get(split.output[0], [])[2:]
    if len(heads) != 3 or heads[0] != 3 or None in heads or heads[1] * heads[2] != weight.shape[1] // 3:
        return None
    pieces = _head_pieces(index, permute.output[0])
    return None if pieces is None else (weight, bias, flat, split, permute, heads, shape, pieces)


def fused_projection_as_three_gemms(index: GraphIndex) -> int:
    """Rewrite each fused q/k/v projection, ``Gemm(x, W, b)`` (from :func:`linears_as_gemm`) reshaped to
    (B, N, 3, H, d), permuted (2, 0, 3, 1, 4) and unbound into q, k and v, as three Gemms on W's and b's column
    thirds, each reshaped to (B, N, H, d) and transposed to (B, H, N, d). The same values and the same transposed
    bytes, without the copy that slicing the permuted tensor into three makes (onnxruntime runs it as a Split);
    static int8 quantizes the three Gemms from one quantized x. Returns how many were rewritten."""
    from onnx import helper

    replaced: Dict[int, List[Any]] = {}
    dropped = set()
    for gemm in index.graph.node:
        found = _fused_projection(index, gemm)
        if found is None:
            continue
        weight, bias, flat, split, permute, heads, shape, pieces = found
        base = gemm.output[0]
        flatten = index.producers.get(gemm.input[0])
        if shape is not None and 0 not in shape:  # (B, N, H, d) with the export's own -1 or batch
            index.add_constant(shape[[0, 1, 3, 4]].astype(np.int64), f"{base}_heads")
            nodes = []
        elif flatten is not None and flatten.op_type == "Flatten" and \
                next((a.i for a in flatten.attribute if a.name == "axis"), 1) == -1:  # x's leading dims + (H, d)
            index.add_constant(np.array(heads[1:], np.int64), f"{base}_head_dims")
            nodes = [helper.make_node("Shape", [flatten.input[0]], [f"{base}_lead"], name=f"{gemm.name}_lead", end=-1),
                     helper.make_node("Concat", [f"{base}_lead", f"{base}_head_dims"], [f"{base}_heads"],
                                      name=f"{gemm.name}_heads", axis=0)]
        else:
            continue
        width = weight.shape[1] // 3
        for i, (taken, out) in sorted(pieces.items()):
            index.add_constant(np.ascontiguousarray(weight[:, i * width:(i + 1) * width]), f"{base}_w{i}")
            index.add_constant(np.ascontiguousarray(bias[i * width:(i + 1) * width]), f"{base}_b{i}")
            nodes += [
                helper.make_node("Gemm", [gemm.input[0], f"{base}_w{i}", f"{base}_b{i}"], [f"{base}_{i}"],
                                 name=f"{gemm.name}_{i}"),
                helper.make_node("Reshape", [f"{base}_{i}", f"{base}_heads"], [f"{base}_{i}_heads"],
                                 name=f"{gemm.name}_{i}_reshape"),
                helper.make_node("Transpose", [f"{base}_{i}_heads"], [out], name=f"{gemm.name}_{i}_transpose",
                                 perm=[0, 2, 1, 3])]
            dropped |= {id(node) for node in taken}
        replaced[id(split)] = nodes  # where x and the 5-D shape are both made
        dropped |= {id(gemm), id(flat), id(permute)}
    if replaced:
        index.replace(replaced, dropped)
        index.drop_unread()  # the fused W and b, and the 5-D shape where it was computed
    return len(replaced)


#: the passes :func:`run_passes` runs, in order (the q/k/v split reads the Gemms the linear pass writes)
PASSES: Tuple[Callable[[GraphIndex], int], ...] = (order_gelu_for_onnxruntime, linears_as_gemm,
                                                   fused_projection_as_three_gemms)


def run_passes(proto, passes: Iterable[Callable[[GraphIndex], int]] = PASSES) -> Dict[str, int]:
    """Run ``passes`` on ``proto`` (in place) over one index and one shape inference; how many places each
    rewrote, by pass name."""
    index = GraphIndex(proto)
    return {rewrite.__name__: rewrite(index) for rewrite in passes}
