"""The two state stores: the local directory and the compacted Kafka topic (real broker).

Both keep snapshots with their offsets and the origin and gap markers, and never hand back a
snapshot past the committed offset. The Kafka store writes a history as a base and segments,
in chunks within the topic's message limit, and deletes the parts no manifest names.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from vigil.connectors.events import Decision, Record
from vigil.connectors.kafka import read_committed
from vigil.daemon.adapters import IorRule, StatePart
from vigil.daemon.config import ConfigError, parse_config
from vigil.daemon.state import FileStore, KafkaStore, StateStore
from vigil.daemon.state.kafka_store import StateTopicError, _topic_configs

TP = ("decisions", 3)
Opener = Callable[..., Awaitable[StateStore]]


@pytest_asyncio.fixture(params=["file", "kafka"], loop_scope="function")
async def open_store(request, tmp_path) -> AsyncIterator[Opener]:
    """Opens a store over one place (a directory, a topic), as a new instance would: with
    nothing in memory."""
    topic = f"state-{uuid.uuid4().hex[:8]}"
    opened: list[StateStore] = []

    async def open_(**options) -> StateStore:
        if request.param == "file":
            store: StateStore = FileStore(tmp_path)
        else:
            bootstrap = request.getfixturevalue("kafka_bootstrap")
            store = KafkaStore(bootstrap, topic, [], **options)
        await store.start()
        opened.append(store)
        await store.open(TP)
        return store

    yield open_
    for store in opened:
        await store.stop()


def _base(blob: bytes) -> StatePart:
    return StatePart(blob)


async def test_a_snapshot_past_the_commit_is_never_restored(open_store):
    store = await open_store()
    await store.save("r", TP, 50, _base(b"50"), committed=50)
    await store.save("r", TP, 100, _base(b"100"), committed=60)  # a job holds the commit
    store = await open_store()
    assert (await store.load("r", TP, at_most=100))[0].parts == [b"100"]
    store = await open_store()
    snapshot, skipped = await store.load("r", TP, at_most=60)
    assert (snapshot.offset, snapshot.parts, skipped) == (50, [b"50"], 0)
    store = await open_store()
    assert await store.load("r", TP, at_most=49) == (None, 0)
    assert await store.load("other", TP) == (None, 0)


async def test_markers_outlive_the_instance(open_store):
    store = await open_store()
    assert (store.origin("r", TP), store.gap("r", TP)) == (0, None)
    await store.mark_origin("r", TP, 7)
    await store.mark_gap("r", TP, 5)
    store = await open_store()
    assert (store.origin("r", TP), store.gap("r", TP)) == (7, 5)
    assert (store.origin("r", ("decisions", 4)), store.origin("s", TP)) == (0, 0)
    await store.clear_gap("r", TP)
    store = await open_store()
    assert (store.origin("r", TP), store.gap("r", TP)) == (7, None)


def test_the_file_store_skips_a_corrupt_file_for_the_one_before(tmp_path):
    async def run():
        store = FileStore(tmp_path, keep=2)
        await store.save("r", TP, 10, _base(b"old"))
        await store.save("r", TP, 20, _base(b"new"))
        newest = max((tmp_path / "r" / "decisions.3").glob("*.snap"))
        newest.write_bytes(newest.read_bytes()[:-1] + b"X")
        snapshot, skipped = await store.load("r", TP)
        assert (snapshot.offset, snapshot.parts, skipped) == (10, [b"old"], 1)
        await store.save("r", TP, 30, _base(b"newer"))
        assert sorted(p.stem for p in (tmp_path / "r" / "decisions.3").glob("*.snap")) == [
            f"{20:020d}",
            f"{30:020d}",
        ]

    asyncio.run(run())


def test_the_file_store_falls_back_to_an_older_file_before_the_commit(tmp_path):
    """Offsets reset back below the newest snapshots: an older one is used, and the newer
    ones are removed so they do not outlive the replay's."""

    async def run():
        store = FileStore(tmp_path, keep=3)
        for offset in (10, 20, 30):
            await store.save("r", TP, offset, _base(str(offset).encode()), committed=offset)
        assert (await store.load("r", TP, at_most=25))[0].parts == [b"20"]
        await store.save("r", TP, 25, _base(b"25"))
        assert (await store.load("r", TP))[0].parts == [b"25"]

    asyncio.run(run())


def test_file_store_pruning_keeps_the_newest_snapshot_the_commit_covers(tmp_path):
    async def run():
        store = FileStore(tmp_path, keep=1)
        await store.save("r", TP, 50, _base(b"50"), committed=50)
        await store.save("r", TP, 100, _base(b"100"), committed=60)
        await store.save("r", TP, 150, _base(b"150"), committed=60)
        assert (await store.load("r", TP, at_most=60))[0].parts == [b"50"]
        await store.save("r", TP, 200, _base(b"200"), committed=200)
        folder = tmp_path / "r" / "decisions.3"
        assert sorted(p.stem for p in folder.glob("*.snap")) == [f"{200:020d}"]

    asyncio.run(run())


# -- the Kafka store ------------------------------------------------------------------


