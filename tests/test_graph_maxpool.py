"""MaxPool as ReLU layers (max(a, b) = b + relu(a - b)): the chain computes what
onnxruntime computes, in real arithmetic and within the float32 rounding bounds, with
padding, strides, dilations and windows that are not powers of two; and its VNN-LIB
queries are decided against sampled maxima."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.test_vnnlib_semantics import query_2, solve
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.rounding import check_enclosure, load_for

POOLS = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1]},
    {"kernel_shape": [3, 1], "pads": [0, 0, 2, 0]},
]


def pooled(seed: int, pool: dict, conv_first: bool) -> bytes:
    """X (1, 2, 5, 5) -> [Conv 3x3 and Relu] -> MaxPool -> Flatten -> Gemm to 2 outputs."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(size=(2, 2, 3, 3)).astype(np.float32), "K")]
    nodes = []
    source = "X"
    if conv_first:
        nodes += [
            helper.make_node("Conv", ["X", "K"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
        ]
        source = "r"
    nodes += [
        helper.make_node("MaxPool", [source], ["p"], **pool),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "W"], ["Y"], transB=1),
    ]
    width = _pooled_width(pool)
    inits.append(numpy_helper.from_array(rng.normal(size=(2, width)).astype(np.float32), "W"))
    graph = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model.SerializeToString()


def _pooled_width(pool: dict) -> int:
    kernel, strides = pool["kernel_shape"], pool.get("strides", [1, 1])
    pads, dilations = pool.get("pads", [0, 0, 0, 0]), pool.get("dilations", [1, 1])
    sides = [
        (5 + pads[a] + pads[a + 2] - dilations[a] * (kernel[a] - 1) - 1) // strides[a] + 1
        for a in range(2)
    ]
    return 2 * sides[0] * sides[1]


@settings(max_examples=16, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    pool=st.sampled_from(range(len(POOLS))),
    conv_first=st.booleans(),
)
def test_max_pooling_computes_what_onnxruntime_does(seed, pool, conv_first):
    model = pooled(seed, POOLS[pool], conv_first)
    network = Network.from_onnx(model)
    x = np.random.default_rng(seed).uniform(-2, 2, size=(40, 50))
    np.testing.assert_allclose(network.forward(x), OnnxRunner(model)(x), atol=1e-4, rtol=1e-4)
    computed, runner = load_for(model, "float32")
    check_enclosure(computed, runner, x.astype(np.float32).astype(np.float64))


@settings(
    max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16))
@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_max_pooling_queries_are_decided(tmp_path, capsys, seed, dtype):
    """Just below a sampled output: `sat`; just above an interval bound computed here
    from the ONNX operators themselves: `unsat`."""
    model = pooled(seed, POOLS[0], conv_first=True)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.1, 0.1, size=(20_000, 50))
    top = float(OnnxRunner(model)(x)[:, 0].max())
    ceiling = _interval_top(model, 0.1)
    box = [("-0.1", "0.1")] * 50
    for threshold, answer in ((top - 1e-3, "sat"), (ceiling + 1e-3, "unsat")):
        text = query_2(box, 2, f"(>= Y[0,0] {threshold!r})", inputs=50, dtype=dtype)
        text = text.replace("[1,50]", "[1,2,5,5]")
        for k in reversed(range(50)):  # X[0,k] -> X[0,c,h,w], longest first
            c, h, w = np.unravel_index(k, (2, 5, 5))
            text = text.replace(f"X[0,{k}]", f"X[0,{c},{h},{w}]")
        lines = solve(tmp_path, model, text, capsys, timeout="60")
        assert lines[0] == answer
        if answer == "sat":
            point = np.array([float(v) for v in lines[2:52]])
            assert np.all(np.abs(point) <= 0.1)
            assert OnnxRunner(model)(point[None])[0, 0] >= threshold


def _interval_top(model: bytes, radius: float) -> float:
    """An upper bound of Y[0] over the box, by interval arithmetic on the graph's own
    operators (Conv 3x3 pad 1, Relu, MaxPool 2x2 stride 2, Gemm)."""
    graph = onnx.load_model_from_string(model).graph
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in graph.initializer}
    kernel, w = weights["K"], weights["W"]
    pad = np.pad(np.full((2, 5, 5), radius), ((0, 0), (1, 1), (1, 1)))
    high = np.zeros((2, 5, 5))
    for o, i, r in np.ndindex(2, 5, 5):  # each output: sum of |k| times the radius
        high[o, i, r] = (np.abs(kernel[o]) * pad[:, i : i + 3, r : r + 3]).sum()
    high = np.maximum(high, 0.0)  # Relu; the low side is 0
    pooled_high = np.array(
        [
            high[ch, 2 * a : 2 * a + 2, 2 * b : 2 * b + 2].max()
            for ch in range(2)
            for a in range(2)
            for b in range(2)
        ]
    )
    return float(np.maximum(w[0], 0.0) @ pooled_high)  # pooled values lie in [0, high]


def test_a_window_in_the_padding_alone_is_refused():
    pool = {"kernel_shape": [1, 1], "pads": [1, 1, 1, 1]}
    with pytest.raises(ValueError, match="wholly in the padding"):
        Network.from_onnx(pooled(0, pool, conv_first=False))
