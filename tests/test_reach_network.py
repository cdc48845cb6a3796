"""ONNX loading into numpy layers (checked against onnxruntime) and `vigil verify reach`."""

from __future__ import annotations

import itertools

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.milp_oracle import max_violation
from tests.onnx_models import forward, mlp
from vigil.daemon.cli import main
from vigil.rules.reach.network import Network, OnnxRunner, UnsupportedModel, load_checked


def graph_model(nodes, inits, n_in: int, n_out: int, shape=None) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape or ["n", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n_out])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 4))
def test_gemm_relu_chains_load_and_agree_with_onnxruntime(seed, depth):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, size=depth + 1)
    layers = [(rng.normal(size=(i, o)), rng.normal(size=o)) for i, o in itertools.pairwise(sizes)]
    model = mlp(layers)
    network, runner = load_checked(model)
    x = rng.normal(size=(16, sizes[0]))
    np.testing.assert_allclose(network.forward(x), forward(layers, x), atol=1e-9)
    np.testing.assert_allclose(network.forward(x), runner(x), atol=1e-9)


def test_matmul_add_flatten_transposed_gemm_and_scaling_load():
    rng = np.random.default_rng(0)
    w1, b1 = rng.normal(size=(4, 5)), rng.normal(size=5)
    w2 = rng.normal(size=(3, 5))  # (out, in) used with transB=1
    b2 = rng.normal(size=3)
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "w1"], ["m"]),
        helper.make_node("Add", ["m", "b1"], ["z"]),
        helper.make_node("Relu", ["z"], ["h"]),
        helper.make_node("Identity", ["h"], ["i"]),
        helper.make_node("Gemm", ["i", "w2", "b2"], ["y"], transB=1, alpha=0.5, beta=2.0),
    ]
    model = graph_model(nodes, {"w1": w1, "b1": b1, "w2": w2, "b2": b2}, 4, 3, shape=["n", 2, 2])
    network, runner = load_checked(model)
    x = rng.normal(size=(8, 4))
    expected = 0.5 * np.maximum(x @ w1 + b1, 0) @ w2.T + 2.0 * b2
    np.testing.assert_allclose(network.forward(x), expected, atol=1e-5)
    np.testing.assert_allclose(runner(x), expected, atol=1e-4)


def test_sigmoid_head_and_export_round_trip():
    rng = np.random.default_rng(1)
    net = Network.from_arrays(
        [
            (rng.normal(size=(6, 3)), rng.normal(size=6)),
            (rng.normal(size=(1, 6)), rng.normal(size=1)),
        ],
        output="sigmoid",
    )
    loaded, runner = load_checked(net.to_onnx())
    assert loaded.output == "sigmoid"
    x = rng.normal(size=(10, 3))
    np.testing.assert_allclose(loaded.forward(x), runner(x), atol=1e-6)
    assert np.all((loaded.forward(x) > 0.5) == (loaded.logits(x) > 0))


def test_a_network_owns_read_only_copies_and_shares_read_only_layers():
    w, b = np.ones((2, 3), dtype=np.float32), np.zeros(2)
    net = Network.from_arrays([(w, b)])
    w[0, 0] = 5.0  # the caller's arrays stay the caller's
    assert net.weights[0][0, 0] == 1.0 and net.weights[0].dtype == np.float64
    with pytest.raises(ValueError, match="read-only"):
        net.biases[0][0] = 1.0
    again = Network.from_arrays([(net.weights[0], net.biases[0])])
    assert again.weights[0] is net.weights[0] and again.biases[0] is net.biases[0]
    view = net.weights[0][:1]  # a read-only view of shared memory is not taken as owned
    assert Network.from_arrays([(view, net.biases[0][:1])]).weights[0] is not view


