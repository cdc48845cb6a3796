"""What a VNN-LIB answer means: in 2.0 queries strict comparisons are strict and a `sat`
assignment satisfies every constraint exactly when the network runs in onnxruntime; 1.0
keeps VNN-COMP's closed region and 1e-4 tolerance; constraints on a softmax or sigmoid
output are about that output, not the logits before it; networks without hidden layers,
constants in every attribute form, and drivers' real-valued time limits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tests.milp_oracle import max_violation
from vigil.daemon.cli._standard import main
from vigil.rules.reach.backward import activation_bounds
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.reach.vnnlib import parse_query


def query_2(
    box: list[tuple[str, str]], outputs: int, *asserts: str, inputs: int = 2, dtype: str = "real"
) -> str:
    """A 2.0 query over X [1, inputs] and Y [1, outputs] of element type ``dtype`` with the
    bounds ``box`` (lower, upper text per input, ``(`` or ``)`` in front for a strict
    bound) and ``asserts``."""
    lines = [
        "(vnnlib-version <2.0>)",
        "(declare-network net",
        f"  (declare-input X {dtype} [1,{inputs}])",
        f"  (declare-output Y {dtype} [1,{outputs}]))",
    ]
    for i, (low, high) in enumerate(box):
        lo_op = ">" if low.startswith("(") else ">="
        hi_op = "<" if high.endswith(")") else "<="
        lines.append(f"(assert ({lo_op} X[0,{i}] {low.strip('(')}))")
        lines.append(f"(assert ({hi_op} X[0,{i}] {high.strip(')')}))")
    return "\n".join([*lines, *(f"(assert {a})" for a in asserts)]) + "\n"


def solve(tmp_path, model: bytes, text: str, capsys, timeout: str = "30") -> list[str]:
    (tmp_path / "m.onnx").write_bytes(model)
    (tmp_path / "q.vnnlib").write_text(text)
    args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
    assert main([*args, "--timeout", timeout]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def values(lines: list[str], inputs: int, outputs: int) -> tuple[list[str], list[str]]:
    """The printed values of X and Y after `sat`, as text (exact)."""
    assert lines[0] == "sat"
    return lines[2 : 2 + inputs], lines[3 + inputs : 3 + inputs + outputs]


def assignment(lines: list[str], inputs: int, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    assert lines[0] == "sat"
    x = np.array([float(v) for v in lines[2 : 2 + inputs]])
    y = np.array([float(v) for v in lines[3 + inputs : 3 + inputs + outputs]])
    return x, y


IDENTITY = Network.from_arrays([(np.eye(2), np.zeros(2))])  # y = x: no hidden layer


def test_strict_comparisons_are_strict_in_2_0(tmp_path, capsys):
    model = IDENTITY.to_onnx()
    box = [("0.0", "1.0"), ("0.0", "1.0")]
    # max Y[0] is 1.0, reached at X[0] = 1.0: `>` is unsat, `>=` sat there
    assert solve(tmp_path, model, query_2(box, 2, "(> Y[0,0] 1.0)"), capsys) == ["unsat"]
    x, y = assignment(solve(tmp_path, model, query_2(box, 2, "(>= Y[0,0] 1.0)"), capsys), 2, 2)
    assert x[0] == 1.0 and y[0] == 1.0
    # a strict input bound: X[0] < 1.0 never reaches Y[0] >= 1.0
    strict_box = [("0.0", "1.0)"), ("0.0", "1.0")]
    lines = solve(tmp_path, model, query_2(strict_box, 2, "(>= Y[0,0] 1.0)"), capsys, "5")
    assert lines[0] in ("unsat", "unknown")
    # and X[0] > 0.5 strictly is met by a point above it
    open_low = [("(0.5", "0.5000001"), ("0.0", "1.0")]
    x, _ = assignment(solve(tmp_path, model, query_2(open_low, 2, "(<= Y[0,0] 2.0)"), capsys), 2, 2)
    assert x[0] > 0.5


def test_vnnlib_1_keeps_the_closed_region_and_its_tolerance():
    text = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n" + (
        "(assert (>= X_0 0.0))\n(assert (<= X_0 1.0))\n(assert (> Y_0 1.0))\n"
    )
    query = parse_query(text)
    assert query.counterexample([1.0], [1.0])  # `>` read as `>=`
    assert query.counterexample([1.0], [0.99995])  # within VNN-COMP's 1e-4
    strict = parse_query(query_2([("0.0", "1.0")], 1, "(> Y[0,0] 1.0)", inputs=1))
    assert not strict.counterexample([1.0], [1.0])
    assert strict.counterexample([1.0], [np.nextafter(1.0, 2.0)])


def softmax_model() -> bytes:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Softmax", ["X"], ["Y"], axis=1)], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_a_softmax_output_never_leaves_0_1(tmp_path, capsys, dtype):
    """float32 underflow gives Y[0] = 0.0 at X = (-1000, 866.85): not `< 0.0`. Over the reals
    softmax lies strictly inside (0, 1); onnxruntime's float32 kernel stays in [0, 1]
    (``backward.EXP_ERROR`` gives the argument)."""
    box = [("-1000.0", "1000.0"), ("-1000.0", "1000.0")]
    text = query_2(box, 2, "(or (< Y[0,0] 0.0) (> Y[0,0] 1.0))", dtype=dtype)
    assert solve(tmp_path, softmax_model(), text, capsys) == ["unsat"]
    # the underflow itself is reached, and reported as the deployed model computes it
    lines = solve(
        tmp_path, softmax_model(), query_2(box, 2, "(<= Y[0,0] 0.0)", dtype=dtype), capsys
    )
    assert lines[0] == "sat" and float(values(lines, 2, 2)[1][0]) == 0.0


@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_a_sigmoid_head_is_decided_on_its_output(tmp_path, capsys, dtype):
    """Y = sigmoid(X0 - X1) with X0 in [-1, 0], X1 in [0, 1]: at most sigmoid(0) = 0.5."""
    model = Network.from_arrays([([[1.0, -1.0]], [0.0])], output="sigmoid").to_onnx()
    box = [("-1.0", "0.0"), ("0.0", "1.0")]
    above = query_2(box, 1, "(> Y[0,0] 0.51)", dtype=dtype)
    assert solve(tmp_path, model, above, capsys) == ["unsat"]
    lines = solve(tmp_path, model, query_2(box, 1, "(>= Y[0,0] 0.45)", dtype=dtype), capsys)
    x, y = assignment(lines, 2, 1)
    assert lines[0] == "sat" and y[0] >= 0.45
    assert np.array_equal(y, OnnxRunner(model)(x[None])[0])


def test_constraints_on_a_softmax_are_on_its_output_not_the_logits(tmp_path, capsys):
    """The logits never reach 0.5 here (X[0] <= 0), the softmax does (about 0.9999):
    bounding the logits instead answered unsat."""
    box = [("-1.0", "0.0"), ("-10.0", "-9.0")]
    x, y = assignment(
        solve(tmp_path, softmax_model(), query_2(box, 2, "(>= Y[0,0] 0.5)"), capsys), 2, 2
    )
    assert y[0] >= 0.5 and np.array_equal(y, OnnxRunner(softmax_model())(x[None])[0])
    assert solve(tmp_path, softmax_model(), query_2(box, 2, "(>= Y[0,1] 0.5)"), capsys) == ["unsat"]


def test_a_sum_of_outputs_on_a_network_without_hidden_layers(tmp_path, capsys):
    """Y = (X0 + 2 X1, 3 X0 - X1): each row alone is met in the box, both together not
    (X1 >= 0.75 and X1 <= 0.5); the search bisected and stopped with an IndexError."""
    net = Network.from_arrays([([[1.0, 2.0], [3.0, -1.0]], [0.0, 0.0])])
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    both = query_2(box, 2, "(>= Y[0,0] 2.5)", "(>= Y[0,1] 2.5)")
    assert solve(tmp_path, net.to_onnx(), both, capsys) == ["unsat"]
    total = query_2(box, 2, "(>= (+ Y[0,0] Y[0,1]) 4.5)")  # at most 4 X0 + X1 = 5
    x, y = assignment(solve(tmp_path, net.to_onnx(), total, capsys), 2, 2)
    assert y[0] + y[1] >= 4.5 and np.all(np.abs(x) <= 1.0)
    above = query_2(box, 2, "(> (+ Y[0,0] Y[0,1]) 5.0)")
    assert solve(tmp_path, net.to_onnx(), above, capsys) == ["unsat"]


@pytest.mark.parametrize(
    "attribute",
    [
        helper.make_attribute("value_floats", [0.5, -0.25]),
        helper.make_attribute("value_float", 0.5),
    ],
)
def test_constants_in_every_numeric_attribute_form(tmp_path, capsys, attribute):
    """A shift by a Constant given as a list or a scalar, and a Reshape whose shape is a
    Constant's value_ints."""
    shift = helper.make_node("Constant", [], ["c"])
    shift.attribute.append(attribute)
    shape = helper.make_node("Constant", [], ["s"], value_ints=[1, 2])
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])
    nodes = [
        shift,
        shape,
        helper.make_node("Add", ["X", "c"], ["z"]),
        helper.make_node("Reshape", ["z", "s"], ["Y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]
    )
    onnx.checker.check_model(model)
    first = np.ravel(helper.get_attribute_value(attribute))[0]
    top = float(1.0 + first)  # the largest Y[0,0]
    box = [("0.0", "1.0"), ("0.0", "1.0")]
    over = query_2(box, 2, f"(> Y[0,0] {top!r})")
    assert solve(tmp_path, model.SerializeToString(), over, capsys) == ["unsat"]
    at = query_2(box, 2, f"(>= Y[0,0] {top!r})")
    x_, y_ = assignment(solve(tmp_path, model.SerializeToString(), at, capsys), 2, 2)
    assert y_[0] == np.float32(x_[0] + first) == np.float32(top)


def test_drivers_real_valued_time_limits_are_accepted(tmp_path, capsys):
    box = [("0.0", "1.0"), ("0.0", "1.0")]
    lines = solve(tmp_path, IDENTITY.to_onnx(), query_2(box, 2, "(>= Y[0,0] 0.5)"), capsys, "60.0")
    assert lines[0] == "sat"


def _network(seed: int, hidden: int) -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [
            (rng.normal(size=(hidden, 2)), rng.normal(size=hidden)),
            (rng.normal(size=(2, hidden)), rng.normal(size=2)),
        ]
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**16),
    hidden=st.integers(1, 8),
    row=st.sampled_from([(1.0, 0.0), (0.0, -1.0), (1.0, 1.0), (1.0, -1.0)]),
    op=st.sampled_from([">", ">="]),
    offset=st.sampled_from([-0.05, -1e-6, 0.0, 1e-6, 0.05]),
)
def test_every_sat_satisfies_its_query_in_onnxruntime_and_unsat_the_milp(
    tmp_path, capsys, seed, hidden, row, op, offset
):
    """Around the exact maximum of a row of outputs (MILP oracle): a `sat` assignment's
    input, run in onnxruntime, gives the printed outputs and meets the query exactly;
    an `unsat` has no real point above the threshold."""
    net = _network(seed, hidden)
    best, _ = max_violation(net, InputSet(-np.ones(2), np.ones(2)), OutputSpec([row], [0.0]))
    threshold = float(best) + offset
    term = f"(+ (* {row[0]!r} Y[0,0]) (* {row[1]!r} Y[0,1]))"
    text = query_2([("-1.0", "1.0"), ("-1.0", "1.0")], 2, f"({op} {term} {threshold!r})")
    lines = solve(tmp_path, net.to_onnx(), text, capsys)
    if lines[0] == "sat":
        x, y = assignment(lines, 2, 2)
        reference = OnnxRunner(net.to_onnx())(x[None])[0]
        assert np.array_equal(y, reference)
        assert parse_query(text).counterexample(x, reference)
    elif lines[0] == "unsat":
        assert best < threshold + 1e-6  # no real point meets it (up to the MILP's gap)
    else:
        assert lines[0] == "unknown" and abs(offset) <= 1e-6  # only at a tie


