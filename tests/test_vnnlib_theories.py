"""VNN-LIB 2.0 constraints that combine variables: an output against an input, and a sum
of inputs (a half-plane of the box), decided over the reals and in float32 and checked
against a dense grid of the network's outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_vnnlib_semantics import query_2, solve, values
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
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**16),
    name=st.sampled_from(sorted(CONSTRAINTS)),
    dtype=st.sampled_from(["real", "float32"]),
)
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
