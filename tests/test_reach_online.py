"""The online verifier's accelerations: exact ones (BMI, LB, BMW, IC) never lose what recomputing
from scratch verifies, IC reproduces full recomputation, and every acceleration (RSR and INN
included) stays sound: all inputs of verified branches satisfy the spec and "holds" agrees with
MILP at every step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.milp_oracle import max_violation
from tests.test_reach_soundness import random_network
from vigil.rules.reach.basis import sample
from vigil.rules.reach.branch import EMPTY, HOLDS, evaluate
from vigil.rules.reach.network import Network
from vigil.rules.reach.online import ACCELERATIONS, Accelerations, OnlineVerifier, lipschitz_bound
from vigil.rules.reach.sets import InputSet, OutputSpec

STEPS = 6
EXACT = ["bmi", "bmi+lb", "bmw", "bmw+ic"]
RELAXED = ["bmi+rsr", "bmi+lb+rsr", "bmw+inn", "bmw+inn+ic"]


def scenario(seed: int, kind: str) -> tuple[OutputSpec, list[tuple[InputSet, Network]]]:
    """A spec with some slack and a sequence of (input set, network) that drifts."""
    rng = np.random.default_rng(seed)
    net = random_network(rng, [3, 12, 12, 2])
    centre = rng.uniform(-0.5, 0.5, 3)
    width = np.full(3, 0.3)
    a = np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0]])
    b = a @ centre + 0.2
    base = InputSet(centre - width, centre + width, a, b)
    c = np.vstack([np.eye(2), -np.eye(2)])
    worst, _ = max_violation(net, base, OutputSpec(c, np.zeros(4)))
    spec = OutputSpec(c, np.full(4, worst + rng.choice([0.02, 0.2])))
    steps = []
    lo, hi = base.lower.copy(), base.upper.copy()
    for _ in range(STEPS):
        if kind == "domain":
            lo = lo + rng.uniform(-0.01, 0.004, 3)
            hi = hi + rng.uniform(-0.004, 0.01, 3)
        elif kind == "updates":
            net = Network.from_arrays(
                [
                    (w + rng.normal(0, 2e-3, w.shape), bias + rng.normal(0, 2e-3, bias.shape))
                    for w, bias in zip(net.weights, net.biases, strict=True)
                ]
            )
        else:  # fine-tuning: only the last layer moves
            w, bias = net.weights[-1], net.biases[-1]
            layers = list(zip(net.weights, net.biases, strict=True))
            layers[-1] = (w + rng.normal(0, 2e-3, w.shape), bias + rng.normal(0, 2e-3, bias.shape))
            net = Network.from_arrays(layers)
        steps.append((InputSet(lo, hi, a, b), net))
    return spec, steps


def scratch_verified(verifier: OnlineVerifier, inputs: InputSet, net: Network) -> np.ndarray:
    """Which of the verifier's current branches a from-scratch evaluation verifies."""
    br = verifier.branches
    region = br.basis.inputs(inputs)
    lo, hi, empty = region.tighten(br.split_lo, br.split_hi)
    ev = evaluate(br.basis.network(net), region, verifier.spec, lo, hi, empty, attack=False)
    return (ev.status == 1) | (ev.status == 3)


def check_sound(verifier, result, inputs, net, spec, rng, exact: float) -> None:
    x = sample(inputs, 600, rng)
    index = verifier.branches.locate(x)
    covered = verifier.branches.verified[index]
    assert spec.violation(net.logits(x[covered])).max(initial=-np.inf) <= 1e-9
    if result.status == "violated":
        point = np.array([result.counterexample])
        assert inputs.contains(point, tol=1e-12)[0]
        assert spec.violation(net.logits(point))[0] > 0
    if result.status == "holds":
        assert exact <= 1e-7


SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["domain", "updates", "finetune"]))
def test_exact_accelerations_keep_what_recomputation_verifies(seed, kind):
    spec, steps = scenario(seed, kind)
    exact = [max_violation(net, inputs, spec)[0] for inputs, net in steps]
    rng = np.random.default_rng(seed)
    for method in EXACT:
        verifier = OnlineVerifier(spec, max_branches=48, accelerations=Accelerations.parse(method))
        for (inputs, net), worst in zip(steps, exact, strict=True):
            result = verifier.step(inputs, net)
            check_sound(verifier, result, inputs, net, spec, rng, worst)
            fresh = scratch_verified(verifier, inputs, net)
            assert np.all(verifier.branches.verified[fresh]), method


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["domain", "updates", "finetune"]))
def test_relaxing_accelerations_stay_sound(seed, kind):
    spec, steps = scenario(seed, kind)
    exact = [max_violation(net, inputs, spec)[0] for inputs, net in steps]
    rng = np.random.default_rng(seed)
    for method in RELAXED:
        acc = Accelerations.parse(method, rsr=5e-3, inn=5.0)
        verifier = OnlineVerifier(spec, max_branches=48, accelerations=acc)
        for (inputs, net), worst in zip(steps, exact, strict=True):
            result = verifier.step(inputs, net)
            check_sound(verifier, result, inputs, net, spec, rng, worst)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_incremental_computation_equals_full_recomputation(seed):
    spec, steps = scenario(seed, "finetune")
    full = OnlineVerifier(spec, max_branches=48, accelerations=Accelerations.parse("bmw"))
    incremental = OnlineVerifier(spec, max_branches=48, accelerations=Accelerations.parse("bmw+ic"))
    for inputs, net in steps:
        a, b = full.step(inputs, net), incremental.step(inputs, net)
        assert a.status == b.status
        np.testing.assert_array_equal(full.branches.status, incremental.branches.status)
        np.testing.assert_allclose(full.branches.upper, incremental.branches.upper, atol=1e-9)


def test_reuse_is_counted_and_unchanged_steps_compute_nothing():
    spec, steps = scenario(11, "domain")
    verifier = OnlineVerifier(spec, max_branches=48, accelerations=Accelerations.parse("bmi"))
    first = verifier.step(*steps[0])
    assert first.rebuilt and first.recomputed == first.branches
    again = verifier.step(*steps[0])
    assert not again.rebuilt and again.recomputed == 0 and again.reused == again.branches


def test_without_acceleration_every_change_rebuilds():
    spec, steps = scenario(5, "updates")
    verifier = OnlineVerifier(spec, max_branches=48)
    assert all(verifier.step(inputs, net).rebuilt for inputs, net in steps)


def test_accelerations_parse_names_and_reject_unknown_ones():
    assert Accelerations.parse("BMW+INN+IC", inn=3.0) == Accelerations(bmw=True, inn=3.0, ic=True)
    assert Accelerations.parse("none") == Accelerations()
    with pytest.raises(ValueError, match="unknown accelerations"):
        Accelerations.parse("bmw+fast")


def test_a_violated_spec_is_reported_with_a_real_counterexample():
    rng = np.random.default_rng(2)
    net = random_network(rng, [2, 8, 1])
    inputs = InputSet(-np.ones(2), np.ones(2))
    c = np.array([[1.0]])
    worst, _ = max_violation(net, inputs, OutputSpec(c, np.zeros(1)))
    spec = OutputSpec(c, np.array([worst - 0.1]))
    result = OnlineVerifier(spec, max_branches=64).step(inputs, net)
    assert result.status == "violated"
    assert spec.violation(net.logits(np.array([result.counterexample])))[0] > 0


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_an_interval_too_wide_to_verify_is_halved_before_the_budget_is_spent(seed):
    """An interval network at 500x the weight change cannot keep the coverage: it is refined
    to at most 8x the exact network's branches, so the budget is never spent on it, and the
    verifier stays sound."""
    spec, steps = scenario(seed, "updates")
    exact = [max_violation(net, inputs, spec)[0] for inputs, net in steps]
    verifier = OnlineVerifier(
        spec, max_branches=1000, accelerations=Accelerations.parse("bmw+inn", inn=500.0)
    )
    verifier.step(*steps[0])
    rng = np.random.default_rng(seed)
    for (inputs, net), worst in zip(steps[1:], exact[1:], strict=True):
        result = verifier.step(inputs, net)
        assert result.branches < 1000 or result.rebuilt
        check_sound(verifier, result, inputs, net, spec, rng, worst)


@pytest.mark.parametrize("seed", [0, 1, 3, 6])  # seeds whose weights stay inside at some steps
def test_results_computed_inside_the_interval_are_computed_over_it(seed, monkeypatch):
    """Inputs and weights drift together: a branch recomputed while the weights stay inside the
    interval network is computed over that interval (its centre +- the range), not around the
    current weights, whose own interval later weights may leave while staying inside."""
    spec, domain = scenario(seed, "domain")
    _, updates = scenario(seed, "updates")
    computed_with: list[Network] = []

    def recording(network, *args, **kwargs):
        computed_with.append(network)
        return evaluate(network, *args, **kwargs)

    monkeypatch.setattr("vigil.rules.reach.online.evaluate", recording)
    acc = Accelerations.parse("bmi+bmw+inn", inn=5.0)
    verifier = OnlineVerifier(spec, max_branches=48, accelerations=acc)
    inside = 0
    for (inputs, _), (_, net) in zip(domain, updates, strict=True):
        computed_with.clear()
        verifier.step(inputs, net)
        centre = verifier._centre
        inside += centre is not net and bool(computed_with)
        for network in computed_with:  # layers after the first are untouched by the basis
            for w, c in zip(network.weights[1:], centre.weights[1:], strict=True):
                np.testing.assert_array_equal(w, c)
    assert inside


