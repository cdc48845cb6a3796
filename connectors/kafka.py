"""Kafka source and sink (aiokafka): manual commits, idempotent or transactional produce."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    InconsistentGroupProtocolError,
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.protocol.metadata import MetadataRequest

from vigil.connectors.assignor import CoPartitioned
from vigil.connectors.base import AssignCallback, Offsets, OutMessage, TopicPartition
from vigil.connectors.errors import MessageRefused
from vigil.connectors.events import Record
from vigil.connectors.kafka_security import (
    BrokerRejected,
    BrokerUnavailable,
    KafkaSecurity,
    diagnose,
)
from vigil.connectors.loop_thread import LoopThread

PLAINTEXT = KafkaSecurity()
PARTITION_FETCH_BYTES = 16 << 20
"""Bytes one fetch may bring per partition (aiokafka's default: 1 MiB). The consumer asks
for more only once its buffer is drained, and the loop then waits a round trip: with a
backlog, that wait comes once per this many bytes (about 60,000 decisions of 30 features
at 16 MiB). Each assigned partition may hold this much buffered."""


async def start_client(
    client: AIOKafkaConsumer | AIOKafkaProducer, servers: str, security: KafkaSecurity
) -> None:
    """Start ``client``; if it cannot bootstrap, raise ``BrokerRejected`` (the security
    settings do not fit the broker) or ``BrokerUnavailable`` (nothing answered, or the
    broker is not serving yet), one line that names what to check. A client that failed to
    start, for any reason (a start that timed out or was cancelled too), is stopped: its
    connections and background tasks would otherwise outlive it, one set per retry, and it
    cannot be started again."""
    try:
        await client.start()
    except KafkaConnectionError:
        await client.stop()
        raise await diagnose(servers, security) from None
    except AssertionError:
        # aiokafka asserts when the bootstrap metadata names no broker, as a broker's does
        # in the seconds after it starts or resumes
        await client.stop()
        raise BrokerUnavailable(
            f"the broker at {servers} answered, but its metadata names no broker yet "
            "(starting or resuming)"
        ) from None
    except BaseException:
        await client.stop()
        raise


def broker_gone(error: BaseException) -> bool:
    """Whether a client's ``error`` says the cluster did not answer in time (worth waiting
    out), as opposed to refusing the request (a setting, a size, an authorisation). Vigil's
    own verdicts (``BrokerUnavailable``, ``BrokerRejected``) are final, not this."""
    if isinstance(error, BrokerUnavailable | BrokerRejected):
        return False
    if isinstance(error, KafkaError):
        return bool(error.retriable) or isinstance(error, KafkaTimeoutError)
    return isinstance(error, (OSError, TimeoutError))


def fenced(error: BaseException) -> bool:
    """Whether ``error`` says the producer's transactional epoch is no longer current: a
    newer producer with its transactional id, or the broker's transaction timeout aborting
    a transaction left open (as during a long outage)."""
    return isinstance(error, (ProducerFenced, InvalidProducerEpoch))


class BrokerProbe:
    """Asks the cluster for its broker list, over a connection of its own: whether any
    broker answers within a time limit (a paused broker still accepts connections, so
    only an answer counts). After a probe without an answer the next one starts from a new
    client and the bootstrap servers, so no connection or metadata left from before an
    outage can keep it from seeing the cluster back."""

    def __init__(self, servers: str, security: KafkaSecurity, client_id: str = "vigil") -> None:
        self._options = {
            **security.client_options(),
            "bootstrap_servers": servers,
            "client_id": f"{client_id}-probe",
        }
        self._client = AIOKafkaClient(**self._options)
        self._bootstrapped = False
        self._stale = False

    async def answers(self, timeout: float) -> bool:
        """Whether any broker answers within ``timeout`` (all are asked at once, so one that
        hangs does not hide the others)."""
        if self._stale:
            await self._replace(timeout)
        if not self._bootstrapped:
            try:
                async with asyncio.timeout(timeout):
                    await self._client.bootstrap()
            except (KafkaError, OSError, TimeoutError):
                self._stale = True
                return False
            self._bootstrapped = True
            return True
        answered = await self._ask_all(timeout)
        self._stale = not answered
        return answered

    async def _ask_all(self, timeout: float) -> bool:
        asks = [
            asyncio.ensure_future(self._client.send(b.nodeId, MetadataRequest([])))
            for b in self._client.cluster.brokers()
        ]
        try:
            for answer in asyncio.as_completed(asks, timeout=timeout):
                try:
                    await answer
                except (KafkaError, OSError):
                    continue
                return True
            return False
        except TimeoutError:
            return False
        finally:
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)

    async def _replace(self, timeout: float) -> None:
        old, self._client = self._client, AIOKafkaClient(**self._options)
        self._bootstrapped = self._stale = False
        try:
            async with asyncio.timeout(timeout):
                await old.close()
        except (KafkaError, OSError, TimeoutError):
            pass

    async def close(self) -> None:
        await self._client.close()


class _Listener(ConsumerRebalanceListener):
    def __init__(self, on_assign: AssignCallback, on_revoke: AssignCallback) -> None:
        self._on_assign, self._on_revoke = on_assign, on_revoke

    async def on_partitions_revoked(self, revoked) -> None:
        await self._on_revoke([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned) -> None:
        await self._on_assign([(tp.topic, tp.partition) for tp in assigned])


FRESH_FETCH_WAIT_MS = 5
"""How long a fetch that found buffered records waits for the records the consumer asks for
once those are taken (a local round trip). The consumer keeps one response per partition
buffered and asks for more only when it is taken, so the buffer holds what had arrived
when the previous batch was taken: without this wait, a record arriving while a batch is
checked and delivered waits for the batch after the next (bench/pipeline_bench.py)."""


class KafkaSource:
    """A consumer-group member reading ``topics`` with manual offset commits."""

    def __init__(
        self,
        topics: list[str],
        bootstrap_servers: str,
        group_id: str,
        client_id: str = "vigil",
        auto_offset_reset: str = "earliest",
        isolation_level: str = "read_committed",
        session_timeout_ms: int = 10_000,
        fetch_max_wait_ms: int = 20,
        security: KafkaSecurity = PLAINTEXT,
        fresh_fetch_wait_ms: int = FRESH_FETCH_WAIT_MS,
        partition_fetch_bytes: int = PARTITION_FETCH_BYTES,
        copartitioned: Iterable[Iterable[str]] = (),
    ) -> None:
        """``copartitioned``: groups of topics whose partition ``p`` one member reads
        together (connectors/assignor.py). It is the group's only assignment protocol:
        aiokafka sends a JoinGroup per configured assignor, and the second, with changed
        metadata, starts another rebalance, so a list of two never settles."""
        self.topics = sorted(set(topics))
        self._fresh_wait_ms = fresh_fetch_wait_ms
        self._security = security
        self._options = dict(
            **security.client_options(),
            bootstrap_servers=bootstrap_servers,
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset=auto_offset_reset,
            isolation_level=isolation_level,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(500, session_timeout_ms // 5),
            # a topic created after start (say, the first model update) is found this soon
            metadata_max_age_ms=15_000,
            # an idle partition (a drained requests topic) makes the broker hold the fetch
            # this long, and the busy partitions on that broker wait for it
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=partition_fetch_bytes,
            partition_assignment_strategy=(CoPartitioned(copartitioned),),
        )
        self._consumer = AIOKafkaConsumer(**self._options)
        self.group_id = group_id
        self._reset = auto_offset_reset
        self._servers = bootstrap_servers

    async def start(self, on_assign: AssignCallback, on_revoke: AssignCallback) -> None:
        """Start the consumer; after a failed start, this may be called again."""
        try:
            await start_client(self._consumer, self._servers, self._security)
        except BaseException:
            self._consumer = AIOKafkaConsumer(**self._options)
            raise
        self._consumer.subscribe(self.topics, listener=_Listener(on_assign, on_revoke))

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        """Up to ``max_records``, waiting at most ``timeout_ms`` for the first; the records
        buffered, then those that arrive within ``fresh_fetch_wait_ms``."""
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            taken = sum(map(len, batches.values()))
            if taken and taken < max_records:
                fresh = await self._consumer.getmany(
                    timeout_ms=self._fresh_wait_ms, max_records=max_records - taken
                )
                for tp, messages in fresh.items():
                    batches[tp] = batches.get(tp, []) + messages
        except InconsistentGroupProtocolError:
            raise ValueError(
                f"consumer group {self.group_id!r}: its members assign partitions with another "
                f"protocol than {CoPartitioned.name!r} (instances of an older Vigil build?): "
                "stop them, then start this one"
            ) from None
        return [
            Record(m.topic, m.partition, m.offset, m.value, m.key, m.headers, m.timestamp)
            for tp in sorted(batches, key=lambda t: (t.topic, t.partition))
            for m in batches[tp]
        ]

    async def commit(self, offsets: Offsets) -> None:
        if offsets:
            await self._consumer.commit({KafkaTP(t, p): o for (t, p), o in offsets.items()})

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self._consumer.committed(KafkaTP(*tp))

    async def start_offset(self, tp: TopicPartition) -> int:
        """The partition's first retained offset, or its end with ``auto_offset_reset =
        "latest"``."""
        if self._reset == "latest":
            ktp = KafkaTP(*tp)
            return (await self._consumer.end_offsets([ktp]))[ktp]
        return await self.first_offset(tp)

    async def first_offset(self, tp: TopicPartition) -> int:
        ktp = KafkaTP(*tp)
        return (await self._consumer.beginning_offsets([ktp]))[ktp]

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read from ``offset``, or from the first retained record if retention deleted it
        (left to the reset policy, ``latest`` would skip every record to the end)."""
        ktp = KafkaTP(*tp)
        if offset <= await self.first_offset(tp):
            await self._consumer.seek_to_beginning(ktp)
        else:
            self._consumer.seek(ktp, offset)

    async def lag(self) -> dict[TopicPartition, int]:
        out = {}
        assigned = self._consumer.assignment()
        unknown = [tp for tp in assigned if self._consumer.highwater(tp) is None]
        ends = await self._consumer.end_offsets(unknown) if unknown else {}
        for tp in assigned:
            high = self._consumer.highwater(tp)
            high = ends.get(tp) if high is None else high
            if high is not None:
                out[(tp.topic, tp.partition)] = max(0, high - await self._consumer.position(tp))
        return out

    def end_offset(self, tp: TopicPartition) -> int | None:
        """The last stable offset under read_committed (the high watermark otherwise), from
        the partition's last fetch response; None before one or once it is unassigned."""
        ktp = KafkaTP(*tp)
        if ktp not in self._consumer.assignment():
            return None
        lso = self._consumer.last_stable_offset(ktp)
        return lso if lso is not None and lso >= 0 else self._consumer.highwater(ktp)

    def pause_only(self, tps: set[TopicPartition]) -> None:
        assigned = self._consumer.assignment()
        wanted = {KafkaTP(*tp) for tp in tps} & assigned
        paused = self._consumer.paused() & assigned
        if wanted - paused:
            self._consumer.pause(*(wanted - paused))
        if paused - wanted:
            self._consumer.resume(*(paused - wanted))

    def assignment(self) -> list[TopicPartition]:
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    async def stop(self) -> None:
        await self._consumer.stop()


