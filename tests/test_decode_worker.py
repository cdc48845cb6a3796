"""A batch read ahead (typed envelopes, the inputs as one matrix, in the decode worker) gives
exactly what ``decode_decision`` gives record by record: the same decisions with the same
numbers, the same dead letters; a worker process that dies costs a batch read in the loop,
not a decision."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_decode_fast_path import events, texts, typed, valid
from vigil.connectors.events import (
    BadEvent,
    DecisionRun,
    Record,
    decode_decision,
    read_envelopes,
)
from vigil.daemon.decode_process import receive, send
from vigil.daemon.decoding import READ_AHEAD_RECORDS, Decoded, DecodeWorker, Link
from vigil.daemon.metrics import Metrics


def outcome(decode, record: Record) -> tuple:
    try:
        d = decode(record)
    except BadEvent as e:
        return ("bad", e.reason, str(e))
    x = d.x.tolist() if isinstance(d.x, np.ndarray) else d.x
    return ("ok", d.record is record, typed(d.id), d.model, typed(x), typed(d.y), d.event)


def read_ahead(records: list[Record]) -> Decoded:
    return Decoded(records, read_envelopes([r.value for r in records]))


values = st.one_of(
    events().map(lambda e: json.dumps(e).encode()),
    valid.map(lambda e: json.dumps(e).encode()),
    texts,
    st.none(),  # a tombstone
    st.binary(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(values, max_size=12), st.data())
def test_a_batch_read_ahead_gives_what_each_record_gives(batch, data):
    """In the order read (the pipeline's) or any other, asked again or not."""
    records = [Record("t", 0, i, v) for i, v in enumerate(batch)]
    decoded = read_ahead(records)
    asked = records
    if records and data.draw(st.booleans()):
        asked = data.draw(st.lists(st.sampled_from(records)))
    for r in asked:
        assert outcome(decoded.decision, r) == outcome(decode_decision, r)


@settings(max_examples=400, deadline=None)
@given(st.lists(values, max_size=12), st.data())
def test_a_run_of_a_batch_read_ahead_is_its_records_decisions_or_none(batch, data):
    """A run is offered exactly when the records asked for are consecutive records of the
    batch, every one read by the worker; its decisions are those each record gives."""
    records = [Record("t", 0, i, v) for i, v in enumerate(batch)]
    decoded = read_ahead(records)
    start = data.draw(st.integers(0, len(records)))
    stop = data.draw(st.integers(start, len(records)))
    asked = records[start:stop]
    if data.draw(st.booleans()) and asked:  # or a copy of one of them, not the batch's own
        at = data.draw(st.integers(0, len(asked) - 1))
        asked = [*asked[:at], Record(*msgspec.structs.astuple(asked[at])), *asked[at + 1 :]]
    run = decoded.run(asked)

    def read_by_worker(r: Record) -> bool:
        try:
            return isinstance(decoded.decision(r).x, np.ndarray)
        except BadEvent:
            return False

    own = all(a is b for a, b in zip(asked, records[start:stop], strict=True))
    all_read = all(map(read_by_worker, asked))
    assert (run is not None) == (bool(asked) and own and all_read)
    if run is None:
        return
    assert isinstance(run, DecisionRun) and len(run) == len(asked)
    assert run.x.shape[0] == len(asked)
    for i, r in enumerate(asked):
        assert outcome(lambda _, d=run[i]: d, r) == outcome(decode_decision, r)
        assert run[i] is run[i - len(asked)]  # built once, negative indices alike
        assert run.x[i].tolist() == run[i].x.tolist()
    half = run[len(run) // 2 :]
    assert all(d.record is r for d, r in zip(half, asked[len(run) // 2 :], strict=True))
    assert half.ids == run.ids[len(run) // 2 :]


def test_the_envelopes_of_the_most_common_width_are_read_ahead_and_the_rest_left():
    values = [
        b'{"id":1,"model":"m","x":[0.1,2],"y":0}',
        b'{"id":2,"model":"m","x":[0.3],"y":1}',  # another width
        b'{"id":3,"model":"m","features":{"a":1},"y":1}',
        b"not json",
        None,
        b'{"id":"s","model":"n","x":[1e-300,-0.0],"y":[0.5,0.5]}',
    ]
    envelopes = read_envelopes(values)
    assert envelopes.read == [0, 5]
    assert envelopes.ids == [1, "s"] and envelopes.models == ["m", "n"]
    assert envelopes.ys == [0, [0.5, 0.5]]
    assert envelopes.x.dtype == np.float64
    assert [v.hex() for v in envelopes.x.ravel()] == [v.hex() for v in (0.1, 2.0, 1e-300, -0.0)]
    assert read_envelopes([]).x.shape == (0, 0)


async def test_the_worker_reads_large_batches_and_a_dead_worker_is_replaced():
    metrics = Metrics()
    worker = DecodeWorker({"t"}, metrics)
    events_ = [
        json.dumps({"id": i, "model": "m", "x": [i / 7, -i], "y": i % 2}).encode()
        for i in range(READ_AHEAD_RECORDS)
    ]
    records = [Record("t", 0, i, v) for i, v in enumerate([b"{", *events_])]
    others = [Record("u", 0, i, v) for i, v in enumerate(events_)]  # no rule reads them
    try:
        assert worker.read(records[:10]) is None  # too few to be worth the round trip
        assert worker.read(others) is None
        decoded = await worker.read(records)  # waits for the worker to start
        for r in records:
            assert outcome(decoded.decision, r) == outcome(decode_decision, r)
        assert isinstance(decoded.decision(records[1]).x, np.ndarray)  # read in the worker
        assert metrics.decode_worker_events._value.get() == READ_AHEAD_RECORDS

        os.kill(worker._link.process.pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        decoded = await worker.read(records)
        assert metrics.decode_worker_failures._value.get() == 1
        for r in records:  # read in the loop instead
            assert outcome(decoded.decision, r) == outcome(decode_decision, r)
        assert not isinstance(decoded.decision(records[1]).x, np.ndarray)
        decoded = await worker.read(records)  # by another worker
        assert isinstance(decoded.decision(records[1]).x, np.ndarray)
        assert metrics.decode_worker_events._value.get() == 2 * READ_AHEAD_RECORDS
    finally:
        worker.close()


async def test_a_worker_that_cannot_start_is_reported_and_the_loop_reads():
    def refusing():
        raise OSError("fork: Resource temporarily unavailable")

    metrics = Metrics()
    worker = DecodeWorker({"t"}, metrics, refusing)
    value = b'{"id":1,"model":"m","x":[1,2],"y":0}'
    records = [Record("t", 0, i, value) for i in range(READ_AHEAD_RECORDS)]
    worker.start()
    assert metrics.decode_worker_failures._value.get() == 1
    assert worker.read(records) is None  # tried again, and read in the loop
    assert metrics.decode_worker_failures._value.get() == 2


class _Silent:
    """A worker that never answers."""

    def __init__(self) -> None:
        self.process = SimpleNamespace(pid=0)
        self.closed = False

    def ask(self, values: list) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    def close(self) -> None:
        self.closed = True


async def test_a_worker_that_does_not_answer_is_stopped_and_the_loop_reads():
    links: list[_Silent] = []

    def silent() -> _Silent:
        links.append(_Silent())
        return links[-1]

    metrics = Metrics()
    worker = DecodeWorker({"t"}, metrics, silent, timeout_seconds=0.2)
    value = b'{"id":1,"model":"m","x":[1,2],"y":0}'
    records = [Record("t", 0, i, value) for i in range(READ_AHEAD_RECORDS)]
    decoded = await worker.read(records)
    assert isinstance(decoded.decision(records[0]).x, list)  # read in the loop
    assert metrics.decode_worker_failures._value.get() == 1 and links[0].closed
    worker.read(records).cancel()
    assert len(links) == 2  # the next large batch starts another


def test_the_worker_process_ends_when_the_daemon_closes_its_socket():
    # as when the daemon dies (even by SIGKILL): the kernel closes its end of the socket
    link = Link()
    try:
        link.sock.close()
        assert link.process.wait(timeout=30) == 0
    finally:
        link.process.kill()
        link._io.shutdown()


def test_the_worker_process_imports_only_what_reading_needs():
    # its start is CPU that a catch-up pays: no logging, metrics or event loop
    heavy = {"structlog", "prometheus_client", "asyncio", "aiokafka"}
    code = f"import sys, vigil.daemon.decode_process; print(sorted({heavy!r} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_worker_imports_vigil_from_where_the_daemon_does(tmp_path, monkeypatch):
    # a directory named like the package, where the daemon runs, is not what it imports
    (tmp_path / "vigil").mkdir()
    (tmp_path / "vigil" / "__init__.py").write_text("raise ImportError('the wrong vigil')\n")
    monkeypatch.chdir(tmp_path)
    link = Link()
    try:
        send(link.sock, [b'{"id": 1, "model": "m", "x": [0.5], "y": 0}'])
        assert receive(link.sock).x.tolist() == [[0.5]]
    finally:
        link.close()
