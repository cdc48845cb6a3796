"""When the broker goes away: the daemon stops when told, tells each outage once, reports it
in /readyz and its metrics, and loses and duplicates nothing.

These tests pause, stop and restart a broker, so they run one of their own (the dev
script's, on free ports and a run dir of their own) and leave the suite's broker alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.daemon_harness import (
    Daemon,
    consume_all,
    decision_events,
    expected_alerts,
    free_port,
    metric_samples,
    produce,
    wait_http,
    witness_map,
)

DEV_KAFKA = Path(__file__).resolve().parents[1] / "ops/kafka/dev-kafka.sh"


class Broker:
    """A dev broker of the tests' own, driven through the dev script."""

    def __init__(self, run_dir: Path) -> None:
        self.port = free_port()
        self.env = {
            **os.environ,
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_SASL_SSL_PORT": str(free_port()),
            "KAFKA_SSL_PORT": str(free_port()),
            "VIGIL_KAFKA_RUN": str(run_dir),
            "KAFKA_HEAP_OPTS": "-Xms256m -Xmx512m",
        }
        self.bootstrap = f"127.0.0.1:{self.port}"

    def __call__(self, command: str) -> None:
        subprocess.run(
            ["bash", str(DEV_KAFKA), command], env=self.env, check=True, capture_output=True
        )

    async def do(self, command: str) -> None:
        await asyncio.to_thread(self, command)


@pytest.fixture(scope="module")
def broker(kafka_bootstrap, tmp_path_factory):
    """Needs what `make test` needs (Java; the suite's broker shows it is there)."""
    if shutil.which("java") is None:
        pytest.skip("java not on PATH: the outage tests start a broker of their own")
    b = Broker(tmp_path_factory.mktemp("outage-broker") / "run")
    b("start")
    try:
        yield b
    finally:
        b("stop")


def lines(daemon: Daemon) -> list[dict]:
    return [orjson.loads(line) for line in daemon.log_text().splitlines() if line.strip()]


def metric(body: str, name: str) -> float:
    return next(s.value for s in metric_samples(body) if s.name == name)