def _drifting_network(rng: np.random.Generator, dims: list[int]) -> Network:
    layers = []
    for i, o in itertools.pairwise(dims):
        scale = rng.uniform(0.6, 1.6) / np.sqrt(i)
        layers.append((rng.normal(0, scale, (o, i)), rng.normal(0, 0.3, o)))
    return Network.from_arrays(layers)


def test_a_recentre_after_drift_inside_the_interval_recomputes_the_drifted_layers():
    """IC: the first layer drifts inside its interval (nothing recomputed), then the last layer
    leaves its own. The new interval is centred on the drifted first layer, so bounds cached
    around the old centre no longer cover it: recomputation must start at the first layer
    whose centre moved, not at the layer that changed in this step."""
    rng = np.random.default_rng(2)
    net = _drifting_network(rng, [2, 8, 8, 1])
    box = InputSet(-np.ones(2), np.ones(2))
    xs = rng.uniform(-1, 1, (20000, 2))
    spec = OutputSpec(np.array([[1.0]]), np.array([net.logits(xs).max() + 0.3]))
    top = xs[np.argmax(net.logits(xs)[:, 0])]
    pre = net.pre_activations(top[None])
    grad = (net.weights[-1][0] * (pre[-1][0] > 0)) @ net.weights[1] * (pre[0][0] > 0)
    up_w, up_b = np.sign(np.outer(grad, top)), np.sign(grad)  # raises the output at the top
    acc = Accelerations.parse("bmw+inn+ic", inn=5.0)
    verifier = OnlineVerifier(spec, max_branches=64, accelerations=acc)
    verifier.step(box, net)
    weights, biases = list(net.weights), list(net.biases)
    last_change, recentred = 1e-9, 0
    for _ in range(6):
        for _ in range(4):
            weights[0], biases[0] = weights[0] + 0.005 * up_w, biases[0] + 0.005 * up_b
            net = Network.from_arrays(list(zip(weights, biases, strict=True)))
            result = verifier.step(box, net)
            assert result.status != "holds" or max_violation(net, box, spec)[0] <= 1e-7
        last_change *= 7
        weights[2] = weights[2] + last_change
        net = Network.from_arrays(list(zip(weights, biases, strict=True)))
        result = verifier.step(box, net)
        recentred += result.recomputed > 0
        assert result.status != "holds" or max_violation(net, box, spec)[0] <= 1e-7
    assert recentred


def test_a_branch_emptied_by_the_set_is_recomputed_when_it_fills_again():
    """BMI + LB: a holding branch whose part of the set empties is marked empty; when the set
    comes back into it, its old bound says nothing about the new box (and must not be moved
    with the box), so it is recomputed rather than reused."""
    rng = np.random.default_rng(17)
    net = _drifting_network(rng, [2, 8, 8, 1])
    start = InputSet(np.zeros(2), np.ones(2))
    xs = rng.uniform(0, 1, (20000, 2))
    spec = OutputSpec(np.array([[1.0]]), np.array([net.logits(xs).max() + 0.02]))
    acc = Accelerations.parse("bmi+lb")
    probe = OnlineVerifier(spec, max_branches=32, accelerations=acc)
    probe.step(start, net)
    br = probe.branches
    i = next(
        i
        for i in np.flatnonzero(br.status == 1)
        if np.isfinite(br.split_hi[i, 0]) and br.split_hi[i, 0] < 1
    )
    cut = br.split_hi[i, 0]
    eps = (spec.d[0] - br.upper[i, 0]) / lipschitz_bound(list(net.weights)) / 4
    zs = np.linspace(max(br.split_lo[i, 1], -6) + 1e-3, min(br.split_hi[i, 1], 7) - 1e-3, 400)
    broken = spec.violation(net.logits(np.stack([np.full_like(zs, cut - eps), zs], 1))) > 1e-6
    z = zs[np.flatnonzero(broken).max()]  # where the spec fails just inside the branch's cut
    away = InputSet([cut + eps, z], [cut + eps + 1.0, z + 1.0])  # the branch's part is empty
    back = InputSet([cut - eps, z], [cut - eps / 2, z + eps])  # inside the branch again
    verifier = OnlineVerifier(spec, max_branches=32, accelerations=acc)
    for inputs in (start, away, back):
        result = verifier.step(inputs, net)
        assert result.status != "holds" or max_violation(net, inputs, spec)[0] <= 1e-7
    assert max_violation(net, back, spec)[0] > 0  # the last set does break the spec


