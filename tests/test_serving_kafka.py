"""Rules on a serving stack's own traffic, with the real broker: Seldon Core 2 model topics
and a KServe inference-logger topic, written as those stacks write them."""

from __future__ import annotations

import asyncio
import signal
import struct
import time

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.daemon_harness import (
    Daemon,
    consume_all,
    create_topic,
    metric_samples,
    wait_http,
    witness_map,
)
from vigil.connectors.events import Record
from vigil.connectors.serving import grpc_predict_v2_pb2 as pb
from vigil.daemon.forwarded import unpack
from vigil.rules.ior import Monitor, MonitorSpec

PARTITIONS = 3


def seldon_rule(tag: str, extra: str = "", timeout: float = 3600) -> str:
    return f"""
[[rules]]
name = "iris"
kind = "ior"
format = "seldon"
seldon_namespace = "{tag}"
model = "iris"
metric = "linf"
eps = 0.04
join_timeout_seconds = {timeout}
{extra}
"""


def topics(tag: str) -> tuple[str, str]:
    return f"seldon.{tag}.model.iris.inputs", f"seldon.{tag}.model.iris.outputs"


def request_bytes(x: np.ndarray) -> bytes:
    message = pb.ModelInferRequest()
    message.inputs.add(name="predict", datatype="FP64", shape=list(x.shape))
    message.raw_input_contents.append(np.ascontiguousarray(x, "<f8").tobytes())
    return message.SerializeToString()


def response_bytes(y: np.ndarray) -> bytes:
    message = pb.ModelInferResponse(model_name="iris")
    out = message.outputs.add(name="predict", datatype="INT64", shape=[len(y), 1])
    out.contents.int64_contents.extend(int(v) for v in y)
    return message.SerializeToString()


def requests_of(x: np.ndarray, y: np.ndarray, sizes: list[int]) -> list[tuple[str, int, slice]]:
    """(request id, partition, rows) of consecutive requests of the given sizes."""
    out, at = [], 0
    for i, size in enumerate(sizes):
        if at >= len(x):
            break
        out.append((f"req{i:05d}", i % PARTITIONS, slice(at, min(at + size, len(x)))))
        at += size
    return out


async def send_seldon(bootstrap: str, tag: str, x, y, batch, side: str, pace: float = 0.0):
    """The model gateway's records of ``batch``: requests on inputs, responses on outputs,
    keyed ``<partition>.<model>.<request id>``, on that partition."""
    inputs, outputs = topics(tag)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for n, (request_id, partition, rows) in enumerate(batch):
            key = f"{partition}.iris.{request_id}".encode()
            headers = [("pipeline", b"iris"), ("x-request-id", request_id.encode())]
            if side == "request":
                value, topic = request_bytes(x[rows]), inputs
            else:
                value, topic = response_bytes(y[rows]), outputs
            await producer.send(topic, value, key=key, partition=partition, headers=headers)
            if pace and n % 10 == 9:
                await producer.flush()
                await asyncio.sleep(pace)
        await producer.flush()
    finally:
        await producer.stop()


async def joined(
    bootstrap: str, topic: str, rows: dict[str, tuple[np.ndarray, np.ndarray]], timeout=120
) -> list[dict]:
    """The decisions the daemon's join makes of its join topic, by an oracle: each request
    paired with its response when the later of the two comes in the topic's (committed)
    order, its rows those the test sent (``rows``: request id -> x, y), without timeouts.
    Asserts that the topic holds each side of each request once: nothing was lost or
    forwarded twice."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    sides: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(sides) < 2 * len(rows):
            for records in (await consumer.getmany(timeout_ms=300)).values():
                sides += [_side(Record(*f)) for r in records for f in unpack(r.value)]
        await asyncio.sleep(2)  # anything more (a duplicate) would arrive now
        for records in (await consumer.getmany(timeout_ms=500)).values():
            sides += [_side(Record(*f)) for r in records for f in unpack(r.value)]
    finally:
        await consumer.stop()
    assert sorted(sides) == sorted((i, side) for i in rows for side in ("request", "response"))
    waiting: set[str] = set()
    out = []
    for ident, _ in sides:
        if ident not in waiting:
            waiting.add(ident)
            continue
        x, y = rows[ident]
        out += [{"id": f"{ident}/{i}", "x": x[i].tolist(), "y": int(y[i])} for i in range(len(x))]
    return out


def _side(forwarded: Record) -> tuple[str, str]:
    """(request id, request or response) of a forwarded record, from the serving stack's
    headers and topic: Seldon's x-request-id and inputs or outputs, KServe's event id and
    type."""
    h = {name: value.decode() for name, value in forwarded.headers}
    if "ce_id" in h:
        return h["ce_id"], h["ce_type"].rpartition(".")[2]
    return h["x-request-id"], "request" if forwarded.topic.endswith(".inputs") else "response"


async def checked(port: int, at_least: int, timeout: float = 60) -> list:
    """The /metrics samples once rule "iris" has checked ``at_least`` decisions."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metric_samples(await wait_http(port, "/metrics"))
        done = sum(
            s.value
            for s in samples
            if s.name == "vigil_events_total" and s.labels == {"rule": "iris", "outcome": "checked"}
        )
        if done >= at_least or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.2)


