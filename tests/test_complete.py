"""The complete search on VNN-LIB queries: verdicts against the MILP oracle and the
published ACAS Xu answers, counterexamples confirmed by onnxruntime, and `vigil verify
vnnlib` end to end."""

from __future__ import annotations

import itertools
import re
import time

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.milp_oracle import max_violation
from tests.onnx_models import conv_residual, mlp
from vigil.daemon.cli import main
from vigil.rules.reach.backward import output_bounds, pre_activation_bounds
from vigil.rules.reach.complete import _BranchAndBound, _Search, verify
from vigil.rules.reach.milp import box_counterexample
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.reach.vnnlib import parse_query


def box_query(lo, hi, rows: list[str], outputs: int) -> str:
    """VNN-LIB 1.0 text: the box and one unsafe conjunction of the given output rows."""
    text = "".join(f"(declare-const X_{i} Real)\n" for i in range(len(lo)))
    text += "".join(f"(declare-const Y_{j} Real)\n" for j in range(outputs))
    for i, (a, b) in enumerate(zip(lo, hi, strict=True)):
        text += f"(assert (>= X_{i} {float(a)!r}))\n(assert (<= X_{i} {float(b)!r}))\n"
    return text + f"(assert (and {' '.join(rows)}))\n"


def random_problem(seed: int, depth: int, widest: int):
    """(rng, a random network of 3 inputs, 2 outputs and ``depth`` hidden layers of 2 to
    ``widest`` neurons, a box lo..hi); the rng goes on for the test's own draws."""
    rng = np.random.default_rng(seed)
    sizes = [3, *rng.integers(2, widest + 1, size=depth), 2]
    net = Network.from_arrays(
        [(rng.normal(size=(o, i)), rng.normal(size=o)) for i, o in itertools.pairwise(sizes)]
    )
    lo = rng.uniform(-1, 0, 3)
    return rng, net, lo, lo + rng.uniform(0.01, 1, 3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_output_bounds_hold_at_the_milp_maximiser(seed, depth):
    rng, net, lo, hi = random_problem(seed, depth, widest=6)
    c = rng.normal(size=(2, 2))
    upper = output_bounds(net, lo[None], hi[None], c).upper[0]
    for row in range(2):
        # the network's value at the MILP's maximiser (the solver's objective carries its
        # feasibility tolerance)
        _, argmax = max_violation(net, InputSet(lo, hi), OutputSpec(c[row : row + 1], [0.0]))
        reached = float(net.logits(np.clip(argmax, lo, hi)[None])[0] @ c[row])
        assert upper[row] >= reached - 1e-9


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 4), side=st.sampled_from([-1, 1]))
def test_the_milp_finisher_agrees_with_the_oracle(seed, depth, side):
    """The finisher's big-M constants are back-substituted bounds (tighter than the
    oracle's interval ones): its verdict on ``c y <= d`` matches the oracle's optimum, with d
    0.01 on either side of it."""
    rng, net, lo, hi = random_problem(seed, depth, widest=7)
    c = rng.normal(size=(1, 2))
    # the least c y over the box: -max(-c y)
    best = -max_violation(net, InputSet(lo, hi), OutputSpec(-c, [0.0]))[0]
    d = np.array([best + 0.01 * side])
    outcome, x = box_counterexample(net, lo, hi, c, d, 30.0)
    if side < 0:
        assert outcome == "infeasible"
    else:
        assert outcome == "found"
        assert np.all(x >= lo - 1e-9) and np.all(x <= hi + 1e-9)
        assert float(net.logits(np.clip(x, lo, hi)[None])[0] @ c[0]) <= d[0] + 1e-6


def test_a_conv_network_with_a_residual_add_gets_the_milp_verdicts():
    rng = np.random.default_rng(7)
    for seed in range(3):
        source = conv_residual(seed, channels=1, outputs=2)
        net = Network.from_onnx(source)
        runner = OnnxRunner(source)
        centre = rng.uniform(-1, 1, net.input_dim)
        lo, hi = centre - 0.05, centre + 0.05
        # unsafe: Y_0 - Y_1 >= t; the MILP's maximum of Y_0 - Y_1 decides it
        spec = OutputSpec(np.array([[1.0, -1.0]]), np.zeros(1))
        best, _ = max_violation(net, InputSet(lo, hi), spec)
        for slack, answer in ((0.05, "unsat"), (-0.05, "sat")):
            threshold = best + slack
            query = parse_query(
                box_query(lo, hi, [f"(>= (- Y_0 Y_1) {float(threshold)!r})"], net.output_dim)
            )
            verdict = verify(net, query, runner, timeout=60)
            assert verdict.result == answer, (seed, slack, verdict)
            if answer == "sat":
                assert np.all((verdict.x >= lo) & (verdict.x <= hi))
                y = runner(verdict.x[None])[0]
                assert y[0] - y[1] >= threshold - 1e-4


