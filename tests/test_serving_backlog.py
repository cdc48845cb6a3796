"""A serving stack's backlog, already in its topics when the daemon starts: an hour of one-row
requests, each answered 5-60 ms later, read at whatever pace and in whatever order the
fetches bring them. Every pair is joined (the rule's partitions are merged in time), every
row checked once, and the alerts are brute force's over the stream in time order."""

from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from tests.daemon_harness import Daemon, consume_all, create_topic, metric_samples, wait_http
from tests.test_serving_kafka import (
    cloudevent,
    kserve_rule,
    request_bytes,
    response_bytes,
    seldon_rule,
    topics,
)

HOUR_MS = 3_600_000
EPS = 0.04


def hour_of_traffic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Request and response CreateTimes (ms): requests spread over an hour, distinct, each
    answered 5-60 ms later."""
    rng = np.random.default_rng(seed)
    start = int(time.time() * 1000) - 2 * HOUR_MS
    asked = start + np.sort(rng.choice(HOUR_MS, size=n, replace=False))
    return asked, asked + rng.integers(5, 61, size=n)


async def produce(bootstrap: str, records: list[tuple]) -> None:
    """(topic, key, value, headers, timestamp ms), in this order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    await producer.start()
    try:
        for topic, key, value, headers, at in records:
            await producer.send(topic, value, key=key, headers=headers, timestamp_ms=at)
        await producer.flush()
    finally:
        await producer.stop()


async def rule_metrics(port: int) -> tuple[float, float]:
    """(decisions checked, history size) of rule "iris"."""
    samples = metric_samples(await wait_http(port, "/metrics"))
    checked = sum(
        s.value
        for s in samples
        if s.name == "vigil_events_total" and s.labels == {"rule": "iris", "outcome": "checked"}
    )
    history = sum(s.value for s in samples if s.name == "vigil_history_size")
    return checked, history


async def until_checked(port: int, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while (await rule_metrics(port))[1] < n:
        assert time.monotonic() < deadline, f"fewer than {n} rows checked in {timeout:.0f} s"
        await asyncio.sleep(0.2)


def decisions_in_time(x, y, answered, ids) -> list[dict]:
    """The stream the checker sees: a pair's row once its later side (the response) is
    read, so in the responses' time order."""
    order = np.argsort(answered, kind="stable")
    return [{"id": f"{ids[i]}/0", "x": x[i].tolist(), "y": int(y[i])} for i in order]


def brute_force(decisions: list[dict], eps: float) -> dict[str, set[str]]:
    """Every earlier decision within eps (L-inf, closed) with another label."""
    x = np.array([d["x"] for d in decisions])
    y = np.array([d["y"] for d in decisions])
    out = {}
    for i, d in enumerate(decisions):
        near = (np.max(np.abs(x[:i] - x[i]), axis=1) <= eps) & (y[:i] != y[i])
        if near.any():
            out[d["id"]] = {decisions[j]["id"] for j in np.flatnonzero(near)}
    return out


def assert_alerts_are_brute_force(alerts: list[dict], decisions: list[dict]) -> None:
    ids = [a["decision"]["id"] for a in alerts]
    assert len(ids) == len(set(ids)), "an alert was duplicated"
    got = {a["decision"]["id"]: {w["id"] for w in a["witnesses"]} for a in alerts}
    assert got == brute_force(decisions, EPS)


@pytest.mark.parametrize("layout", ["requests-first", "responses-first"])
async def test_an_hour_of_seldon_traffic_already_in_its_topics_is_joined_whole(
    kafka_bootstrap, tmp_path, compas, layout
):
    """All requests written before all responses, or the reverse; a few requests are never
    answered and are the only dead letters, once the join's timeout of stream time passed."""
    x, y = compas
    n = len(x)
    daemon = Daemon(kafka_bootstrap, tmp_path)
    tag = daemon.tag
    inputs, outputs = topics(tag)
    for topic in (inputs, outputs):
        await create_topic(kafka_bootstrap, topic, 1)  # Seldon Core 2's default
    daemon.extra_rules = seldon_rule(tag, timeout=300)
    asked, answered = hour_of_traffic(n, seed=1 if layout == "requests-first" else 2)
    ids = [f"r{i:05d}" for i in range(n)]
    lonely = set(range(100, 3000, 600))  # never answered, well before the last 300 s
    requests, responses = [], []
    for i in range(n):
        key = f"0.iris.{ids[i]}".encode()
        headers = [("pipeline", b"iris"), ("x-request-id", ids[i].encode())]
        requests.append((inputs, key, request_bytes(x[i : i + 1]), headers, int(asked[i])))
        if i not in lonely:
            value = response_bytes(y[i : i + 1])
            responses.append((outputs, key, value, headers, int(answered[i])))
    first, then = (requests, responses) if layout == "requests-first" else (responses, requests)
    await produce(kafka_bootstrap, first)
    await produce(kafka_bootstrap, then)
    answered_ids = [i for i in range(n) if i not in lonely]
    decisions = decisions_in_time(
        x[answered_ids], y[answered_ids], answered[answered_ids], [ids[i] for i in answered_ids]
    )
    expected = brute_force(decisions, EPS)
    daemon.start()
    try:
        await until_checked(daemon.port, len(decisions))
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, len(lonely), 60)
        checked, history = await rule_metrics(daemon.port)
        assert daemon.running()
    finally:
        daemon.kill()
    assert (checked, history) == (len(decisions), len(decisions)), "a row lost or doubled"
    assert sorted((d["reason"], d["error"].split("'")[1]) for d in dead) == sorted(
        ("unmatched", ids[i]) for i in lonely
    )
    assert all("within 300 s of stream time" in d["error"] for d in dead)
    assert_alerts_are_brute_force(alerts, decisions)


