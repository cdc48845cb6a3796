"""Known facts on the real Certifair streams, for every backend."""

from __future__ import annotations

import pytest

from rules.ior import BACKENDS, Monitor, MonitorSpec
from tests.conftest import load_stream


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_adult_base_p1_known_counts(certifair_dir, backend):
    x, y = load_stream(certifair_dir / "adult-base-P1-combined.csv")
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=0.04, metric="linf"), backend)
    flagged = pairs = 0
    for s in range(0, len(x), 4096):
        w = monitor.check_batch(x[s : s + 4096], y[s : s + 4096])
        flagged += len(w.flagged)
        pairs += w.pairs
    assert (flagged, pairs) == (2250, 6949)
