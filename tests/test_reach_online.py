"""The online verifier's accelerations: exact ones (BMI, LB, BMW, IC) never lose what recomputing
from scratch verifies, IC reproduces full recomputation, and every acceleration (RSR and INN
included) stays sound: all inputs of verified branches satisfy the spec and "holds" agrees with
MILP at every step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rules.reach.basis import sample
from rules.reach.branch import evaluate
from rules.reach.network import Network
from rules.reach.online import Accelerations, OnlineVerifier
from rules.reach.sets import InputSet, OutputSpec
from tests.milp_oracle import max_violation
from tests.test_reach_soundness import random_network

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

    monkeypatch.setattr("rules.reach.online.evaluate", recording)
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