def _rule(**options) -> IorRule:
    config = parse_config(
        {
            "files": {"decisions": "unused", "topic": "decisions"},
            "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
            "rules": [{"name": "r", "kind": "ior", "topic": "decisions", "eps": 0.25, **options}],
        }
    )
    return IorRule(config.rules[0])


def _decisions(rng: np.random.Generator, start: int, n: int) -> list[Decision]:
    x = rng.integers(0, 8, size=(n, 4)) / 8
    y = rng.integers(0, 2, size=n)
    return [
        Decision(
            Record("decisions", 3, start + i, b""),
            f"d{start + i}",
            "m",
            x[i].tolist(),
            int(y[i]),
            {},
        )
        for i in range(n)
    ]


def _state(rule: IorRule) -> tuple:
    monitor = rule.monitors[TP]
    h = monitor.history
    return monitor.evicted, h.x.tolist(), h.y.tolist(), list(h.ids)


def _witnesses(result) -> list[tuple]:
    alerts = [orjson.loads(e.message.value) for e in result.events]
    return [(a["decision"], a["witnesses"]) for a in alerts]


async def _kafka_store(bootstrap: str, topic: str, **options) -> KafkaStore:
    store = KafkaStore(bootstrap, topic, [], **options)
    await store.start()
    await store.open(TP)
    return store


async def _live_keys(bootstrap: str, topic: str) -> dict[tuple, bytes]:
    """The topic's records as compaction will leave them: the last value per key, keys whose
    last value is a tombstone left out."""
    live: dict[tuple, bytes] = {}
    for record in await read_committed(bootstrap, topic):
        key = tuple(orjson.loads(record.key))
        if record.value is None:
            live.pop(key, None)
        else:
            live[key] = record.value
    return live


async def test_kafka_snapshots_are_a_base_then_segments_of_the_new_decisions(kafka_bootstrap):
    """Each snapshot after the base holds only the decisions since the one before; a new
    instance restores base + segments to the very same history, which goes on to find the
    same witnesses as the original."""
    topic = f"state-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(1)
    rule, store = _rule(), await _kafka_store(kafka_bootstrap, topic, chunk_bytes=4096)
    sizes = []
    try:
        position = 0
        for step in range(5):
            await rule.check(TP, _decisions(rng, position, 300), 0)
            position += 300
            part = store.take("r", TP, lambda since: rule.snapshot(TP, since))
            assert part.base is (step == 0)
            assert (part.start, part.stop) == (0 if step == 0 else position - 300, position)
            sizes.append(len(part.blob))
            await store.save("r", TP, position, part, committed=position)
    finally:
        await store.stop()
    assert max(sizes[1:]) < 1.1 * min(sizes[1:]) and sizes[0] > 0.9 * sizes[1]  # 300 each
    live = await _live_keys(kafka_bootstrap, topic)
    assert sum(1 for k in live if k[3] == "part") > 5  # chunked to 4 KiB

    restored, again = _rule(), await _kafka_store(kafka_bootstrap, topic)
    try:
        snapshot, skipped = await again.load("r", TP, at_most=position)
    finally:
        await again.stop()
    assert (snapshot.offset, len(snapshot.parts), skipped) == (position, 5, 0)
    restored.restore(TP, snapshot.parts)
    assert _state(restored) == _state(rule)
    more = _decisions(rng, position, 200)
    a, b = await rule.check(TP, more, 0), await restored.check(TP, more, 0)
    assert a.alerts > 0 and _witnesses(a) == _witnesses(b)


