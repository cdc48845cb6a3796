"""APΔS, the interval-network MILP, exact enumeration and robust CFX generation.

Oracles: a Python loop over realisations (and onnxruntime) for the batched sampler, the
defining inequality for the sample size, brute-force grids for the nearest counterfactual,
concrete witnesses and random realisations for the MILP, and the Appendix B enumeration for
both the MILP verdict and the probabilistic guarantee.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.rules.certify.cfx import (
    InvalidTarget,
    ShiftSample,
    apas_delta_max,
    enumerate_shifts,
    largest_delta,
    margin_rows,
    nearest_cfx,
    provable_delta_max,
    robust_cfx,
    sample_size,
    worst_case,
)
from vigil.rules.certify.cfx.apas import MAX_SAMPLED, InvalidConfidence
from vigil.rules.certify.cfx.decision import margins
from vigil.rules.certify.cfx.interval import ParameterBox, interval_bounds
from vigil.rules.certify.cfx.search import DELTA_CAP, DELTA_INIT
from vigil.rules.reach.network import Network, OnnxRunner

SETTINGS = settings(max_examples=25, deadline=None)


def random_network(seed: int, sizes: list[int], output: str = "sigmoid") -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [(rng.normal(size=(o, i)), rng.normal(scale=0.3, size=o)) for i, o in pairwise(sizes)],
        output,
    )


def valid_input(network: Network, target: int, seed: int) -> np.ndarray:
    """The input with the largest margin among random ones (valid when any is)."""
    xs = np.random.default_rng(seed + 1).uniform(-1, 1, size=(64, network.input_dim))
    return xs[np.argmax(margins(network, xs, target))]


def box_deviation(a: Network, b: Network) -> float:
    return max(
        float(np.abs(p - q).max())
        for p, q in zip(a.weights + a.biases, b.weights + b.biases, strict=True)
    )


# -- sample size and search ----------------------------------------------------------------


@given(st.floats(0.5, 0.9999), st.floats(0.5, 0.9999))
def test_sample_size_is_the_smallest_n_meeting_lemma_4(gamma, R):
    n = sample_size(gamma, R)
    assert 1 - R**n >= gamma - 1e-12
    assert n == 1 or 1 - R ** (n - 1) < gamma + 1e-12


def test_sample_size_of_the_paper_setting_and_bad_values():
    # log(0.001) / log(0.995) = 1378.09: the paper rounds to 1378, Lemma 4 needs 1379.
    assert sample_size(0.999, 0.995) == 1379
    assert 1 - 0.995**1378 < 0.999 <= 1 - 0.995**1379
    for gamma, R in ((1.0, 0.9), (0.9, 0.0), (-0.1, 0.5)):
        with pytest.raises(InvalidConfidence):
            sample_size(gamma, R)


def test_sample_size_is_capped_before_anything_is_sampled():
    with pytest.raises(InvalidConfidence, match=r"gamma=0.9999999, R=0.99999999 need n=1611809549"):
        sample_size(0.9999999, 0.99999999)
    assert sample_size(0.999, 0.995, MAX_SAMPLED // 1379) == 1379
    with pytest.raises(InvalidConfidence, match="n=1379 realisations of 72517 parameters"):
        sample_size(0.999, 0.995, MAX_SAMPLED // 1379 + 1)
    network = random_network(0, [2, 3, 1])  # 13 parameters: n <= 7.7e6, these need 9.2e6
    with pytest.raises(InvalidConfidence, match=r"gamma=0.9999, R=0.999999"):
        apas_delta_max(network, np.zeros(2), 1, 0.9999, 0.999999)


def test_largest_delta_reports_exactly_the_cap():
    assert largest_delta(lambda d: True) == DELTA_CAP
    assert largest_delta(lambda d: True, delta_cap=0.5) == 0.5
    assert DELTA_CAP - DELTA_INIT <= largest_delta(lambda d: d < DELTA_CAP) < DELTA_CAP


@given(st.floats(0.0, 50.0))
def test_largest_delta_finds_a_threshold_to_within_delta_init(threshold):
    calls: list[float] = []

    def robust_at(d: float) -> bool:
        calls.append(d)
        return d <= threshold

    found = largest_delta(robust_at)
    if threshold < DELTA_INIT:
        assert found == 0.0
    else:
        assert threshold - DELTA_INIT <= found <= threshold
    assert found == 0.0 or robust_at(found)
    assert len(calls) <= 2 * math.log2(max(threshold, 1.0) / DELTA_INIT) + 6


# -- batched sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "output", "target"),
    [
        ([3, 5, 4, 1], "sigmoid", 1),
        ([3, 5, 1], "none", 0),
        ([3, 4, 4, 3], "softmax", 2),
        ([4, 1], "sigmoid", 1),
        ([4, 3], "none", 1),
    ],
)
def test_batched_margins_equal_a_loop_over_realisations(sizes, output, target):
    network = random_network(7, sizes, output)
    x = valid_input(network, target, 7)
    sample = ShiftSample(network, x, target, 40, np.random.default_rng(0))
    delta = 0.3
    batched = sample.margins(delta)
    looped = [margins(sample.realisation(i, delta), x, target)[0] for i in range(40)]
    np.testing.assert_allclose(batched, looped, atol=1e-10)
    # The realisations are real models: onnxruntime agrees on which class they give.
    for i in range(3):
        real = sample.realisation(i, delta)
        assert box_deviation(real, network) <= delta + 1e-12
        probs = OnnxRunner(real.to_onnx(np.float64))(x[None])[0]
        if probs.size == 1:
            chosen = int(probs[0] >= (0.5 if output == "sigmoid" else 0.0))
        else:
            chosen = int(np.argmax(probs))
        assert (chosen == target) == (batched[i] >= 0)


def test_margin_rows_reject_unknown_targets():
    with pytest.raises(InvalidTarget, match="0 or 1"):
        margin_rows(random_network(0, [2, 1]), 2)
    with pytest.raises(InvalidTarget, match=r"\[0, 3\)"):
        margin_rows(random_network(0, [2, 3], "softmax"), 3)
    with pytest.raises(InvalidTarget, match="single softmax"):
        margin_rows(random_network(0, [2, 1], "softmax"), 1)


def test_apas_returns_zero_for_an_invalid_counterfactual():
    network = random_network(3, [2, 4, 1])
    xs = np.random.default_rng(0).uniform(-1, 1, size=(64, 2))
    x = xs[np.argmin(margins(network, xs, 1))]
    assert margins(network, x, 1)[0] < 0
    assert apas_delta_max(network, x, 1, rng=np.random.default_rng(0)) == 0.0


# -- the MILP -----------------------------------------------------------------------------------

TINY = st.sampled_from(
    [
        ([2, 3, 3, 1], "sigmoid", 1),
        ([2, 3, 2, 1], "none", 0),
        ([2, 3, 3, 3], "softmax", 1),
        ([3, 4, 1], "sigmoid", 1),
    ]
)


@SETTINGS
@given(st.integers(0, 10_000), TINY, st.floats(0.01, 0.5))
def test_milp_worst_case_is_exact(seed, spec, delta):
    """Sound (no realisation does worse) and complete (a realisation attains it)."""
    sizes, output, target = spec
    network = random_network(seed, sizes, output)
    x = valid_input(network, target, seed)
    result = worst_case(network, x, target, delta)
    assert result.bound <= result.margin + 1e-7
    # Complete: the witness lies in the delta box and reaches the optimum.
    assert box_deviation(result.witness, network) <= delta + 1e-9
    assert margins(result.witness, x, target)[0] == pytest.approx(result.margin, abs=1e-6)
    # Sound: neither random realisations nor interval arithmetic contradict it.
    sampled = ShiftSample(network, x, target, 300, np.random.default_rng(seed)).margins(delta)
    assert sampled.min() >= result.margin - 1e-7
    bounds = interval_bounds(ParameterBox.around(network, delta), x, margin_rows(network, target))
    assert bounds.margin_lo[0] <= result.margin + 1e-7


@SETTINGS
@given(
    st.integers(0, 10_000),
    st.sampled_from([([1, 2, 2, 1], "sigmoid", 1), ([1, 2, 2, 2], "softmax", 0)]),
    st.sampled_from([0.5, 2.0]),
)
def test_milp_verdict_agrees_with_exact_enumeration(seed, spec, factor):
    sizes, output, target = spec
    network = random_network(seed, sizes, output)
    x = valid_input(network, target, seed)
    provable = provable_delta_max(network, x, target)
    delta = max(provable, DELTA_INIT) * factor
    verdict = worst_case(network, x, target, delta).robust
    found = enumerate_shifts(network, x, target, delta, max_boxes=20_000)
    if verdict:
        assert found.non_robust == 0.0
    else:
        assert found.robust < 1.0
    if found.unknown == 0.0:  # enumeration settled the whole box
        assert verdict == (found.non_robust == 0.0)


@SETTINGS
@given(st.integers(0, 10_000), TINY, st.integers(5, 300))
def test_provable_delta_never_exceeds_sampled_delta(seed, spec, n):
    sizes, output, target = spec
    network = random_network(seed, sizes, output)
    x = valid_input(network, target, seed)
    provable = provable_delta_max(network, x, target)
    sample = ShiftSample(network, x, target, n, np.random.default_rng(seed))
    sampled = largest_delta(sample.robust_at)
    assert provable <= sampled
    if provable > 0:
        assert worst_case(network, x, target, provable).robust


# -- exact enumeration and the probabilistic guarantee ------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_enumeration_brackets_the_sampled_failure_rate(seed):
    network = random_network(seed, [1, 2, 1])
    x = valid_input(network, 1, seed)
    delta = 2.0 * max(provable_delta_max(network, x, 1), 0.01)
    found = enumerate_shifts(network, x, 1, delta, max_boxes=50_000)
    assert found.robust + found.non_robust + found.unknown == pytest.approx(1.0)
    sample = ShiftSample(network, x, 1, 20_000, np.random.default_rng(seed))
    observed = float((sample.margins(delta) < 0).mean())
    slack = 4 * math.sqrt(0.25 / 20_000)
    lo, hi = found.non_robust_bounds
    assert lo - slack <= observed <= hi + slack


def test_guarantee_holds_at_the_returned_delta_max():
    """At most a fraction 1 - R non-robust at delta_max, failing in ~1 - gamma of the runs.

    gamma = R = 0.9 (n = 22), so failures are frequent enough to count in 60 runs, on 1-1-1
    networks whose 4-parameter box the enumeration settles; an unsettled run counts as a
    failure. Runs whose counterfactual is not valid (delta_max = 0, no claim) are skipped.
    Failures ~ Binomial(60, <= 0.1): 14 or more has probability < 0.005.
    """
    gamma = R = 0.9
    runs = failures = 0
    seed = 0
    while runs < 60:
        seed += 1
        network = random_network(seed, [1, 1, 1])
        x = valid_input(network, 1, seed)
        delta = apas_delta_max(network, x, 1, gamma, R, np.random.default_rng(seed))
        if delta == 0.0:
            continue
        runs += 1
        _, hi = enumerate_shifts(network, x, 1, delta, max_boxes=20_000).non_robust_bounds
        failures += hi > 1 - R
    assert failures <= 13


# -- robust counterfactual generation -------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 10_000), st.floats(0.0, 2.0), st.booleans())
def test_nearest_cfx_is_the_l1_nearest_on_a_grid(seed, kappa, fix_first):
    network = random_network(seed, [2, 4, 3, 1])
    x = np.random.default_rng(seed).uniform(0, 1, size=2)
    immutable = [0] if fix_first else []
    found = nearest_cfx(network, x, 1, kappa, 0.0, 1.0, immutable)
    grid = np.stack(np.meshgrid(np.linspace(0, 1, 201), np.linspace(0, 1, 201)), -1).reshape(-1, 2)
    if fix_first:
        grid = np.column_stack([np.full(201, x[0]), np.linspace(0, 1, 201)])
    feasible = grid[margins(network, grid, 1) >= kappa]
    if found is None:
        assert feasible.size == 0
        return
    assert margins(network, found, 1)[0] >= kappa - 1e-6
    assert np.all((found >= 0) & (found <= 1))
    if fix_first:
        assert found[0] == x[0]
    cost = np.abs(found - x).sum()
    if feasible.size:
        assert cost <= np.abs(feasible - x).sum(axis=1).min() + 1e-9


@pytest.mark.parametrize("seed", [0, 5, 7])  # networks that reach a margin > 1 in the box
def test_robust_cfx_passes_its_robustness_test(seed):
    network = random_network(seed, [3, 6, 4, 1])
    xs = np.random.default_rng(seed).uniform(0, 1, size=(64, 3))
    x = xs[np.argmin(margins(network, xs, 1))]
    delta = 0.05
    box = {"lower": -5.0, "upper": 5.0}
    by_milp = robust_cfx(network, x, delta, 1, "milp", **box)
    by_apas = robust_cfx(network, x, delta, 1, "apas", rng=np.random.default_rng(seed), **box)
    assert by_milp.x is not None and by_apas.x is not None
    assert worst_case(network, by_milp.x, 1, delta).robust
    fresh = ShiftSample(network, by_apas.x, 1, 4000, np.random.default_rng(seed + 99))
    assert (fresh.margins(delta) < 0).mean() <= 0.02
    assert margins(network, by_apas.x, 1)[0] >= by_apas.kappa - 1e-6
    assert by_apas.l1 == pytest.approx(np.abs(by_apas.x - x).sum())


@pytest.mark.parametrize("delta", [math.nan, math.inf, -0.1])
def test_bad_delta_is_rejected_by_name(delta):
    network = random_network(0, [2, 3, 1])
    x = valid_input(network, 1, 0)
    with pytest.raises(ValueError, match="delta must be finite and >= 0"):
        robust_cfx(network, x, delta)
    with pytest.raises(ValueError, match="delta must be finite and >= 0"):
        worst_case(network, x, 1, delta)
    with pytest.raises(ValueError, match="delta must be finite and >= 0"):
        enumerate_shifts(network, x, 1, delta)
