"""Known facts on the real Certifair streams, for every backend."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import load_stream
from tests.oracle import witness_sets
from vigil.rules.ior import BACKENDS, Monitor, MonitorSpec


# The indexed backends on the published counts. bdd (about 1 ms per decision: a minute
# here), bruteforce and snn (near a minute each on 2 cores) are compared with brute force on
# the compas and german streams below and in the property tests; parallel (blocks of brute
# force or snn in worker processes) there too.
@pytest.mark.parametrize(
    "backend", sorted(set(BACKENDS) - {"bdd", "parallel", "bruteforce", "snn"})
)
def test_adult_base_p1_known_counts(certifair_dir, backend):
    x, y = load_stream(certifair_dir / "adult-base-P1-combined.csv")
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=0.04, metric="linf"), backend)
    flagged = pairs = 0
    for s in range(0, len(x), 4096):
        w = monitor.check_batch(x[s : s + 4096], y[s : s + 4096])
        flagged += len(w.flagged)
        pairs += w.pairs
    assert (flagged, pairs) == (2250, 6949)


_TRUTH: dict[tuple[str, float], list] = {}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("eps", [0.01, 0.04, 0.16])
@pytest.mark.parametrize("stream", ["compas-base-P1", "german-base-P1"])
def test_backends_agree_with_brute_force(certifair_dir, stream, eps, backend):
    x, y = load_stream(certifair_dir / f"{stream}-combined.csv")
    if (stream, eps) not in _TRUTH:
        _TRUTH[stream, eps] = witness_sets(x, y, eps)
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=eps), backend)
    got = []
    for s in range(0, len(x), 1000):
        w = monitor.check_batch(x[s : s + 1000], y[s : s + 1000])
        got += [list(zip(*map(np.ndarray.tolist, w.of(i)), strict=True)) for i in range(len(w))]
    assert got == _TRUTH[stream, eps]
