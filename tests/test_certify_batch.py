"""Batch robustness verification: the MILP verifiers against an exact enumeration oracle."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.cluster.hierarchy import linkage, to_tree
from scipy.optimize import linprog
from scipy.spatial.distance import pdist

from vigil.rules.certify.batch.bandit import RandomSizer, SplitChooser, ThompsonSizer
from vigil.rules.certify.batch.baverly import BatchVerifier, Stats, verify_one_by_one
from vigil.rules.certify.batch.clustering import BatchTree, activation_patterns
from vigil.rules.certify.batch.mipverify import Outcome, ball_box, prefix_bounds, verify_ball
from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import (
    BOUND_SLACK,
    Layer,
    ReluModel,
    Solver,
    VerificationError,
)

SOLVER_TOL = 1e-7
"""HiGHS's default primal and dual feasibility tolerance."""
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tiny_network(seed: int, sizes=(2, 4, 3, 3)) -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [
            (rng.normal(size=(b, a)), rng.normal(scale=0.5, size=b))
            for a, b in itertools.pairwise(sizes)
        ]
    )


def oracle_robust(net: Network, box: Layer, label: int) -> bool:
    """Exact: for every activation pattern, an LP asks for a point of the box in that linear
    region with some other class scoring >= the label. No big-M, no bounds, no MILP."""
    widths = net.hidden_sizes
    d = net.input_dim
    for bits in itertools.product([0, 1], repeat=sum(widths)):
        a_ub, b_ub = [], []
        w_eff, b_eff = np.eye(d), np.zeros(d)  # the current layer's input as an affine map of x
        pos = 0
        for w, b, n in zip(net.weights[:-1], net.biases[:-1], widths, strict=True):
            zw, zb = w @ w_eff, w @ b_eff + b
            on = np.array(bits[pos : pos + n], dtype=bool)
            pos += n
            a_ub += list(-zw[on]) + list(zw[~on])  # z >= 0 where on, z <= 0 where off
            b_ub += list(zb[on]) + list(-zb[~on])
            w_eff, b_eff = zw * on[:, None], zb * on
        out_w, out_b = net.weights[-1] @ w_eff, net.weights[-1] @ b_eff + net.biases[-1]
        for j in range(net.output_dim):
            if j == label:
                continue
            rows = [*a_ub, out_w[label] - out_w[j]]  # y_j - y_label >= 0
            rhs = [*b_ub, out_b[j] - out_b[label]]
            res = linprog(
                np.zeros(d),
                A_ub=np.array(rows),
                b_ub=np.array(rhs),
                bounds=list(zip(box.lower, box.upper, strict=True)),
                method="highs",
            )
            if res.status == 0:
                return False
    return True


def exact_pre_bounds(net: Network, box: Layer, layer: int) -> Layer:
    """Exact min and max of each pre-activation of hidden ``layer`` over the box: an LP per
    activation pattern of the layers before it, no relaxation."""
    d = net.input_dim
    n = net.hidden_sizes[layer]
    lower, upper = np.full(n, np.inf), np.full(n, -np.inf)
    for bits in itertools.product([0, 1], repeat=sum(net.hidden_sizes[:layer])):
        a_ub, b_ub = [], []
        w_eff, b_eff = np.eye(d), np.zeros(d)
        pos = 0
        for i in range(layer):
            w, b, width = net.weights[i], net.biases[i], net.hidden_sizes[i]
            zw, zb = w @ w_eff, w @ b_eff + b
            on = np.array(bits[pos : pos + width], dtype=bool)
            pos += width
            a_ub += list(-zw[on]) + list(zw[~on])
            b_ub += list(zb[on]) + list(-zb[~on])
            w_eff, b_eff = zw * on[:, None], zb * on
        zw = net.weights[layer] @ w_eff
        zb = net.weights[layer] @ b_eff + net.biases[layer]
        for j in range(n):
            for sign in (1.0, -1.0):
                res = linprog(
                    sign * zw[j],
                    A_ub=np.array(a_ub) if a_ub else None,
                    b_ub=np.array(b_ub) if b_ub else None,
                    bounds=list(zip(box.lower, box.upper, strict=True)),
                    method="highs",
                )
                if res.status == 0:
                    value = sign * res.fun + zb[j]
                    lower[j], upper[j] = min(lower[j], value), max(upper[j], value)
    return Layer(lower, upper)


