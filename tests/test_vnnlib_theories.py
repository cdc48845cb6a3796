"""VNN-LIB 2.0 theories beyond one input, one output and bounds: constraints that combine
variables (an output against an input, a sum of inputs), several inputs and outputs, and
hidden nodes, decided over the reals and in float32 and checked against a dense grid of
the network's values."""

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
from vigil.rules.reach.network import Network, OnnxRunner

GRID = np.stack(np.meshgrid(*[np.linspace(-1.0, 1.0, 801)] * 2), -1).reshape(-1, 2)
SPACING = 2.0 / 800


def network(seed: int) -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [
            (rng.normal(size=(8, 2)), rng.normal(size=8)),
            (rng.normal(size=(2, 8)), rng.normal(size=2)),
        ]
    )


def lipschitz(net: Network) -> float:
    """A Lipschitz bound of each output in the max norm of the input."""
    return float((np.abs(net.weights[1]) @ np.abs(net.weights[0])).sum(axis=1).max())


CONSTRAINTS = {
    # name: (the unsafe region's constraints, its margin on the grid's points (>= 0: unsafe))
    "output above an input": (
        ["(>= (- Y[0,0] X[0,0]) {t})"],
        lambda x, y, t: y[:, 0] - x[:, 0] - t,
    ),
    "half-plane of the box": (
        ["(<= (+ X[0,0] X[0,1]) 0.0)", "(>= Y[0,1] {t})"],
        lambda x, y, t: np.minimum(-(x[:, 0] + x[:, 1]), y[:, 1] - t),
    ),
}


@settings(
    max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16))
@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_constraints_combining_variables_are_decided(tmp_path, capsys, seed, name, dtype):
    """Just below the grid's best: `sat`, the assignment meeting every constraint in
    onnxruntime; above it by more than the grid can miss: `unsat`."""
    net = network(seed)
    model = net.to_onnx()
    asserts, margin = CONSTRAINTS[name]
    y = net.forward(GRID)
    # the largest threshold t the grid's points reach, found where margin(t) = 0
    if name == "output above an input":
        best = float((y[:, 0] - GRID[:, 0]).max())
        slack = (lipschitz(net) + 1.0) * SPACING
    else:
        best = float(y[GRID.sum(axis=1) <= 0.0, 1].max())
        slack = lipschitz(net) * 2 * SPACING  # a grid point of the half-plane within 2 steps
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    for threshold, answer in ((best - 0.05, "sat"), (best + slack + 0.01, "unsat")):
        rows = [a.format(t=repr(threshold)) for a in asserts]
        lines = solve(tmp_path, model, query_2(box, 2, *rows, dtype=dtype), capsys)
        assert lines[0] == answer, (threshold, lines)
        if answer == "sat":
            x_text, y_text = values(lines, 2, 2)
            x = np.array([float(v) for v in x_text])
            reference = OnnxRunner(model)(x[None])
            assert [float(v) for v in reference[0]] == [float(v) for v in y_text]
            assert margin(x[None], reference, threshold)[0] >= 0.0


def test_a_combined_constraint_on_a_softmax_network_is_refused(tmp_path, capsys):
    net = Network.from_arrays([(np.eye(2), np.zeros(2))], output="softmax")
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    (tmp_path / "m.onnx").write_bytes(net.to_onnx())
    with pytest.raises(AssertionError, match="network ending in softmax"):
        solve(tmp_path, net.to_onnx(), query_2(box, 2, "(>= Y[0,0] X[0,0])"), capsys)


