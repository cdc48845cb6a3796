"""Parallel decomposition (Clemont, Algorithm 2): one sub-monitor per block of features.

If a pair is within eps in the full space it is within eps in every block (dropping
coordinates never increases an L-inf, L1 or L2 distance), so the pairs every block finds
are a superset of the witnesses; the monitor's exact check removes the rest. For L-inf the
intersection is already exact. Blocks run in threads: the inner backends spend their time
in numpy and Faiss kernels, which release the GIL.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rules.ior.backends.base import Backend, Pairs, verify
from rules.ior.history import History
from rules.ior.spec import MonitorSpec


class ParallelBackend(Backend):
    """``blocks`` contiguous feature blocks, each searched by an ``inner`` backend."""

    name = "parallel"

    def __init__(
        self, spec: MonitorSpec, history: History, blocks: int = 2, inner: str = "bruteforce"
    ) -> None:
        from rules.ior.backends import BACKENDS

        super().__init__(spec, history)
        dim = history.x.shape[1]
        if not 1 <= blocks <= dim:
            raise ValueError(f"blocks must be between 1 and the {dim} compared features")
        if inner not in BACKENDS or inner == self.name:
            raise ValueError(f"inner backend {inner!r} is not one of {sorted(BACKENDS)}")
        self.blocks, self.inner = blocks, inner
        self._columns = np.array_split(np.arange(dim), blocks)
        self._subs = []
        for cols in self._columns:
            sub_spec = MonitorSpec(
                dim=len(cols),
                eps=spec.eps,
                metric=spec.metric,
                output=spec.output,
                delta=spec.delta,
                output_metric=spec.output_metric,
                output_dim=spec.output_dim,
                quantitative=spec.quantitative,
            )
            sub_history = History(sub_spec)
            self._subs.append((cols, sub_history, BACKENDS[inner](sub_spec, sub_history)))
        self._pool = ThreadPoolExecutor(blocks, thread_name_prefix="vigil-block")
        # a block's float64 distance may round above the full one: widen by its rounding bound
        self._block_eps = spec.eps * (1 + 8 * dim * np.finfo(np.float64).eps)
        self.rebuild()

    def options(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "inner": self.inner}

    def rebuild(self) -> None:
        h = self.history
        for cols, sub_history, sub in self._subs:
            sub_history.size = 0
            sub_history.append(h.x[:, cols], h.y, ())
            sub.rebuild()

    def advance(self, start: int, stop: int) -> Pairs:
        h = self.history
        for cols, sub_history, _ in self._subs:
            sub_history.append(h.x[start:stop][:, cols], h.y[start:stop], ())
        min_out = 0.0 if self.spec.quantitative else self.spec.delta

        def block(entry) -> np.ndarray:
            _, sub_history, sub = entry
            found = verify(sub_history, *sub.advance(start, stop), min_out, self._block_eps)
            return np.unique(found.query * stop + found.index)

        keys = None
        for found in self._pool.map(block, self._subs):
            keys = found if keys is None else np.intersect1d(keys, found, assume_unique=True)
        return keys // stop, keys % stop