@SLOW
@given(
    seed=st.integers(0, 10_000),
    centre=st.lists(st.floats(-1, 1), min_size=2, max_size=2),
    eps=st.floats(0.05, 0.8),
)
@example(seed=6813, centre=[-0.2579945, -0.90792506], eps=0.7731586637912042)  # 8.3e-7 apart
def test_milp_bounds_are_sound_exact_and_no_looser_than_lp(seed, centre, eps):
    net = tiny_network(seed, sizes=(2, 3, 3, 3, 3))
    box = ball_box(np.array(centre), eps, None)
    lp = prefix_bounds(net, box, 3, Solver(bounds="lp"))
    milp = prefix_bounds(net, box, 3, Solver(bounds="milp"))
    for layer in (1, 2):
        exact = exact_pre_bounds(net, box, layer)
        assert np.all(milp[layer].lower <= exact.lower + 1e-9)
        assert np.all(milp[layer].upper >= exact.upper - 1e-9)
        # a neuron left unstable was tightened both ways: exact up to the solver's gap
        unstable = milp[layer].unstable
        tol = 1e-3 * (1.0 + np.abs(exact.lower) + np.abs(exact.upper))
        assert np.all((milp[layer].lower - exact.lower)[unstable] >= -tol[unstable])
        assert np.all((milp[layer].upper - exact.upper)[unstable] <= tol[unstable])
        # and LP proved no neuron stable that MILP leaves open
        assert not np.any(unstable & ~lp[layer].unstable)
        # A bound read from the solver is widened by BOUND_SLACK, an interval bound is not; the
        # two runs may take a neuron's bound from different sources, so either may end up one
        # slack (plus the LP's optimality tolerance) looser than the other.
        for mine, theirs, sign in (
            (milp[layer].lower, lp[layer].lower, 1.0),
            (milp[layer].upper, lp[layer].upper, -1.0),
        ):
            slack = BOUND_SLACK * (1.0 + np.abs(theirs)) + SOLVER_TOL
            assert np.all(sign * (mine - theirs)[unstable] >= -slack[unstable])


def margin(net: Network, x: np.ndarray, label: int) -> float:
    z = net.logits(x[None, :])[0]
    return float(np.max(np.delete(z, label)) - z[label])


@pytest.mark.parametrize("bounds", ["lp", "milp"])
@SLOW
@given(
    seed=st.integers(0, 10_000),
    centre=st.lists(st.floats(-1, 1), min_size=2, max_size=2),
    eps=st.floats(0.05, 0.6),
)
def test_one_ball_verdict_matches_region_enumeration(bounds, seed, centre, eps):
    net = tiny_network(seed)
    x = np.array(centre)
    label = int(np.argmax(net.logits(x[None, :])[0]))
    box = ball_box(x, eps, (-1.0, 1.0))
    outcome = verify_ball(net, box, label, solver=Solver(bounds=bounds))
    assert outcome.robust == oracle_robust(net, box, label)
    if not outcome.robust:
        adv = outcome.adversarial
        assert np.all(adv >= box.lower - 1e-9) and np.all(adv <= box.upper + 1e-9)
        assert margin(net, adv, label) >= -1e-7


@pytest.mark.parametrize("bounds", ["lp", "milp"])
@SLOW
@given(
    seed=st.integers(0, 10_000),
    centres=st.lists(st.lists(st.floats(-1, 1), min_size=2, max_size=2), min_size=2, max_size=6),
    eps=st.floats(0.05, 0.5),
    split=st.sampled_from([1, 2]),
)
def test_batch_verdicts_match_oracle_at_every_split(bounds, seed, centres, eps, split):
    net = tiny_network(seed)
    x = np.array(centres)
    label = int(np.argmax(net.logits(x[:1])[0]))
    x = x[np.argmax(net.logits(x), axis=1) == label]
    boxes = [ball_box(c, eps, None) for c in x]
    verifier = BatchVerifier(net, boxes, label, None, Solver(60.0, bounds), Stats())
    verifier.run_batch(list(range(len(boxes))), split)
    for i, box in enumerate(boxes):
        assert verifier.outcomes[i].robust == oracle_robust(net, box, label)


