"""Optimized lower slopes of crossing ReLUs (alpha-CROWN) and multipliers of a branch's sign
assumptions (beta-CROWN), ``backward.optimized_slopes``: the gradients against finite
differences, the bounds against the MILP oracle's optimum (over the branch) and CROWN's
bound, and optimized root bounds carried into branches against sampled points."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.milp_oracle import max_violation
from tests.test_relu_split import assert_branches_hold, random_network
from vigil.rules.reach.backward import (
    Relaxation,
    _slope_gradient,
    _substitute,
    optimized_slopes,
    pre_activation_bounds,
    split_bounds,
)
from vigil.rules.reach.sets import InputSet, OutputSpec


def _problem(seed: int, depth: int):
    rng = np.random.default_rng(seed)
    net = random_network(rng, [4, *rng.integers(3, 8, size=depth), 3], gain=1.5)
    lo = rng.uniform(-1, 0, 4)
    return rng, net, lo, lo + rng.uniform(0.2, 1.5, 4)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3), noisy=st.booleans())
def test_the_slope_gradient_matches_finite_differences(seed, depth, noisy):
    """Each row's bound is piecewise linear in its slopes: a small step along one slope moves
    it by the gradient times the step (away from the kinks a random point almost surely
    avoids)."""
    rng, net, lo, hi = _problem(seed, depth)
    noise = tuple(rng.uniform(0, 0.05, b.size) for b in net.biases) if noisy else None
    box = lo[None], hi[None]
    pre = pre_activation_bounds(net, *box)
    centre, radius = (box[0] + box[1]) / 2, (box[1] - box[0]) / 2
    C = rng.normal(size=(2, 3))
    args = (net.weights, net.biases, pre, C, centre, radius, None, noise, None, False)
    slopes = [rng.uniform(size=(1, 2, low.shape[1])) for low, _ in pre]
    trace: list = []
    cuts = [rng.normal(size=(1, 2, low.shape[1])) for low, _ in pre]
    upper, lam = _substitute(*args, slopes, trace, cuts)
    grads, on_pre = _slope_gradient(
        net.weights, net.biases, pre, trace, lam, centre, radius, noise, slopes
    )
    h = 1e-7
    for layer, slope in enumerate(slopes):
        for j in range(slope.shape[2]):
            moved = [s.copy() for s in slopes]
            moved[layer][:, :, j] += h
            difference = (_substitute(*args, moved, None, cuts)[0] - upper) / h
            np.testing.assert_allclose(difference, grads[layer][:, :, j], atol=1e-4, rtol=1e-4)
            shifted = [c.copy() for c in cuts]
            shifted[layer][:, :, j] += h
            difference = (_substitute(*args, slopes, None, shifted)[0] - upper) / h
            np.testing.assert_allclose(difference, on_pre[layer][:, :, j], atol=1e-4, rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_optimized_bounds_lie_between_the_milp_optimum_and_crown(seed, depth):
    """The optimized bound of each output row is at least the exact maximum the MILP oracle
    finds (sound) and at most CROWN's bound (its first step); the optimized pre-activation
    bounds of every hidden neuron hold at the oracle's extremes. (They need not be tighter
    than CROWN's everywhere: CROWN's bound is not monotone in the bounds of the layers
    before.)"""
    rng, net, lo, hi = _problem(seed, depth)
    box = lo[None], hi[None]
    tightened = pre_activation_bounds(net, *box, slope_steps=15)
    centre, radius = (box[0] + box[1]) / 2, (box[1] - box[0]) / 2
    C = rng.normal(size=(2, 3))
    args = (net.weights, net.biases, tightened, C, centre, radius)
    crown = _substitute(*args, None, None, None, False)[0][0]
    least = optimized_slopes(*args, None, 15).upper
    assert np.all(least[0] <= crown + 1e-12)
    for row in range(2):
        _, argmax = max_violation(net, InputSet(lo, hi), OutputSpec(C[row : row + 1], [0.0]))
        reached = float(net.logits(np.clip(argmax, lo, hi)[None])[0] @ C[row])
        assert least[0, row] >= reached - 1e-9
    # every hidden layer's bounds: each neuron's extremes at the oracle's optimisers
    for k, width in enumerate(net.hidden_sizes):
        prefix = type(net).from_arrays(
            list(zip(net.weights[: k + 1], net.biases[: k + 1], strict=True))
        )
        for j in range(width):
            for sign in (1.0, -1.0):
                row = np.zeros((1, width))
                row[0, j] = sign
                _, argmax = max_violation(prefix, InputSet(lo, hi), OutputSpec(row, [0.0]))
                reached = float(prefix.logits(np.clip(argmax, lo, hi)[None])[0] @ row[0])
                bound = tightened[k][1][0, j] if sign > 0 else -tightened[k][0][0, j]
                assert bound >= reached - 1e-9


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_branches_within_optimized_root_bounds_hold_every_sampled_point(seed, depth):
    """Random sign assumptions, bounded with the root's optimized bounds and optimized
    slopes on the rows: the points of the box that meet a branch's assumptions stay under
    its output bounds and inside its pre-activation bounds; a branch found empty holds none.
    The optimized rows' bounds are at most those without the slopes' steps."""
    rng, net, lo, hi = _problem(seed, depth)
    branches = 6
    signs = [
        rng.choice([-1, 0, 0, 1], size=(branches, w)).astype(np.int8) for w in net.hidden_sizes
    ]
    root = pre_activation_bounds(net, lo[None], hi[None], slope_steps=10)
    C = rng.normal(size=(2, 3))
    boxes = np.tile(lo, (branches, 1)), np.tile(hi, (branches, 1))
    bound = split_bounds(net, *boxes, signs, C, root, slope_steps=10)
    plain = split_bounds(net, *boxes, signs, C, root)
    assert np.all(bound.upper <= plain.upper + 1e-5 * (1 + np.abs(plain.upper)))
    assert_branches_hold(net, signs, bound, C, lo + (hi - lo) * rng.random((20_000, 4)))


def test_bounds_within_never_empty_a_branch_on_their_own():
    """Known bounds that miss a neuron's own (as two computations of a neuron constant on
    the box may, by rounding) leave it a point at its own bound: only a sign assumption
    empties a branch."""
    _, net, lo, hi = _problem(3, 2)
    box = lo[None], hi[None]
    own = pre_activation_bounds(net, *box)
    above = [(high + 1.0, high + 2.0) for _, high in own]
    shifted = pre_activation_bounds(net, *box, within=above)
    first_low, first_high = shifted[0]
    assert np.array_equal(first_low, own[0][1]) and np.array_equal(first_high, own[0][1])
    for low, high in shifted:
        assert np.all(low <= high)
    signs = [np.zeros((1, w), dtype=np.int8) for w in net.hidden_sizes]
    assert not split_bounds(net, *box, signs, np.eye(3), above).empty[0]


def test_no_step_after_the_first_begins_past_the_deadline():
    """With its deadline passed, the optimization stops after its first step: CROWN's bound,
    with CROWN's slopes."""
    rng, net, lo, hi = _problem(5, 2)
    box = lo[None], hi[None]
    pre = pre_activation_bounds(net, *box)
    centre, radius = (box[0] + box[1]) / 2, (box[1] - box[0]) / 2
    args = (net.weights, net.biases, pre, rng.normal(size=(2, 3)), centre, radius)
    crown = _substitute(*args, None, None, None, False)[0]
    first = optimized_slopes(*args, None, 50, until=0.0)
    np.testing.assert_array_equal(first.upper, crown)
    np.testing.assert_array_equal(
        _substitute(*args, None, None, None, False, first.slopes)[0], crown
    )
    assert np.all(optimized_slopes(*args, None, 50).upper < crown)


