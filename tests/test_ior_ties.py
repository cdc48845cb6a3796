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
from vigil.rules.ior.backends.base import _screened, verify
from vigil.rules.ior.history import History

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.data(),
    st.sampled_from(EPS),
    st.sampled_from(["linf", "l1", "l2"]),
    st.integers(6, 9),
)
def test_the_screen_before_the_full_distance_drops_no_tie(data, eps, metric, dim):
    # clusters far apart (so that one feature rejects most pairs and the screen runs), whose
    # rows differ by up to twice eps in each feature: many pairs are exactly eps apart as
    # written, some a hair above eps in float64
    step = hundredths(eps)
    clusters = data.draw(st.integers(3, 5))
    size = data.draw(st.integers(12, 16))
    offsets = data.draw(
        st.lists(
            st.lists(st.integers(0, 2 * step), min_size=dim, max_size=dim),
            min_size=clusters * size,
            max_size=clusters * size,
        )
    )
    cents = np.array(offsets) + 10_000 * np.repeat(np.arange(clusters), size)[:, None]
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=len(cents), max_size=len(cents))))
    x = np.array([[float(f"{c / 100:.2f}") for c in row] for row in cents])
    spec = MonitorSpec(dim=dim, eps=float(eps), metric=metric)
    history = History(spec)
    history.append(x, y, list(range(len(x))))
    q, j = np.triu_indices(len(x), k=1)[::-1]  # every pair, the later one first
    assert len(_screened(history.x, q, j, float(eps))[0]) < len(q)  # the screen runs
    found = verify(history, q.astype(np.int64), j.astype(np.int64), 0.0)
    expected = oracle(cents, y, step, metric)
    got = [[] for _ in range(len(x))]
    for a, b in sorted(zip(found.query.tolist(), found.index.tolist(), strict=True)):
        got[a].append(b)
    assert got == expected
