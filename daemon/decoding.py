"""A backlog's decision events read in a worker process while the loop checks the batch before.

Reading a decision event (the typed decode, its inputs' floats, the batch's matrix) takes
about a quarter of the loop's time per decision, and the loop has one core. A batch of at
least ``READ_AHEAD_RECORDS`` is therefore handed to one worker process, which sends back the
typed envelopes with their inputs as one matrix; the loop checks batches fetched before
meanwhile (daemon/pipeline.py holds up to ``READ_AHEAD_BATCHES`` of them). Smaller batches
(live traffic) are read in the loop: they would only wait for the other process. Every
record the worker leaves (a bad event, another shape) is read in the loop by
``decode_decision``, so the decisions and dead letters do not depend on where a batch was
read.
"""

from __future__ import annotations

import asyncio
import operator
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import structlog

from vigil.connectors.events import (
    Decision,
    DecisionRun,
    Envelopes,
    Record,
    decode_decision,
)
from vigil.daemon.decode_process import receive, send
from vigil.daemon.metrics import Metrics

log = structlog.get_logger("vigil.decoding")

READ_AHEAD_RECORDS = 1000
"""Decision events a fetched batch needs for the worker to read them."""

READ_AHEAD_BATCHES = 2
"""Batches the worker may be reading while the loop checks an earlier one. The worker
reads a batch in about as long as the loop checks one, so with one batch ahead the loop
waited for it about every other batch (a sixth of a backlog's drain, docs/benchmarks.md);
with two, the worker's slower batches are absorbed by its faster ones."""


class Decoded:
    """A batch's decisions read ahead (``records``: the records the worker was given);
    ``decision`` reads any other record itself."""

    def __init__(
        self, records: list[Record] | None = None, envelopes: Envelopes | None = None
    ) -> None:
        self._records = records or []
        self._envelopes = envelopes
        self._index: dict[int, int] | None = None  # each record's position, built when asked
        self._next = 0  # the position asked for next, if asked in order
        self._row = np.full(len(self._records), -1, dtype=np.int64)  # the envelope of each
        if envelopes is not None:
            self._row[envelopes.read] = np.arange(len(envelopes.read))

    def _at(self, record: Record) -> int | None:
        """The record's position among those read, or None."""
        if self._next < len(self._records) and self._records[self._next] is record:
            return self._next  # partitions are asked for in the order they were read
        if self._index is None:
            self._index = {id(r): i for i, r in enumerate(self._records)}
        return self._index.get(id(record))

    def decision(self, record: Record) -> Decision:
        """The record's decision; raises ``BadEvent`` as ``decode_decision`` does."""
        at = self._at(record)
        if at is not None:
            self._next = at + 1
        row = -1 if at is None else int(self._row[at])
        if row < 0:
            return decode_decision(record)
        e = self._envelopes
        assert e is not None
        return Decision(record, e.ids[row], e.models[row], e.x[row], e.ys[row])

    def run(self, records: list[Record]) -> DecisionRun | None:
        """The decisions of ``records`` as one run, when they are consecutive records of
        the batch read and the worker read every one of them; else None."""
        first = self._at(records[0]) if records else None
        if first is None:
            return None
        self._next = first  # where the records' own decisions are asked for, if not a run
        stop = first + len(records)
        if stop > len(self._records):
            return None
        row, last = int(self._row[first]), int(self._row[stop - 1])
        # rows number the records read in order: both ends read n - 1 rows apart, all are
        if row < 0 or last - row != len(records) - 1:
            return None
        if not all(map(operator.is_, self._records[first:stop], records)):
            return None
        e = self._envelopes
        assert e is not None
        rows = slice(row, last + 1)
        self._next = stop
        return DecisionRun(records, e.ids[rows], e.models[rows], e.ys[rows], e.x[rows])


_ONE_BLAS_THREAD = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
"""The worker multiplies no matrices: numpy's BLAS threads, started at its import, would
only spin (0.1 s of CPU for each start of the worker on two cores)."""


