"""Sigmoid, Tanh, integer and non-integer powers and products of two computed tensors (Mul,
MatMul) inside a network: loaded as layers of such neurons (a product as a difference of squares),
bounded by their activations' intervals, and decided by bounds (the MILP does not model
them), over the reals and in float32: `sat` exact in onnxruntime below a dense grid's
best, `unsat` above it by more than the grid can miss, never a wrong answer."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.test_vnnlib_semantics import query_2, solve, values
from vigil.daemon.cli._standard import main
from vigil.rules.graph import UnsupportedModel
from vigil.rules.reach.backward import output_bounds, smooth_relaxation
from vigil.rules.reach.network import SIGMOID, TANH, OnnxRunner, load_checked
from vigil.rules.reach.rounding import load_for

GRID = np.stack(np.meshgrid(*[np.linspace(-1.0, 1.0, 401)] * 2), -1).reshape(-1, 2)


def graph(
    name: str,
    nodes: list,
    seed: int,
    weights: dict[str, tuple[int, ...]],
    constants: dict[str, np.ndarray] | None = None,
    inputs: int = 2,
) -> bytes:
    """X [1, inputs] through ``nodes`` to Y [1, 2] (opset 17); ``weights`` drawn from a
    normal distribution by ``seed``, in their order, and ``constants`` as given."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), key)
        for key, shape in weights.items()
    ]
    initializers += [numpy_helper.from_array(v, key) for key, v in (constants or {}).items()]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, inputs])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
            initializers,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    return model.SerializeToString()


def squashing(seed: int, first: str, second: str, width: int = 6, inputs: int = 2) -> bytes:
    """X -> Gemm -> ``first`` -> Gemm (+ a residual of the first layer) -> ``second`` ->
    Gemm -> Y (2 outputs)."""
    nodes = [
        helper.make_node("Gemm", ["X", "W0", "B0"], ["z0"]),
        helper.make_node(first, ["z0"], ["h0"]),
        helper.make_node("Gemm", ["h0", "W1", "B1"], ["z1"]),
        helper.make_node("Add", ["z1", "h0"], ["r1"]),
        helper.make_node(second, ["r1"], ["h1"]),
        helper.make_node("Gemm", ["h1", "W2", "B2"], ["Y"]),
    ]
    shapes = {"W0": (inputs, width), "B0": (width,), "W1": (width, width), "B1": (width,)}
    shapes |= {"W2": (width, 2), "B2": (2,)}
    return graph("squash", nodes, seed, shapes, inputs=inputs)


def assert_decided(tmp_path, capsys, model: bytes, dtype: str, best: float, slack: float):
    """``Y[0,0] >= t`` over [-1, 1]²: `sat` just below the grid's ``best``, the assignment
    exact in onnxruntime; `unsat` above it by more than the grid can miss (``slack``)."""
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    for threshold, answer in ((best - 0.05, "sat"), (best + slack + 0.01, "unsat")):
        text = query_2(box, 2, f"(>= Y[0,0] {threshold!r})", dtype=dtype)
        lines = solve(tmp_path, model, text, capsys, timeout="30")
        assert lines[0] == answer, (threshold, lines)
        if answer == "sat":
            x_text, y_text = values(lines, 2, 2)
            x = np.array([float(v) for v in x_text])
            reference = OnnxRunner(model, node_by_node=True)(x[None])[0]
            assert [float(v) for v in reference] == [float(v) for v in y_text]
            assert reference[0] >= threshold


ACTIVATIONS = ["Sigmoid", "Tanh", "Relu"]
FUNCTIONS = {
    "Sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
    "Tanh": np.tanh,
    "Relu": lambda z: np.maximum(z, 0.0),
}


def by_hand(model: bytes, first: str, second: str, x: np.ndarray) -> np.ndarray:
    """The graph of ``squashing`` in numpy, from its initializers (not the importer)."""
    w = {
        t.name: numpy_helper.to_array(t).astype(np.float64)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    h0 = FUNCTIONS[first](x @ w["W0"] + w["B0"])
    h1 = FUNCTIONS[second](h0 @ w["W1"] + w["B1"] + h0)
    return h1 @ w["W2"] + w["B2"]


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**16),
    first=st.sampled_from(ACTIVATIONS[:2]),
    second=st.sampled_from(ACTIVATIONS),
)
@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_squashing_networks_are_decided_by_bounds(tmp_path, capsys, seed, first, second, dtype):
    model = squashing(seed, first, second)
    network, _ = load_for(model, dtype)
    assert not network.relu_only
    y = by_hand(model, first, second, GRID)[:, 0]
    # the grid misses at most the largest slope (in the max norm) times half a step
    weights = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    slope = 1.0
    for name, extra in (("W0", 0.0), ("W1", 1.0), ("W2", 0.0)):  # W1 with the residual
        slope *= float(np.abs(weights[name]).sum(axis=0).max()) + extra
    slack = slope * 1.0 / 400
    assert_decided(tmp_path, capsys, model, dtype, float(y.max()), slack)


