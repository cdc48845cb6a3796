"""The daemon against the real dev broker: exactness, crash recovery, shutdown, bad input,
metrics. Each test uses its own topics, consumer group and state directory."""

from __future__ import annotations

import asyncio
import random
import re
import signal
import time

import orjson
import pytest

from tests.daemon_harness import (
    Daemon,
    consume_all,
    create_topic,
    decision_events,
    expected_alerts,
    produce,
    wait_http,
    witness_map,
)


@pytest.mark.parametrize("exactly_once", [True, False])
async def test_alerts_equal_offline_replay_and_sigterm_drains(
    kafka_bootstrap, tmp_path, compas, exactly_once
):
    x, y = compas
    daemon = Daemon(kafka_bootstrap, tmp_path, exactly_once=exactly_once)
    expected = expected_alerts(x, y, daemon.eps)
    await produce(kafka_bootstrap, daemon.topic, decision_events(x, y, "compas"))
    daemon.start()
    try:
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        assert len(alerts) == len(expected)
        assert witness_map(alerts) == expected
        assert all(a["source"]["topic"] == daemon.topic for a in alerts)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, daemon.log_text()
        assert time.monotonic() - started < 20
    finally:
        daemon.kill()
    log = daemon.log_text()
    assert '"event": "stopped"' in log or '"event":"stopped"' in log
    snaps = list((tmp_path / "state").rglob("*.snap"))
    assert snaps and max(int(p.stem) for p in snaps) == len(x)


async def test_sigkill_at_random_points_loses_and_duplicates_nothing(
    kafka_bootstrap, tmp_path, compas
):
    x, y = compas
    daemon = Daemon(kafka_bootstrap, tmp_path, exactly_once=True, snapshot_every_events=250)
    expected = expected_alerts(x, y, daemon.eps)
    events = decision_events(x, y, "compas")
    chunks = [events[i : i + 600] for i in range(0, len(events), 600)]
    rng = random.Random(11)
    kills = 0
    await produce(kafka_bootstrap, daemon.topic, chunks[0])
    for chunk in chunks[1:]:
        daemon.start()
        await wait_http(daemon.port, "/readyz", timeout=90)  # recovered and caught up
        producing = asyncio.create_task(produce(kafka_bootstrap, daemon.topic, chunk, pace=0.05))
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        daemon.kill()  # while the chunk is still arriving, often mid-batch
        kills += 1
        await producing
    daemon.start()
    try:
        alerts = await consume_all(
            kafka_bootstrap, daemon.alerts_topic, len(expected), 180, settle=4.0
        )
    finally:
        daemon.kill()
    ids = [a["decision"]["id"] for a in alerts]
    assert len(ids) == len(set(ids)), "an alert was duplicated"
    assert witness_map(alerts) == expected, "an alert was lost or differs"
    # witnesses whose partner came in an earlier chunk: the history survived the crashes
    chunk_of = {f"d{i}": i // 600 for i in range(len(x))}
    assert any(chunk_of[w] < chunk_of[d] for d, ws in expected.items() for w in ws)
    restarts = [
        orjson.loads(line)
        for line in daemon.log_text().splitlines()
        if '"partition_assigned"' in line
    ]
    assert len(restarts) == kills + 1
    assert any(r["replay_from"] < (r["committed"] or 0) for r in restarts), (
        "no restart replayed records between a snapshot and the committed offset"
    )


async def test_a_group_starting_at_the_end_skips_the_backlog_across_a_restart(
    kafka_bootstrap, tmp_path, compas
):
    """auto_offset_reset = "latest": decisions already on the topic are neither checked nor
    history, also after a crash before any snapshot; decisions sent while down are not lost."""
    x, y = compas
    x, y = x[:2400], y[:2400]
    daemon = Daemon(kafka_bootstrap, tmp_path, auto_offset_reset="latest")
    events = decision_events(x, y, "compas")
    daemon.create_topics()
    await produce(kafka_bootstrap, daemon.topic, events[:800])  # the backlog
    daemon.start()
    try:
        await wait_http(daemon.port, "/readyz", timeout=90)
        await produce(kafka_bootstrap, daemon.topic, events[800:1600])
        first = expected_alerts(x[:1600], y[:1600], daemon.eps, first=800)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(first), 120)
        assert witness_map(alerts) == first
        daemon.kill()  # no snapshot yet: the restart rebuilds the history by a replay
        await produce(kafka_bootstrap, daemon.topic, events[1600:])
        daemon.start()
        expected = expected_alerts(x, y, daemon.eps, first=800)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
    finally:
        daemon.kill()
    assert not list((tmp_path / "state").rglob("*.snap"))
    assert len(alerts) == len(expected)
    assert witness_map(alerts) == expected


