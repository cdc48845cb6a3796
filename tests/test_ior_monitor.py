"""The monitor's contract beyond the oracle: validation, snapshots, auto's planning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle import witness_sets
from vigil.rules.ior import InvalidDecision, Monitor, MonitorSpec
from vigil.rules.ior.backends import grid
from vigil.rules.ior.backends.periodic import optimal_buffer_size
from vigil.rules.ior.history import History


def collect(monitor: Monitor, x, y, batch: int) -> list[list[tuple[int, float]]]:
    out = []
    for s in range(0, len(x), batch):
        w = monitor.check_batch(x[s : s + batch], y[s : s + batch])
        out += [list(zip(*map(np.ndarray.tolist, w.of(i)), strict=True)) for i in range(len(w))]
    return out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": 0, "eps": 0.1}, "dim must be a positive integer"),
        ({"dim": 2, "eps": -1}, "eps must be a finite number >= 0"),
        ({"dim": 2, "eps": float("nan")}, "eps must be a finite number"),
        ({"dim": 2, "eps": 0.1, "metric": "cosine"}, "'cosine' is not a valid InputMetric"),
        ({"dim": 2, "eps": 0.1, "delta": 0.5}, "delta applies to probability outputs only"),
        ({"dim": 2, "eps": 0.1, "ignore": (0, 1)}, "ignore leaves no feature"),
        ({"dim": 2, "eps": 0.1, "ignore": (5,)}, "outside 0..1"),
        ({"dim": 2, "eps": 0.1, "scale": (1.0,)}, "scale has 1 entries"),
        ({"dim": 2, "eps": 0.1, "scale": (1.0, 0.0)}, "finite and > 0"),
        ({"dim": 2, "eps": 0.1, "output": "probabilities", "output_dim": 1}, "output_dim >= 2"),
    ],
)
def test_spec_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MonitorSpec(**kwargs)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown backend 'annoy'"):
        Monitor(MonitorSpec(dim=2, eps=0.1), "annoy")


@pytest.mark.parametrize(
    ("x", "y", "error", "message"),
    [
        ([[0.0, 1.0], [np.nan, 0.0]], [0, 1], InvalidDecision, "row 1: feature 0 is nan"),
        ([[0.0, np.inf]], [0], InvalidDecision, "row 0: feature 1 is inf"),
        ([[0.0, 1.0, 2.0]], [0], ValueError, r"shape \(n, 2\), got \(1, 3\)"),
        ([[0.0, 1.0]], [0.5], InvalidDecision, "row 0: label 0.5 is not an integer"),
        ([[0.0, 1.0]], [0, 1], ValueError, r"labels must have shape \(1,\)"),
        ([[0.0, 1.0]], ["a"], ValueError, "labels must be integers"),
    ],
)
def test_bad_decisions_are_rejected_before_anything_is_stored(x, y, error, message):
    monitor = Monitor(MonitorSpec(dim=2, eps=0.1))
    with pytest.raises(error, match=message):
        monitor.check_batch(np.array(x), np.array(y))
    assert monitor.size == 0


def test_probability_outputs_must_be_finite_vectors():
    monitor = Monitor(MonitorSpec(dim=1, eps=0.1, output="probabilities", output_dim=2))
    with pytest.raises(InvalidDecision, match="row 1: output vector has a non-finite entry"):
        monitor.check_batch(np.zeros((2, 1)), np.array([[0.5, 0.5], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match=r"outputs must have shape \(1, 2\)"):
        monitor.check_batch(np.zeros((1, 1)), np.array([0.5]))


def test_ids_name_witnesses():
    monitor = Monitor(MonitorSpec(dim=1, eps=0.5))
    monitor.check_batch(np.array([[0.0], [5.0]]), np.array([0, 0]), ids=["a", "b"])
    w = monitor.check_batch(np.array([[0.25]]), np.array([1]), ids=["c"])
    index, distance = w.of(0)
    assert monitor.ids(index) == ["a"] and distance.tolist() == [0.25]


@pytest.mark.parametrize("blob", [b"", b"garbage", b"VIGIL-IOR/1\nnot-an-npz"])
def test_restore_rejects_corrupt_snapshots(blob):
    with pytest.raises(ValueError):
        Monitor.restore(blob)


def test_snapshot_keeps_ids_backend_and_options():
    monitor = Monitor(MonitorSpec(dim=2, eps=0.1, metric="l1"), "kdtree", buffer_size=7)
    monitor.check_batch(np.array([[0.0, 0.0], [0.05, 0.0]]), np.array([1, 2]), ids=["p", 9])
    restored = Monitor.restore(monitor.snapshot())
    assert restored.backend.name == "kdtree" and restored.backend.buffer_size == 7
    assert restored.spec == monitor.spec and restored.ids([0, 1]) == ["p", 9]


def test_auto_uses_discrete_features_as_keys_and_a_grid_for_the_rest():
    rng = np.random.default_rng(3)
    n = 3000
    x = np.hstack([rng.integers(0, 2, size=(n, 3)), rng.random((n, 2))])
    y = rng.integers(0, 2, size=n)
    monitor = Monitor(MonitorSpec(dim=5, eps=0.05))
    got = collect(monitor, x, y, 500)
    assert monitor.backend.plan.keys == (0, 1, 2)
    assert set(monitor.backend.plan.grid) <= {3, 4} and monitor.backend.plan.grid
    assert got == witness_sets(x, y, 0.05)


def test_auto_replans_when_a_key_feature_stops_being_discrete():
    rng = np.random.default_rng(4)
    n = 2000
    x = np.hstack([rng.integers(0, 4, size=(n, 1)) / 4, rng.random((n, 1))])
    x[1500:, 0] += 1 / 64  # now within eps of the old values: feature 0 can't be a key
    y = rng.integers(0, 2, size=n)
    monitor = Monitor(MonitorSpec(dim=2, eps=1 / 32))
    got = collect(monitor, x, y, 250)
    assert 0 not in monitor.backend.plan.keys
    assert got == witness_sets(x, y, 1 / 32)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 40),
    steps=st.lists(st.one_of(st.integers(0, 70), st.none()), max_size=40),
    seed=st.integers(0, 2**32 - 1),
    limit=st.one_of(st.none(), st.integers(1, 300)),
)
def test_history_holds_every_row_appended_since_the_last_clear(capacity, steps, seed, limit):
    """Growth copies rows over several appends: whatever the batch sizes, the columns read
    back exactly the rows appended (None: ``clear``), and the magnitudes are theirs. With
    ``limit``, no columns are made larger than it (or than the most rows held)."""
    rng = np.random.default_rng(seed)
    history = History(MonitorSpec(dim=3, eps=0.1), capacity=capacity)
    xs, ys, ids = [np.empty((0, 3))], [np.empty(0, dtype=np.int64)], []
    most = capacity
    for size in steps:
        if size is None:
            history.clear()
            xs, ys, ids = xs[:1], ys[:1], []
            continue
        x, y = rng.normal(size=(size, 3)) * 10, rng.integers(0, 3, size)
        new = list(range(len(ids), len(ids) + size))
        assert history.append(x, y, new, limit) == (len(ids), len(ids) + size)
        xs, ys, ids = [*xs, x], [*ys, y], ids + new
        most = max(most, history.size)
        if limit is not None:
            assert all(len(c) <= max(most, limit) for c in (history._x, *(history._next or ())))
    x, y = np.vstack(xs), np.concatenate(ys)
    assert history.size == len(x) and history.ids == ids
    assert np.array_equal(history.x, x) and np.array_equal(history.y, y)
    assert np.array_equal(history.column_max_abs, np.abs(x).max(axis=0, initial=0.0))


@pytest.mark.parametrize("fill_rows", [4096, 64])
def test_grid_plans_again_over_several_batches_and_keeps_exact_witnesses(monkeypatch, fill_rows):
    """Planning again after fourfold growth runs one sample probe per batch, then the new
    plan's table is filled a slice of rows per batch (64: over many batches) and takes
    over; no batch meanwhile loses a witness."""
    monkeypatch.setattr(grid, "_FILL_ROWS", fill_rows)
    rng = np.random.default_rng(3)
    n = 3000
    x = 0.5 + rng.random((n, 2)) * 1e-3
    x[:300, 0] = rng.random(300)  # feature 0 spreads the first rows, feature 1 the rest
    x[300:, 1] = rng.random(n - 300)
    y = rng.integers(0, 2, size=n)
    monitor = Monitor(MonitorSpec(dim=2, eps=0.01), "grid")
    got, grids, busy = [], [], []
    for s in range(0, n, 50):
        got += collect(monitor, x[s : s + 50], y[s : s + 50], 50)
        backend = monitor.backend
        grids.append(backend.plan.grid)
        busy.append(backend._planning is not None or backend._filling is not None)
    assert got == witness_sets(x, y, 0.01)
    switch = grids.index(grids[-1])
    assert grids[-1][0] == 1 and grids[switch - 1] == (0,)
    assert busy[switch - 2 : switch] == [True, True] and not busy[switch]
    if fill_rows == 64:  # filling alone spans batches: more than planning's 2-3
        assert busy[switch - 8 : switch] == [True] * 8


def test_a_history_under_a_limit_never_makes_columns_past_it():
    """Before and after evictions, the history's columns (and any doubled ones being
    filled) have room for at most ``history_limit`` decisions."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 8, size=(6000, 3)) / 8
    y = rng.integers(0, 2, size=6000)
    monitor = Monitor(MonitorSpec(dim=3, eps=0.25), history_limit=2000)
    for s in range(0, 6000, 100):
        monitor.check_batch(x[s : s + 100], y[s : s + 100])
        history = monitor.history
        assert all(len(c) <= 2000 for c in (history._x, *(history._next or ())))
    assert monitor.evicted > 0


