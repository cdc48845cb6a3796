"""Semantic robustness: the monitor in the space of an ONNX embedding model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.onnx_models import forward, mlp
from tests.oracle import witness_sets
from vigil.rules.ior import BACKENDS, Monitor, MonitorSpec
from vigil.rules.ior.embedding import OnnxEmbedding


def dyadic_mlp(rng, sizes):
    """Weights and biases in multiples of 1/8: exact float64 arithmetic on dyadic inputs."""
    return [
        (rng.integers(-8, 9, size=(a, b)) / 8, rng.integers(-8, 9, size=b) / 8)
        for a, b in itertools.pairwise(sizes)
    ]


def test_onnxruntime_and_numpy_agree():
    rng = np.random.default_rng(0)
    layers = dyadic_mlp(rng, [6, 5, 3])
    embedding = OnnxEmbedding(mlp(layers))
    x = rng.integers(0, 16, size=(50, 6)) / 16
    assert (embedding.input_dim, embedding.dim) == (6, 3)
    np.testing.assert_array_equal(embedding(x), forward(layers, x))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400),
    metric=st.sampled_from(["linf", "l2", "l1"]),
    eps=st.sampled_from([0.0, 1 / 16, 1 / 4, 1.0]),
)
def test_monitor_in_embedding_space_matches_oracle(backend, seed, n, metric, eps):
    metric = "linf" if backend == "bdd" else metric  # bdd is L-inf only
    rng = np.random.default_rng(seed)
    layers = dyadic_mlp(rng, [5, 4, 2])
    x = rng.integers(0, 8, size=(n, 5)) / 8
    y = rng.integers(0, 2, size=n)
    monitor = Monitor(
        MonitorSpec(dim=2, eps=eps, metric=metric), backend, OnnxEmbedding(mlp(layers))
    )
    half = n // 2
    w1 = monitor.check_batch(x[:half], y[:half])
    monitor = Monitor.restore(monitor.snapshot())
    w2 = monitor.check_batch(x[half:], y[half:])
    got = [
        list(zip(*map(np.ndarray.tolist, w.of(i)), strict=True))
        for w in (w1, w2)
        for i in range(len(w))
    ]
    assert got == witness_sets(forward(layers, x), y, eps, metric)


def test_embedding_errors_are_clear(tmp_path):
    rng = np.random.default_rng(1)
    embedding = OnnxEmbedding(mlp(dyadic_mlp(rng, [3, 2])))
    with pytest.raises(ValueError, match=r"the embedding has 2 dimensions, spec\.dim is 5"):
        Monitor(MonitorSpec(dim=5, eps=0.1), "auto", embedding)
    monitor = Monitor(MonitorSpec(dim=2, eps=0.1), "auto", embedding)
    with pytest.raises(ValueError, match="takes 3 features, got 4"):
        monitor.check_batch(np.zeros((1, 4)), np.array([0]))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="cannot load the embedding model"):
        OnnxEmbedding(bad)