BAD = [
    (b"\x00\xffgarbage", "undecodable"),
    (b"{not json", "undecodable"),
    (b"[1, 2, 3]", "schema"),
    (b'{"id": "b1", "model": "compas", "x": [0.1]}', "schema"),
    (b'{"id": "b2", "model": "compas", "x": "abc", "y": 1}', "schema"),
    (b'{"id": "b3", "model": "compas", "x": [0.1, 0.2], "y": 1}', "dimension"),
    (b'{"id": true, "model": "compas", "x": [0.1], "y": 1}', "schema"),
    (
        b'{"id": "b5", "model": "compas", "x": [NaN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], '
        b'"y": 1}',
        "non_finite",
    ),
    (
        b'{"id": "b6", "model": "compas", "x": [1e999, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], '
        b'"y": 1}',
        None,
    ),
    (
        b'{"id": "b7", "model": "compas", "x": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], '
        b'"y": 0.5}',
        "schema",
    ),
]


def with_bad_events(good: list[bytes]) -> tuple[list[bytes], dict[int, str | None]]:
    """``good`` with one of ``BAD`` after every 70th event, and each bad event's offset with
    the reason its dead letter must give (None: undecodable or non_finite)."""
    stream, bad_at = [], {}
    for i, event in enumerate(good):
        stream.append(event)
        if i % 70 == 35:
            value, reason = BAD[len(bad_at) % len(BAD)]
            bad_at[len(stream)] = reason
            stream.append(value)
    return stream, bad_at


def assert_dead_letters(dead: list[dict], bad_at: dict[int, str | None]) -> None:
    assert sorted(d["source"]["offset"] for d in dead) == sorted(bad_at)
    for d in dead:
        want = bad_at[d["source"]["offset"]]
        assert d["reason"] == want or (
            want is None and d["reason"] in ("undecodable", "non_finite")
        )


async def test_bad_input_goes_to_dead_letters_and_metrics_move(kafka_bootstrap, tmp_path, compas):
    x, y = compas
    x, y = x[:800], y[:800]
    daemon = Daemon(kafka_bootstrap, tmp_path, exactly_once=False)
    expected = expected_alerts(x, y, daemon.eps)
    stream, bad_at = with_bad_events(decision_events(x, y, "compas"))
    rng = random.Random(5)
    await produce(kafka_bootstrap, daemon.topic, stream)
    daemon.start()
    try:
        await wait_http(daemon.port, "/healthz")
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, len(bad_at), 120)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 60)
        assert daemon.proc.poll() is None, "the daemon stopped on bad input"
        assert witness_map(alerts) == expected
        assert_dead_letters(dead, bad_at)
        for d in dead:
            assert d["error"] and d["source"]["topic"] == daemon.topic
            assert "payload" in d or "payload_base64" in d
        await wait_http(daemon.port, "/readyz")
        body = await wait_http(daemon.port, "/metrics")
        counts = {
            r: float(v)
            for r, v in re.findall(r'vigil_dead_letters_total\{reason="(\w+)"\} ([0-9.e+]+)', body)
            if float(v)  # every reason's series exists from the start, at 0
        }
        seen = {}
        for d in dead:
            seen[d["reason"]] = seen.get(d["reason"], 0) + 1
        assert counts == seen
        checked = re.search(
            r'vigil_events_total\{outcome="checked",rule="compas-fairness"\} '
            r"([0-9.e+]+)",
            body,
        )
        assert checked and float(checked.group(1)) == len(x)
        assert f'vigil_consumer_lag{{partition="0",topic="{daemon.topic}"}} 0.0' in body
        assert re.search(
            r'vigil_check_seconds_count\{backend="auto",rule="compas-fairness"\} '
            r"[1-9]",
            body,
        )
        assert (
            f'vigil_history_size{{partition="0",rule="compas-fairness",topic="{daemon.topic}"}}'
            f" {float(len(x))}" in body
        )
        # more traffic moves the counters
        await produce(kafka_bootstrap, daemon.topic, [BAD[0][0]])
        for _ in range(50):
            body = await wait_http(daemon.port, "/metrics")
            if (
                f'vigil_dead_letters_total{{reason="undecodable"}} {seen["undecodable"] + 1}'
                in body
            ):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("vigil_dead_letters_total did not move")
        assert rng is not None
    finally:
        daemon.kill()
    assert orjson.loads(orjson.dumps(dead[0]))