class Link:
    """A worker process (daemon/decode_process.py) and a socket pair to it: nothing shared
    but the socket, so a daemon killed with SIGKILL leaves nothing behind. One thread of
    the daemon sends each batch and waits for the answer, so the event loop never blocks on
    the socket; each message moves in one blocking call, so that thread takes the
    interpreter's lock twice a batch, not once per socket buffer (it waits up to the switch
    interval, 5 ms, each time the loop is busy checking)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        # a new interpreter (no fork of the loop and client threads) that imports from
        # where the daemon does, not from its working directory
        path = os.pathsep.join(p for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "vigil.daemon.decode_process", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env={**os.environ, **_ONE_BLAS_THREAD, "PYTHONPATH": path},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._io = ThreadPoolExecutor(1, thread_name_prefix="vigil-decode")

    def ask(self, values: list[bytes | None]) -> asyncio.Future[Envelopes]:
        """The worker's reading of ``values``, in the order asked."""
        return asyncio.get_running_loop().run_in_executor(self._io, self._round_trip, values)

    def _round_trip(self, values: list[bytes | None]) -> Envelopes:
        send(self.sock, values)
        return receive(self.sock)

    def close(self) -> None:
        """Stop the process; a batch under way fails (its thread sees the socket close)."""
        self.process.kill()
        self.process.wait()
        self._io.submit(self.sock.close)
        self._io.shutdown(wait=False)


class DecodeWorker:
    """One worker process reading large batches' decision events ahead of the loop.

    ``start`` starts the process (a backlog is often waiting when the daemon starts); the
    first batch waits for it to be up. A worker that fails, or takes more than
    ``timeout_seconds`` to start or to answer, is stopped, its batches are read in the loop,
    and the next large batch starts another."""

    def __init__(
        self,
        topics: Iterable[str],
        metrics: Metrics,
        new_link: Callable[[], Link] = Link,
        timeout_seconds: float = 60.0,
    ) -> None:
        self.topics = frozenset(topics)
        self.metrics = metrics
        self.new_link = new_link
        self.timeout_seconds = timeout_seconds
        self._link: Link | None = None
        self._starting: asyncio.Future | None = None

    def start(self) -> None:
        """Start the worker process, unless it runs (called in the event loop)."""
        if self._link is not None:
            return
        try:
            link = self._link = self.new_link()
        except Exception as e:  # no process could be started
            self._report(e)
            return
        self._starting = link.ask([])
        self._starting.add_done_callback(self._started)
        log.info("decode_worker_starting", pid=link.process.pid)

    def _started(self, starting: asyncio.Future) -> None:
        if not starting.cancelled() and starting.exception() is None:
            log.info("decode_worker_up")

    def read(self, records: list[Record]) -> asyncio.Future[Decoded] | None:
        """Start reading the decision events among ``records``; None when they are too few
        to be worth the round trip (the loop then reads them as it checks them)."""
        if len(records) < READ_AHEAD_RECORDS:  # live traffic: no pass over its records
            return None
        wanted = [r for r in records if r.topic in self.topics]
        if len(wanted) < READ_AHEAD_RECORDS:
            return None
        self.start()
        if self._link is None or self._starting is None:
            return None
        return asyncio.ensure_future(self._decoded(wanted, self._link, self._starting))

    async def _decoded(
        self, records: list[Record], link: Link, starting: asyncio.Future
    ) -> Decoded:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await asyncio.shield(starting)  # shared by the batches that wait for it
                envelopes = await link.ask([r.value for r in records])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the process died, hung, or could not take the batch
            if link is self._link:  # its other batches fail alike: report it once
                self._report(e)
                self.close()
            return Decoded()
        self.metrics.decode_worker_events.inc(len(envelopes.read))
        return Decoded(records, envelopes)

    def _report(self, error: BaseException) -> None:
        log.warning("decode_worker_failed", error=repr(error))
        self.metrics.decode_worker_failures.inc()

    def close(self) -> None:
        """Stop the worker (a batch under way is read in the loop instead)."""
        if self._link is not None:
            self._link.close()
        self._link = self._starting = None
