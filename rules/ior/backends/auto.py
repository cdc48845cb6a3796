"""``auto``: picks the backend for the stream's shape.

* up to ``HIGH_DIMENSION`` compared features: ``grid`` (exact-match keys plus an eps-grid,
  planned from the data), the fastest on tabular streams by a wide margin;
* above it (images, embeddings): ``bruteforce``, since any spatial partition degenerates
  there and Faiss's SIMD scan is the fastest exact search (the Clemont paper's finding
  for CIFAR-10, confirmed in docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from vigil.rules.ior.backends.base import HIGH_DIMENSION, Backend, Pairs
from vigil.rules.ior.backends.bruteforce import BruteForceBackend
from vigil.rules.ior.backends.grid import GridBackend
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec


class AutoBackend(Backend):
    name = "auto"

    def __init__(self, spec: MonitorSpec, history: History) -> None:
        super().__init__(spec, history)
        chosen = BruteForceBackend if spec.view_dim > HIGH_DIMENSION else GridBackend
        self.chosen: Backend = chosen(spec, history)

    @property
    def plan(self) -> Any:
        """The grid plan (keys, grid features), or None when brute force was chosen."""
        return getattr(self.chosen, "plan", None)

    def advance(self, start: int, stop: int) -> Pairs:
        return self.chosen.advance(start, stop)

    def rebuild(self) -> None:
        self.chosen.rebuild()