def test_unsupported_operators_are_named():
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["z"]),
        helper.make_node("Erf", ["z"], ["y"], name="act1"),
    ]
    model = graph_model(nodes, {"w": np.ones((2, 2)), "b": np.zeros(2)}, 2, 2)
    with pytest.raises(UnsupportedModel, match=r"'act1'.*Erf is not supported"):
        Network.from_onnx(model)


def test_branching_graphs_load():
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["h"]),
        helper.make_node("Add", ["h", "z"], ["y"], name="skip"),
    ]
    w = np.array([[1.0, -2.0], [0.5, 1.0]])
    network, _ = load_checked(graph_model(nodes, {"w": w, "b": np.zeros(2)}, 2, 2))
    x = np.random.default_rng(0).normal(size=(20, 2))
    z = x @ w
    np.testing.assert_allclose(network.forward(x), np.maximum(z, 0) + z, atol=1e-6)


def test_onnxruntime_disagreement_is_reported(tmp_path):
    net = Network.from_arrays([(np.eye(2), np.zeros(2))])
    other = OnnxRunner(Network.from_arrays([(2 * np.eye(2), np.zeros(2))]).to_onnx())
    from vigil.rules.reach.network import check_agreement

    with pytest.raises(UnsupportedModel, match="disagrees with onnxruntime"):
        check_agreement(net, other, np.ones((3, 2)))


def write_problem(tmp_path, net: Network, lower, upper, c, d) -> list[str]:
    paths = {}
    for name, value in {"lower": lower, "upper": upper, "C": c, "d": d}.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], np.asarray(value, dtype=np.float64))
    model = tmp_path / "model.onnx"
    model.write_bytes(net.to_onnx())
    return ["verify", "reach", "--model", str(model)] + [
        a for name, p in paths.items() for a in (f"--{name}", str(p))
    ]


@pytest.mark.parametrize("slack", [0.05, -0.05])
def test_verify_reach_cli_agrees_with_milp(tmp_path, capsys, slack):
    from vigil.rules.reach.sets import InputSet, OutputSpec

    rng = np.random.default_rng(4)
    net = Network.from_arrays(
        [
            (rng.normal(size=(8, 2)), rng.normal(size=8)),
            (rng.normal(size=(1, 8)), rng.normal(size=1)),
        ]
    )
    lower, upper, c = -np.ones(2), np.ones(2), np.array([[1.0]])
    worst, _ = max_violation(net, InputSet(lower, upper), OutputSpec(c, np.zeros(1)))
    # float32 export: keep the threshold clear of rounding
    argv = write_problem(tmp_path, net, lower, upper, c, [worst + slack])
    assert main([*argv, "--max-branches", "512"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert set(result) == {
        "status",
        "coverage",
        "branches",
        "seconds",
        "counterexample",
        "complete",
    }
    assert result["complete"] is None  # 512 branches decide it
    if slack > 0:
        assert result["status"] == "holds" and result["coverage"] == 1.0
    else:
        assert result["status"] == "violated"
        runner = OnnxRunner(net.to_onnx())
        assert runner(np.array([result["counterexample"]]))[0, 0] > worst + slack


def test_verify_reach_cli_names_bad_input(tmp_path, capsys):
    net = Network.from_arrays([(np.eye(2), np.zeros(2))])
    argv = write_problem(tmp_path, net, [0, 0, 0], [1, 1, 1], np.eye(2), [1, 1])
    assert main(argv) == 2
    assert "3 dimensions, the model 2" in capsys.readouterr().err
    argv = write_problem(tmp_path, net, [0, 1], [1, 0], np.eye(2), [1, 1])
    assert main(argv) == 2
    assert "lower > upper in dimension 1" in capsys.readouterr().err
    (tmp_path / "lower.npy").write_text("not an array")
    assert main(argv) == 2
    assert "--lower" in capsys.readouterr().err


def test_bytes_that_are_not_onnx_are_named(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08garbage")
    for source in (path, path.read_bytes()):
        with pytest.raises(UnsupportedModel, match="not an ONNX model"):
            load_checked(source)