def two_in_two_out(seed: int) -> bytes:
    """Inputs A [1,2] and B [1,1], joined; a ReLU layer whose output is the tensor "h";
    outputs Y [1,1] and Z [1,2]."""
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Concat", ["A", "B"], ["ab"], axis=1),
        helper.make_node("Gemm", ["ab", "W1", "b1"], ["z"]),
        helper.make_node("Relu", ["z"], ["h"]),
        helper.make_node("Gemm", ["h", "W2", "b2"], ["Y"]),
        helper.make_node("Gemm", ["h", "W3", "b3"], ["Z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mio",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, 1]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [1, 2]),
        ],
        [
            weight("W1", 3, 4),
            weight("b1", 4),
            weight("W2", 4, 1),
            weight("b2", 1),
            weight("W3", 4, 2),
            weight("b3", 2),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def mio_query(dtype: str, hidden: bool, *asserts: str) -> str:
    lines = [
        "(vnnlib-version <2.0>)",
        "(declare-network net",
        f"  (declare-input A {dtype} [1,2])",
        f"  (declare-input B {dtype} [1,1])",
        *([f'  (declare-hidden H {dtype} [1,4] "h")'] if hidden else []),
        f"  (declare-output Y {dtype} [1,1])",
        f"  (declare-output Z {dtype} [1,2]))",
        "(assert (>= A[0,0] -1.0)) (assert (<= A[0,0] 1.0))",
        "(assert (>= A[0,1] -1.0)) (assert (<= A[0,1] 1.0))",
        "(assert (>= B[0,0] -1.0)) (assert (<= B[0,0] 1.0))",
    ]
    return "\n".join([*lines, *(f"(assert {a})" for a in asserts)]) + "\n"


CUBE = np.stack(np.meshgrid(*[np.linspace(-1.0, 1.0, 61)] * 3), -1).reshape(-1, 3)


@pytest.mark.parametrize("dtype", ["real", "float32"])
@pytest.mark.parametrize("target", ["Z[0,1] - Y[0,0]", "H[0,2]"])
def test_several_inputs_outputs_and_a_hidden_node(tmp_path, capsys, dtype, target):
    """A constraint on two outputs, or on a hidden node: `sat` just below the grid's best
    (the assignment printed in declaration order, each value onnxruntime's), `unsat`
    above it by more than the grid can miss."""
    model = two_in_two_out(7)
    w = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load_model_from_string(model).graph.initializer
    }
    h = np.maximum(CUBE @ w["W1"] + w["b1"], 0.0)  # the graph's arithmetic, in numpy
    y, z = h @ w["W2"] + w["b2"], h @ w["W3"] + w["b3"]
    best = float((z[:, 1] - y[:, 0]).max() if target.startswith("Z") else h[:, 2].max())
    term = "(- Z[0,1] Y[0,0])" if target.startswith("Z") else "H[0,2]"
    slope = float(np.abs(w["W1"]).sum(axis=0).max()) * (
        1.0 + float(np.abs(w["W2"]).sum() + np.abs(w["W3"]).sum())
    )
    slack = slope * 2.0 / 60
    for threshold, answer in ((best - 0.05, "sat"), (best + slack + 0.01, "unsat")):
        text = mio_query(dtype, True, f"(>= {term} {threshold!r})")
        (tmp_path / "m.onnx").write_bytes(model)
        (tmp_path / "q.vnnlib").write_text(text)
        args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
        assert main([*args, "--timeout", "30"]) == 0, capsys.readouterr().err
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == answer, (threshold, lines)
        if answer == "sat":
            heads = [line for line in lines[1:] if not line[0].isdigit() and line[0] != "-"]
            assert heads == [
                f"A {dtype} [1,2]",
                f"B {dtype} [1,1]",
                f"H {dtype} [1,4]",
                f"Y {dtype} [1,1]",
                f"Z {dtype} [1,2]",
            ]
            numbers = [float(line) for line in lines[1:] if line not in heads]
            x = np.array(numbers[:3])
            reference = node_by_node_outputs(model, x[None], ("h",))[0]
            # printed: H (4), Y (1), Z (2); computed: Y, Z, then h
            assert numbers[3:7] == reference[3:].tolist()
            assert numbers[7:] == reference[:3].tolist()
            value = reference[2] - reference[0] if target.startswith("Z") else reference[5]
            assert value >= threshold


def node_by_node_outputs(model: bytes, x: np.ndarray, hidden: tuple[str, ...]) -> np.ndarray:
    """Y, Z, then the hidden tensors, from onnxruntime on the rows of x (A then B)."""
    proto = onnx.load_model_from_string(model)
    proto.graph.output.extend(helper.make_empty_tensor_value_info(h) for h in hidden)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    rows = []
    for point in x.astype(np.float32):
        out = session.run(None, {"A": point[None, :2], "B": point[None, 2:]})
        rows.append(np.concatenate([np.ravel(o) for o in out]).astype(np.float64))
    return np.array(rows)


def two_networks_query(dtype: str, same_input: bool, relation: str, equal: bool = False) -> str:
    lines = [
        "(vnnlib-version <2.0>)",
        f"(declare-network f (declare-input A {dtype} [1,2]) (declare-output B {dtype} [1,1]))",
        "(declare-network g "
        + ("(equal-to f) " if equal else "")
        + f"(declare-input C {dtype} [1,2]) (declare-output D {dtype} [1,1]))",
    ]
    for name in ("A", "C"):
        for i in range(2):
            lines.append(f"(assert (>= {name}[0,{i}] -1.0)) (assert (<= {name}[0,{i}] 1.0))")
    if same_input:
        lines.append("(assert (== A[0,0] C[0,0])) (assert (== C[0,1] A[0,1]))")
    lines.append(f"(assert {relation})")
    return "\n".join(lines) + "\n"