async def test_a_kill_during_the_catch_up_loses_and_doubles_nothing(
    kafka_bootstrap, tmp_path, compas
):
    """A SIGKILL mid-way through the backlog, the partition ahead paused at a small read-ahead
    bound all along: every row checked once, the alerts brute force's, no dead letter."""
    x, y = compas
    n = len(x)
    daemon = Daemon(
        kafka_bootstrap,
        tmp_path,
        snapshot_every_events=500,
        kafka_settings="max_batch = 25",  # a catch-up long enough to be killed in
    )
    tag = daemon.tag
    inputs, outputs = topics(tag)
    for topic in (inputs, outputs):
        await create_topic(kafka_bootstrap, topic, 1)
    daemon.extra_rules = seldon_rule(tag, "join_pending_limit = 64", timeout=300)
    asked, answered = hour_of_traffic(n, seed=3)
    ids = [f"r{i:05d}" for i in range(n)]
    requests, responses = [], []
    for i in range(n):
        key = f"0.iris.{ids[i]}".encode()
        headers = [("pipeline", b"iris"), ("x-request-id", ids[i].encode())]
        requests.append((inputs, key, request_bytes(x[i : i + 1]), headers, int(asked[i])))
        responses.append((outputs, key, response_bytes(y[i : i + 1]), headers, int(answered[i])))
    await produce(kafka_bootstrap, requests)
    await produce(kafka_bootstrap, responses)
    decisions = decisions_in_time(x, y, answered, ids)
    expected = brute_force(decisions, EPS)
    daemon.start()
    try:
        deadline = time.monotonic() + 120
        while (checked := (await rule_metrics(daemon.port))[0]) < n // 4:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        daemon.signal(signal.SIGKILL)
        daemon.wait(30)
        assert checked < n, "the catch-up ended before the kill"
        daemon.start(create_topics=False)
        await until_checked(daemon.port, n)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 0, 10)
        assert daemon.running()
        _, history = await rule_metrics(daemon.port)
    finally:
        daemon.kill()
    assert history == n, "a row lost or doubled"
    assert dead == []
    assert_alerts_are_brute_force(alerts, decisions)


async def test_a_kserve_backlog_in_one_partition_is_joined_whole(kafka_bootstrap, tmp_path, compas):
    """The inference logger's CloudEvents, requests and responses interleaved in one
    partition in the order they were logged, an hour of them before the daemon starts."""
    x, y = compas
    n = len(x)
    daemon = Daemon(kafka_bootstrap, tmp_path)
    topic = f"kserve-{daemon.tag}"
    await create_topic(kafka_bootstrap, topic, 1)
    daemon.extra_rules = kserve_rule("iris", topic, "credit")
    asked, answered = hour_of_traffic(n, seed=4)
    ids = [f"c{i:05d}" for i in range(n)]
    logged = []
    for i in range(n):
        request = {"instances": x[i : i + 1].tolist()}
        response = {"predictions": y[i : i + 1].tolist()}
        logged.append((int(asked[i]), cloudevent("request", ids[i], "credit", request)))
        logged.append((int(answered[i]), cloudevent("response", ids[i], "credit", response)))
    logged.sort(key=lambda item: item[0])
    await produce(
        kafka_bootstrap, [(topic, None, value, headers, at) for at, (value, headers) in logged]
    )
    decisions = decisions_in_time(x, y, answered, ids)
    expected = brute_force(decisions, EPS)
    daemon.start()
    try:
        await until_checked(daemon.port, n)
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 0, 5)
        checked, history = await rule_metrics(daemon.port)
    finally:
        daemon.kill()
    assert (checked, history) == (n, n)
    assert dead == []
    assert_alerts_are_brute_force(alerts, decisions)
