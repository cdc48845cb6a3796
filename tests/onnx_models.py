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


def conv_residual(seed: int, channels: int = 2, side: int = 4, outputs: int = 3) -> bytes:
    """A small image classifier as a graph, not a chain: Sub/Div normalisation, Conv,
    BatchNormalization, Relu, a second Conv whose output is added back to the first block's
    (a residual Add), AveragePool, Transpose, Reshape, Concat with a constant-scaled copy,
    Flatten and Gemm. Input (1, 1, side, side), float32, batch fixed to 1 (as VNN-COMP
    exports)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    inits = {
        "mean": np.array(0.5, f32),
        "std": np.array(2.0, f32),
        "k1": rng.normal(size=(channels, 1, 3, 3)).astype(f32),
        "c1": rng.normal(size=channels).astype(f32),
        "gamma": rng.uniform(0.5, 1.5, channels).astype(f32),
        "beta": rng.normal(size=channels).astype(f32),
        "mu": rng.normal(size=channels).astype(f32),
        "var": rng.uniform(0.5, 2.0, channels).astype(f32),
        "k2": rng.normal(size=(channels, channels, 3, 3)).astype(f32),
        "half": np.array(0.5, f32),
        "shape": np.array([1, -1], np.int64),
    }
    pooled = (side // 2) ** 2 * channels
    inits["w"] = rng.normal(size=(outputs, 2 * pooled)).astype(f32)
    inits["b"] = rng.normal(size=outputs).astype(f32)
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["scaled"]),
        helper.make_node("Conv", ["scaled", "k1", "c1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["a", "gamma", "beta", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["h1"]),
        helper.make_node("Conv", ["h1", "k2"], ["a2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("Add", ["h2", "h1"], ["res"], name="residual"),
        helper.make_node("AveragePool", ["res"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["pool"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["flat"]),
        helper.make_node("Mul", ["flat", "half"], ["halved"]),
        helper.make_node("Concat", ["flat", "halved"], ["both"], axis=1),
        helper.make_node("Flatten", ["both"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv-residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, outputs])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()
