"""Small ONNX models built here with the onnx helper API (no downloads)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(layers: list[tuple[np.ndarray, np.ndarray]], dtype=np.float64) -> bytes:
    """Gemm layers (weights (in, out), bias (out,)) with Relu between them."""
    elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    nodes, inits = [], []
    current = "x"
    for i, (w, b) in enumerate(layers):
        inits += [
            numpy_helper.from_array(w.astype(dtype), f"w{i}"),
            numpy_helper.from_array(b.astype(dtype), f"b{i}"),
        ]
        out = f"h{i}" if i < len(layers) - 1 else "y"
        nodes.append(
            helper.make_node(
                "Gemm", [current, f"w{i}", f"b{i}"], [f"z{i}" if i < len(layers) - 1 else out]
            )
        )
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [f"z{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", elem, ["n", layers[0][0].shape[0]])],
        [helper.make_tensor_value_info("y", elem, ["n", layers[-1][0].shape[1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """The same network in numpy."""
    h = np.asarray(x, dtype=np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0)
    return h