@SLOW
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(3, 9),
    eps=st.floats(0.05, 0.4),
    sizer=st.sampled_from(["thompson", "random"]),
    bounds=st.sampled_from(["lp", "milp"]),
)
def test_baverly_equals_one_by_one(seed, n, eps, sizer, bounds):
    net = tiny_network(seed, sizes=(2, 5, 4, 3))
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    label = int(np.bincount(np.argmax(net.logits(x), axis=1)).argmax())
    x = x[np.argmax(net.logits(x), axis=1) == label]
    boxes = [ball_box(c, eps, (-1.0, 1.0)) for c in x]

    def check(p):
        return margin(net, p, label) > 0

    stats = Stats()
    solver = Solver(60.0, bounds)
    batched = BatchVerifier(net, boxes, label, check, solver, stats).verify(3, sizer, seed)
    alone = verify_one_by_one(net, boxes, label, check, Solver(60.0, "lp"))
    assert {i: o.robust for i, o in batched.items()} == {i: o.robust for i, o in alone.items()}
    for o in batched.values():
        if not o.robust:
            assert check(o.adversarial)
    assert all(1 <= s <= 3 for s in stats.batch_sizes)


def test_linear_classifier_is_verified_without_batches():
    net = tiny_network(2, sizes=(2, 3))
    x = np.random.default_rng(2).uniform(-1, 1, size=(6, 2))
    label = int(np.bincount(np.argmax(net.logits(x), axis=1)).argmax())
    boxes = [ball_box(c, 0.3, None) for c in x[np.argmax(net.logits(x), axis=1) == label]]
    out = BatchVerifier(net, boxes, label, None, Solver(60.0), Stats()).verify(4, "thompson", 0)
    assert [out[i].robust for i in range(len(boxes))] == [
        oracle_robust(net, b, label) for b in boxes
    ]


@pytest.mark.parametrize("hull", [True, False])
@given(
    boxes=st.lists(
        st.lists(st.tuples(st.integers(-8, 8), st.integers(0, 4)), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    ),
    point=st.lists(st.integers(-10, 14), min_size=3, max_size=3),
)
@settings(max_examples=40, deadline=None)
def test_union_encoding_is_feasible_iff_point_in_some_box(hull, boxes, point):
    """Theorem 4.1 for both forms of Eq. 1."""
    layers = [
        Layer(np.array([a for a, _ in b]) / 4, np.array([a + w for a, w in b]) / 4) for b in boxes
    ]
    model = ReluModel(Solver(10.0))
    model.start_union(layers, hull=hull)
    p = np.array(point) / 4
    alive_point = p[model.alive]
    fixed_ok = np.array_equal(p[~model.alive], model.dead_value[~model.alive])
    for col, value in zip(model.current, alive_point, strict=True):  # v = p as rows
        model.h.addRow(value, value, 1, np.array([col], dtype=np.int32), np.array([1.0]))
    expected = any(np.all(p >= b.lower) and np.all(p <= b.upper) for b in layers)
    if not fixed_ok:
        assert not expected
        return
    found = model.solve_milp() is not None
    assert found == expected


def reference_take(root, remaining: set[int], limit: int) -> list[int]:
    """Slow pre-order search over scipy's own tree, counting the leaves still remaining."""

    def count(node):
        return len(set(node.pre_order()) & remaining)

    def visit(node):
        c = count(node)
        if c == 0:
            return None
        if c <= limit:
            return sorted(set(node.pre_order()) & remaining)
        return visit(node.get_left()) or visit(node.get_right())

    return visit(root)


@given(
    patterns=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=14),
    sizes=st.lists(st.integers(1, 5), min_size=20, max_size=20),
)
@settings(max_examples=60, deadline=None)
def test_batch_tree_hands_out_preorder_subtrees(patterns, sizes):
    p = np.array(patterns)
    tree = BatchTree(p, list(range(len(p))))
    root = to_tree(linkage(pdist(p, metric="hamming"), method="complete")) if len(p) > 1 else None
    remaining = set(range(len(p)))
    for limit in sizes:
        if not remaining:
            break
        batch = tree.take(limit)
        expected = [0] if root is None else reference_take(root, remaining, limit)
        assert sorted(batch) == expected
        remaining -= set(batch)
        assert tree.remaining() == len(remaining)
    assert tree.take(3) == [] or remaining


def test_activation_patterns_are_the_signs_of_pre_activations():
    net = tiny_network(3, sizes=(4, 6, 5, 2))
    x = np.random.default_rng(0).normal(size=(7, 4))
    h1 = x @ net.weights[0].T + net.biases[0]
    h2 = np.maximum(h1, 0) @ net.weights[1].T + net.biases[1]
    assert np.array_equal(activation_patterns(net, x), np.hstack([h1 > 0, h2 > 0]))


def test_thompson_sizer_settles_on_the_fastest_size():
    sizer = ThompsonSizer(16, bucket=4, seed=1)
    assert sizer.arms == [4, 8, 12, 16]
    rng = np.random.default_rng(0)
    true_velocity = {4: 1.0, 8: 3.0, 12: 1.5, 16: 0.5}
    picks = []
    for _ in range(80):
        size = sizer.choose()
        picks.append(size)
        sizer.update(size, true_velocity[size] + rng.normal(scale=0.2))
    assert picks[-40:].count(8) >= 30