def test_a_wide_squashing_network_takes_the_relu_search(tmp_path, capsys):
    """40 inputs (above the input-bisection size): `sat` found by the attack, `unsat` far
    above the samples' best closed by the bounds; the verdict never claims more."""
    model = squashing(5, "Tanh", "Relu", width=12, inputs=40)
    runner = OnnxRunner(model)
    rng = np.random.default_rng(5)
    samples = rng.uniform(-0.1, 0.1, (2000, 40))
    best = float(runner(samples)[:, 0].max())
    box = [("-0.1", "0.1")] * 40
    lines = solve(
        tmp_path, model, query_2(box, 2, f"(>= Y[0,0] {best - 0.01!r})", inputs=40), capsys
    )
    assert lines[0] == "sat"
    x = np.array([float(v) for v in values(lines, 40, 2)[0]])
    assert runner(x[None])[0, 0] >= best - 0.01
    far = query_2(box, 2, f"(>= Y[0,0] {best + 100.0!r})", inputs=40)
    assert solve(tmp_path, model, far, capsys) == ["unsat"]


def test_the_other_verifiers_refuse_a_squashing_network():
    with pytest.raises(UnsupportedModel, match="sigmoid or tanh inside the network"):
        load_checked(squashing(0, "Tanh", "Relu"))


def products(seed: int, power: int = 2) -> bytes:
    """X [1,2] -> a = Gemm, b = Gemm -> Mul(a, b) - Pow(a, power) + MatMul(a, b) (their
    inner product, as vectors) -> Relu -> Gemm -> Y [1,2]: products of two computed
    tensors."""
    nodes = [
        helper.make_node("Gemm", ["X", "Wa", "Ba"], ["a"]),
        helper.make_node("Gemm", ["X", "Wb", "Bb"], ["b"]),
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("Pow", ["a", "power"], ["ap"]),
        helper.make_node("Sub", ["ab", "ap"], ["d"]),
        helper.make_node("Reshape", ["a", "flat"], ["va"]),
        helper.make_node("Reshape", ["b", "flat"], ["vb"]),
        helper.make_node("MatMul", ["va", "vb"], ["inner"]),
        helper.make_node("Add", ["d", "inner"], ["e"]),
        helper.make_node("Relu", ["e"], ["h"]),
        helper.make_node("Gemm", ["h", "W", "B"], ["Y"]),
    ]
    shapes = {"Wa": (2, 4), "Ba": (4,), "Wb": (2, 4), "Bb": (4,), "W": (4, 2), "B": (2,)}
    constants = {"power": np.array(power, np.float32), "flat": np.array([4], np.int64)}
    return graph("products", nodes, seed, shapes, constants)


def products_by_hand(model: bytes, x: np.ndarray, power: int) -> np.ndarray:
    w = {
        t.name: numpy_helper.to_array(t).astype(np.float64)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    a, b = x @ w["Wa"] + w["Ba"], x @ w["Wb"] + w["Bb"]
    inner = (a * b).sum(axis=1, keepdims=True)
    return np.maximum(a * b - a**power + inner, 0.0) @ w["W"] + w["B"]


@settings(
    max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16))