def test_a_branch_emptied_across_a_recentre_is_not_restarted_from_its_cache():
    """IC: while the set sits in one corner, the other branches are empty and skip the
    recentre for a first-layer change; when the set comes back to the same boxes and only the
    last layer moved, those branches' cached first-layer bounds are from the network before
    the change, so they must be recomputed from the first layer, not restarted from the cache."""
    rng = np.random.default_rng(0)
    net = _drifting_network(rng, [2, 8, 8, 1])
    square = InputSet(np.zeros(2), np.ones(2))
    top = max_violation(net, square, OutputSpec(np.array([[1.0]]), np.zeros(1)))[0]
    spec = OutputSpec(np.array([[1.0]]), np.array([top + 0.005]))
    acc = Accelerations.parse("bmi+bmw+ic")
    verifier = OnlineVerifier(spec, max_branches=48, accelerations=acc)
    weights, biases = list(net.weights), list(net.biases)
    corner = InputSet(np.zeros(2), np.full(2, 1e-3))
    assert verifier.step(square, net).status == "holds"
    assert (verifier.branches.status == HOLDS).sum() > 1
    weights[0] = weights[0] * 1.1
    net = Network.from_arrays(list(zip(weights, biases, strict=True)))
    result = verifier.step(corner, net)
    assert result.status != "holds" or max_violation(net, corner, spec)[0] <= 1e-7
    assert (verifier.branches.status == EMPTY).any()  # these skipped the recentre
    biases[-1] = biases[-1] - 1e-4
    net = Network.from_arrays(list(zip(weights, biases, strict=True)))
    result = verifier.step(square, net)
    assert result.status != "holds" or max_violation(net, square, spec)[0] <= 1e-7
    assert max_violation(net, square, spec)[0] > 0


def test_counterexamples_break_the_current_weights_not_the_interval_centre():
    """BMW + INN: a violated branch whose point no longer breaks the moved weights is searched
    again; the search must use the weights now, not the interval network's centre."""
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(0, 0.7, (6, 2)), rng.normal(0, 0.3, 6)
    w1 = rng.normal(0, 0.4, (1, 6))
    box = InputSet(-np.ones(2), np.ones(2))
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, 201)] * 2), -1).reshape(-1, 2)

    def network(shift: float) -> Network:
        return Network.from_arrays([(w0, b0), (w1, np.array([shift]))])

    spec = OutputSpec(np.array([[1.0]]), np.array([network(0.0).logits(grid).max() - 0.005]))
    verifier = OnlineVerifier(
        spec, max_branches=16, accelerations=Accelerations.parse("bmw+inn", inn=5.0)
    )
    # a change of 0.01 sets the interval to +-0.05; -0.03 is inside it and satisfies the spec
    for shift in (0.0, 0.01, -0.03):
        net = network(shift)
        result = verifier.step(box, net)
        if result.status == "violated":
            point = np.array([result.counterexample])
            assert spec.violation(net.logits(point))[0] > 0, shift
    assert max_violation(network(-0.03), box, spec)[0] < 0


@pytest.mark.parametrize(("seed", "side"), [(13, 1), (15, 0), (15, 1)])
def test_a_violated_branch_emptied_and_refilled_is_not_taken_for_verified(seed, side):
    """BMI: the set grows past a side where the spec fails (one branch violated), moves to a
    corner (that branch empties) and grows back. "Empty" is a fact about the set, not a
    result for the box: it stands only while the box stays empty, so the refilled branch
    is computed again and found violated."""
    rng = np.random.default_rng(seed)
    net = _drifting_network(rng, [2, 8, 8, 1])
    square = InputSet(np.zeros(2), np.ones(2))
    top = max_violation(net, square, OutputSpec(np.array([[1.0]]), np.zeros(1)))[0]
    spec = OutputSpec(np.array([[1.0]]), np.array([top + 0.01]))
    upper = np.ones(2)
    upper[side] = 1.05
    grown = InputSet(np.zeros(2), upper)
    xs = rng.uniform(0, 1, (2000, 2))
    low = xs[np.argmin(net.logits(xs)[:, 0])]
    corner = InputSet(low - 1e-3, low + 1e-3)
    assert max_violation(net, grown, spec)[0] > 0
    verifier = OnlineVerifier(spec, max_branches=64, accelerations=Accelerations.parse("bmi"))
    statuses = [verifier.step(inputs, net).status for inputs in (square, grown, corner, grown)]
    assert statuses[:2] == ["holds", "violated"]
    assert statuses[3] != "holds"