def _branch(seed: int, depth: int):
    """A random network, box and rows, and one branch: random sign assumptions that some
    point of the box meets (the first of 2,000 sampled points that meets them does)."""
    rng, net, lo, hi = _problem(seed, depth)
    x = lo + (hi - lo) * rng.random((2_000, 4))
    pre = net.pre_activations(x)
    keep = [rng.random(w) < 0.4 for w in net.hidden_sizes]
    signs = [
        np.where(k, np.where(z[0] >= 0, 1, -1), 0)[None].astype(np.int8)
        for k, z in zip(keep, pre, strict=True)
    ]
    return rng, net, lo, hi, signs


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_a_branch_s_optimized_bound_holds_the_milp_optimum_over_the_branch(seed, depth):
    """With the multipliers of its sign assumptions optimized, a branch's bound of each row
    is at least the exact maximum over the inputs that meet the assumptions (the MILP
    oracle, which adds them as constraints), and at most CROWN's bound."""
    rng, net, lo, hi, signs = _branch(seed, depth)
    C = rng.normal(size=(2, 3))
    bound = split_bounds(net, lo[None], hi[None], signs, C, slope_steps=20)
    crown = split_bounds(net, lo[None], hi[None], signs, C)
    assert not bound.empty[0]
    # the steps are taken in float32: the least of theirs may be CROWN's within its rounding
    assert np.all(bound.upper <= crown.upper + 1e-5 * (1 + np.abs(crown.upper)))
    for row in range(2):
        spec = OutputSpec(C[row : row + 1], [0.0])
        best, _ = max_violation(net, InputSet(lo, hi), spec, [s[0] for s in signs])
        assert bound.upper[0, row] >= best - 1e-7