@pytest.mark.parametrize("power", [2, 3])
@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_products_of_computed_tensors_are_decided_by_bounds(tmp_path, capsys, seed, power, dtype):
    """Mul and MatMul of two computed tensors and Pow 2 and 3, as squares: the loaded
    network is what onnxruntime computes (within the rounding bounds in float32), and
    queries just below a grid's best are `sat`, above it by more than the grid can miss
    `unsat`."""
    model = products(seed, power)
    network, runner = load_for(model, dtype)
    probe = np.random.default_rng(seed).uniform(-1, 1, (64, 2)).astype(np.float32)
    np.testing.assert_allclose(network.forward(probe), runner(probe), rtol=1e-4, atol=1e-4)
    y = products_by_hand(model, GRID, power)[:, 0]
    # slope bound of each neuron before the Relu over [-1, 1]²:
    # |d(ab)| <= |a||db| + |b||da|, |d(a^n)| <= n |a|^(n-1) |da|, and the inner product's
    w = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    size = lambda m, c: np.abs(m).sum(axis=0) + np.abs(c)  # noqa: E731
    slope_a, slope_b = np.abs(w["Wa"]).sum(axis=0), np.abs(w["Wb"]).sum(axis=0)
    big_a, big_b = size(w["Wa"], w["Ba"]), size(w["Wb"], w["Bb"])
    mixed = big_a * slope_b + big_b * slope_a
    inner = mixed + power * big_a ** (power - 1) * slope_a + mixed.sum()
    slack = float(np.abs(w["W"][:, 0]) @ inner) / 400
    assert_decided(tmp_path, capsys, model, dtype, float(y.max()), slack)


def test_a_negative_or_large_power_of_a_computed_tensor_is_refused():
    proto = onnx.load_model_from_string(products(0))  # the same graph, other exponents
    for exponent, message in ((-0.5, r"\[-0.5\]"), (9.0, r"\[9.0\]")):
        for t in proto.graph.initializer:
            if t.name == "power":
                t.CopyFrom(numpy_helper.from_array(np.array(exponent, np.float32), "power"))
        with pytest.raises(
            UnsupportedModel, match=rf"\(Pow\): a computed tensor to the power {message}"
        ):
            load_for(proto.SerializeToString(), "real")


def roots(seed: int, power: float, base: str = "sum of squares") -> bytes:
    """X [1,2] -> a, b = Gemm -> Pow(s, power) of s = a² + b² + 1/2 (``base``: a alone, which
    crosses 0) -> Gemm -> Y [1,2]: a non-integer power of a computed tensor."""
    nodes = [
        helper.make_node("Gemm", ["X", "Wa", "Ba"], ["a"]),
        helper.make_node("Gemm", ["X", "Wb", "Bb"], ["b"]),
        helper.make_node("Mul", ["a", "a"], ["aa"]),
        helper.make_node("Pow", ["b", "two"], ["bb"]),
        helper.make_node("Add", ["aa", "bb"], ["s0"]),
        helper.make_node("Add", ["s0", "half"], ["s"]),
        helper.make_node("Pow", ["s" if base == "sum of squares" else "a", "power"], ["r"]),
        helper.make_node("Gemm", ["r", "W", "B"], ["Y"]),
    ]
    shapes = {"Wa": (2, 3), "Ba": (3,), "Wb": (2, 3), "Bb": (3,), "W": (3, 2), "B": (2,)}
    constants = {key: np.array(v, np.float32) for key, v in (("two", 2.0), ("half", 0.5))}
    constants["power"] = np.array(power, np.float32)
    return graph("roots", nodes, seed, shapes, constants)


@settings(
    max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16))