TRANSACTION_RETRY_BACKOFF_MS = 5
"""A transaction begun right after the previous commit is often refused with
CONCURRENT_TRANSACTIONS while the broker still writes that commit's markers, and is asked
again after this wait. aiokafka waits its retry backoff (default 100 ms), or, when the
refusal comes for a partition (a batch with alerts), a fixed 20 ms (``BACKOFF_OVERRIDE``);
Java's client takes the smaller of the two, as ``_retry_transactions_after`` does. Every
exactly-once delivery waited one of these (bench/txn_bench.py, median delivery of a batch
with alerts: 26.7 ms with aiokafka's waits, 12.2 ms with this one)."""


def _retry_transactions_after(backoff_ms: int) -> None:
    aiokafka_sender.BACKOFF_OVERRIDE = min(20, backoff_ms) / 1000


LINGER_MS = 0
"""How long the producer holds a batch open for more messages. A delivery appends all its
messages before the client's sender runs (no append waits while a batch has room), so
any wait only delays the acknowledgement the commit waits for: 5 ms had been added to
every delivery (bench/pipeline_bench.py at 10,000 decisions/s: p50 22 -> 12 ms
at-least-once, 38 -> 26 ms exactly-once)."""

BATCH_BYTES = 512 << 10
"""How many bytes of one partition's messages the producer sends as one batch. The client's
16 KiB default holds about two forwarded 32-row requests; a full batch makes the next
append wait for a round trip to the broker, so a delivery of thousands took a second
(bench/serving_bench.py, requests of 32 rows). Below the broker's default record-batch
limit of 1 MiB."""

