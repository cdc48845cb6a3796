"""Parallel decomposition (Clemont, Algorithm 2): one sub-monitor per block of features.

If a pair is within eps in the full space it is within eps in every block (dropping
coordinates never increases an L-inf, L1 or L2 distance), so the pairs every block finds
are a superset of the witnesses; the monitor's exact check removes the rest. For L-inf the
intersection is already exact. Blocks run in threads (the default: inner backends that
spend their time in numpy and Faiss kernels release the GIL) or, for inner backends that
hold it (``bdd``), in worker processes that own their block's sub-monitor.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import weakref
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from vigil.rules.ior.backends.base import Backend, Pairs, verify
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec


class _Block:
    """One block's sub-monitor: a history of the block's columns and an inner backend."""

    def __init__(self, spec: dict, inner: str) -> None:
        from vigil.rules.ior.backends import BACKENDS

        sub_spec = MonitorSpec.from_dict(spec)
        self.history = History(sub_spec)
        self.backend = BACKENDS[inner](sub_spec, self.history)

    def reset(self, x: np.ndarray, y: np.ndarray) -> None:
        self.history.clear()
        self.history.append(x, y, ())
        self.backend.rebuild()

    def advance(self, x: np.ndarray, y: np.ndarray, min_out: float, eps: float) -> np.ndarray:
        """Append the batch's block columns; the block-close pairs as ``q * stop + j``."""
        start, stop = self.history.append(x, y, ())
        found = verify(self.history, *self.backend.advance(start, stop), min_out, eps)
        return np.unique(found.query * stop + found.index)


class _InThread:
    def __init__(self, block: _Block, pool: ThreadPoolExecutor) -> None:
        self._block, self._pool, self._future = block, pool, None

    def submit(self, method: str, *args: Any) -> None:
        self._future = self._pool.submit(getattr(self._block, method), *args)

    def result(self) -> Any:
        return self._future.result()


class _InProcess:
    """A ``_Block`` living in a worker process, for inner backends that hold the GIL."""

    def __init__(self, spec: dict, inner: str) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, spec, inner), daemon=True)
        self._proc.start()
        child.close()
        weakref.finalize(self, _shut, self._conn, self._proc)

    def submit(self, method: str, *args: Any) -> None:
        self._conn.send((method, args))

    def result(self) -> Any:
        outcome = self._conn.recv()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _serve(conn: Connection, spec: dict, inner: str) -> None:
    block = _Block(spec, inner)
    while (message := conn.recv()) is not None:
        method, args = message
        try:
            conn.send(getattr(block, method)(*args))
        except Exception as e:  # handed to the monitor, which raises it
            conn.send(e)


def _shut(conn: Connection, proc: mp.process.BaseProcess) -> None:
    with contextlib.suppress(OSError):
        conn.send(None)
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()


def check_options(blocks: int, inner: str, workers: str) -> None:
    """Raise ValueError naming the first option a parallel backend cannot take (at config
    time as well as when one is built)."""
    from vigil.rules.ior.backends import BACKENDS

    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    if inner not in BACKENDS or inner == ParallelBackend.name:
        others = sorted(set(BACKENDS) - {ParallelBackend.name})
        raise ValueError(f"inner backend {inner!r} is not one of {others}")
    if workers not in ("threads", "processes"):
        raise ValueError(f"workers must be 'threads' or 'processes', got {workers!r}")


class ParallelBackend(Backend):
    """``blocks`` contiguous feature blocks (at most one per compared feature), each searched
    by an ``inner`` backend, in threads or (``workers="processes"``) in worker processes."""

    name = "parallel"

    def __init__(
        self,
        spec: MonitorSpec,
        history: History,
        blocks: int = 2,
        inner: str = "bruteforce",
        workers: str = "threads",
    ) -> None:
        check_options(blocks, inner, workers)
        super().__init__(spec, history)
        dim = history.x.shape[1]
        blocks = min(blocks, dim)
        self.blocks, self.inner, self.workers = blocks, inner, workers
        self._columns = np.array_split(np.arange(dim), blocks)
        pool = ThreadPoolExecutor(blocks, thread_name_prefix="vigil-block")
        self._blocks: list[_InThread | _InProcess] = []
        for cols in self._columns:
            sub = {**spec.to_dict(), "dim": len(cols), "scale": None, "ignore": []}
            self._blocks.append(
                _InProcess(sub, inner)
                if workers == "processes"
                else _InThread(_Block(sub, inner), pool)
            )
        # a block's float64 distance may round above the full one: widen by its rounding bound
        self._block_eps = spec.eps * (1 + 8 * dim * np.finfo(np.float64).eps)
        self.rebuild()

    def options(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "inner": self.inner, "workers": self.workers}

    def _call(self, method: str, rows: slice, *extra: Any) -> list[Any]:
        h = self.history
        x, y = h.x[rows], h.y[rows]
        for cols, block in zip(self._columns, self._blocks, strict=True):
            block.submit(method, np.ascontiguousarray(x[:, cols]), y, *extra)
        return [block.result() for block in self._blocks]

    def rebuild(self) -> None:
        self._call("reset", slice(0, self.history.size))

    def advance(self, start: int, stop: int) -> Pairs:
        min_out = 0.0 if self.spec.quantitative else self.spec.delta
        keys = None
        for found in self._call("advance", slice(start, stop), min_out, self._block_eps):
            keys = found if keys is None else np.intersect1d(keys, found, assume_unique=True)
        return keys // stop, keys % stop
