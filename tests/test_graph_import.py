"""The ONNX graph importer: graphs (convolutions, normalisation, residual branches, shape
operators) become ReLU chains that compute what onnxruntime computes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_models import conv_residual
from vigil.rules.graph import CONVERTERS, UnsupportedModel
from vigil.rules.reach.network import Network, OnnxRunner, load_checked
from vigil.rules.reach.rounding import load_for


def model(nodes, inits, shape, out, extra_inputs=()) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_conv_network_with_a_residual_add_computes_what_onnxruntime_does(seed):
    source = conv_residual(seed)
    network = Network.from_onnx(source)
    x = np.random.default_rng(seed).uniform(-2, 2, size=(40, 16))
    np.testing.assert_allclose(network.forward(x), OnnxRunner(source)(x), atol=1e-4, rtol=1e-4)


def test_a_skip_from_the_network_input_is_carried_through_relus_with_its_sign():
    rng = np.random.default_rng(3)
    f32 = np.float32
    inits = {
        "w1": rng.normal(size=(3, 4)).astype(f32),
        "w2": rng.normal(size=(4, 3)).astype(f32),
        "b2": rng.normal(size=3).astype(f32),
    }
    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(f32(2.0))),
        helper.make_node("MatMul", ["x", "w1"], ["z1"]),
        helper.make_node("Relu", ["z1"], ["h1"]),
        helper.make_node("Dropout", ["h1"], ["d1"]),
        helper.make_node("MatMul", ["d1", "w2"], ["z2"]),
        helper.make_node("Add", ["z2", "b2"], ["z3"]),
        helper.make_node("Relu", ["z3"], ["h2"]),
        helper.make_node("Neg", ["x"], ["minus"]),
        helper.make_node("Mul", ["two", "minus"], ["skip"]),
        helper.make_node("Add", ["h2", "skip"], ["s"], name="skip-add"),
        helper.make_node("Identity", ["s"], ["y"]),
    ]
    source = model(nodes, inits, ["n", 3], ["n", 3])
    network, runner = load_checked(source)
    x = rng.uniform(-3, 3, size=(50, 3))  # negative inputs: the carried x keeps its sign
    expected = np.maximum(np.maximum(x @ inits["w1"], 0) @ inits["w2"] + inits["b2"], 0) - 2 * x
    np.testing.assert_allclose(network.forward(x), expected, atol=1e-5)
    np.testing.assert_allclose(runner(x), expected, atol=1e-4)


def test_padded_average_pooling_and_strided_grouped_convolution_agree():
    rng = np.random.default_rng(5)
    f32 = np.float32
    inits = {"k": rng.normal(size=(4, 1, 2, 2)).astype(f32), "w": rng.normal(size=(2, 16))}
    inits["w"] = inits["w"].astype(f32)
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], group=2, strides=[2, 1], dilations=[1, 2]),
        helper.make_node("Relu", ["c"], ["h"]),
        helper.make_node(
            "AveragePool", ["h"], ["p"], kernel_shape=[2, 2], pads=[1, 0, 0, 1], strides=[1, 1]
        ),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1),
    ]
    source = model(nodes, inits, [1, 2, 5, 4], [1, 2])
    network, runner = load_checked(source)
    x = rng.normal(size=(10, 40))
    np.testing.assert_allclose(network.forward(x), runner(x), atol=1e-4)


def test_weights_also_listed_as_graph_inputs_are_weights():
    w = np.eye(2, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    listed = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])
    network = Network.from_onnx(model(nodes, {"w": w}, [1, 2], [1, 2], [listed]))
    assert network.input_dim == 2 and network.output_dim == 2


def test_an_unsupported_operator_is_named_with_its_node():
    nodes = [helper.make_node("Erf", ["x"], ["y"], name="squash")]
    with pytest.raises(UnsupportedModel, match=r"'squash': operator Erf is not supported"):
        Network.from_onnx(model(nodes, {}, ["n", 2], ["n", 2]))
    assert "Erf" not in CONVERTERS and {"Conv", "Relu", "Gemm"} <= set(CONVERTERS)


def test_products_of_two_data_tensors_are_read_as_squares():
    """Mul, MatMul and Pow of tensors computed from the input: a difference of squares,
    exactly (the chain in float64 against numpy)."""
    rng = np.random.default_rng(0)
    square = model([helper.make_node("Mul", ["x", "x"], ["y"])], {}, ["n", 2], ["n", 2])
    x = rng.uniform(-3, 3, size=(50, 2))
    np.testing.assert_allclose(Network.from_onnx(square).forward(x), x * x, rtol=1e-12)
    gram = model([helper.make_node("MatMul", ["x", "x"], ["y"])], {}, [2, 2], [2, 2])
    m = rng.uniform(-3, 3, size=(50, 2, 2))
    expected = (m @ m).reshape(50, -1)
    np.testing.assert_allclose(
        Network.from_onnx(gram).forward(m.reshape(50, -1)), expected, rtol=1e-9, atol=1e-9
    )
    # 1-D operands, promoted as numpy does: a row times a matrix, a matrix times a column,
    # and the inner product of two vectors
    halves = [
        helper.make_node("Slice", ["x", "zero", "two", "zero"], ["v"]),
        helper.make_node("Slice", ["x", "two", "four", "zero"], ["w"]),
        helper.make_node("Reshape", ["x", "square_shape"], ["m"]),
    ]
    ints = {
        "zero": np.array([0]),
        "two": np.array([2]),
        "four": np.array([4]),
        "square_shape": np.array([2, 2]),
    }
    flat = rng.uniform(-3, 3, size=(50, 4))
    v, w, m = flat[:, :2], flat[:, 2:], flat.reshape(50, 2, 2)
    for left, right, out, expected in (
        ("v", "m", [2], np.einsum("ni,nij->nj", v, m)),
        ("m", "w", [2], np.einsum("nij,nj->ni", m, w)),
        ("v", "w", [], np.einsum("ni,ni->n", v, w)[:, None]),
    ):
        vectors = model([*halves, helper.make_node("MatMul", [left, right], ["y"])], ints, [4], out)
        got = Network.from_onnx(vectors).forward(flat)
        np.testing.assert_allclose(got, expected.reshape(50, -1), rtol=1e-9, atol=1e-9)
        load_for(vectors, "float32")
    cube = model(
        [helper.make_node("Pow", ["x", "three"], ["y"])],
        {"three": np.array(3.0, np.float32)},
        ["n", 2],
        ["n", 2],
    )
    np.testing.assert_allclose(Network.from_onnx(cube).forward(x), x**3, rtol=1e-9, atol=1e-9)
    for source in (square, gram, cube):  # onnxruntime's float32 within the rounding bounds
        load_for(source, "float32")


def test_a_fixed_batch_is_that_many_rows_of_one_input():
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["h"]),
        helper.make_node("MatMul", ["h", "v"], ["y"]),
    ]
    weights = {
        k: rng.normal(size=s).astype(np.float32)
        for k, s in (("w", (3, 4)), ("b", (4,)), ("v", (4, 1)))
    }
    network, _ = load_checked(model(nodes, weights, [2, 3], [2, 1]))  # raises on disagreement
    assert (network.input_dim, network.output_dim) == (6, 2)
    softmax = [*nodes[:2], helper.make_node("Softmax", ["h"], ["y"], axis=-1, name="probs")]
    with pytest.raises(UnsupportedModel, match=r"'probs' \(Softmax\): a Softmax over 2 rows"):
        Network.from_onnx(model(softmax, weights, [2, 3], [2, 4]))


def test_the_acasxu_networks_load_as_onnxruntime_runs_them(acasxu):
    network, runner = load_checked(acasxu / "ACASXU_run2a_4_5_batch_2000.onnx")
    assert network.hidden_sizes == [50] * 6 and network.output_dim == 5
    x = np.random.default_rng(0).uniform(-0.5, 0.5, size=(20, 5))
    np.testing.assert_allclose(network.forward(x), runner(x), atol=1e-5)