MAX_REQUEST_BYTES = 1 << 20
"""The largest message the producer sends (aiokafka's default); the broker's default limit
per message is about the same."""


class KafkaSink:
    """Idempotent producer; with ``transactional_id``, every ``deliver`` is one Kafka
    transaction that also commits the consumer offsets (exactly-once processing). The
    offsets go to the transaction while its messages are produced: AddOffsetsToTxn and
    TxnOffsetCommit overlap the produce, so a transaction with alerts is four round trips
    in a row (AddPartitionsToTxn, the longer of produce and the offsets' two, EndTxn), not
    five (bench/pipeline_bench.py, docs/benchmarks.md). The producer runs in a thread of its
    own (connectors/loop_thread.py), so that a delivery goes on while the daemon's loop
    checks the next batch."""

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        client_id: str = "vigil",
        transactional_id: str | None = None,
        security: KafkaSecurity = PLAINTEXT,
        topics: Iterable[str] = (),
    ) -> None:
        self.commits_offsets = transactional_id is not None
        self._group_id = group_id
        self._servers = bootstrap_servers
        self._security = security
        self._client_id = client_id
        self._transactional_id = transactional_id
        self._topics = sorted(set(topics))
        self._limits: dict[str, int] = {}
        self._backoff_ms = 100
        if transactional_id is not None:
            self._backoff_ms = TRANSACTION_RETRY_BACKOFF_MS
            _retry_transactions_after(self._backoff_ms)
        self._producer: AIOKafkaProducer | None = None
        self._io: LoopThread | None = None  # the producer lives in its loop

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self._security.client_options(),
            bootstrap_servers=self._servers,
            client_id=self._client_id,
            enable_idempotence=True,
            acks="all",
            transactional_id=self._transactional_id,
            linger_ms=LINGER_MS,
            # aiokafka sends a batch the broker refused for its size as one, never split
            max_batch_size=min([BATCH_BYTES, *self._limits.values()]),
            max_request_size=MAX_REQUEST_BYTES,
            retry_backoff_ms=self._backoff_ms,
        )

    async def start(self) -> None:
        """Start a new producer, its batches no larger than the smallest message limit of
        the topics given (``message_limits``); after a failed start, this may be called
        again."""
        if self._io is None:
            self._io = LoopThread("vigil-sink")
        await self._io.run(self._start())

    async def _start(self) -> None:
        if self._topics:
            self._limits = await message_limits(self._servers, self._topics, self._security)
        producer = self._new_producer()
        await start_client(producer, self._servers, self._security)
        self._producer = producer

    async def restart(self, close_timeout: float) -> None:
        """Replace the producer after a failed delivery: the old one is closed (for at most
        ``close_timeout`` seconds; a transaction it left open is aborted by the new one's
        start, which fences it), the new one starts with a fresh epoch."""
        assert self._io is not None, "restart before start"
        await self._io.run(self._restart(close_timeout))

    async def _restart(self, close_timeout: float) -> None:
        old, self._producer = self._producer, None
        try:
            async with asyncio.timeout(close_timeout):
                if old is not None:
                    await old.stop()
        except (TimeoutError, KafkaError, OSError):
            pass
        await self._start()

    async def deliver(self, messages: list[OutMessage], offsets: Offsets) -> None:
        """Send ``messages`` (and, exactly-once, commit ``offsets`` in their transaction);
        ``MessageRefused`` names a message too large for its topic."""
        assert self._io is not None, "deliver before start"
        await self._io.run(self._deliver(messages, offsets))

    async def _deliver(self, messages: list[OutMessage], offsets: Offsets) -> None:
        assert self._producer is not None, "deliver before start"
        if not self.commits_offsets:
            await self._send_all(messages)
            return
        if not messages and not offsets:
            return
        commit = None
        if offsets:
            commit = partial(
                self._producer.send_offsets_to_transaction,
                {KafkaTP(t, p): o for (t, p), o in offsets.items()},
                self._group_id,
            )
        async with self._producer.transaction():
            # the offsets' two round trips go on while the messages are produced
            await self._send_all(messages, alongside=commit)

    async def _send_all(
        self,
        messages: list[OutMessage],
        alongside: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Send ``messages`` and wait for their acknowledgement, and for ``alongside``,
        begun once they are queued."""
        assert self._producer is not None
        send = self._producer.send
        futures: list[asyncio.Future] = []
        try:
            for m in messages:
                futures.append(
                    await send(
                        m.topic,
                        m.value,
                        key=m.key,
                        headers=list(m.headers) if m.headers else None,  # the builder takes lists
                        timestamp_ms=m.timestamp_ms,
                    )
                )
        except MessageSizeTooLargeError as e:
            raise _refused(messages, futures, self._limits) from e
        waits = [*futures, asyncio.ensure_future(alongside())] if alongside else futures
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        failed = [e for e in outcomes if isinstance(e, BaseException)]
        for e in failed:
            if isinstance(e, MessageSizeTooLargeError):
                raise _refused(messages, futures, self._limits) from e
        if failed:
            raise failed[0]

    async def stop(self) -> None:
        """Close the producer (sending what it holds) and end the sink's thread; a second
        stop does nothing, a start after it starts anew."""
        io, self._io = self._io, None
        if io is None:
            return
        try:
            await io.run(self._stop())
        finally:
            await io.close()

    async def _stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


def _refused(
    messages: list[OutMessage], futures: list[asyncio.Future], limits: dict[str, int]
) -> MessageRefused:
    """Name the largest message refused for its size (the broker refuses a whole batch),
    or the one the client refused before sending it."""
    failed = [
        m
        for m, f in zip(messages, futures, strict=False)
        if f.done() and not f.cancelled() and isinstance(f.exception(), MessageSizeTooLargeError)
    ]
    m = max(failed, key=_size) if failed else messages[len(futures)]
    if not failed:
        return MessageRefused(
            f"a message of {_size(m):,} bytes for topic {m.topic!r} is over the producer's "
            f"request limit of {MAX_REQUEST_BYTES:,} bytes"
        )
    limit = f" (its limit: {limits[m.topic]:,})" if m.topic in limits else ""
    return MessageRefused(
        f"topic {m.topic!r} refused a message of {_size(m):,} bytes as too large{limit}: "
        "raise the topic's max.message.bytes above it"
    )


def _size(m: OutMessage) -> int:
    return len(m.value) + len(m.key or b"") + sum(len(k) + len(v) for k, v in m.headers)


async def message_limits(
    servers: str, topics: list[str], security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    """The largest record batch each of ``topics`` takes (``max.message.bytes``); a topic
    not created yet takes the broker's default (``message.max.bytes``). A limit the
    client may not read (no DescribeConfigs right) is left out."""
    async with admin_client(servers, security) as admin:
        brokers = (await admin.describe_cluster())["brokers"]  # none yet: a broker starting
        broker = str(brokers[0]["node_id"]) if brokers else None
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None}) for t in topics
        ]
        if broker is not None:
            resources.append(
                ConfigResource(ConfigResourceType.BROKER, broker, {"message.max.bytes": None})
            )
        responses = await admin.describe_configs(resources) if resources else []
    found: dict[tuple[int, str], int] = {}
    missing: set[str] = set()
    for response in responses:
        for code, _, kind, name, entries in response.resources:
            if code == 0 and entries:
                found[kind, name] = int(entries[0][1])
            elif code == UnknownTopicOrPartitionError.errno:
                missing.add(name)
    default = found.get((ConfigResourceType.BROKER, broker or ""))
    limits = {
        t: found[ConfigResourceType.TOPIC, t]
        for t in topics
        if (ConfigResourceType.TOPIC, t) in found
    }
    if default is not None:
        limits.update({t: default for t in missing})
    return limits


async def topic_partitions(
    servers: str, topics: list[str], security: KafkaSecurity = PLAINTEXT
) -> dict[str, int | None]:
    """Connect as Vigil's clients do and count each topic's partitions (None: no such
    topic), so a deployment can be checked before it runs."""
    async with admin_client(servers, security) as admin:
        counts = await partition_counts(admin)
    return {t: counts.get(t) for t in topics}


async def read_committed(
    servers: str,
    topic: str,
    security: KafkaSecurity = PLAINTEXT,
    idle_timeout: float = 30.0,
) -> list[Record]:
    """Every committed record of ``topic`` below the end offsets (the last stable offsets,
    under read_committed) found when reading starts, by partition then offset: a one-off
    read, in no consumer group, so nothing is committed. Raises ``ValueError`` for a topic
    that does not exist (without creating it), ``BrokerRejected`` or ``BrokerUnavailable``
    when connecting fails, ``BrokerUnavailable`` when no partition moves for
    ``idle_timeout`` seconds."""
    where = f"kafka://{servers}/{topic}"
    consumer = AIOKafkaConsumer(
        **security.client_options(),
        bootstrap_servers=servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
    )
    await start_client(consumer, servers, security)
    try:
        if topic not in await consumer.topics():  # checked first: subscribing could create it
            raise ValueError(f"{where}: no such topic")
        consumer.subscribe([topic])
        deadline = time.monotonic() + idle_timeout
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"{where}: no partitions after {idle_timeout:.0f} s")
            await asyncio.sleep(0.02)
        # then assigned: a subscription is assigned afresh when the metadata changes, which
        # would drop the seek below
        partitions = sorted(consumer.assignment())
        consumer.unsubscribe()
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        return await _drain(consumer, end, where, idle_timeout)
    finally:
        await consumer.stop()


async def _drain(
    consumer: AIOKafkaConsumer, end: dict[KafkaTP, int], where: str, idle: float
) -> list[Record]:
    """Fetch until every partition's position reaches its end offset (control records and
    aborted batches count: the position moves past them)."""
    records: list[Record] = []
    positions = {tp: await consumer.position(tp) for tp in end}
    progress = time.monotonic()
    while any(positions[tp] < end[tp] for tp in end):
        pending = [tp for tp in end if positions[tp] < end[tp]]
        batches = await consumer.getmany(*pending, timeout_ms=200)
        for tp, messages in batches.items():
            records += [
                Record(m.topic, m.partition, m.offset, m.value, m.key)
                for m in messages
                if m.offset < end[tp]
            ]
        moved = {tp: await consumer.position(tp) for tp in pending}
        if any(moved[tp] != positions[tp] for tp in pending):
            progress = time.monotonic()
        elif time.monotonic() - progress > idle:
            raise BrokerUnavailable(f"{where}: no records for {idle:.0f} s before the end offsets")
        positions.update(moved)
    return sorted(records, key=lambda r: (r.partition, r.offset))


async def ensure_topics(
    servers: str, wanted: dict[str, list[str]], security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    """Create each topic of ``wanted`` that does not exist, with as many partitions as the
    largest of the topics it is derived from (1 if none exists yet) and up to 3 replicas;
    the partition count of every wanted topic. Raises ``ValueError`` when the broker
    refuses to create one."""
    async with admin_client(servers, security) as admin:
        counts = await partition_counts(admin)  # all topics: naming one may create it
        missing = [t for t in wanted if t not in counts]
        if missing:
            replicas = min(3, len((await admin.describe_cluster())["brokers"]))
            new = [
                NewTopic(t, max([1, *(counts.get(s, 0) for s in wanted[t])]), replicas)
                for t in missing
            ]
            response = await admin.create_topics(new)
            for topic, code, message in response.topic_errors:
                if code and code != TopicAlreadyExistsError.errno:  # not another instance's
                    raise ValueError(
                        f"cannot create topic {topic!r}: {message or for_code(code).__name__}"
                    )
            while any(t not in counts for t in missing):  # metadata takes a moment to appear
                await asyncio.sleep(0.1)
                counts = await partition_counts(admin)
        return {t: counts[t] for t in wanted}


@asynccontextmanager
async def admin_client(servers: str, security: KafkaSecurity) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed on leaving; ``diagnose``'s error when it cannot
    connect."""
    admin = AIOKafkaAdminClient(**security.client_options(), bootstrap_servers=servers)
    try:
        await admin.start()
    except KafkaConnectionError:
        await admin.close()
        raise await diagnose(servers, security) from None
    try:
        yield admin
    finally:
        await admin.close()


async def partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Every topic's number of partitions."""
    return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()}