def test_a_network_with_non_finite_weights_is_rejected_without_touching_the_state():
    rng = np.random.default_rng(0)
    net = random_network(rng, [2, 6, 1])
    box = InputSet(-np.ones(2), np.ones(2))
    xs = rng.uniform(-1, 1, (20000, 2))
    spec = OutputSpec(np.array([[1.0]]), np.array([net.logits(xs).max() + 0.05]))
    broken_w = net.weights[0].copy()
    broken_w[0, 0] = np.nan
    broken = Network.from_arrays([(broken_w, net.biases[0]), (net.weights[1], net.biases[1])])
    violating = Network.from_arrays(
        [(net.weights[0] * 3, net.biases[0] + 1.0), (net.weights[1], net.biases[1])]
    )
    assert max_violation(violating, box, spec)[0] > 0
    for method in ("bmw", "bmw+inn", "bmi+lb+bmw+inn+ic"):
        verifier = OnlineVerifier(spec, max_branches=32, accelerations=Accelerations.parse(method))
        assert verifier.step(box, net).status == "holds"
        with pytest.raises(ValueError, match="layer 0 of the network has non-finite"):
            verifier.step(box, broken)
        assert verifier.step(box, violating).status != "holds", method
    with pytest.raises(ValueError, match="non-finite"):
        OnlineVerifier(spec).step(box, broken)


def test_a_network_with_more_layers_rebuilds():
    rng = np.random.default_rng(1)
    small, deep = random_network(rng, [2, 6, 1]), random_network(rng, [2, 6, 6, 1])
    box = InputSet(-np.ones(2), np.ones(2))
    spec = OutputSpec(np.array([[1.0]]), np.array([10.0]))
    acc = Accelerations.parse("bmi+lb+bmw+inn+ic")
    verifier = OnlineVerifier(spec, max_branches=16, accelerations=acc)
    for net in (small, random_network(rng, [2, 6, 1]), deep, deep):
        result = verifier.step(box, net)
    assert result.status == "holds"
    assert not result.rebuilt and result.recomputed == 0


MOVES = ["first_layer", "raise_last", "lower_last", "corner", "back", "past_side"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    moves=st.lists(st.sampled_from(MOVES), min_size=3, max_size=8),
    names=st.lists(st.sampled_from(ACCELERATIONS), min_size=1, max_size=6, unique=True),
)
def test_adversarial_drift_stays_sound(seed, moves, names):
    """Sequences built from the moves that broke earlier versions: the first layer drifting
    inside its interval, a later layer leaving it, the set collapsing to a corner (branches
    empty) and coming back, the set growing past a side. Every step, under any combination of
    accelerations: "holds" agrees with the MILP, verified branches hold on samples, and a
    counterexample lies in the set and breaks the current network."""
    rng = np.random.default_rng(seed)
    net = _drifting_network(rng, [2, 8, 8, 1])
    square = InputSet(np.zeros(2), np.ones(2))
    top = max_violation(net, square, OutputSpec(np.array([[1.0]]), np.zeros(1)))[0]
    spec = OutputSpec(np.array([[1.0]]), np.array([top + rng.choice([0.005, 0.05])]))
    acc = Accelerations.parse("+".join(names), rsr=5e-3, inn=5.0)
    verifier = OnlineVerifier(spec, max_branches=48, accelerations=acc)
    weights, biases = list(net.weights), list(net.biases)
    inputs = square
    steps = [(inputs, net)]
    for move in moves:
        if move == "first_layer":
            weights[0] = weights[0] + rng.choice([1e-3, 5e-3]) * rng.choice(
                [-1, 1], weights[0].shape
            )
        elif move in ("raise_last", "lower_last"):
            step = rng.choice([1e-3, 0.05])
            biases[-1] = biases[-1] + (step if move == "raise_last" else -step)
        elif move == "corner":
            point = rng.uniform(0, 1, 2)
            inputs = InputSet(point - 1e-3, point + 1e-3)
        elif move == "back":
            inputs = square
        else:
            upper = np.ones(2)
            upper[rng.integers(2)] = 1.05
            inputs = InputSet(np.zeros(2), upper)
        net = Network.from_arrays(list(zip(weights, biases, strict=True)))
        steps.append((inputs, net))
    for inputs, net in steps:
        result = verifier.step(inputs, net)
        worst = max_violation(net, inputs, spec)[0] if result.status == "holds" else 0.0
        check_sound(verifier, result, inputs, net, spec, rng, worst)
