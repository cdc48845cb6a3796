"""The shape, reduction and affine operators the importer takes (Squeeze, Unsqueeze, Slice,
Gather, ReduceSum, ReduceMean, Cast, Split, Transpose, Identity, Dropout, Constant in each
attribute form, arithmetic with constants, the folded shape arithmetic): each model
matches onnxruntime on random inputs, and a VNN-LIB 2.0 query just above its maximum is
`unsat` and just below it `sat`, the maximum taken by onnxruntime at every corner of the
box (the models are affine), over the reals and in float32."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from vigil.daemon.cli._standard import main
from vigil.rules.graph import UnsupportedModel
from vigil.rules.reach.network import OnnxRunner, load_checked
from vigil.rules.reach.rounding import load_for

SHAPE = (1, 2, 3)


def const(name: str, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def model(nodes: list, out: str, width: int, initializers: list = ()) -> bytes:
    """X (1, 2, 3) through ``nodes`` to ``out`` of ``width`` values, flattened, then a fixed
    Gemm to one output Y."""
    weights = np.random.default_rng(width).normal(size=(1, width)).astype(np.float32)
    tail = [
        helper.make_node("Flatten", [out], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "W"], ["Y"], transB=1),
    ]
    graph = helper.make_graph(
        [*nodes, *tail],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(weights, "W"), *initializers],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return m.SerializeToString()


MODELS = {
    "squeeze+unsqueeze": model(
        [
            helper.make_node("Unsqueeze", ["X", "ax0"], ["u"]),
            helper.make_node("Squeeze", ["u", "ax1"], ["s"]),
        ],
        "s",
        6,
        [const("ax0", [0]), const("ax1", [1])],
    ),
    "slice": model(
        [helper.make_node("Slice", ["X", "st", "en", "ax", "sp"], ["s"])],
        "s",
        4,
        [const("st", [0, 1]), const("en", [2, 3]), const("ax", [1, 2]), const("sp", [1, 1])],
    ),
    "slice backwards": model(  # rows 1, 0 and column 2 (2 to 0 by -2)
        [helper.make_node("Slice", ["X", "st", "en", "ax", "sp"], ["s"])],
        "s",
        2,
        [const("st", [-1, 2]), const("en", [-100, 0]), const("ax", [1, -1]), const("sp", [-1, -2])],
    ),
    "gather": model(
        [helper.make_node("Gather", ["X", "idx"], ["g"], axis=2)],
        "g",
        4,
        [const("idx", [2, 0])],
    ),
    "reducesum": model(
        [helper.make_node("ReduceSum", ["X", "ax"], ["r"], keepdims=0)],
        "r",
        2,
        [const("ax", [2])],
    ),
    "reducemean": model([helper.make_node("ReduceMean", ["X"], ["r"], axes=[1])], "r", 3),
    "cast": model(
        [
            helper.make_node("Cast", ["X"], ["c"], to=TensorProto.DOUBLE),
            helper.make_node("Cast", ["c"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["shape"], ["ints"], to=TensorProto.INT64),
            helper.make_node("Reshape", ["f", "ints"], ["r"]),
        ],
        "r",
        6,
        [const("shape", [1.0, 3.0, 2.0], np.float32)],
    ),
    "split": model(
        [
            helper.make_node("Split", ["X", "parts"], ["a", "b"], axis=2),
            helper.make_node("Concat", ["b", "a"], ["c"], axis=2),
        ],
        "c",
        6,
        [const("parts", [1, 2])],
    ),
    "transpose, identity, dropout": model(
        [
            helper.make_node("Transpose", ["X"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Identity", ["t"], ["i"]),
            helper.make_node("Dropout", ["i"], ["d"]),
        ],
        "d",
        6,
    ),
    "constant forms": model(
        [
            helper.make_node("Constant", [], ["two"], value_float=2.0),
            helper.make_node("Constant", [], ["steps"], value_floats=[0.5, -1.0, 0.25]),
            helper.make_node("Constant", [], ["shape"], value_ints=[1, 6]),
            helper.make_node("Constant", [], ["minus"], value_int=-1),
            helper.make_node(
                "Constant",
                [],
                ["third"],
                value=helper.make_tensor("v", TensorProto.FLOAT, [], [3.0]),
            ),
            helper.make_node("Cast", ["minus"], ["minus_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["X", "two"], ["m"]),
            helper.make_node("Add", ["m", "steps"], ["a"]),
            helper.make_node("Mul", ["a", "minus_f"], ["n"]),
            helper.make_node("Div", ["n", "third"], ["q"]),
            helper.make_node("Reshape", ["q", "shape"], ["r"]),
        ],
        "r",
        6,
    ),
    "arithmetic with constants and sums of tensors": model(
        [
            helper.make_node("Sub", ["X", "c"], ["s"]),
            helper.make_node("Neg", ["s"], ["n"]),
            helper.make_node("Div", ["n", "c"], ["q"]),
            helper.make_node("Add", ["q", "X"], ["a"]),
            helper.make_node("Sub", ["c", "a"], ["b"]),
            helper.make_node("MatMul", ["b", "M"], ["p"]),
        ],
        "p",
        4,
        [
            const("c", [[[2.0, -0.5, 4.0]]], np.float32),
            const("M", np.arange(6).reshape(3, 2) - 2.5, np.float32),
        ],
    ),
    # exporters' shape arithmetic, folded to constants: a mask and weights from Range,
    # Pow, Sqrt and comparisons; Expand and Where on the data itself
    "folded shape arithmetic": model(
        [
            helper.make_node("Shape", ["X"], ["s"]),
            helper.make_node("Range", ["zero", "three_s", "one_s"], ["r"]),
            helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
            helper.make_node("Pow", ["rf", "two"], ["sq"]),
            helper.make_node("Sqrt", ["sq"], ["root"]),
            helper.make_node("Equal", ["rf", "onef"], ["middle"]),
            helper.make_node("Less", ["rf", "half"], ["first"]),
            helper.make_node("Greater", ["rf", "three_halves"], ["last"]),
            helper.make_node("And", ["middle", "last"], ["never"]),
            helper.make_node("Not", ["first"], ["later"]),
            helper.make_node("Or", ["never", "later"], ["keep"]),
            helper.make_node(
                "ConstantOfShape",
                ["s"],
                ["ones"],
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5]),
            ),
            helper.make_node("Tile", ["root", "reps"], ["tiled"]),
            helper.make_node("Slice", ["X", "s0", "s1", "s2"], ["x0"]),
            helper.make_node("Expand", ["x0", "s"], ["wide"]),
            helper.make_node("Slice", ["tiled", "s0", "three", "ax0"], ["tiled3"]),
            helper.make_node("Mul", ["X", "tiled3"], ["scaled"]),
            helper.make_node("Where", ["keep", "scaled", "wide"], ["w"]),
            helper.make_node("Mul", ["w", "ones"], ["w2"]),
            helper.make_node("Size", ["X"], ["size"]),
            helper.make_node("Unsqueeze", ["size", "ax0"], ["size1"]),
            helper.make_node("Concat", ["one", "size1"], ["target"], axis=0),
            helper.make_node("Reshape", ["w2", "target"], ["flat6"]),
        ],
        "flat6",
        6,
        [
            const("zero", 0),
            const("three_s", 3),
            const("one_s", 1),
            const("three", [3]),
            const("one", [1]),
            const("reps", [2]),
            const("ax0", [0]),
            const("s0", [0]),
            const("s1", [1]),
            const("s2", [2]),
            const("two", 2.0, np.float32),
            const("onef", 1.0, np.float32),
            const("half", 0.5, np.float32),
            const("three_halves", 1.5, np.float32),
        ],
    ),
}


def query(threshold: float, dtype: str = "real") -> str:
    lines = [
        "(vnnlib-version <2.0>)",
        "(declare-network net",
        f"  (declare-input X {dtype} [1,2,3])",
        f"  (declare-output Y {dtype} [1,1]))",
    ]
    for i, j in itertools.product(range(2), range(3)):
        lines.append(f"(assert (>= X[0,{i},{j}] -1.0)) (assert (<= X[0,{i},{j}] 1.0))")
    lines.append(f"(assert (>= Y[0,0] {threshold!r}))")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("dtype", ["real", "float32"])
@pytest.mark.parametrize("name", MODELS)
def test_the_operator_matches_onnxruntime_and_its_queries_are_decided(
    tmp_path, capsys, name, dtype
):
    onnx_bytes = MODELS[name]
    network, runner = load_checked(onnx_bytes)  # raises if numpy and onnxruntime disagree
    assert network.input_dim == 6
    corners = np.array(list(itertools.product([-1.0, 1.0], repeat=6)))
    top = float(OnnxRunner(onnx_bytes)(corners).max())
    (tmp_path / "m.onnx").write_bytes(onnx_bytes)
    for threshold, answer in ((top + 0.05, "unsat"), (top - 0.05, "sat")):
        (tmp_path / "q.vnnlib").write_text(query(threshold, dtype))
        args = ["verify", str(tmp_path / "q.vnnlib"), "--network", f"net={tmp_path / 'm.onnx'}"]
        assert main([*args, "--timeout", "30"]) == 0, capsys.readouterr().err
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == answer
        if answer == "sat":
            x = np.array([float(v) for v in lines[2:8]])
            assert runner(x[None])[0, 0] >= threshold
            assert float(lines[9]) == runner(x[None])[0, 0]  # the output as computed


def test_an_integer_cast_of_the_input_is_refused_by_name():
    bad = model(
        [helper.make_node("Cast", ["X"], ["c"], to=TensorProto.INT32, name="trunc")], "c", 6
    )
    with pytest.raises(UnsupportedModel, match=r"'trunc' \(Cast\).*integer type"):
        load_checked(bad)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (
            [helper.make_node("Sqrt", ["X"], ["c"], name="root")],
            r"'root' \(Sqrt\): its inputs must be constants",
        ),
        (
            [
                helper.make_node("Greater", ["X", "two"], ["mask"], name="cmp"),
                helper.make_node("Where", ["mask", "X", "X"], ["c"]),
            ],
            r"'cmp' \(Greater\): its inputs must be constants",
        ),
    ],
)
def test_a_folded_operator_on_the_input_is_refused_by_name(nodes, message):
    bad = model(nodes, "c", 6, [const("two", 2.0, np.float32)])
    with pytest.raises(UnsupportedModel, match=message):
        load_checked(bad)


def test_a_squashed_constant_is_folded_over_the_reals_and_refused_in_float32():
    """tanh of a constant scales X: exact over the reals; in float32 onnxruntime's tanh
    would enter the chain as an exact constant, which no rounding bound covers."""
    squashed = model(
        [
            helper.make_node("Tanh", ["c"], ["t"], name="gate"),
            helper.make_node("Mul", ["X", "t"], ["m"]),
        ],
        "m",
        6,
        [const("c", [0.5, -1.0, 2.0], np.float32)],
    )
    network, _ = load_for(squashed, "real")
    x = np.random.default_rng(0).uniform(-1.0, 1.0, (5, 6))
    w = np.random.default_rng(6).normal(size=(1, 6)).astype(np.float32).astype(np.float64)
    scaled = (x.reshape(5, 2, 3) * np.tanh([0.5, -1.0, 2.0])).reshape(5, 6)
    np.testing.assert_allclose(network.forward(x), scaled @ w.T, rtol=1e-6)
    with pytest.raises(UnsupportedModel, match=r"'gate' \(Tanh\): tanh of a constant in float32"):
        load_for(squashed, "float32")