def single_output(seed: int) -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [
            (rng.normal(size=(8, 2)), rng.normal(size=8)),
            (rng.normal(size=(1, 8)), rng.normal(size=1)),
        ]
    )


@pytest.mark.parametrize("dtype", ["real", "float32"])
@pytest.mark.parametrize("same_input", [True, False])
def test_two_networks_compared(tmp_path, capsys, dtype, same_input):
    """Teacher and student on the same input (the equalities make them read one input),
    or each on its own: the largest B - D over a grid, `sat` just below it with both
    networks' outputs as onnxruntime computes them, `unsat` above it."""
    f, g = single_output(1), single_output(2)
    (tmp_path / "f.onnx").write_bytes(f.to_onnx())
    (tmp_path / "g.onnx").write_bytes(g.to_onnx())
    if same_input:
        gap = f.forward(GRID)[:, 0] - g.forward(GRID)[:, 0]
        best, slack = float(gap.max()), (lipschitz(f) + lipschitz(g)) * SPACING
    else:
        best = float(f.forward(GRID)[:, 0].max() - g.forward(GRID)[:, 0].min())
        slack = (lipschitz(f) + lipschitz(g)) * SPACING
    args = ["--network", f"f={tmp_path / 'f.onnx'}", "--network", f"g={tmp_path / 'g.onnx'}"]
    for threshold, answer in ((best - 0.05, "sat"), (best + slack + 0.01, "unsat")):
        query = tmp_path / "q.vnnlib"
        query.write_text(
            two_networks_query(dtype, same_input, f"(>= (- B[0,0] D[0,0]) {threshold!r})")
        )
        assert main(["verify", str(query), *args, "--timeout", "30"]) == 0, capsys.readouterr().err
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == answer, (threshold, lines)
        if answer == "sat":
            assert [lines[k] for k in (1, 4, 6, 9)] == [
                f"A {dtype} [1,2]",
                f"B {dtype} [1,1]",
                f"C {dtype} [1,2]",
                f"D {dtype} [1,1]",
            ]
            a = np.array([float(v) for v in lines[2:4]])
            b = float(lines[5])
            c = np.array([float(v) for v in lines[7:9]])
            d = float(lines[10])
            if same_input:
                assert np.array_equal(a, c)
            assert b == OnnxRunner(f.to_onnx(), node_by_node=True)(a[None])[0, 0]
            assert d == OnnxRunner(g.to_onnx(), node_by_node=True)(c[None])[0, 0]
            assert b - d >= threshold


@pytest.mark.parametrize("dtype", ["real", "float32"])
def test_a_network_equal_to_another_needs_no_file(tmp_path, capsys, dtype):
    """f and its declared copy on one input: B - D is 0 exactly, also in float32, so it
    reaches 0 and never 0.01."""
    f = single_output(3)
    (tmp_path / "f.onnx").write_bytes(f.to_onnx())
    for threshold, answer in (("0.0", "sat"), ("0.01", "unsat")):
        query = tmp_path / "q.vnnlib"
        relation = f"(>= (- B[0,0] D[0,0]) {threshold})"
        query.write_text(two_networks_query(dtype, True, relation, equal=True))
        args = ["verify", str(query), "--network", f"f={tmp_path / 'f.onnx'}", "--timeout", "30"]
        assert main(args) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.splitlines()[0] == answer


def test_declarations_out_of_the_models_order_are_refused(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(two_in_two_out(7))
    text = mio_query("real", False, "(>= Y[0,0] 0.0)").replace(
        "(declare-input A real [1,2])\n  (declare-input B real [1,1])",
        "(declare-input B real [1,1])\n  (declare-input A real [1,2])",
    )
    (tmp_path / "q.vnnlib").write_text(text)
    args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
    assert main(args) == 2
    assert "the model's inputs, in order, are A (2 values), B (1 values)" in capsys.readouterr().err


def test_polynomial_arithmetic_is_refused_with_the_theories_answered(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(network(0).to_onnx())
    box = [("-1.0", "1.0"), ("-1.0", "1.0")]
    (tmp_path / "q.vnnlib").write_text(query_2(box, 2, "(<= (* Y[0,0] Y[0,1]) 1.0)"))
    args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
    assert main(args) == 2
    assert "polynomial arithmetic is not supported" in capsys.readouterr().err
