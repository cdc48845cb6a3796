"""A history that retention truncated is flagged, never silent.

A host that restarts with no snapshot covering the deleted head of a partition cannot
rebuild the records it lacks: the rule's alerts must say ``history_complete: false``, the
gap must be logged and counted, and with ``on_history_gap = "fail"`` the daemon stops.
The witness sets stay exact for what is left: they equal brute force over the retained
records.
"""

from __future__ import annotations

import asyncio
import signal

import jsonschema
import numpy as np
import orjson
import pytest
import structlog
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from tests.daemon_harness import (
    Daemon,
    consume_all,
    decision_events,
    expected_alerts,
    produce,
    wait_http,
    witness_map,
)
from tests.oracle import witness_sets
from tests.test_daemon_units import schema
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import IorRule
from vigil.daemon.config import parse_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.pipeline import HistoryGap, Pipeline, PipelineSettings
from vigil.daemon.state import FileStore

N, COMMITTED, FIRST = 400, 260, 100


@pytest.fixture
def stream():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 8, size=(N, 3)) / 8
    y = rng.integers(0, 2, size=N)
    values = [
        orjson.dumps({"id": i, "model": "m", "x": x[i].tolist(), "y": int(y[i])}) for i in range(N)
    ]
    return x, y, values


def _pipeline(values, store, sink, first=0, fail=False):
    rule = IorRule(
        parse_config(
            {
                "files": {"decisions": "unused", "topic": "t"},
                "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
                "rules": [{"name": "r", "kind": "ior", "topic": "t", "eps": 0.25}],
            }
        ).rules[0]
    )
    source = MemorySource("t", values, first=first)
    settings = PipelineSettings("dead", max_batch=37, fail_on_history_gap=fail)
    metrics = Metrics()
    return Pipeline([rule], source, sink, store, metrics, settings), source


async def _run(values, store, sink, commits, first=0, fail=False, final_snapshot=True):
    pipeline, source = _pipeline(values, store, sink, first, fail)
    source.commits = commits
    await source.start(pipeline.on_assign, pipeline.on_revoke)
    await pipeline.run(asyncio.Event(), until_idle=True)
    if final_snapshot:
        await pipeline.snapshot_all()
    return pipeline, source.commits


def _alerts(sink):
    return [orjson.loads(m.value) for m in sink.messages if m.topic == "vigil.alerts"]


def _expected(x, y, start, emit_from):
    """Brute-force witness sets over the records from ``start`` on, for the decisions from
    ``emit_from`` on."""
    truth = witness_sets(x[start:], y[start:], 0.25)
    return {
        start + n: [start + j for j, _ in ws]
        for n, ws in enumerate(truth)
        if ws and start + n >= emit_from
    }


def _metric(pipeline, name, **labels) -> float:
    text = pipeline.metrics.render().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name}{{{want}}} in the metrics")


def test_a_host_replaced_after_retention_flags_its_alerts(tmp_path, stream):
    x, y, values = stream
    _, commits = asyncio.run(_run(values[:COMMITTED], FileStore(tmp_path / "a"), MemorySink(), []))
    assert commits[-1] == {("t", 0): COMMITTED}

    # a new host: empty state dir; retention deleted the first FIRST records
    store, sink = FileStore(tmp_path / "b"), MemorySink()
    with structlog.testing.capture_logs() as logs:
        pipeline, _ = asyncio.run(_run(values, store, sink, commits, first=FIRST))
    gaps = [e for e in logs if e["event"] == "history_gap"]
    assert len(gaps) == 1 and gaps[0]["log_level"] == "error"
    assert (gaps[0]["missing_from"], gaps[0]["missing_to"]) == (0, FIRST)
    assert _metric(pipeline, "vigil_history_gaps_total", rule="r") == 1
    assert _metric(pipeline, "vigil_history_complete", rule="r", topic="t", partition="0") == 0

    alerts = _alerts(sink)
    assert alerts and all(a["history_complete"] is False for a in alerts)
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == _expected(x, y, FIRST, COMMITTED)
    validator = jsonschema.Draft202012Validator(schema("alert"))
    for alert in alerts:
        validator.validate(alert)

    # the flag survives snapshots and restarts of the truncated state
    more = values + [
        orjson.dumps({"id": i, "model": "m", "x": [0.5, 0.5, 0.5], "y": i % 2})
        for i in range(N, N + 10)
    ]
    sink = MemorySink()
    with structlog.testing.capture_logs() as logs:
        asyncio.run(_run(more, store, sink, [{("t", 0): N}], first=FIRST))
    assert _alerts(sink) and all(a["history_complete"] is False for a in _alerts(sink))
    assert not [e for e in logs if e["event"] == "history_gap"]  # known, not found again


