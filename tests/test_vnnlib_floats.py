"""Queries over floating-point element types: the network as onnxruntime computes it in
the declared type. A `sat` holds exactly in that evaluation; an `unsat` comes from bounds
that enclose it (the importer's per-operation rounding bounds); `real` keeps the real
semantics."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.test_vnnlib_semantics import query_2, solve, values
from vigil.daemon.cli._standard import main
from vigil.rules.graph.precision import PRECISIONS
from vigil.rules.reach.backward import EXP_ERROR, output_bounds
from vigil.rules.reach.network import Network
from vigil.rules.reach.rounding import check_enclosure, load_for, rounding_noise

# y = relu(1e8 x + 1) - relu(1e8 x) is 1 over the reals; in float32 the 1 is lost
# (float32's spacing at 1e8 is 8), so y = 0 on all of [1, 2]
CANCELLING = Network.from_arrays(
    [(np.array([[1e8], [1e8]]), np.array([1.0, 0.0])), (np.array([[1.0, -1.0]]), np.zeros(1))]
)
# y = relu(x + 1) + relu(2 x) >= 4 on [1, 2]: rounding cannot bring it near 0.5
ROBUST = Network.from_arrays(
    [(np.array([[1.0], [2.0]]), np.array([1.0, 0.0])), (np.array([[1.0, 1.0]]), np.zeros(1))]
)
BOX = [("1.0", "2.0")]


def node_by_node(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def test_float32_rounding_reaches_what_the_reals_do_not(tmp_path, capsys):
    text = query_2(BOX, 1, "(<= Y[0,0] 0.5)", inputs=1, dtype="float32")
    lines = solve(tmp_path, CANCELLING.to_onnx(), text, capsys)
    (x_text,), (y_text,) = values(lines, 1, 1)
    assert lines[1] == "X float32 [1,1]" and lines[3] == "Y float32 [1,1]"
    x = np.float32(float(x_text))
    assert float(x) == float(x_text) and 1.0 <= x <= 2.0  # a float32 value in the box
    (y,) = node_by_node(CANCELLING.to_onnx()).run(None, {"x": np.array([[x]], np.float32)})
    assert float(y[0, 0]) == float(y_text) and y[0, 0] <= 0.5  # exactly, no tolerance
    real = query_2(BOX, 1, "(<= Y[0,0] 0.5)", inputs=1)
    assert solve(tmp_path, CANCELLING.to_onnx(), real, capsys) == ["unsat"]


@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_where_rounding_cannot_matter_both_are_unsat(tmp_path, capsys, dtype):
    text = query_2(BOX, 1, "(<= Y[0,0] 0.5)", inputs=1, dtype=dtype)
    assert solve(tmp_path, ROBUST.to_onnx(), text, capsys) == ["unsat"]


def test_the_real_bounds_miss_the_float32_output_and_the_rounding_bounds_hold_it():
    """The test below could not fail if rounding never mattered: here it does."""
    network, runner = load_for(CANCELLING.to_onnx(), "float32")
    x = np.array([[1.5]])
    rows = np.array([[1.0], [-1.0]])
    real = output_bounds(Network(network.weights, network.biases), x, x, rows).upper[0]
    computed = runner(x)[0, 0]
    assert computed == 0.0 and -real[1] > computed  # below the real lower bound (1)
    check_enclosure(network, runner, x)  # within the rounding bounds


def rich_model(seed: int, scale: float, via: int = TensorProto.FLOAT16) -> bytes:
    """Conv, BatchNormalization, AveragePool, Flatten, Gemm with nearly cancelling columns,
    a residual from the input, MatMul, Add, Mul, Div, Sub, ReduceSum, Concat, Neg and a
    round trip through ``via`` (float16), in float32."""
    rng = np.random.default_rng(seed)

    def tensor(name: str, a) -> TensorProto:
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    a = rng.normal(size=(12, 3)) * scale
    w2 = np.hstack([a, -a + rng.normal(size=(12, 3))])
    inits = [
        tensor("W1", rng.normal(size=(3, 2, 3, 3)) * scale),
        tensor("B1", rng.normal(size=3)),
        tensor("gamma", rng.uniform(0.5, 2, 3)),
        tensor("beta", rng.normal(size=3)),
        tensor("mean", rng.normal(size=3)),
        tensor("var", rng.uniform(0.5, 2, 3)),
        tensor("W2", w2),
        tensor("B2", rng.normal(size=6) * scale),
        tensor("W3", rng.normal(size=(6, 32))),
        tensor("M", rng.normal(size=(6, 4))),
        tensor("c1", rng.normal(size=4) * scale),
        tensor("s", rng.normal(size=4)),
        tensor("dv", rng.uniform(0.5, 3, 4)),
        tensor("c2", rng.normal(size=4)),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "W2", "B2"], ["g"]),
        helper.make_node("Flatten", ["X"], ["fx"]),
        helper.make_node("Gemm", ["fx", "W3"], ["skip"], transB=1),
        helper.make_node("Add", ["g", "skip"], ["gs"]),
        helper.make_node("Relu", ["gs"], ["h"]),
        helper.make_node("MatMul", ["h", "M"], ["m"]),
        helper.make_node("Add", ["m", "c1"], ["a"]),
        helper.make_node("Mul", ["a", "s"], ["mu"]),
        helper.make_node("Div", ["mu", "dv"], ["d"]),
        helper.make_node("Sub", ["d", "c2"], ["sb"]),
        helper.make_node("ReduceSum", ["sb", "axis1"], ["sum"], keepdims=1),
        helper.make_node("Neg", ["sum"], ["neg"]),
        helper.make_node("Concat", ["sb", "neg"], ["cat"], axis=1),
        helper.make_node("Cast", ["cat"], ["half"], to=via),
        helper.make_node("Cast", ["half"], ["Y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "rich",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model.SerializeToString()


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1.0, 1e3, 1e6]),
    radius=st.sampled_from([1e-3, 1.0, 100.0]),
)
def test_the_rounding_bounds_enclose_onnxruntime_on_every_operator(seed, scale, radius):
    """At single points and over a box: onnxruntime's float32 output (node by node) lies
    within the bounds, whatever the magnitudes and cancellations."""
    # float16 holds at most 65504: only the smallest weights stay in its range
    small = scale == 1.0 and radius <= 1.0
    model = rich_model(seed, scale, TensorProto.FLOAT16 if small else TensorProto.DOUBLE)
    network, runner = load_for(model, "float32")
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=32)
    lo, hi = centre - radius, centre + radius
    points = (lo + (hi - lo) * rng.random((64, 32))).astype(np.float32).astype(np.float64)
    check_enclosure(network, runner, points)
    noisy = rounding_noise(network, lo[None], hi[None])
    rows = np.vstack([np.eye(5), -np.eye(5)])
    bounds = output_bounds(noisy, lo[None], hi[None], rows).upper[0]
    y = runner(points)
    assert np.all(y <= bounds[:5]) and np.all(y >= -bounds[5:])


def test_a_value_that_may_overflow_is_refused_not_bounded():
    network, _ = load_for(rich_model(0, 1.0), "float32")
    rounding_noise(network, -np.ones((1, 32)), np.ones((1, 32)))  # in range
    with pytest.raises(ValueError, match="beyond the float32 range: overflow is not bounded"):
        rounding_noise(network, np.full((1, 32), -1e5), np.full((1, 32), 1e5))


def _float_network(seed: int, hidden: int, scale: float, head: str = "none") -> Network:
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(hidden, 2)) * scale
    return Network.from_arrays(
        [
            (w1, rng.normal(size=hidden)),
            (rng.normal(size=(2, hidden)), rng.normal(size=2) * scale),
        ],
        head,
    )


HOLDS = {
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


@settings(
    max_examples=24,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**16),
    hidden=st.integers(1, 8),
    scale=st.sampled_from([1.0, 1e4]),
    op=st.sampled_from(sorted(HOLDS)),
    quantile=st.sampled_from([0.0, 0.01, 0.5, 0.99, 1.0]),
    nudge=st.sampled_from([-1, 0, 1]),
    head=st.sampled_from(["none", "sigmoid", "softmax"]),
)
def test_every_float32_sat_holds_exactly_in_onnxruntime_and_every_unsat_in_samples(
    tmp_path, capsys, seed, hidden, scale, op, quantile, nudge, head
):
    """Thresholds at sampled float32 outputs and one float32 step either side, with no
    head, a Sigmoid or a Softmax: a `sat` assignment is float32, in the box, and
    onnxruntime's float32 output at it meets the constraint exactly; after `unsat` no
    sampled float32 input does; where 1% of the samples meet it, the answer is `sat`."""
    net = _float_network(seed, hidden, scale, head)
    model = net.to_onnx()
    session = node_by_node(model)
    rng = np.random.default_rng(seed)
    grid = np.linspace(-1.0, 1.0, 9)
    samples = np.vstack(
        [rng.uniform(-1.0, 1.0, (4000, 2)), np.stack(np.meshgrid(grid, grid), -1).reshape(-1, 2)]
    ).astype(np.float32)
    sampled = session.run(None, {"x": samples})[0][:, 0]
    threshold = np.quantile(sampled, quantile, method="nearest")
    threshold = float(
        np.float32(threshold) if not nudge else np.nextafter(threshold, nudge * np.inf)
    )
    text = query_2(
        [("-1.0", "1.0"), ("-1.0", "1.0")],
        2,
        f"({op} Y[0,0] {np.format_float_positional(threshold, trim='0')})",
        dtype="float32",
    )
    lines = solve(tmp_path, model, text, capsys, timeout="5")
    if lines[0] == "sat":
        x_text, y_text = values(lines, 2, 2)
        x = np.array([float(v) for v in x_text])
        assert np.array_equal(x, x.astype(np.float32)) and np.all(np.abs(x) <= 1.0)
        (y,) = session.run(None, {"x": x[None].astype(np.float32)})
        assert [float(v) for v in y[0]] == [float(v) for v in y_text]
        assert HOLDS[op](float(y[0, 0]), threshold)
        return
    met = HOLDS[op](sampled.astype(np.float64), threshold)
    assert met.mean() < 0.01, lines  # a region this large is found by sampling
    if lines[0] == "unsat":
        assert not met.any()
    else:
        # at a tie (an output equal to the threshold on a whole region, as where every
        # ReLU is off) the rounding bounds cannot separate the two sides
        assert lines[0] in ("unknown", "timed-out"), lines


def test_a_float16_network_answers_in_float16(tmp_path, capsys):
    rng = np.random.default_rng(3)
    layers = [(rng.normal(size=(8, 2)), rng.normal(size=8)), (rng.normal(size=(1, 8)), [0.0])]
    half = _half(Network.from_arrays(layers).to_onnx())
    session = node_by_node(half)
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, 41)] * 2), -1).reshape(-1, 2)
    top = float(session.run(None, {"x": grid.astype(np.float16)})[0].max())
    lines = solve(tmp_path, half, query_2(box, 1, f"(>= Y[0,0] {top!r})", dtype="float16"), capsys)
    x_text, (y_text,) = values(lines, 2, 1)
    x = np.array([float(v) for v in x_text])
    assert np.array_equal(x, x.astype(np.float16))
    (y,) = session.run(None, {"x": x[None].astype(np.float16)})
    assert float(y[0, 0]) == float(y_text) >= top
    # the float16 output's ulp near 5 is 2^-8: 1.0 above any value seen is out of reach
    bound = output_bounds(
        Network.from_arrays(layers), -np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 1))
    )
    above = float(bound.upper[0, 0]) + 1.0
    text = query_2(box, 1, f"(>= Y[0,0] {above!r})", dtype="float16")
    assert solve(tmp_path, half, text, capsys) == ["unsat"]


def _half(model: bytes) -> bytes:
    """The same model in float16."""
    proto = onnx.load_model_from_string(model)
    for t in proto.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in [*proto.graph.input, *proto.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return proto.SerializeToString()


@pytest.mark.parametrize(
    ("dtype", "message"),
    [
        ("float64", "the query declares float64 tensors, the model's input is float32"),
        ("int8", "element type int8 is not supported"),
    ],
)
def test_a_type_the_model_does_not_compute_in_is_refused(tmp_path, capsys, dtype, message):
    (tmp_path / "m.onnx").write_bytes(ROBUST.to_onnx())
    if dtype.startswith("int"):  # integer types take integer constants
        text = query_2([("1", "2")], 1, "(<= Y[0,0] 0)", inputs=1, dtype=dtype)
    else:
        text = query_2(BOX, 1, "(<= Y[0,0] 0.5)", inputs=1, dtype=dtype)
    (tmp_path / "q.vnnlib").write_text(text)
    args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_heads_in_float32_stay_near_the_real_function():
    """What ``backward.EXP_ERROR`` assumes of onnxruntime's sigmoid and softmax, on the
    row shapes the evaluator feeds and on long vectors: near the real function, and a
    softmax within [0, 1]."""
    rng = np.random.default_rng(0)
    cases = (
        ("Sigmoid", ["n", 3]),
        ("Softmax", ["n", 3]),
        ("Softmax", ["n", 40]),
        ("Sigmoid", ["n"]),
    )
    for op, shape in cases:
        attrs = {"axis": -1} if op == "Softmax" else {}
        graph = helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], **attrs)],
            "head",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = node_by_node(model.SerializeToString())
        for scale in (1.0, 30.0, 1000.0):
            size = (300_000 // shape[1], shape[1]) if len(shape) == 2 else (1_000_000,)
            x = (rng.normal(size=size) * scale).astype(np.float32)
            y = session.run(None, {"x": x})[0].astype(np.float64)
            z = x.astype(np.longdouble)
            if op == "Sigmoid":
                exact = 1 / (1 + np.exp(-z))
            else:
                e = np.exp(z - z.max(axis=1, keepdims=True))
                exact = e / e.sum(axis=1, keepdims=True)
                assert y.min() >= 0.0 and y.max() <= 1.0
            assert float(np.abs(y - exact).max()) <= EXP_ERROR / 2


def test_the_precisions_are_the_ieee_formats():
    for name, p in PRECISIONS.items():
        info = np.finfo(p.dtype)
        assert p.unit == info.eps / 2 and p.tiny == info.smallest_normal, name


@pytest.mark.parametrize("seed", [1, 2])
def test_a_float32_query_through_every_operator_is_decided(tmp_path, capsys, seed):
    """The rich graph (Conv, BatchNormalization, AveragePool, Gemm, MatMul, elementwise
    arithmetic, ReduceSum, Concat, a float16 round trip): `sat` just below the best of
    2,000 float32 samples, exact in onnxruntime; `unsat` just above the rounding bounds
    over the box, and no sample above it."""
    model = rich_model(seed, 1.0)
    session = node_by_node(model)
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-1.0, 1.0, 32)
    lo, hi = centre - 0.05, centre + 0.05
    samples = (lo + (hi - lo) * rng.random((2000, 32))).astype(np.float32)
    outputs = np.vstack([session.run(None, {"X": s.reshape(1, 2, 4, 4)})[0] for s in samples])
    network, _ = load_for(model, "float32")
    noisy = rounding_noise(network, lo[None], hi[None])
    ceiling = float(output_bounds(noisy, lo[None], hi[None], np.eye(5)[:1]).upper[0, 0])
    box = [(repr(float(a)), repr(float(b))) for a, b in zip(lo, hi, strict=True)]
    for threshold, answer in (
        (float(outputs[:, 0].max()) - 0.01, "sat"),
        (ceiling + 0.01, "unsat"),
    ):
        text = query_2(box, 5, f"(>= Y[0,0] {threshold!r})", inputs=32, dtype="float32")
        text = text.replace("[1,32]", "[1,2,4,4]")
        for k in reversed(range(32)):
            c, h, w = np.unravel_index(k, (2, 4, 4))
            text = text.replace(f"X[0,{k}]", f"X[0,{c},{h},{w}]")
        lines = solve(tmp_path, model, text, capsys, timeout="60")
        assert lines[0] == answer
        if answer == "sat":
            x_text, y_text = values(lines, 32, 5)
            x = np.array([float(v) for v in x_text], dtype=np.float32)
            assert np.all((x.astype(np.float64) >= lo) & (x.astype(np.float64) <= hi))
            (y,) = session.run(None, {"X": x.reshape(1, 2, 4, 4)})
            assert [float(v) for v in y[0]] == [float(v) for v in y_text]
            assert y[0, 0] >= threshold
        else:
            assert outputs[:, 0].max() < threshold