async def http_status(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    head = await reader.read()
    writer.close()
    return int(head.split()[1])


async def stop_within(daemon: Daemon, deadline: float) -> tuple[int, float]:
    """SIGTERM, then the exit status and how long the process took to end."""
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    code = await asyncio.to_thread(daemon.wait, deadline + 10)
    return code, time.monotonic() - started


async def test_sigterm_during_start_up_with_no_broker_ends_within_the_deadline(tmp_path):
    daemon = Daemon(f"127.0.0.1:{free_port()}", tmp_path)  # nothing listens there
    daemon.start(create_topics=False)
    try:
        await wait_http(daemon.port, "/healthz")
        await asyncio.sleep(2)  # waiting for the broker by now
        assert await http_status(daemon.port, "/readyz") == 503
        code, took = await stop_within(daemon, 20)
    finally:
        daemon.kill()
    log = daemon.log_text()
    assert took < 20, f"took {took:.1f} s"
    assert code == 3, log  # stopped, but the broker never answered
    events = [e["event"] for e in lines(daemon)]
    assert events == ["broker_unreachable", "stopping", "shutdown_deadline_exceeded"], log
    assert lines(daemon)[-1]["pending"] == ["the broker never answered"]
    assert "Traceback" not in log


async def test_sigterm_during_an_outage_ends_within_the_deadline(broker, tmp_path, compas):
    x, y = compas
    daemon = Daemon(broker.bootstrap, tmp_path)
    daemon.start()
    try:
        await produce(broker.bootstrap, daemon.topic, decision_events(x[:500], y[:500], "compas"))
        await wait_http(daemon.port, "/readyz")
        await consume_all(broker.bootstrap, daemon.alerts_topic, 1, 60, settle=0.5)
        await broker.do("stop")
        await asyncio.sleep(3)
        code, took = await stop_within(daemon, 20)
    finally:
        daemon.kill()
        await broker.do("restart")
    log = daemon.log_text()
    assert took < 20, f"took {took:.1f} s"
    assert code in (0, 3), log  # 3: a client's goodbye went unanswered (docs/operations.md)
    assert "Traceback" not in log
    assert '"stopping"' in log and ('"stopped"' in log or '"shutdown_deadline_exceeded"' in log)


MODELS = ("compas", "m1")
"""Model k goes to partition k; "compas" is the harness's own rule."""
RULES = """
[[rules]]
name = "m1-fairness"
kind = "ior"
topic = "decisions-{tag}"
model = "m1"
metric = "linf"
eps = 0.04
backend = "auto"
"""
SLICE = 300


async def test_pauses_restarts_and_kills_keep_alerts_exactly_once(broker, tmp_path, compas):
    """Two exactly-once instances with the Kafka state store; while a stream arrives in
    slices the broker is paused for 15 s, then stopped and restarted on its own data after
    30 s, and the instances are SIGKILLed (once while the broker is away): the committed
    alerts equal the offline monitor's, none twice, and both instances run at the end. The
    instance that ran through the 30 s outage wrote at most 10 lines for it, answered not
    ready and vigil_broker_up 0 during it, and ready and 1 after it."""
    x, y = compas
    streams: list[list[bytes]] = []
    expected: dict[str, list[str]] = {}
    for k, m in enumerate(MODELS):
        xs, ys = np.roll(x, -1000 * k, axis=0)[:3000], np.roll(y, -1000 * k)[:3000]
        streams.append(decision_events(xs, ys, m, f"{m}-"))
        expected |= expected_alerts(xs, ys, 0.04, prefix=f"{m}-")
    tag = Daemon(broker.bootstrap, tmp_path).tag
    instances: dict[str, Daemon] = {}

    def start(name: str) -> None:
        """A fresh process of instance ``name`` (same state dir and client id)."""
        (tmp_path / name).mkdir(exist_ok=True)
        instances[name] = d = Daemon(
            broker.bootstrap,
            tmp_path / name,
            tag=tag,
            client_id=name,
            partitions=len(MODELS),
            snapshot_every_events=200,
            extra_rules=RULES,
            state_settings='store = "kafka"',
            port=instances[name].port if name in instances else free_port(),
        )
        d.start(create_topics=name == "a" and len(instances) == 1)

    def send(first: int, last: int, pace: float = 0.05) -> asyncio.Future:
        return asyncio.gather(
            *(
                produce(
                    broker.bootstrap,
                    f"decisions-{tag}",
                    streams[k][first * SLICE : last * SLICE],
                    key=m.encode(),
                    pace=pace,
                    partition=k,
                )
                for k, m in enumerate(MODELS)
            )
        )

    try:
        start("a")
        start("b")
        await send(0, 2)
        for d in instances.values():
            await wait_http(d.port, "/readyz", timeout=90)

        producing = asyncio.ensure_future(send(2, 4, pace=0.2))  # 15 pairs of groups: ~3 s
        await asyncio.sleep(1)
        await broker.do("pause")
        await asyncio.sleep(5)
        instances["a"].kill()  # dies while the broker is frozen
        start("a")
        await asyncio.sleep(10)
        await broker.do("resume")
        await producing

        await send(4, 6)
        a = instances["a"]
        before = len(lines(a))
        await broker.do("stop")
        instances["b"].kill()  # dies while the broker is away, comes back meanwhile
        start("b")
        outage_began, seen = time.monotonic(), set()
        while time.monotonic() - outage_began < 30:
            body = await wait_http(a.port, "/metrics")
            seen.add((await http_status(a.port, "/readyz"), metric(body, "vigil_broker_up")))
            await asyncio.sleep(1)
        await broker.do("restart")
        await wait_http(a.port, "/readyz", timeout=90)
        body = await wait_http(a.port, "/metrics")

        producing = asyncio.ensure_future(send(6, 10, pace=0.1))
        await asyncio.sleep(2)
        instances["a"].kill()  # dies mid-stream once more
        start("a")
        await producing
        alerts = await consume_all(
            broker.bootstrap, instances["a"].alerts_topic, len(expected), 240, settle=5
        )
        running = {name: d.running() for name, d in instances.items()}
        after = lines(a)[before:]
    finally:
        for d in instances.values():
            d.kill()
    ids = [a["decision"]["id"] for a in alerts]
    assert len(ids) == len(set(ids)), "an alert was duplicated"
    assert witness_map(alerts) == expected, "an alert was lost or differs"
    tails = {name: d.log_text()[-2000:] for name, d in instances.items()}
    assert running == {"a": True, "b": True}, tails
    # the 30 s outage as instance "a" told it: two lines of its own, the client's held back
    # (at most 10 lines from the outage's start to its end), not ready meanwhile, then ready
    told = [e["event"] for e in after if e.get("logger") is None]
    assert told.count("broker_unreachable") == 1 and told.count("broker_reachable") == 1, told
    end = next(i for i, e in enumerate(after) if e["event"] == "broker_reachable")
    assert end < 10, "\n".join(map(str, after[: end + 1]))
    assert after[end]["outage_seconds"] >= 30 and after[end]["client_lines_suppressed"] > 0
    assert (503, 0.0) in seen, seen  # not ready once the grace (10 s) had passed
    assert metric(body, "vigil_broker_up") == 1
    assert metric(body, "vigil_broker_unreachable_seconds_total") >= 30
