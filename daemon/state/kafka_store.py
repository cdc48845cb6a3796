"""Snapshots in a compacted Kafka topic, so a partition's state moves with the partition.

Whichever instance is assigned source partition ``p`` restores its rules' state from state
partition ``p mod <state partitions>``, then replays only the records after the snapshot.
A history only grows, so a snapshot is written as a *segment*, the decisions added since the
previous one, after a *base*: its cost follows the new decisions, not the history. Every
record's key is a JSON array ``[rule, topic, partition, kind, ...]``:

- ``["part", id, i]``: chunk ``i`` of one part (a base or a segment), each chunk within the
  topic's message size limit;
- ``["latest"]``: the manifest of the newest snapshot, and ``["covered"]`` of the newest one
  written at or before the committed offset (the one a restart uses while jobs hold the
  commit back); a manifest names its parts in order with their lengths and SHA-256 and is
  written after them, so a crash mid-write leaves only parts no manifest names;
- ``["origin"]``, ``["gap"]``: the markers of ``FileStore``.

Parts no manifest names (a newer base replaced them, or a write was cut short) are deleted
with tombstones, and compaction reclaims them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError, for_code

from vigil.connectors.base import TopicPartition
from vigil.connectors.kafka import PLAINTEXT, partition_counts, start_client
from vigil.connectors.kafka_security import KafkaSecurity, diagnose
from vigil.daemon.adapters.base import StatePart
from vigil.daemon.state.store import Snapshot

log = structlog.get_logger("vigil.state")

RECORD_OVERHEAD = 1024
"""Bytes a chunk's record needs beyond its value (key, headers, batch framing)."""
READER_FETCH_WAIT_MS = 20
"""How long the broker may hold the state reader's fetch for records not yet written."""
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(64 << 20)}
"""How a missing state topic is created: compacted, in log segments small enough that
compaction reclaims replaced snapshots within hours rather than after a gigabyte."""
_MANIFESTS = ("latest", "covered")


class StateTopicError(ValueError):
    """The state topic exists with settings that would lose snapshots or refuse them."""


@dataclass
class _Held:
    """What the topic holds for one rule and source partition."""

    manifests: dict[str, dict] = field(default_factory=dict)
    chunks: dict[tuple[str, int], bytes | None] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    """Where the next part continues a chain: the base's first position, the end, how many
    parts, and where the rule's live state began at the last part."""

    start: int
    stop: int
    parts: int
    live_from: int