def test_amortised_buffer_size_grows_sublinearly():
    sizes = [optimal_buffer_size(n, 12) for n in (1_000, 100_000, 10_000_000)]
    assert sizes == sorted(sizes) and sizes[2] < 10_000_000 / 100


def test_auto_picks_the_grid_for_tabular_and_brute_force_for_high_dimension():
    assert Monitor(MonitorSpec(dim=30, eps=0.1)).backend.chosen.name == "grid"
    assert Monitor(MonitorSpec(dim=3072, eps=0.1)).backend.chosen.name == "bruteforce"
    assert Monitor(MonitorSpec(dim=3072, eps=0.1)).backend.plan is None


def test_use_backend_reindexes_the_history_only_when_it_changes():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 4, size=(120, 3)) / 4
    y = rng.integers(0, 2, size=120)
    spec = MonitorSpec(dim=3, eps=0.25)
    monitor = Monitor(spec, "parallel", blocks=3)
    assert collect(monitor, x[:80], y[:80], 80) == witness_sets(x[:80], y[:80], 0.25)
    backend = monitor.backend
    monitor.use_backend("parallel", {"blocks": 3})  # the defaults left out: unchanged
    assert monitor.backend is backend
    monitor.use_backend("kdtree", {})
    assert monitor.backend.name == "kdtree"
    assert collect(monitor, x[80:], y[80:], 40) == witness_sets(x, y, 0.25)[80:]


