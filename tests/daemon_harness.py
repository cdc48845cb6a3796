"""Running the real daemon (`vigil run`) against the dev broker, and reading its output."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from vigil.rules.ior import Monitor, MonitorSpec

KNN_RULE = """
[[rules]]
name = "knn-fairness"
kind = "certify"
job = "knn"
topic = "knn-{tag}"
"""
"""A certify rule (KNN fairness) reading requests from knn-<tag>; for ``Daemon.extra_rules``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decision_events(x: np.ndarray, y: np.ndarray, model: str, prefix: str = "d") -> list[bytes]:
    """Decision events with ids ``<prefix><row>``."""
    return [
        orjson.dumps({"id": f"{prefix}{i}", "model": model, "x": x[i].tolist(), "y": int(y[i])})
        for i in range(len(x))
    ]


def witness_map(alerts: list[dict]) -> dict[str, list[str]]:
    """Decision id -> witness ids of alert events."""
    return {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}


def expected_alerts(
    x: np.ndarray, y: np.ndarray, eps: float, first: int = 0, prefix: str = "d"
) -> dict[str, list[str]]:
    """Offline result: decision id -> witness ids (what `vigil replay` computes), for the
    stream of decisions ``first`` and after (ids as ``decision_events`` makes them)."""
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=eps))
    w = monitor.check_batch(x[first:], y[first:], [f"{prefix}{i}" for i in range(first, len(x))])
    return {f"{prefix}{first + i}": monitor.ids(w.of(int(i))[0]) for i in w.flagged}


@dataclass
class Daemon:
    """A `vigil run` subprocess with its own topics, group and state directory."""

    bootstrap: str
    workdir: Path
    exactly_once: bool = True
    eps: float = 0.04
    snapshot_every_events: int = 100_000
    extra_rules: str = ""  # more [[rules]] (TOML), with {tag} standing for this run's tag
    offload_workers: int = 2
    auto_offset_reset: str = "earliest"
    listener: str | None = None  # the daemon's bootstrap address, if not ``bootstrap``
    kafka_settings: str = ""  # more [kafka] keys (TOML): TLS and SASL
    client_id: str = "vigil"  # distinct per instance of one group on this host (exactly-once)
    state_settings: str = ""  # more [state] keys (TOML), e.g. the snapshot store
    partitions: int = 1  # of the decisions topic, when this run creates it
    log_level: str = "info"
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    proc: subprocess.Popen | None = None
    port: int = field(default_factory=free_port)

    @property
    def topic(self) -> str:
        return f"decisions-{self.tag}"

    @property
    def alerts_topic(self) -> str:
        return f"alerts-{self.tag}"

    @property
    def dead_topic(self) -> str:
        return f"dead-{self.tag}"

    @property
    def verifications_topic(self) -> str:
        return f"verifications-{self.tag}"

    @property
    def certifications_topic(self) -> str:
        return f"certifications-{self.tag}"

    def topic_for(self, name: str) -> str:
        return f"{name}-{self.tag}"

    def write_config(self) -> Path:
        path = self.workdir / "vigil.toml"
        path.write_text(f"""
[kafka]
bootstrap_servers = "{self.listener or self.bootstrap}"
{self.kafka_settings}
group_id = "vigil-{self.tag}"
client_id = "{self.client_id}"
exactly_once = {str(self.exactly_once).lower()}
fetch_timeout_ms = 100
session_timeout_ms = 6000
auto_offset_reset = "{self.auto_offset_reset}"

[outputs]
alerts_topic = "{self.alerts_topic}"
dead_letter_topic = "{self.dead_topic}"
verifications_topic = "{self.verifications_topic}"
certifications_topic = "{self.certifications_topic}"

[offload]
workers = {self.offload_workers}
timeout_seconds = 120

[metrics]
port = {self.port}

[state]
dir = "state"
snapshot_every_events = {self.snapshot_every_events}
snapshot_every_seconds = 3600
{self.state_settings}

[shutdown]
deadline_seconds = 20

[logging]
format = "json"
level = "{self.log_level}"

{self.rules_toml()}""")
        return path

    def rules_toml(self) -> str:
        """The config's [[rules]]: the compas i.o.r. rule and ``extra_rules``."""
        return f"""
[[rules]]
name = "compas-fairness"
kind = "ior"
topic = "{self.topic}"
model = "compas"
metric = "linf"
eps = {self.eps}
backend = "auto"
{self.extra_rules.replace("{tag}", self.tag)}
"""

    def held_partitions(self) -> set[int]:
        """The partitions held now, as the log's assignment and revocation lines say."""
        held: set[int] = set()
        for line in self.log_text().splitlines():
            if '"partition_assigned"' not in line and '"partition_revoked"' not in line:
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:  # a line still being written
                continue
            if entry["event"] == "partition_assigned":
                held.add(entry["partition"])
            else:
                held.discard(entry["partition"])
        return held

    def create_topics(self) -> None:
        """Create every topic of this run up front: a send to a topic the broker is still
        auto-creating can fail (NotLeaderForPartition), and the daemon then exits by design."""
        names = [
            self.topic,
            self.alerts_topic,
            self.dead_topic,
            self.verifications_topic,
            self.certifications_topic,
            self.topic_for("knn"),
            self.topic_for("models"),
        ]

        async def create() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                existing = set(await admin.list_topics())
                new = [
                    NewTopic(n, self.partitions if n == self.topic else 1, 1)
                    for n in names
                    if n not in existing
                ]
                if new:
                    await admin.create_topics(new)
            finally:
                await admin.close()

        worker = threading.Thread(target=lambda: asyncio.run(create()))
        worker.start()
        worker.join()

    def start(self, create_topics: bool = True) -> None:
        if create_topics:
            self.create_topics()
        config = self.write_config()
        self.log = open(self.workdir / "daemon.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vigil.daemon.cli", "run", "--config", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.log.close()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")


def metric_samples(body: str) -> list[Sample]:
    """Every sample of a /metrics page."""
    return [s for family in text_string_to_metric_families(body) for s in family.samples]


async def create_topic(
    bootstrap: str, topic: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> None:
    """Create ``topic`` (replication factor 1, the dev broker's) with topic ``configs``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs or {})])
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    key: bytes = b"compas",
    pace: float = 0.0,
    partition: int | None = None,
) -> None:
    """Send values in order (to ``partition``, or where the key hashes); with ``pace``, in
    groups of 20 with that many seconds between."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for i, v in enumerate(values):
            await producer.send(topic, v, key=key, partition=partition)
            if pace and i % 20 == 19:
                await producer.flush()
                await asyncio.sleep(pace)
        await producer.flush()
    finally:
        await producer.stop()


async def consume_all(
    bootstrap: str, topic: str, expect: int, timeout: float, settle: float = 2.0
) -> list[dict]:
    """Read committed records until ``expect`` arrived and nothing more came for ``settle``
    seconds (so duplicates would be seen), or until ``timeout``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            got = [orjson.loads(r.value) for rs in batches.values() for r in rs]
            if got:
                out += got
                quiet_since = time.monotonic()
            elif len(out) >= expect and time.monotonic() - quiet_since >= settle:
                break
    finally:
        await consumer.stop()
    return out


async def wait_http(port: int, path: str, status: int = 200, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            data = await reader.read()
            writer.close()
            head, _, body = data.partition(b"\r\n\r\n")
            last = int(head.split()[1])
            if last == status:
                return body.decode()
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{path} did not answer {status} within {timeout}s (last: {last})")