class KafkaStore:
    """The ``StateStore`` of ``[state] store = "kafka"``; see the module docstring."""

    def __init__(
        self,
        servers: str,
        topic: str,
        source_topics: list[str],
        security: KafkaSecurity = PLAINTEXT,
        chunk_bytes: int = 512 << 10,
        max_segments: int = 32,
        client_id: str = "vigil",
    ) -> None:
        self.servers = servers
        self.topic = topic
        self.source_topics = source_topics
        self.security = security
        self.chunk_bytes = chunk_bytes
        self.max_segments = max_segments
        self.client_id = client_id
        self.partitions = 0
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._held: dict[tuple[str, TopicPartition], _Held] = {}
        self._saved: dict[tuple[str, TopicPartition], dict] = {}  # the chain parts extend
        self._plans: dict[tuple[str, TopicPartition], _Plan] = {}

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Create the topic if missing (compacted), or check it is compacted only and takes
        chunks of ``chunk_bytes``; then start the producer."""
        await self._ensure_topic()
        self._producer = AIOKafkaProducer(
            **self.security.client_options(),
            bootstrap_servers=self.servers,
            client_id=f"{self.client_id}-state",
            acks="all",
            enable_idempotence=True,
            max_request_size=self.chunk_bytes + RECORD_OVERHEAD,
            linger_ms=5,
        )
        await start_client(self._producer, self.servers, self.security)

    async def _reader(self) -> AIOKafkaConsumer:
        """The consumer that reads state partitions, started on first use (one stopped
        before any assignment fails in aiokafka)."""
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                **self.security.client_options(),
                bootstrap_servers=self.servers,
                client_id=f"{self.client_id}-state",
                group_id=None,
                enable_auto_commit=False,
                max_partition_fetch_bytes=max(8 << 20, self.chunk_bytes + RECORD_OVERHEAD),
                # it reads to an end offset known beforehand: the broker need not hold a fetch
                # for more, and the next partition's assignment waits for a fetch in flight
                # (500 ms by default, twice: a second per partition recovered)
                fetch_max_wait_ms=READER_FETCH_WAIT_MS,
            )
            await start_client(consumer, self.servers, self.security)
            self._consumer = consumer
        return self._consumer

    async def stop(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    async def _ensure_topic(self) -> None:
        admin = AIOKafkaAdminClient(
            **self.security.client_options(), bootstrap_servers=self.servers
        )
        try:
            await admin.start()
        except KafkaConnectionError:
            await admin.close()
            raise await diagnose(self.servers, self.security) from None
        try:
            counts = await partition_counts(admin)  # all topics: naming one may create it
            created = self.topic not in counts
            if created:
                partitions = max([1, *(counts.get(t, 0) for t in self.source_topics)])
                replicas = min(3, len((await admin.describe_cluster())["brokers"]))
                topic = NewTopic(self.topic, partitions, replicas, topic_configs=TOPIC_CONFIG)
                response = await admin.create_topics([topic])
                error = response.topic_errors[0][1]
                if error == TopicAlreadyExistsError.errno:  # another instance was first
                    created = False
                elif error:
                    raise StateTopicError(
                        f"cannot create state topic {self.topic!r}: "
                        f"{response.topic_errors[0][2] or for_code(error).__name__}"
                    )
                else:
                    log.info(
                        "state_topic_created",
                        topic=self.topic,
                        partitions=partitions,
                        replication_factor=replicas,
                    )
                while self.topic not in counts:  # its metadata takes a moment to appear
                    await asyncio.sleep(0.1)
                    counts = await partition_counts(admin)
            self.partitions = counts[self.topic]
            configs = await _topic_configs(admin, self.topic)
        finally:
            await admin.close()
        where = f"state topic {self.topic!r}"
        policy = configs.get("cleanup.policy", "")
        if policy != "compact":
            raise StateTopicError(
                f"{where} has cleanup.policy={policy!r}; it must be 'compact' alone "
                "(deletion by age or size would remove bases that are still needed)"
            )
        limit = int(configs.get("max.message.bytes", 0))
        if limit < self.chunk_bytes + RECORD_OVERHEAD:
            raise StateTopicError(
                f"{where} takes messages of at most {limit} bytes (max.message.bytes); "
                f"set [state] chunk_bytes to {max(limit - RECORD_OVERHEAD, 1)} or less"
            )

    # -- reading ----------------------------------------------------------------------

    async def open(self, tp: TopicPartition) -> None:
        """Read what the topic holds for source partition ``tp`` (its state partition from
        the beginning to the end offset found now)."""
        started = time.perf_counter()
        self.close(tp)
        state_tp = KafkaTP(self.topic, tp[1] % self.partitions)
        consumer = await self._reader()
        consumer.assign([state_tp])
        await consumer.seek_to_beginning(state_tp)
        end = (await consumer.end_offsets([state_tp]))[state_tp]
        records = read = 0
        while await consumer.position(state_tp) < end:
            batches = await consumer.getmany(state_tp, timeout_ms=500)
            for message in batches.get(state_tp, []):
                if message.offset >= end:
                    continue
                records += 1
                read += len(message.value or b"")
                self._apply(tp, message.key, message.value)
        log.info(
            "state_read",
            topic=tp[0],
            partition=tp[1],
            state_partition=state_tp.partition,
            records=records,
            bytes=read,
            seconds=round(time.perf_counter() - started, 3),
        )

    def _apply(self, tp: TopicPartition, raw_key: bytes | None, value: bytes | None) -> None:
        try:
            rule, topic, partition, kind, *rest = orjson.loads(raw_key or b"")
        except (ValueError, TypeError):
            log.warning("state_record_unreadable", topic=self.topic, key=repr(raw_key)[:80])
            return
        if (topic, partition) != tuple(tp):
            return
        held = self._held.setdefault((rule, tp), _Held())
        if kind == "part":
            chunk = (rest[0], rest[1])
            if value is None:
                held.chunks.pop(chunk, None)
            else:
                held.chunks[chunk] = value
        elif kind in _MANIFESTS or kind in ("origin", "gap"):
            target = held.manifests if kind in _MANIFESTS else held.markers
            if value is None:
                target.pop(kind, None)
            else:
                body = orjson.loads(value)
                target[kind] = body if kind in _MANIFESTS else int(body["offset"])

    def close(self, tp: TopicPartition) -> None:
        """Forget a partition another instance now owns."""
        for store in (self._held, self._saved, self._plans):
            for key in [k for k in store if k[1] == tp]:
                del store[key]

    async def load(
        self, rule: str, tp: TopicPartition, at_most: int | None = None
    ) -> tuple[Snapshot | None, int]:
        """The newest snapshot at offset ``at_most`` or before (the latest, else the one
        the commit covered) and how many incomplete or corrupt ones were passed over. Parts
        continue from the chain of the snapshot returned."""
        held = self._held.get((rule, tp), _Held())
        skipped = 0
        tried: list[dict] = []
        found = None
        for name in _MANIFESTS:
            manifest = held.manifests.get(name)
            if manifest is None or manifest in tried:
                continue
            tried.append(manifest)
            if at_most is not None and manifest["offset"] > at_most:
                log.info("snapshot_ahead_of_commit", rule=rule, tp=tp, committed=at_most)
                continue
            parts = _assemble(held, manifest)
            if parts is None:
                skipped += 1
                log.warning("snapshot_corrupt_skipped", rule=rule, tp=tp, manifest=name)
                continue
            found = Snapshot(manifest["offset"], parts)
            self._saved[(rule, tp)] = manifest
            self._plans[(rule, tp)] = _plan_of(manifest)
            break
        for chunk in held.chunks:  # loaded once: keep the keys (to delete), not the bytes
            held.chunks[chunk] = None
        return found, skipped

    def origin(self, rule: str, tp: TopicPartition) -> int:
        return self._held.get((rule, tp), _Held()).markers.get("origin", 0)

    def gap(self, rule: str, tp: TopicPartition) -> int | None:
        return self._held.get((rule, tp), _Held()).markers.get("gap")

    # -- writing ----------------------------------------------------------------------

    def forget(self, rule: str, tp: TopicPartition) -> None:
        """Start the next snapshot with a base (a write failed, or the state was rebuilt)."""
        self._saved.pop((rule, tp), None)
        self._plans.pop((rule, tp), None)

    def take(
        self,
        rule: str,
        tp: TopicPartition,
        snapshot: Callable[[int | None], StatePart | None],
    ) -> StatePart | None:
        """The rule's state for the next save: a segment continuing the chain saved or being
        saved, or a base once the chain has ``max_segments`` segments or holds more
        decisions the rule has forgotten than it keeps."""
        plan = self._plans.get((rule, tp))
        since = None
        if (
            plan is not None
            and plan.parts <= self.max_segments
            and plan.live_from - plan.start <= plan.stop - plan.live_from
        ):
            since = plan.stop
        part = snapshot(since)
        if part is None:
            return None
        if part.base or plan is None:
            self._plans[(rule, tp)] = _Plan(part.start, part.stop, 1, part.live_from)
        else:
            self._plans[(rule, tp)] = _Plan(plan.start, part.stop, plan.parts + 1, part.live_from)
        return part

    async def save(
        self, rule: str, tp: TopicPartition, offset: int, part: StatePart, committed: int = 0
    ) -> None:
        """Write ``part``, then the manifest naming it after the parts it continues (as the
        covered one too when ``offset <= committed``), then delete parts no manifest names."""
        key = (rule, tp)
        held = self._held.setdefault(key, _Held())
        chain = self._saved.get(key)
        if part.base:
            parts: list[dict] = []
        elif chain is None or chain["stop"] != part.start:
            raise ValueError(
                f"segment from {part.start} does not continue the saved snapshot "
                f"(ending at {None if chain is None else chain['stop']})"
            )
        else:
            parts = list(chain["parts"])
        parts.append(await self._write_part(rule, tp, part, held))
        manifest = {
            "offset": offset,
            "stop": part.stop,
            "live_from": part.live_from,
            "parts": parts,
            "written_at": time.time(),
        }
        names = ["latest", "covered"] if offset <= committed else ["latest"]
        await self._send_all(tp, [(_key(rule, tp, n), orjson.dumps(manifest)) for n in names])
        for name in names:
            held.manifests[name] = manifest
        self._saved[key] = manifest
        await self._delete_unnamed(rule, tp, held)

    async def _write_part(
        self, rule: str, tp: TopicPartition, part: StatePart, held: _Held
    ) -> dict:
        part_id = f"{part.start}-{part.stop}-{uuid.uuid4().hex[:8]}"
        size = self.chunk_bytes
        chunks = [part.blob[i : i + size] for i in range(0, len(part.blob), size)] or [b""]
        await self._send_all(
            tp, [(_key(rule, tp, "part", part_id, i), chunk) for i, chunk in enumerate(chunks)]
        )
        for i in range(len(chunks)):
            held.chunks[(part_id, i)] = None
        return {
            "id": part_id,
            "chunks": len(chunks),
            "length": len(part.blob),
            "sha256": hashlib.sha256(part.blob).hexdigest(),
            "base": part.base,
            "start": part.start,
            "stop": part.stop,
        }

    async def _delete_unnamed(self, rule: str, tp: TopicPartition, held: _Held) -> None:
        named = {p["id"] for m in held.manifests.values() for p in m["parts"]}
        unnamed = [c for c in held.chunks if c[0] not in named]
        if unnamed:
            await self._send_all(tp, [(_key(rule, tp, "part", *c), None) for c in unnamed])
            for c in unnamed:
                del held.chunks[c]

    async def mark_origin(self, rule: str, tp: TopicPartition, offset: int) -> None:
        await self._mark(rule, tp, "origin", offset)

    async def mark_gap(self, rule: str, tp: TopicPartition, offset: int) -> None:
        await self._mark(rule, tp, "gap", offset)

    async def clear_gap(self, rule: str, tp: TopicPartition) -> None:
        if self.gap(rule, tp) is not None:
            await self._mark(rule, tp, "gap", None)

    async def _mark(self, rule: str, tp: TopicPartition, name: str, offset: int | None) -> None:
        value = None if offset is None else orjson.dumps({"offset": offset})
        await self._send_all(tp, [(_key(rule, tp, name), value)])
        markers = self._held.setdefault((rule, tp), _Held()).markers
        if offset is None:
            markers.pop(name, None)
        else:
            markers[name] = offset

    async def _send_all(
        self, tp: TopicPartition, records: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Send to the state partition of source partition ``tp`` and wait for every
        acknowledgement."""
        assert self._producer is not None, "start() first"
        partition = tp[1] % self.partitions
        sent = [
            await self._producer.send(self.topic, value, key=key, partition=partition)
            for key, value in records
        ]
        await asyncio.gather(*sent)


def _key(rule: str, tp: TopicPartition, *kind: object) -> bytes:
    return orjson.dumps([rule, tp[0], tp[1], *kind])


def _plan_of(manifest: dict) -> _Plan:
    parts = manifest["parts"]
    return _Plan(parts[0]["start"], manifest["stop"], len(parts), manifest["live_from"])


def _assemble(held: _Held, manifest: dict) -> list[bytes] | None:
    """The manifest's parts, each checked for length and checksum; None if any is
    missing or damaged."""
    out = []
    for part in manifest["parts"]:
        chunks = [held.chunks.get((part["id"], i)) for i in range(part["chunks"])]
        if any(c is None for c in chunks):
            return None
        blob = b"".join(chunks)  # type: ignore[arg-type]
        if len(blob) != part["length"] or hashlib.sha256(blob).hexdigest() != part["sha256"]:
            return None
        out.append(blob)
    return out


async def _topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    out = {}
    for response in responses:
        for resource in response.resources:
            for entry in resource[4]:
                out[entry[0]] = entry[1]
    return out
