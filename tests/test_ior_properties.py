"""Every backend returns exactly the brute-force oracle's witness sets.

Inputs, eps, scales and outputs are dyadic rationals with few bits, so every distance is
computed exactly in float64 by any summation order: the oracle and the backends must agree
to the bit, including at distance exactly eps.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.oracle import largest_ratios, window_starts, witness_sets
from vigil.rules.ior import BACKENDS, Monitor, MonitorSpec

LABEL_ONLY = ("output", "output_dim", "delta", "output_metric")
EPS = [0.0, 1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
METRICS = ["linf", "l2", "l1"]
BACKEND_OPTIONS = {
    "auto": st.just({}),
    "grid": st.just({}),
    "bdd": st.fixed_dictionaries(
        {"ordering": st.sampled_from(["interleaved", "blocked"]), "reorder": st.booleans()}
    ),
    "bruteforce": st.just({}),
    "kdtree": st.sampled_from([{}, {"buffer_size": 1}, {"buffer_size": 3}, {"buffer_size": 17}]),
    "parallel": st.fixed_dictionaries(
        {"blocks": st.integers(1, 3), "inner": st.sampled_from(["bruteforce", "auto", "snn"])}
    ),
    "snn": st.sampled_from([{}, {"buffer_size": 1}, {"buffer_size": 5}, {"buffer_size": 40}]),
}


def extend_chain(monitor: Monitor, chain: list, base: bool) -> list[tuple[bytes, int]]:
    """Snapshot parts as the state store keeps them: a new base, or a segment of what
    came since the chain's end while that is still in the history."""
    end = chain[-1][1] if chain else None
    if base or end is None or end < monitor.evicted:
        return [(monitor.snapshot(), monitor.position)]
    return [*chain, (monitor.snapshot(since=end), monitor.position)]


def run_monitor(spec: MonitorSpec, backend: str, options: dict, x, y, sizes, snapshot_at):
    monitor = Monitor(spec, backend, **options)
    got, ratios, pos, chain = [], [], 0, []
    for b, size in enumerate(sizes):
        chain = extend_chain(monitor, chain, base=b % 3 == 0)
        if b == snapshot_at:
            monitor = Monitor.restore(*(part for part, _ in chain))
        w = monitor.check_batch(x[pos : pos + size], y[pos : pos + size])
        assert w.first == pos and len(w) == size
        for i in range(size):
            idx, d = w.of(i)
            got.append(list(zip(idx.tolist(), d.tolist(), strict=True)))
        if spec.quantitative:
            ratios += list(zip(w.ratio.tolist(), w.ratio_witness.tolist(), strict=True))
        pos += size
    assert monitor.size == len(x)
    return got, ratios


@st.composite
def outputs(draw, n: int):
    if draw(st.booleans()):
        labels = draw(st.sampled_from([[0], [0, 1], [0, 1, 2], [-1, 3, 7, 8]]))
        y = np.array(draw(st.lists(st.sampled_from(labels), min_size=n, max_size=n)), dtype=int)
        return y, {}
    m = draw(st.integers(2, 3))
    y = (
        np.array(
            draw(
                st.lists(
                    st.lists(st.integers(0, 8), min_size=m, max_size=m), min_size=n, max_size=n
                )
            ),
            dtype=float,
        ).reshape(n, m)
        / 8
    )
    kw = {
        "output": "probabilities",
        "output_dim": m,
        "delta": draw(st.sampled_from([0.0, 1 / 8, 1 / 4])),
        "output_metric": draw(st.sampled_from(["linf", "l1", "tv"])),
    }
    return y, kw


@st.composite
def partition(draw, n: int):
    sizes, left = [], n
    while left:
        s = draw(st.integers(1, left))
        sizes.append(s)
        left -= s
    snapshot_at = draw(st.none() | st.integers(0, max(0, len(sizes) - 1)))
    return sizes, snapshot_at