def test_split_chooser_tries_every_layer_then_weighs_time_not_batches():
    chooser = SplitChooser(3)
    order = []
    for seconds in (1.0, 0.5, 0.04):
        order.append(chooser.choose())
        chooser.update(order[-1], 4, seconds)
    assert order == [3, 2, 1] and not chooser.exploring
    assert chooser.choose() == 1
    chooser.update(1, 16, 16.0)  # a large batch at layer 1 failed and refined every ball
    # layer 1 still has the best mean velocity (100 and 1 balls/s), but 20 balls took 16 s
    assert chooser.choose() == 2


def test_random_sizer_stays_in_range():
    sizer = RandomSizer(5, seed=0)
    picks = {sizer.choose() for _ in range(200)}
    assert picks == {1, 2, 3, 4, 5}


def test_timeout_is_an_error_not_a_verdict():
    net = tiny_network(5, sizes=(8, 24, 24, 4))
    x = np.zeros(8)
    label = int(np.argmax(net.logits(x[None, :])[0]))
    with pytest.raises(VerificationError):
        verify_ball(net, ball_box(x, 0.5, None), label, solver=Solver(time_limit=0.0))


def test_batch_over_budget_falls_back_to_single_balls():
    net = tiny_network(11, sizes=(2, 4, 3, 3))
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, size=(8, 2))
    label = int(np.bincount(np.argmax(net.logits(x), axis=1)).argmax())
    x = x[np.argmax(net.logits(x), axis=1) == label]
    boxes = [ball_box(c, 0.3, None) for c in x]
    stats = Stats()
    verifier = BatchVerifier(net, boxes, label, None, Solver(60.0), stats, batch_budget=0.0)
    verifier.run_batch(list(range(len(boxes))), 1)
    assert stats.fallbacks == 1
    assert [verifier.outcomes[i].robust for i in range(len(boxes))] == [
        oracle_robust(net, b, label) for b in boxes
    ]


def test_thompson_sizer_learns_about_every_arm_it_plays():
    """The arm that chose is credited, even when the tree had fewer balls left than it
    asked for: no arm stays untried (and first in line) forever."""
    sizer = ThompsonSizer(16, bucket=4, seed=0)
    picks = []
    for _ in range(12):
        picks.append(sizer.choose())
        sizer.update(picks[-1], 1.0)  # only 9 balls were left each time
    assert all(sizer.rewards) and picks[:4] == [16, 12, 8, 4]


def test_time_breakdown_sums_to_the_wall_time():
    net = tiny_network(3, sizes=(2, 6, 6, 6, 3))
    x = np.random.default_rng(2).uniform(-1, 1, size=(24, 2))
    label = int(np.bincount(np.argmax(net.logits(x), axis=1)).argmax())
    boxes = [ball_box(c, 0.05, None) for c in x[np.argmax(net.logits(x), axis=1) == label]]
    stats = Stats()
    start = time.perf_counter()
    verifier = BatchVerifier(net, boxes, label, None, Solver(60.0), stats)
    verifier.verify(4, "thompson", 0)
    wall = time.perf_counter() - start
    assert len(stats.split_layers) == stats.batches and set(stats.split_layers) <= {1, 2, 3}
    assert stats.split_layers[:3] == [3, 2, 1]  # every split layer tried, the last first
    assert sum(stats.as_dict()["time"].values()) <= wall + 1e-3
    # a batch split at the last layer costs what single balls do: it bounds later budgets
    assert verifier.single_times


def test_batches_leave_a_split_layer_that_proves_slowly(monkeypatch):
    net = tiny_network(3, sizes=(2, 6, 6, 6, 3))
    boxes = [ball_box(c, 0.05, None) for c in np.random.default_rng(2).uniform(-1, 1, (60, 2))]
    verifier = BatchVerifier(net, boxes, 0, None, Solver(60.0), Stats())

    def run_batch(ids, split):
        time.sleep(0.02 if split == 1 else 0.002)  # split 1: ten times slower per ball
        for i in ids:
            verifier._decide(i, Outcome(True))
        return len(ids), 0.01

    monkeypatch.setattr(verifier, "run_batch", run_batch)
    verifier.verify(4, "thompson", 0)
    later = verifier.stats.split_layers[3:]
    assert len(verifier.outcomes) == len(boxes)
    assert later.count(1) <= len(later) // 4
