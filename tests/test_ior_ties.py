"""Ties at eps on the values as written: every backend against integer arithmetic.

Features written with two decimals (as a CSV or a JSON event carries them) and a decimal eps
make many pairs exactly eps apart in the written values, while float64 subtraction puts
some of them a hair above eps and some a hair below. The ball is closed on the written
values: the oracle scales every value to integer hundredths and compares exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.rules.ior import BACKENDS, Monitor, MonitorSpec

EPS = ["0.01", "0.05", "0.1", "0.25", "0.3", "0.5", "1.25"]
OPTIONS = {"parallel": {"blocks": 2, "inner": "bruteforce"}}


def hundredths(text: str) -> int:
    whole, _, frac = text.partition(".")
    return int(whole) * 100 + int((frac + "00")[:2])


def oracle(cents: np.ndarray, y: np.ndarray, eps: int, metric: str) -> list[list[int]]:
    """Witness positions of each decision, in exact integer arithmetic on the written values."""
    out = []
    for n in range(len(cents)):
        diff = np.abs(cents[:n] - cents[n])
        if metric == "linf":
            close = diff.max(axis=1, initial=0) <= eps
        elif metric == "l1":
            close = diff.sum(axis=1) <= eps
        else:
            close = (diff * diff).sum(axis=1) <= eps * eps
        out.append(np.flatnonzero(close & (y[:n] != y[n])).tolist())
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.data(),
    st.sampled_from(EPS),
    st.sampled_from(["linf", "l1", "l2"]),
    st.sampled_from([50, 10_000]),  # values up to 0.50 or 100.00
)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_keeps_ties_of_the_written_values(backend, data, eps, metric, top):
    if backend == "bdd" and metric != "linf":
        metric = "linf"  # the bdd backend is L-inf only
    n = data.draw(st.integers(2, 120))
    dim = data.draw(st.integers(1, 4))
    cents = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, top), min_size=dim, max_size=dim), min_size=n, max_size=n
            )
        )
    )
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    x = np.array([[float(f"{c / 100:.2f}") for c in row] for row in cents])  # as a CSV reads
    monitor = Monitor(
        MonitorSpec(dim=dim, eps=float(eps), metric=metric), backend, **OPTIONS.get(backend, {})
    )
    w = monitor.check_batch(x, y)
    got = [w.of(i)[0].tolist() for i in range(n)]
    assert got == oracle(cents, y, hundredths(eps), metric)


def test_a_pair_exactly_eps_apart_as_written_is_a_witness_and_one_hair_above_is_not():
    # 0.35 - 0.1 is 0.24999999999999997 in float64, 0.54 - 0.29 is 0.25000000000000006: both
    # are 0.25 as written; 0.8 - 0.54 is 0.26
    x = np.array([[0.1], [0.35], [0.29], [0.54], [0.8]])
    monitor = Monitor(MonitorSpec(dim=1, eps=0.25, metric="linf"), "bruteforce")
    w = monitor.check_batch(x, np.array([0, 1, 1, 0, 1]))
    assert [w.of(i)[0].tolist() for i in range(5)] == [[], [0], [0], [1, 2], []]
    assert w.of(3)[1][1] == 0.25  # the written distance, not the float's