@st.composite
def small_streams(draw):
    """Streams drawn value by value: duplicates and exact-eps neighbours on purpose."""
    dim = draw(st.integers(1, 40))
    n = draw(st.integers(0, 40))
    eps = draw(st.sampled_from(EPS))
    discrete = draw(st.lists(st.booleans(), min_size=dim, max_size=dim))
    rows: list[list[float]] = []
    for _ in range(n):
        if rows and draw(st.integers(0, 3)) == 0:
            row = list(draw(st.sampled_from(rows)))
            for k in draw(st.lists(st.integers(0, dim - 1), max_size=3)):
                row[k] += draw(st.sampled_from([-eps, eps, eps / 2]))
        else:
            row = [
                draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
                if discrete[k]
                else draw(st.integers(0, 512)) / 256
                for k in range(dim)
            ]
        rows.append(row)
    x = np.array(rows, dtype=float).reshape(n, dim)
    y, out_kw = draw(outputs(n))
    spec_kw = {
        "dim": dim,
        "eps": eps,
        "metric": draw(st.sampled_from(METRICS)),
        "quantitative": draw(st.booleans()),
        **out_kw,
    }
    if dim > 1 and draw(st.booleans()):
        spec_kw["ignore"] = tuple(draw(st.sets(st.integers(0, dim - 1), max_size=dim - 1)))
    if draw(st.booleans()):
        spec_kw["scale"] = tuple(
            draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=dim, max_size=dim))
        )
    return spec_kw, x, y, draw(partition(n))