def test_parallel_takes_at_most_one_block_per_feature():
    rng = np.random.default_rng(10)
    x = rng.integers(0, 4, size=(60, 2)) / 4
    y = rng.integers(0, 2, size=60)
    monitor = Monitor(MonitorSpec(dim=2, eps=0.25), "parallel", blocks=8)
    assert monitor.backend.blocks == 2
    assert collect(monitor, x, y, 60) == witness_sets(x, y, 0.25)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    pools=st.lists(st.integers(1, 20), min_size=3, max_size=3),
    batch=st.integers(1, 60),
)
def test_grid_notices_every_new_key_value_few_or_many(seed, pools, batch):
    """Key features of 1 to 20 codes (compared value by value up to grid._FEW_VALUES, looked
    up past it) whose codes keep arriving, one of them sometimes a hair off a code: after
    every batch the keys are exactly the spaced features, and the witnesses the oracle's."""
    rng = np.random.default_rng(seed)
    n, eps = 240, 0.25
    # codes 0, 1, ... arrive over the stream: the pool a row draws from grows with it
    reach = np.minimum(1 + np.arange(n) * 4 // n * 7, 28)
    x = np.stack([rng.integers(0, np.minimum(reach, p)) for p in pools], axis=1).astype(float)
    off = rng.random(n) < 0.01  # an eighth off a code: feature 2 stops being a key
    x[off, 2] += 1 / 8
    y = rng.integers(0, 2, size=n)
    monitor = Monitor(MonitorSpec(dim=3, eps=eps), "grid")
    got = []
    for s in range(0, n, batch):
        got += collect(monitor, x[s : s + batch], y[s : s + batch], batch)
        seen = x[: s + batch]
        spaced = tuple(
            k for k in range(3) if np.all(np.diff(np.unique(seen[:, k])) > eps * (1 + 1e-9))
        )
        assert monitor.backend.plan.keys == spaced
    assert got == witness_sets(x, y, eps)
