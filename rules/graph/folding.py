"""Nodes that compute constants (shapes, masks, index ranges) folded into their values.

Exporters leave shape arithmetic in the graph: ``Shape -> Gather -> Concat -> Reshape``,
``ConstantOfShape``, ``Range``, ``Equal -> Where``. On constants these are evaluated once,
by onnx's reference evaluator, in the types the graph gives them; the importer then sees
only their values. On a tensor computed from the network input, an operator here is an
error naming the node (``Shape``, ``Size``, ``Expand`` and ``Where`` have converters for
that case). Operators with a converter (Pow, Add, ...) are folded by it.
"""

from __future__ import annotations

import numpy as np
import onnx

FOLDED = frozenset(
    {
        "And",
        "ConstantOfShape",
        "Equal",
        "Expand",
        "Greater",
        "Less",
        "Not",
        "Or",
        "Range",
        "Shape",
        "Size",
        "Sqrt",
        "Tile",
        "Where",
    }
)
"""Operators evaluated when every input is a constant."""


def fold(
    proto: onnx.NodeProto,
    inputs: list[np.ndarray | None],
    kinds: list[np.dtype | None],
    floats: type,
) -> list[np.ndarray]:
    """The node's outputs on constant ``inputs``, each given in its graph type ``kinds``
    (None: a float); floating-point inputs are evaluated as ``floats`` (float64 over the
    reals, the declared type otherwise)."""
    from onnx.reference import ReferenceEvaluator  # imported when a graph needs it: 0.3 s

    feeds = {}
    for name, value, kind in zip(proto.input, inputs, kinds, strict=True):
        if not name or value is None:
            continue
        typed = np.dtype(floats) if kind is None or kind.kind == "f" else kind
        feeds[name] = np.asarray(value).astype(typed)
    outputs = ReferenceEvaluator(proto).run(None, feeds)
    return [np.asarray(out) for out in outputs]