def test_the_multipliers_tighten_branches_beyond_the_slopes():
    """Over branches of random networks, optimizing the sign assumptions' multipliers with
    the slopes gives a lower bound than the slopes alone for some rows (they are a
    different relaxation, not the same one found again)."""
    gains = []
    for seed in range(12):
        rng, net, lo, hi, signs = _branch(seed, 2)
        C = rng.normal(size=(2, 3))
        box = lo[None], hi[None]
        pre = pre_activation_bounds(net, *box, signs)
        args = (net.weights, net.biases, pre, C, (box[0] + box[1]) / 2, (box[1] - box[0]) / 2)
        alone = optimized_slopes(*args, None, 30).upper
        both = optimized_slopes(*args, None, 30, signs=signs)
        assert both.cuts is not None and all(
            np.all(c * s[:, None, :] >= 0) for c, s in zip(both.cuts, signs, strict=True)
        )
        gains.append(alone - both.upper)
    assert max(float(g.max()) for g in gains) > 1e-3


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_a_child_started_from_its_parent_s_relaxation_holds_the_milp_optimum(seed, depth):
    """A child branch (one more neuron's sign assumed) whose steps start from its parent's
    optimized slopes and multipliers: its bound of each row is at least the exact maximum
    over its inputs (the MILP oracle). With one step its bound is the start's own, so the
    start is taken and not CROWN's choice."""
    rng, net, lo, hi, signs = _branch(seed, depth)
    free = [(k, j) for k, s in enumerate(signs) for j in np.flatnonzero(s[0])]
    if not free:
        return
    k, j = free[rng.integers(len(free))]
    parent_signs = [s.copy() for s in signs]
    parent_signs[k][0, j] = 0
    C = rng.normal(size=(2, 3))
    box = lo[None], hi[None]
    parent = split_bounds(net, *box, parent_signs, C, slope_steps=20)
    assert parent.relaxation is not None
    child = split_bounds(net, *box, signs, C, slope_steps=20, start=parent.relaxation)
    for row in range(2):
        spec = OutputSpec(C[row : row + 1], [0.0])
        best, _ = max_violation(net, InputSet(lo, hi), spec, [s[0] for s in signs])
        assert child.upper[0, row] >= best - 1e-7
    first = split_bounds(net, *box, signs, C, slope_steps=1, start=parent.relaxation)
    pre = pre_activation_bounds(net, *box, signs)
    centre, radius = (box[0] + box[1]) / 2, (box[1] - box[0]) / 2
    start = parent.relaxation
    cuts = None  # a parent without assumptions has no multipliers: its child's start at 0
    if start.multipliers is not None:
        cuts = [
            (m * s[:, None, :]).astype(np.float32)
            for m, s in zip(start.multipliers, signs, strict=True)
        ]
    slopes = [np.clip(a.astype(np.float32), 0, 1) for a in start.slopes]
    args = (net.weights, net.biases, pre, C, centre, radius, None, None, None, False, slopes)
    expected = _substitute(*args, cuts=cuts)[0]
    np.testing.assert_allclose(first.upper, expected, rtol=1e-12, atol=1e-12)


def test_a_start_outside_the_ranges_is_clipped_into_them():
    """Slopes past [0, 1] and negative multipliers (as a rounded or foreign start may have)
    are clipped: the bound stays at least the MILP oracle's optimum."""
    rng, net, lo, hi, signs = _branch(7, 2)
    C = rng.normal(size=(2, 3))
    box = lo[None], hi[None]
    shapes = [(1, 2, w) for w in net.hidden_sizes]
    wild = Relaxation(
        [rng.uniform(-3, 4, size=s) for s in shapes], [rng.uniform(-5, 1, size=s) for s in shapes]
    )
    bound = split_bounds(net, *box, signs, C, slope_steps=3, start=wild)
    assert bound.relaxation is not None
    assert all(np.all((a >= 0) & (a <= 1)) for a in bound.relaxation.slopes)
    assert all(np.all(m >= 0) for m in bound.relaxation.multipliers or [])
    for row in range(2):
        spec = OutputSpec(C[row : row + 1], [0.0])
        best, _ = max_violation(net, InputSet(lo, hi), spec, [s[0] for s in signs])
        assert bound.upper[0, row] >= best - 1e-7