def test_a_snapshot_that_covers_the_deleted_head_keeps_the_history_complete(tmp_path, stream):
    x, y, values = stream
    store = FileStore(tmp_path)
    _, commits = asyncio.run(_run(values[:COMMITTED], store, MemorySink(), []))
    sink = MemorySink()
    with structlog.testing.capture_logs() as logs:
        pipeline, _ = asyncio.run(_run(values, store, sink, commits, first=FIRST))
    assert not [e for e in logs if e["event"] == "history_gap"]
    assert _metric(pipeline, "vigil_history_complete", rule="r", topic="t", partition="0") == 1
    alerts = _alerts(sink)
    assert alerts and all(a["history_complete"] is True for a in alerts)
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == _expected(x, y, 0, COMMITTED)


def test_on_history_gap_fail_stops_the_daemon(tmp_path, stream):
    _, _, values = stream
    _, commits = asyncio.run(_run(values[:COMMITTED], FileStore(tmp_path / "a"), MemorySink(), []))
    sink = MemorySink()
    with pytest.raises(HistoryGap, match=r"t\[0\]: offsets 0\.\.99 were deleted"):
        asyncio.run(_run(values, FileStore(tmp_path / "b"), sink, commits, first=FIRST, fail=True))
    assert not _alerts(sink)


def test_records_deleted_before_they_were_read_are_reported(tmp_path, stream):
    _, _, values = stream
    store = FileStore(tmp_path)
    _, commits = asyncio.run(_run(values[:COMMITTED], store, MemorySink(), []))
    with structlog.testing.capture_logs() as logs:
        pipeline, commits = asyncio.run(
            _run(values, store, MemorySink(), commits, first=COMMITTED + 40)
        )
    unread = [e for e in logs if e["event"] == "history_gap" and e["unanswered"]]
    assert [(e["missing_from"], e["missing_to"]) for e in unread] == [(COMMITTED, COMMITTED + 40)]
    assert _metric(pipeline, "vigil_history_gaps_total", rule="") == 1
    assert commits[-1] == {("t", 0): N}


def test_a_new_group_starts_a_complete_history_at_the_first_retained_record(tmp_path, stream):
    x, y, values = stream
    sink = MemorySink()
    with structlog.testing.capture_logs() as logs:
        asyncio.run(_run(values, FileStore(tmp_path), sink, [], first=FIRST))
    assert not [e for e in logs if e["event"] == "history_gap"]
    alerts = _alerts(sink)
    assert alerts and all(a["history_complete"] is True for a in alerts)
    got = {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}
    assert got == _expected(x, y, FIRST, FIRST)


@pytest.mark.parametrize("store", ["file", "kafka"])
async def test_a_replaced_host_on_a_truncated_topic_through_kafka(
    kafka_bootstrap, tmp_path, compas, store
):
    """The real broker: retention (delete_records) removes the head after the first host
    committed and snapshotted; a second host with an empty state dir takes over. With the
    file store its history lacks the head, and its alerts must say so; with the Kafka store
    it restores the snapshot and its alerts are those of the whole stream."""
    x, y = compas[0][:1600], compas[1][:1600]
    half, cut = 800, 300
    settings = f'store = "{store}"'
    first = Daemon(kafka_bootstrap, tmp_path / "a", state_settings=settings)
    (tmp_path / "a").mkdir()
    events = decision_events(x, y, "compas")
    before = expected_alerts(x[:half], y[:half], first.eps)
    await produce(kafka_bootstrap, first.topic, events[:half])
    first.start()
    try:
        got = await consume_all(kafka_bootstrap, first.alerts_topic, len(before), 120)
        assert witness_map(got) == before
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0, first.log_text()
    finally:
        first.kill()

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({KafkaTP(first.topic, 0): RecordsToDelete(cut)})
    finally:
        await admin.close()
    await produce(kafka_bootstrap, first.topic, events[half:])

    # same topics and group, empty state dir
    second = Daemon(kafka_bootstrap, tmp_path / "b", tag=first.tag, state_settings=settings)
    (tmp_path / "b").mkdir()
    complete = store == "kafka"
    after = {
        d: ws
        for d, ws in expected_alerts(x, y, first.eps, first=0 if complete else cut).items()
        if int(d[1:]) >= half
    }
    second.start()
    try:
        alerts = await consume_all(
            kafka_bootstrap, first.alerts_topic, len(before) + len(after), 120
        )
        new = alerts[len(got) :]
        assert witness_map(new) == after
        assert new and all(a["history_complete"] is complete for a in new)
        metrics = await wait_http(second.port, "/metrics")
        gaps = 0 if complete else 1
        assert f'vigil_history_gaps_total{{rule="compas-fairness"}} {gaps}.0' in metrics
        loaded = 1 if complete else 0
        assert f'vigil_snapshots_total{{outcome="loaded"}} {loaded}.0' in metrics
        second.signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, second.log_text()
    finally:
        second.kill()
    assert ('"history_gap"' in second.log_text()) is not complete
    if complete:  # restored, then only what followed the snapshot was read
        assigned = [
            orjson.loads(line)
            for line in second.log_text().splitlines()
            if '"partition_assigned"' in line
        ]
        assert [a["replay_from"] for a in assigned] == [half]