@pytest.mark.parametrize("power", [0.5, 1.5])
@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_a_non_integer_power_of_a_positive_tensor_is_decided_by_bounds(
    tmp_path, capsys, seed, power, dtype
):
    """Pow 0.5 and 1.5 of a² + b² + 1/2: what onnxruntime computes, and queries decided
    around a grid's best as above."""
    model = roots(seed, power)
    network, runner = load_for(model, dtype)
    probe = np.random.default_rng(seed).uniform(-1, 1, (64, 2)).astype(np.float32)
    np.testing.assert_allclose(network.forward(probe), runner(probe), rtol=1e-4, atol=1e-4)
    w = {
        t.name: numpy_helper.to_array(t).astype(np.float64)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    a, b = GRID @ w["Wa"] + w["Ba"], GRID @ w["Wb"] + w["Bb"]
    y = ((a**2 + b**2 + 0.5) ** power @ w["W"] + w["B"])[:, 0]
    # slope bound: |d s^p| <= p max(s^(p-1)) |ds| on s in [1/2, s_max], |ds| <= 2|a||da| + 2|b||db|
    size = lambda m, c: np.abs(m).sum(axis=0) + np.abs(c)  # noqa: E731
    big_a, big_b = size(w["Wa"], w["Ba"]), size(w["Wb"], w["Bb"])
    slope_s = 2 * big_a * np.abs(w["Wa"]).sum(axis=0) + 2 * big_b * np.abs(w["Wb"]).sum(axis=0)
    s_max = big_a**2 + big_b**2 + 0.5
    steepest = power * np.maximum(0.5 ** (power - 1), s_max ** (power - 1))
    slack = float(np.abs(w["W"][:, 0]) @ (steepest * slope_s)) / 400
    assert_decided(tmp_path, capsys, model, dtype, float(y.max()), slack)


@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_a_power_of_a_tensor_that_may_be_negative_is_never_unsat(tmp_path, capsys, dtype):
    """onnxruntime's Pow 0.5 is NaN below 0, and NaN may become a number further on: no
    bound covers that, so even a threshold far above every value is `unknown`; a reachable
    one is `sat`, exact in onnxruntime."""
    model = roots(11, 0.5, base="a")
    runner = OnnxRunner(model, node_by_node=True)
    coarse = np.stack(np.meshgrid(*[np.linspace(-1.0, 1.0, 101)] * 2), -1).reshape(-1, 2)
    values_ = runner(coarse.astype(np.float32))[:, 0]
    assert 0.2 < np.isnan(values_).mean() < 0.8  # some base negative on half of the box
    best = float(np.nanmax(values_))
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    far = solve(
        tmp_path, model, query_2(box, 2, f"(>= Y[0,0] {best + 100.0!r})", dtype=dtype), capsys
    )
    assert far == ["unknown"]
    args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
    assert main(args) == 0
    assert "base of a non-integer power in layer 3 may be negative" in capsys.readouterr().err
    lines = solve(
        tmp_path, model, query_2(box, 2, f"(>= Y[0,0] {best - 0.05!r})", dtype=dtype), capsys
    )
    assert lines[0] == "sat"
    x = np.array([float(v) for v in values(lines, 2, 2)[0]])
    assert runner(x[None])[0, 0] >= best - 0.05


@settings(max_examples=60, deadline=None)
@given(
    code=st.sampled_from(["sigmoid", "tanh"]),
    ends=st.lists(
        st.floats(-60.0, 60.0, allow_nan=False) | st.floats(-1e-3, 1e-3, allow_nan=False),
        min_size=2,
        max_size=2,
    ),
)
def test_the_parallel_lines_hold_the_function_between_them(code, ends):
    """Dense points of [lo, hi] (and its ends) lie between the two lines, evaluated in
    extended precision; the lines are no further apart than the function's values at the
    ends."""
    lo, hi = min(ends), max(ends)
    kind = SIGMOID if code == "sigmoid" else TANH
    a, below, above = smooth_relaxation(kind, np.array([[lo]]), np.array([[hi]]), 0.0)
    z = np.linspace(lo, hi, 20_001).astype(np.longdouble)
    f = 1 / (1 + np.exp(-z)) if code == "sigmoid" else np.tanh(z)
    line = np.longdouble(a[0, 0]) * z
    assert np.all(f - line >= np.longdouble(below[0, 0]))
    assert np.all(f - line <= np.longdouble(above[0, 0]))
    # never further apart than the interval's ends: f(z) - a z moves less than f does
    assert above[0, 0] - below[0, 0] <= float(f[-1] - f[0]) + 1e-9


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    first=st.sampled_from(ACTIVATIONS[:2]),
    second=st.sampled_from(ACTIVATIONS),
    radius=st.sampled_from([0.05, 0.5, 3.0]),
)
def test_the_bounds_through_squashing_layers_hold_every_sampled_output(seed, first, second, radius):
    """Output bounds of the loaded network (real arithmetic) over a box against numpy's
    own evaluation of the graph at many points of it, its corners included."""
    model = squashing(seed, first, second, inputs=3)
    network, _ = load_for(model, "real")
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-1.0, 1.0, 3)
    lo, hi = centre - radius, centre + radius
    corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
    points = np.vstack([lo + (hi - lo) * rng.random((4000, 3)), corners])
    y = by_hand(model, first, second, points)
    rows = np.vstack([np.eye(2), -np.eye(2)])
    upper = output_bounds(network, lo[None], hi[None], rows).upper[0]
    assert np.all(y.max(axis=0) <= upper[:2] + 1e-9)
    assert np.all(-y.min(axis=0) <= upper[2:] + 1e-9)