def exact(head: str, z: np.ndarray) -> np.ndarray:
    """The head in extended precision, which neither overflows nor underflows here."""
    z = z.astype(np.longdouble)
    if head == "sigmoid":
        return 1 / (1 + np.exp(-z))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    outputs=st.integers(1, 6),
    scale=st.sampled_from([0.1, 3.0, 800.0]),
    head=st.sampled_from(["sigmoid", "softmax"]),
)
def test_the_heads_bounds_hold_the_head_of_every_sampled_logit_vector(seed, outputs, scale, head):
    """Down to subnormal values, where exp overflows and 1 / (1 + e^t) underflows."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(scale=scale, size=(2, 4, outputs))
    low, high = np.minimum(a, b), np.maximum(a, b)
    y_low, y_high = activation_bounds(head, low, high)
    for box in range(4):
        z = low[box] + (high[box] - low[box]) * rng.random((500, outputs))
        corners = np.where(rng.random((64, outputs)) < 0.5, low[box], high[box])
        y = exact(head, np.vstack([z, corners]))
        assert np.all(y >= y_low[box]) and np.all(y <= y_high[box])
    assert np.all((y_low >= 0.0) & (y_low <= y_high) & (y_high <= 1.0))
    point = exact(head, low)  # a box of one point: the bounds close in on its value
    y_low, y_high = activation_bounds(head, low, low)
    assert np.all(y_high - y_low <= 1e-10 * point + 1e-320)