@st.composite
def seeded_streams(draw):
    """Longer streams (past the auto backend's planning points) generated from a seed:
    mixed discrete/continuous features, duplicates, and late drift that breaks a discrete
    feature's spacing or a feature's magnitude, forcing re-planning."""
    dim = draw(st.integers(1, 24))
    n = draw(st.integers(200, 1400))
    seed = draw(st.integers(0, 2**32 - 1))
    eps = draw(st.sampled_from(EPS[1:5]))
    rng = np.random.default_rng(seed)
    discrete = rng.random(dim) < draw(st.sampled_from([0.0, 0.5, 0.9]))
    x = np.where(
        discrete, rng.integers(0, 4, size=(n, dim)) / 2, rng.integers(0, 256, size=(n, dim)) / 256
    )
    dup = rng.random(n) < 0.2
    x[dup] = x[rng.integers(0, n, size=n)[dup]]
    nudge = rng.random((n, dim)) < 0.05
    x = x + nudge * rng.choice([-eps, eps], size=(n, dim))
    drift = draw(st.sampled_from(["none", "spacing", "magnitude"]))
    if drift == "spacing" and discrete.any():
        k = int(np.flatnonzero(discrete)[0])
        x[n // 2 :, k] += rng.integers(0, 4, size=n - n // 2) / 64
    elif drift == "magnitude":
        x[n // 2 :, rng.integers(0, dim)] *= 2**22
    classes = draw(st.sampled_from([2, 3, 6]))
    y = (rng.integers(0, 256, size=n) * (x.sum(axis=1) * 8 + 1)).astype(np.int64) % classes
    sizes = []
    left = n
    while left:
        sizes.append(int(min(left, rng.integers(1, draw(st.sampled_from([8, 64, 700]))))))
        left -= sizes[-1]
    spec_kw = {
        "dim": dim,
        "eps": eps,
        "metric": draw(st.sampled_from(METRICS)),
        "quantitative": draw(st.booleans()),
    }
    return spec_kw, x, y, (sizes, draw(st.none() | st.integers(0, len(sizes) - 1)))


def check_against_oracle(spec_kw, backend, options, x, y, sizes, snapshot_at):
    if backend == "bdd":  # L-inf and labels only
        spec_kw = {k: v for k, v in spec_kw.items() if k not in LABEL_ONLY} | {"metric": "linf"}
        y = y if y.ndim == 1 else y.argmax(axis=1)
    spec = MonitorSpec(**spec_kw)
    if "blocks" in options:
        options = {**options, "blocks": min(options["blocks"], spec.view_dim)}
    got, ratios = run_monitor(spec, backend, options, x, y, sizes, snapshot_at)
    common = (spec_kw.get("metric", "linf"),)
    view = {"scale": spec_kw.get("scale"), "ignore": spec_kw.get("ignore", ())}
    out_metric = spec_kw.get("output_metric", "linf")
    assert got == witness_sets(
        x, y, spec_kw["eps"], *common, spec_kw.get("delta", 0.0), out_metric, **view
    )
    if spec_kw.get("quantitative"):
        assert ratios == largest_ratios(x, y, spec_kw["eps"], *common, out_metric, **view)


# bdd checks about a decision a millisecond, the others a hundred times faster: it gets
# a third of the examples (a sixth on long streams) so that its two tests take under a
# minute, not two and a half
QUICK = sorted(set(BACKENDS) - {"bdd"})
SLOW_SHARE = 3


SMALL_STREAMS = 80
"""Random small streams per backend (each backend takes 10-20 s of the 20-minute suite)."""


@pytest.mark.parametrize("backend", QUICK)
@settings(max_examples=SMALL_STREAMS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=small_streams(), data=st.data())
def test_small_streams_match_oracle(backend, stream, data):
    spec_kw, x, y, (sizes, snapshot_at) = stream
    options = data.draw(BACKEND_OPTIONS[backend])
    check_against_oracle(spec_kw, backend, options, x, y, sizes, snapshot_at)


@settings(
    max_examples=SMALL_STREAMS // SLOW_SHARE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(stream=small_streams(), data=st.data())
def test_small_streams_match_oracle_on_bdd(stream, data):
    test_small_streams_match_oracle.hypothesis.inner_test("bdd", stream, data)


@pytest.mark.parametrize("backend", QUICK)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=seeded_streams(), data=st.data())
def test_long_streams_match_oracle(backend, stream, data):
    spec_kw, x, y, (sizes, snapshot_at) = stream
    options = data.draw(BACKEND_OPTIONS[backend])
    check_against_oracle(spec_kw, backend, options, x, y, sizes, snapshot_at)


@settings(
    max_examples=25 // (2 * SLOW_SHARE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(stream=seeded_streams(), data=st.data())
def test_long_streams_match_oracle_on_bdd(stream, data):
    test_long_streams_match_oracle.hypothesis.inner_test("bdd", stream, data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=seeded_streams())
def test_grid_keys_are_every_spaced_feature_after_every_batch(stream):
    """The grid tracks its key features' values batch by batch and re-plans from them, not
    from the whole history: its keys must be exactly the features whose distinct values
    (all so far) are more than eps apart."""
    spec_kw, x, y, (sizes, _) = stream
    spec = MonitorSpec(**spec_kw)
    monitor = Monitor(spec, "grid")
    pos = 0
    for size in sizes:
        monitor.check_batch(x[pos : pos + size], y[pos : pos + size])
        pos += size
        seen = monitor.history.x[: monitor.size]
        spaced = tuple(
            k
            for k in range(seen.shape[1])
            if np.all(np.diff(np.unique(seen[:, k] + 0.0)) > spec.eps * (1 + 1e-9))
        )
        assert monitor.backend.plan.keys == spaced


@st.composite
def wide_streams(draw):
    """More than 64 features: flat scans search in L2 as a prefilter for L-inf and L1."""
    dim = draw(st.integers(65, 160))
    n = draw(st.integers(1, 250))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(0, 3, size=(n, dim)) / 4
    dup = rng.random(n) < 0.3
    x[dup] = x[rng.integers(0, n, size=n)[dup]]
    eps = draw(st.sampled_from([0.0, 1 / 4, 1 / 2, 4.0]))
    x = x + (rng.random((n, dim)) < 0.02) * rng.choice([-eps, eps], size=(n, dim))
    y = rng.integers(0, 2, size=n)
    spec_kw = {
        "dim": dim,
        "eps": eps,
        "metric": draw(st.sampled_from(METRICS)),
        "quantitative": draw(st.booleans()),
    }
    sizes = [int(s) for s in np.diff([0, *sorted(rng.integers(0, n, size=3)), n]) if s]
    return spec_kw, x, y, (sizes, draw(st.none() | st.integers(0, len(sizes) - 1)))


@pytest.mark.parametrize("backend", ["auto", "bruteforce", "kdtree", "snn", "parallel"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=wide_streams(), data=st.data())
def test_wide_streams_match_oracle(backend, stream, data):
    spec_kw, x, y, (sizes, snapshot_at) = stream
    options = data.draw(BACKEND_OPTIONS[backend])
    check_against_oracle(spec_kw, backend, options, x, y, sizes, snapshot_at)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=seeded_streams(), inner=st.sampled_from(["kdtree", "bdd"]))
def test_parallel_blocks_in_worker_processes_match_oracle(stream, inner):
    spec_kw, x, y, (sizes, snapshot_at) = stream
    if inner == "bdd":
        spec_kw = {**spec_kw, "metric": "linf"}
    options = {"blocks": 2, "inner": inner, "workers": "processes"}
    check_against_oracle(spec_kw, "parallel", options, x, y, sizes, snapshot_at)


@pytest.mark.parametrize("backend", QUICK)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=small_streams(), limit=st.integers(1, 30), data=st.data())
def test_history_limit_matches_oracle_on_the_window(backend, stream, limit, data):
    """With a history limit, each decision's witnesses (and quantitative ratio) are the
    oracle's over exactly the decisions still held, named by stream position, across a
    snapshot and restore."""
    spec_kw, x, y, (sizes, snapshot_at) = stream
    if backend == "bdd":
        spec_kw = {k: v for k, v in spec_kw.items() if k not in LABEL_ONLY} | {"metric": "linf"}
        y = y if y.ndim == 1 else y.argmax(axis=1)
    options = data.draw(BACKEND_OPTIONS[backend])
    spec = MonitorSpec(**spec_kw)
    if "blocks" in options:
        options = {**options, "blocks": min(options["blocks"], spec.view_dim)}
    monitor = Monitor(spec, backend, history_limit=limit, **options)
    got, ratios, pos, chain = [], [], 0, []
    for b, size in enumerate(sizes):
        chain = extend_chain(monitor, chain, base=b % 3 == 0)
        if b == snapshot_at:
            monitor = Monitor.restore(*(part for part, _ in chain))
        w = monitor.check_batch(x[pos : pos + size], y[pos : pos + size])
        assert w.first == pos
        for i in range(size):
            idx, d = w.of(i)
            got.append(list(zip(idx.tolist(), d.tolist(), strict=True)))
            assert monitor.ids(idx) == idx.tolist()  # default ids are stream positions
        if spec.quantitative:
            ratios += list(zip(w.ratio.tolist(), w.ratio_witness.tolist(), strict=True))
        pos += size
        assert monitor.size <= max(limit, size)
    metric, out_metric = spec_kw.get("metric", "linf"), spec_kw.get("output_metric", "linf")
    view = {"scale": spec_kw.get("scale"), "ignore": spec_kw.get("ignore", ())}
    want, want_ratios = [], []
    for n, lo in enumerate(window_starts(sizes, limit)):
        xs, ys = x[lo : n + 1], y[lo : n + 1]
        last = witness_sets(
            xs, ys, spec_kw["eps"], metric, spec_kw.get("delta", 0.0), out_metric, **view
        )[-1]
        want.append([(j + lo, d) for j, d in last])
        r, j = largest_ratios(xs, ys, spec_kw["eps"], metric, out_metric, **view)[-1]
        want_ratios.append((r, j + lo if j >= 0 else -1))
    assert got == want
    if spec.quantitative:
        assert ratios == want_ratios


@settings(
    max_examples=40 // SLOW_SHARE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(stream=small_streams(), limit=st.integers(1, 30), data=st.data())
def test_history_limit_matches_oracle_on_the_window_on_bdd(stream, limit, data):
    test_history_limit_matches_oracle_on_the_window.hypothesis.inner_test(
        "bdd", stream, limit, data
    )