def offline(decisions: list[dict], eps: float) -> dict[str, list[str]]:
    """The monitor over the decisions in their topic's order: decision id -> witness ids."""
    x = np.array([d["x"] for d in decisions])
    y = np.array([d["y"] for d in decisions])
    ids = [d["id"] for d in decisions]
    monitor = Monitor(MonitorSpec(dim=x.shape[1], eps=eps))
    w = monitor.check_batch(x, y, ids)
    return {ids[i]: monitor.ids(w.of(int(i))[0]) for i in w.flagged}


def brute_force(decisions: list[dict], eps: float) -> dict[str, set[str]]:
    """Every earlier decision within eps (L-inf, closed) with another label."""
    out: dict[str, set[str]] = {}
    for i, d in enumerate(decisions):
        xi = np.array(d["x"])
        found = {
            e["id"]
            for e in decisions[:i]
            if e["y"] != d["y"] and np.max(np.abs(np.array(e["x"]) - xi)) <= eps
        }
        if found:
            out[d["id"]] = found
    return out


async def test_seldon_traffic_is_checked_exactly_once_through_a_kill_between_request_and_response(
    kafka_bootstrap, tmp_path, compas
):
    x, y = compas
    x, y = x[:1200], y[:1200]
    tag = Daemon(kafka_bootstrap, tmp_path).tag
    for topic in topics(tag):
        await create_topic(kafka_bootstrap, topic, PARTITIONS)
    rng = np.random.default_rng(7)
    batch = requests_of(x, y, [int(s) for s in rng.choice([1, 1, 2, 3, 32], size=len(x))])
    half = len(batch) // 2
    instances: dict[str, Daemon] = {}

    def start(name: str) -> Daemon:
        (tmp_path / name).mkdir(exist_ok=True)
        d = Daemon(
            kafka_bootstrap,
            tmp_path / name,
            tag=tag,
            client_id=name,
            snapshot_every_events=100,
            extra_rules=seldon_rule(tag),
            state_settings='store = "kafka"',
        )
        d.start(create_topics=not instances)
        instances[name] = d
        return d

    join_topic = f"vigil-{tag}.iris.join"
    try:
        a, b = start("a"), start("b")
        await send_seldon(kafka_bootstrap, tag, x, y, batch[:half], "request")
        await send_seldon(kafka_bootstrap, tag, x, y, batch[: half // 2], "response")
        for d in (a, b):
            await wait_http(d.port, "/readyz", timeout=90)
        await asyncio.sleep(3)  # the joins hold the other half of the requests now
        a.kill()  # between requests and their responses
        start("a")
        await send_seldon(kafka_bootstrap, tag, x, y, batch[half // 2 : half], "response", 0.05)
        await send_seldon(kafka_bootstrap, tag, x, y, batch[half:], "request")
        b.signal(signal.SIGKILL)  # the other instance too, its join mid-stream
        b.wait(30)
        start("b")
        await send_seldon(kafka_bootstrap, tag, x, y, batch[half:], "response", 0.05)
        sent = {r: (x[rows], y[rows]) for r, _, rows in batch}
        decisions = await joined(kafka_bootstrap, join_topic, sent)
        expected = offline(decisions, 0.04)
        alerts = await consume_all(kafka_bootstrap, a.alerts_topic, len(expected), 120)
        running = [d.running() for d in instances.values()]
        deadline = time.monotonic() + 30
        while True:  # the decisions after the last alert may still be in their batch
            histories = [
                s.value
                for d in instances.values()
                for s in metric_samples(await wait_http(d.port, "/metrics"))
                if s.name == "vigil_history_size" and s.labels["rule"] == "iris"
            ]
            if histories == [len(x)] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        for d in instances.values():
            d.kill()
    assert histories == [len(x)], "the checker lost or doubled a decision"
    alert_ids = [a["decision"]["id"] for a in alerts if a["rule"] == "iris"]
    assert len(alert_ids) == len(set(alert_ids)), "an alert was duplicated"
    got = witness_map([a for a in alerts if a["rule"] == "iris"])
    assert got == expected
    assert {k: set(v) for k, v in got.items()} == brute_force(decisions, 0.04)
    assert all(running)


def struct_bytes(values: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v.encode() for v in values)


def kserve_rule(name: str, topic: str, service: str, extra: str = "") -> str:
    return f"""
[[rules]]
name = "{name}"
kind = "ior"
format = "kserve"
topic = "{topic}"
model = "{service}"
metric = "linf"
eps = 0.04
{extra}
"""


def cloudevent(kind: str, event_id: str, service: str, body: dict) -> tuple[bytes, list]:
    """A KafkaSink record in binary mode: the HTTP body, ce_* headers, no key."""
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode()),
        ("ce_source", f"http://{service}-predictor/".encode()),
        ("ce_type", f"org.kubeflow.serving.inference.{kind}".encode()),
        ("content-type", b"application/json"),
        ("ce_inferenceservicename", service.encode()),
        ("ce_namespace", b"default"),
        ("ce_component", b"predictor"),
    ]
    return orjson.dumps(body), headers


async def test_a_kserve_topic_mixing_two_inference_services(kafka_bootstrap, tmp_path, compas):
    """Service "credit" logs OIP JSON, service "risk" KServe v1, on one topic of three
    partitions (no key: a request and its response land anywhere); each rule checks its
    own service's decisions."""
    x, y = compas
    x, y = x[:600], y[:600]
    daemon = Daemon(kafka_bootstrap, tmp_path)
    topic = f"kserve-{daemon.tag}"
    await create_topic(kafka_bootstrap, topic, PARTITIONS)
    daemon.extra_rules = kserve_rule("credit", topic, "credit") + kserve_rule("risk", topic, "risk")
    records = []
    for i in range(0, len(x), 3):
        rows = slice(i, i + 3)
        oip_request = {
            "inputs": [
                {"name": "input-0", "shape": [3, 14], "datatype": "FP64", "data": x[rows].tolist()}
            ]
        }
        oip_response = {
            "model_name": "credit",
            "id": f"other-{i}",
            "outputs": [
                {"name": "output-0", "shape": [3], "datatype": "INT64", "data": y[rows].tolist()}
            ],
        }
        records.append(cloudevent("request", f"c{i}", "credit", oip_request))
        records.append(cloudevent("request", f"r{i}", "risk", {"instances": x[rows].tolist()}))
        records.append(cloudevent("response", f"c{i}", "credit", oip_response))
        records.append(cloudevent("response", f"r{i}", "risk", {"predictions": y[rows].tolist()}))
    daemon.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for n, (value, headers) in enumerate(records):
                await producer.send(topic, value, headers=headers, partition=n % PARTITIONS)
            await producer.flush()
        finally:
            await producer.stop()
        decisions = {}
        for name, prefix in (("credit", "c"), ("risk", "r")):
            sent = {f"{prefix}{i}": (x[i : i + 3], y[i : i + 3]) for i in range(0, len(x), 3)}
            join_topic = f"vigil-{daemon.tag}.{name}.join"
            decisions[name] = await joined(kafka_bootstrap, join_topic, sent)
        expected = {name: offline(ds, 0.04) for name, ds in decisions.items()}
        total = sum(map(len, expected.values()))
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, total, 120)
    finally:
        daemon.kill()
    for name in ("credit", "risk"):
        mine = [a for a in alerts if a["rule"] == name]
        assert witness_map(mine) == expected[name]
        assert all(a["model"] == name for a in mine)


async def test_bad_serving_traffic_goes_to_dead_letters_and_the_rest_is_checked(
    kafka_bootstrap, tmp_path, compas
):
    x, y = compas
    daemon = Daemon(kafka_bootstrap, tmp_path)
    tag = daemon.tag
    inputs, outputs = topics(tag)
    for topic in (inputs, outputs):
        await create_topic(kafka_bootstrap, topic, 1)
    daemon.extra_rules = seldon_rule(tag, 'input_tensor = "predict"', timeout=5)
    now = int(time.time() * 1000)
    strings = pb.ModelInferRequest()
    strings.inputs.add(name="predict", datatype="BYTES", shape=[1, 1])
    strings.raw_input_contents.append(struct_bytes(["high"]))
    other = pb.ModelInferRequest()
    other.inputs.add(name="features", datatype="FP64", shape=[1, 14])
    other.raw_input_contents.append(x[0].astype("<f8").tobytes())
    sent = [  # (topic, request id, value, timestamp)
        (inputs, "lonely", request_bytes(x[:1]), now - 60_000),  # never answered
        (inputs, "good1", request_bytes(x[:40]), now),
        (outputs, "good1", response_bytes(y[:40]), now),
        (inputs, "rows", request_bytes(x[:3]), now),
        (outputs, "rows", response_bytes(y[:2]), now),  # 2 rows for 3
        (inputs, "named", other.SerializeToString(), now),
        (outputs, "named", response_bytes(y[:1]), now),
        (inputs, "cut", request_bytes(x[:5])[:-7], now),  # truncated protobuf
        (outputs, "cut", response_bytes(y[:5]), now),  # its response then waits in vain
        (inputs, "text", strings.SerializeToString(), now),
        (outputs, "text", response_bytes(y[:1]), now),
        (inputs, "good2", request_bytes(x[40:80]), now + 10_000),  # stream time moves on
        (outputs, "good2", response_bytes(y[40:80]), now + 10_000),
    ]
    daemon.start()
    try:
        await wait_http(daemon.port, "/readyz")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for n, (topic, request_id, value, at) in enumerate(sent):
                if n == len(sent) - 2:  # once the others are joined: stream time moves on
                    await producer.flush()
                    await checked(daemon.port, 40)
                key = f"0.iris.{request_id}".encode()
                await producer.send(topic, value, key=key, timestamp_ms=at)
            await producer.flush()
        finally:
            await producer.stop()
        dead = await consume_all(kafka_bootstrap, daemon.dead_topic, 6, 60)
        samples = await checked(daemon.port, 80)
        body = await wait_http(daemon.port, "/metrics")
        assert daemon.running()
    finally:
        daemon.kill()
    history = [s.value for s in samples if s.name == "vigil_history_size"]
    assert history == [80], "the rows of good1 and good2, and no other"
    letters = sorted((d["reason"], d["source"]["topic"], d["error"]) for d in dead)
    reasons = [(reason, topic) for reason, topic, _ in letters]
    assert reasons == [
        ("category", inputs),
        ("schema", inputs),
        ("schema", inputs),
        ("undecodable", inputs),
        ("unmatched", inputs),
        ("unmatched", outputs),
    ], letters
    errors = " | ".join(error for _, _, error in letters)
    for fragment in (
        "'predict' holds strings",
        "2 rows for a request of 3",
        "no input tensor 'predict' (tensors: 'features')",
        "unmatched request 'lonely'",
        "unmatched response 'cut'",
    ):
        assert fragment in errors, errors
    assert 'vigil_serving_unmatched_total{rule="iris",side="request",why="timeout"} 1.0' in body


async def test_a_reach_rule_on_seldon_traffic_verifies_the_inputs_the_model_saw(
    kafka_bootstrap, tmp_path
):
    """The reach rule's window is the inputs of the Seldon requests (rows of 4-row requests):
    the box it verifies is theirs, with the verdict the MILP oracle gives for it."""
    from tests.test_daemon_reach import EPS, networks

    v1, _, spec = networks()
    (tmp_path / "model.onnx").write_bytes(v1.to_onnx())
    daemon = Daemon(kafka_bootstrap, tmp_path)
    tag = daemon.tag
    for topic in topics(tag):
        await create_topic(kafka_bootstrap, topic, 1)
    daemon.extra_rules = f"""
[[rules]]
name = "reach"
kind = "reach"
format = "seldon"
seldon_namespace = "{tag}"
model = "iris"
onnx = "model.onnx"
window = 200
eps = {EPS}
C = {spec.C.tolist()}
d = {spec.d.tolist()}
max_branches = 512
accelerations = "bmi+lb+bmw+ic"
"""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.8, size=(60, 3))
    x[0], x[1] = 0.1, 0.9  # the window's box is [0.1, 0.9]^3
    y = np.zeros(60, dtype=np.int64)
    batch = [(f"q{i}", 0, slice(4 * i, 4 * i + 4)) for i in range(15)]
    daemon.start()
    try:
        await send_seldon(kafka_bootstrap, tag, x, y, batch, "request")
        await send_seldon(kafka_bootstrap, tag, x, y, batch, "response")
        events = await consume_all(kafka_bootstrap, daemon.verifications_topic, 1, 90, settle=2.0)
    finally:
        daemon.kill()
    last = events[-1]
    assert last["model"] == "iris" and last["decisions"] == 60, last
    np.testing.assert_allclose(last["input_set"]["lower"], np.full(3, 0.1 - EPS))
    np.testing.assert_allclose(last["input_set"]["upper"], np.full(3, 0.9 + EPS))
    assert last["status"] == "holds"  # the spec holds on [-EPS, 1 + EPS]^3, a larger box