async def test_kafka_store_rebases_and_deletes_the_parts_no_manifest_names(kafka_bootstrap):
    """After ``max_segments`` segments, or a failed write, the next snapshot is a base; the
    parts it replaces (and parts of a write cut short) are deleted with tombstones."""
    topic = f"state-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(2)
    rule, store = _rule(), await _kafka_store(kafka_bootstrap, topic, max_segments=2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    orphan = orjson.dumps(["r", *TP, "part", "0-1-cut", 0])
    await producer.send_and_wait(topic, b"half a write", key=orphan, partition=0)
    await producer.stop()
    await store.open(TP)
    bases = []
    try:
        for step in range(7):
            await rule.check(TP, _decisions(rng, 100 * step, 100), 0)
            if step == 5:
                store.forget("r", TP)  # as the pipeline does after a failed write
            part = store.take("r", TP, lambda since: rule.snapshot(TP, since))
            bases.append(part.base)
            await store.save("r", TP, 100 * (step + 1), part, committed=100 * (step + 1))
    finally:
        await store.stop()
    assert bases == [True, False, False, True, False, True, False]
    live = await _live_keys(kafka_bootstrap, topic)
    manifest = orjson.loads(live[("r", *TP, "latest")])
    assert [p["base"] for p in manifest["parts"]] == [True, False]
    named = {(p["id"], i) for p in manifest["parts"] for i in range(p["chunks"])}
    assert {(k[4], k[5]) for k in live if k[3] == "part"} == named

    again = await _kafka_store(kafka_bootstrap, topic)
    try:
        snapshot, _ = await again.load("r", TP)
    finally:
        await again.stop()
    restored = _rule()
    restored.restore(TP, snapshot.parts)
    assert _state(restored) == _state(rule)


async def test_a_bounded_history_is_rebased_before_its_segments_hold_mostly_evicted_rows(
    kafka_bootstrap,
):
    topic = f"state-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(3)
    rule, store = _rule(history_limit=200), await _kafka_store(kafka_bootstrap, topic)
    bases = []
    try:
        for step in range(12):
            await rule.check(TP, _decisions(rng, 50 * step, 50), 0)
            part = store.take("r", TP, lambda since: rule.snapshot(TP, since))
            bases.append(part.base)
            await store.save("r", TP, 50 * (step + 1), part, committed=50 * (step + 1))
        again = await _kafka_store(kafka_bootstrap, topic)
        snapshot, _ = await again.load("r", TP)
        await again.stop()
    finally:
        await store.stop()
    assert bases[0] and 1 < sum(bases) < len(bases)
    restored = _rule(history_limit=200)
    restored.restore(TP, snapshot.parts)
    assert _state(restored) == _state(rule)
    assert sum(1 for p in snapshot.parts) <= 8


async def test_kafka_store_skips_a_damaged_snapshot_for_the_covered_one(kafka_bootstrap):
    topic = f"state-{uuid.uuid4().hex[:8]}"
    store = await _kafka_store(kafka_bootstrap, topic)
    try:
        await store.save("r", TP, 10, _base(b"ten"), committed=10)
        await store.save("r", TP, 20, _base(b"twenty"), committed=10)
    finally:
        await store.stop()
    live = await _live_keys(kafka_bootstrap, topic)
    latest = orjson.loads(live[("r", *TP, "latest")])["parts"][0]["id"]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    key = orjson.dumps(["r", *TP, "part", latest, 0])
    await producer.send_and_wait(topic, b"twentY", key=key, partition=0)
    await producer.stop()
    again = await _kafka_store(kafka_bootstrap, topic)
    try:
        snapshot, skipped = await again.load("r", TP)
    finally:
        await again.stop()
    assert (snapshot.offset, snapshot.parts, skipped) == (10, [b"ten"], 1)


async def test_kafka_store_creates_its_topic_compacted_with_the_source_partitions(
    kafka_bootstrap,
):
    source, topic = f"src-{uuid.uuid4().hex[:8]}", f"state-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(source, 4, 1)])
        store = KafkaStore(kafka_bootstrap, topic, [source])
        await store.start()
        await store.stop()
        assert store.partitions == 4
        assert (await _topic_configs(admin, topic))["cleanup.policy"] == "compact"
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("configs", "chunk_bytes", "message"),
    [
        ({"cleanup.policy": "delete"}, 4096, r"cleanup\.policy='delete'; it must be 'compact'"),
        ({"cleanup.policy": "compact,delete"}, 4096, r"must be 'compact' alone"),
        (
            {"cleanup.policy": "compact", "max.message.bytes": "3000"},
            4096,
            r"at most 3000 bytes \(max\.message\.bytes\); set \[state\] chunk_bytes to 1976",
        ),
    ],
)
async def test_a_state_topic_that_would_lose_or_refuse_snapshots_is_refused(
    kafka_bootstrap, configs, chunk_bytes, message
):
    topic = f"state-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
    finally:
        await admin.close()
    store = KafkaStore(kafka_bootstrap, topic, [], chunk_bytes=chunk_bytes)
    with pytest.raises(StateTopicError, match=message) as caught:
        await store.start()
    assert topic in str(caught.value)


KAFKA = {"kafka": {"bootstrap_servers": "b:9092", "group_id": "fraud"}}
FILES = {
    "files": {"decisions": "d.jsonl", "topic": "decisions"},
    "outputs": {"alerts_file": "a", "dead_letter_file": "d"},
}
RULES = {"rules": [{"name": "r", "kind": "ior", "topic": "decisions", "eps": 0.1}]}


def test_the_state_topic_defaults_to_one_per_group():
    config = parse_config({**KAFKA, **RULES, "state": {"store": "kafka"}})
    assert config.state.topic_for(config.kafka.group_id) == "fraud-state"
    named = parse_config({**KAFKA, **RULES, "state": {"store": "kafka", "topic": "s"}})
    assert named.state.topic_for("fraud") == "s"
    assert parse_config({**KAFKA, **RULES}).state.store == "file"


@pytest.mark.parametrize(
    ("source", "state", "message"),
    [
        (FILES, {"store": "kafka"}, r'state\.store = "kafka" needs the \[kafka\] source'),
        (KAFKA, {"topic": "s"}, r'state\.topic is only used with state\.store = "kafka"'),
        (KAFKA, {"store": "s3"}, r"state\.store\n?.*'file' or 'kafka'"),
        (KAFKA, {"store": "kafka", "chunk_bytes": 100}, r"state\.chunk_bytes\n?.*1024"),
        (KAFKA, {"store": "kafka", "max_segments": -1}, r"state\.max_segments"),
    ],
)
def test_state_store_settings_are_checked(source, state, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**source, **RULES, "state": state})