def test_a_mlp_counterexample_is_found_where_only_one_tiny_region_is_unsafe():
    rng = np.random.default_rng(3)
    layers = [(rng.normal(size=(2, 12)), rng.normal(size=12)), (rng.normal(size=(12, 1)), [0.0])]
    source = mlp([(w, np.asarray(b)) for w, b in layers])
    net, runner = Network.from_onnx(source), OnnxRunner(source)
    lo, hi = -np.ones(2), np.ones(2)
    best, _ = max_violation(net, InputSet(lo, hi), OutputSpec([[1.0]], [0.0]))
    query = parse_query(box_query(lo, hi, [f"(>= Y_0 {float(best - 1e-3)!r})"], 1))
    verdict = verify(net, query, runner, timeout=60)
    assert verdict.result == "sat" and verdict.y[0] >= best - 1e-3 - 1e-4
    query = parse_query(box_query(lo, hi, [f"(>= Y_0 {float(best + 1e-3)!r})"], 1))
    assert verify(net, query, runner, timeout=60).result == "unsat"


def test_the_time_limit_is_honoured(acasxu):
    net = Network.from_onnx(acasxu / "ACASXU_run2a_3_3_batch_2000.onnx")
    runner = OnnxRunner(acasxu / "ACASXU_run2a_3_3_batch_2000.onnx")
    query = parse_query((acasxu / "prop_2.vnnlib").read_text())
    verdict = verify(net, query, runner, timeout=1.0)
    assert verdict.result == "timeout" and verdict.seconds < 3.0


@pytest.mark.parametrize(
    ("network", "prop", "answer"),
    [
        ("4_5", 1, "unsat"),
        ("4_5", 2, "sat"),
        ("4_5", 3, "unsat"),
        ("4_5", 4, "unsat"),
        ("1_9", 7, "sat"),
    ],
)
def test_acasxu_instances_get_the_published_verdicts(
    acasxu, tmp_path, capsys, network, prop, answer
):
    model = acasxu / f"ACASXU_run2a_{network}_batch_2000.onnx"
    spec = acasxu / f"prop_{prop}.vnnlib"
    out = tmp_path / "result.txt"
    assert (
        main(["verify", "vnnlib", str(model), str(spec), "--timeout", "116", "--out", str(out)])
        == 0
    )
    result = orjson.loads(capsys.readouterr().out)
    assert result["result"] == answer
    text = out.read_text()
    assert text.splitlines()[0] == answer
    if answer == "sat":  # the result file's assignment, checked on its own
        values = dict(re.findall(r"\(([XY]_\d+) ([^\s()]+)\)", text))
        x = np.array([float(values[f"X_{i}"]) for i in range(5)])
        y = OnnxRunner(model)(x[None])[0]
        np.testing.assert_allclose(y, [float(values[f"Y_{j}"]) for j in range(5)], atol=1e-4)
        assert parse_query(spec.read_text()).counterexample(x, y)  # 1.0: within 1e-4


def test_the_cli_names_what_does_not_fit(tmp_path, capsys):
    net = Network.from_arrays([(np.eye(2), np.zeros(2))])
    model = tmp_path / "m.onnx"
    model.write_bytes(net.to_onnx())
    spec = tmp_path / "p.vnnlib"
    spec.write_text(box_query([0, 0, 0], [1, 1, 1], ["(>= Y_0 5)"], 2))
    assert main(["verify", "vnnlib", str(model), str(spec)]) == 2
    assert "over 3 inputs and 2 outputs, m.onnx has 2 and 2" in capsys.readouterr().err
    spec.write_text("(declare-const X_0 Real)\n(assert (<= X_0 1)")
    assert main(["verify", "vnnlib", str(model), str(spec)]) == 2
    assert "never closed" in capsys.readouterr().err
    assert main(["verify", "vnnlib", str(tmp_path / "none.onnx"), str(spec)]) == 2
    assert "none.onnx: no such file" in capsys.readouterr().err


def test_a_milp_past_the_deadline_is_not_started_and_its_box_stays_open():
    """The finisher's boxes are decided only while time is left: one past the deadline
    answers "timeout" without a MILP, so the search ends at its deadline (ACAS Xu 4_2
    property 2 ran 2.6 s past 116 s when each late box still got 0.1 s of HiGHS)."""
    rng = np.random.default_rng(5)
    net = Network.from_arrays(
        [(rng.normal(size=(8, 2)), rng.normal(size=8)), (rng.normal(size=(1, 8)), [0.0])]
    )
    lo, hi = -np.ones(2), np.ones(2)
    (case,) = parse_query(box_query(lo, hi, ["(>= Y_0 100.0)"], 1)).cases
    stats = {"boxes": 0, "branches": 0, "splits": 0, "milp": 0, "candidates": 0}
    search = _Search(net, net.forward, stats, 1 << 28)
    bab = _BranchAndBound(net, case, search, stats, None, 1 << 28)
    open_ = np.ones(len(case.unsafe), dtype=bool)
    bounds = pre_activation_bounds(net, lo[None], hi[None])
    assert bab._milp(lo, hi, open_, bounds, time.monotonic() - 1.0) == "timeout"
    assert stats["milp"] == 0
    assert bab._milp(lo, hi, open_, bounds, time.monotonic() + 30.0) == "unsat"
    assert stats["milp"] == 1
    assert not open_.any()  # the polytope shown empty is closed