async def test_a_backlog_read_in_the_decode_worker_gives_every_alert_and_dead_letter(
    kafka_bootstrap, tmp_path, compas
):
    # the backlog's batches (max_batch 1000) are read in the worker, but for the remainder
    # under READ_AHEAD_RECORDS, read in the loop; bad events sit in both
    x, y = compas
    daemon = Daemon(kafka_bootstrap, tmp_path, exactly_once=True, kafka_settings="max_batch = 1000")
    expected = expected_alerts(x, y, daemon.eps)
    stream, bad_at = with_bad_events(decision_events(x, y, "compas"))
    await produce(kafka_bootstrap, daemon.topic, stream)
    daemon.start()
    try:
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, len(bad_at), 120)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 60)
        assert witness_map(alerts) == expected
        assert_dead_letters(dead, bad_at)
        body = await wait_http(daemon.port, "/metrics")
        read = re.search(r"vigil_decode_worker_events_total ([0-9.e+]+)", body)
        # the first three batches' decisions, twice if the first fetch straddled the
        # assignment (that batch is dropped and fetched again)
        assert read and 0.9 * len(x) < float(read.group(1)) <= 2 * len(stream), body
        assert "vigil_decode_worker_failures_total 0.0" in body
    finally:
        daemon.kill()


async def test_rebalance_moves_a_partition_and_its_series(kafka_bootstrap, tmp_path):
    from aiokafka import AIOKafkaProducer

    first = Daemon(kafka_bootstrap, tmp_path / "a", exactly_once=False)
    second = Daemon(kafka_bootstrap, tmp_path / "b", exactly_once=False, tag=first.tag)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    await create_topic(kafka_bootstrap, first.topic, 2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(200):
            event = {"id": i, "model": "compas", "x": [i % 7 / 7] * 14, "y": i % 2}
            await producer.send(first.topic, orjson.dumps(event), partition=i % 2)
        await producer.flush()
    finally:
        await producer.stop()

    def lag_partitions(body: str) -> set[str]:
        return set(
            re.findall(rf'vigil_consumer_lag\{{partition="(\d)",topic="{first.topic}"\}}', body)
        )

    async def split() -> tuple[str, str]:
        for _ in range(150):
            a = await wait_http(first.port, "/metrics")
            b = await wait_http(second.port, "/metrics")
            pa, pb = lag_partitions(a), lag_partitions(b)
            if len(pa) == len(pb) == 1 and pa | pb == {"0", "1"}:
                return a, b
            await asyncio.sleep(0.2)
        raise AssertionError(f"no split: {pa} / {pb}")

    first.start()
    try:
        for _ in range(150):
            if lag_partitions(await wait_http(first.port, "/metrics")) == {"0", "1"}:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the first daemon never held both partitions")
        second.start()
        a, b = await split()
        gone = lag_partitions(b).pop()
        assert f'vigil_history_size{{partition="{gone}"' not in a
        assert f'vigil_consumer_lag{{partition="{gone}"' not in a
        assert "vigil_assigned_partitions 1.0" in a and "vigil_assigned_partitions 1.0" in b
        assert "partition_revoked" in first.log_text()
    finally:
        first.kill()
        second.kill()


async def test_alerts_fit_an_alerts_topic_with_a_small_message_limit_or_stop_the_daemon_clearly(
    kafka_bootstrap, tmp_path, compas
):
    # a topic's max.message.bytes bounds a whole record batch: every alert fits a 4,000-byte
    # limit, a delivery's batch would not
    x, y = compas
    fits = Daemon(kafka_bootstrap, tmp_path / "fits", exactly_once=True)
    (tmp_path / "fits").mkdir()
    expected = expected_alerts(x, y, fits.eps)
    await create_topic(kafka_bootstrap, fits.alerts_topic, configs={"max.message.bytes": "4000"})
    await produce(kafka_bootstrap, fits.topic, decision_events(x, y, "compas"))
    fits.start()
    try:
        alerts = await consume_all(kafka_bootstrap, fits.alerts_topic, len(expected), 120)
        assert witness_map(alerts) == expected
        assert fits.running(), fits.log_text()
    finally:
        fits.kill()

    # no alert fits 200 bytes: the daemon stops, naming the topic, and commits nothing
    small = Daemon(kafka_bootstrap, tmp_path / "small", exactly_once=True)
    (tmp_path / "small").mkdir()
    await create_topic(kafka_bootstrap, small.alerts_topic, configs={"max.message.bytes": "200"})
    await produce(kafka_bootstrap, small.topic, decision_events(x, y, "compas"))
    small.start()
    try:
        assert small.wait(timeout=60) != 0
    finally:
        small.kill()
    assert f"topic '{small.alerts_topic}' refused a message of" in small.log_text()
    assert await consume_all(kafka_bootstrap, small.alerts_topic, 0, 5) == []
