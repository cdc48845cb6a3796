"""What the Kafka source and sink add to aiokafka for latency and throughput: a fetch reads
what arrived while the previous batch was checked, a backlog is read in responses of the
configured size, and the exactly-once sink asks again soon for a transaction the broker
refused while it still wrote the previous commit's markers."""

from __future__ import annotations

import asyncio
import threading
import uuid
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ConcurrentTransactions
from aiokafka.producer.sender import AddOffsetsToTxnHandler, AddPartitionsToTxnHandler, Sender
from aiokafka.structs import TopicPartition

from tests.daemon_harness import consume_all, create_topic, produce
from vigil.connectors import kafka as kafka_connector
from vigil.connectors.base import OutMessage
from vigil.connectors.errors import MessageRefused
from vigil.connectors.kafka import (
    PLAINTEXT,
    TRANSACTION_RETRY_BACKOFF_MS,
    KafkaSink,
    KafkaSource,
    start_client,
)
from vigil.connectors.kafka_security import BrokerUnavailable


def refused_for(topic: str) -> SimpleNamespace:
    return SimpleNamespace(errors=[(topic, [(0, ConcurrentTransactions.errno)])])


async def nothing(_tps) -> None:
    """An assignment callback with nothing to do."""


async def test_a_fetch_takes_the_records_that_arrived_after_the_buffered_ones(kafka_bootstrap):
    """The consumer keeps one response buffered per partition; a fetch that takes it must
    also take the records the broker received since, not leave them for the next batch."""
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)

    async def sent(prefix: str) -> list[bytes]:
        values = [f"{prefix}{i}".encode() for i in range(10)]
        await produce(kafka_bootstrap, topic, values)
        return values

    # a generous wait: a fetch returns as soon as the records are there
    source = KafkaSource([topic], kafka_bootstrap, f"g-{topic}", fresh_fetch_wait_ms=2000)
    await source.start(nothing, nothing)
    try:
        first = await sent("a")
        got: list[bytes] = []
        while len(got) < len(first):
            got += [r.value for r in await source.fetch(100, 5000)]
        assert got == first
        buffered = await sent("b")
        await asyncio.sleep(1)  # the consumer's next response (these) is buffered by now
        fresh = await sent("c")
        assert [r.value for r in await source.fetch(100, 5000)] == buffered + fresh
    finally:
        await source.stop()


async def test_the_partition_fetch_size_bounds_what_one_fetch_brings(kafka_bootstrap):
    """A backlog is read in responses of ``partition_fetch_bytes``: the default takes 400
    KiB of records in one fetch, 64 KiB takes a fraction of them."""
    topic = f"fetch-size-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)
    await produce(kafka_bootstrap, topic, [i.to_bytes(2, "big") * 512 for i in range(400)])

    async def first_fetch(**options) -> int:
        source = KafkaSource([topic], kafka_bootstrap, f"g-{uuid.uuid4().hex[:8]}", **options)
        await source.start(nothing, nothing)
        try:
            records: list = []
            while not records:
                records = await source.fetch(1000, 5000)
            return len(records)
        finally:
            await source.stop()

    assert await first_fetch() == 400
    # one response of at most 64 KiB (plus the producer's batch that crosses it), and at
    # most one more arriving within the fresh-fetch wait
    assert await first_fetch(partition_fetch_bytes=64 << 10) < 200


async def test_a_refused_transaction_is_asked_again_after_the_sinks_backoff():
    assert TRANSACTION_RETRY_BACKOFF_MS < 20  # below aiokafka's fixed wait for a partition
    sink = KafkaSink("127.0.0.1:1", "group", transactional_id="vigil-test")
    sender = sink._new_producer()._sender
    expected = TRANSACTION_RETRY_BACKOFF_MS / 1000
    # a batch with alerts: the first partition of the transaction is refused
    partitions = AddPartitionsToTxnHandler(sender, [TopicPartition("alerts", 0)])
    assert partitions.handle_response(refused_for("alerts")) == expected
    # a batch of offsets only: the group's offsets are refused
    offsets = AddOffsetsToTxnHandler(sender, "group")
    assert offsets.handle_response(SimpleNamespace(error_code=ConcurrentTransactions.errno)) == (
        expected
    )


async def test_a_group_of_an_older_builds_members_is_named_not_joined(kafka_bootstrap):
    """A member of an older build assigns with the client's round-robin protocol; a source
    joining its group is refused by the broker, and says what to do."""
    topic = f"upgrade-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)
    group = f"g-{topic}"
    old = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group)
    await old.start()
    source = KafkaSource([topic], kafka_bootstrap, group)
    try:
        while not old.assignment():
            await old.getmany(timeout_ms=200)
        await source.start(nothing, nothing)
        with pytest.raises(ValueError, match=r"another protocol .* stop them, then start"):
            async with asyncio.timeout(30):
                while True:
                    await source.fetch(10, 200)
    finally:
        await source.stop()
        await old.stop()


class _Unserved:
    """An aiokafka client whose start asserts as aiokafka does when the bootstrap metadata
    names no broker (a broker in the seconds after it starts or resumes)."""

    stopped = False

    async def start(self) -> None:
        raise AssertionError("Did we not perform bootstrap?")

    async def stop(self) -> None:
        self.stopped = True


async def test_a_broker_not_serving_yet_is_told_as_unavailable_not_as_an_assertion():
    client = _Unserved()
    with pytest.raises(BrokerUnavailable, match="metadata names no broker yet"):
        await start_client(client, "127.0.0.1:1", PLAINTEXT)  # type: ignore[arg-type]
    assert client.stopped


async def test_a_transaction_commits_while_the_callers_loop_is_busy(kafka_bootstrap):
    """The sink's producer runs in a thread of its own: a delivery started before the
    daemon's loop computes for a while (a backlog's batch check) goes through all its
    round trips meanwhile, and a read_committed reader sees it before that loop yields."""
    topic = f"busy-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)
    sink = KafkaSink(kafka_bootstrap, "g", transactional_id=f"busy-{topic}", topics=[topic])
    await sink.start()
    seen = threading.Event()

    def read() -> None:
        if asyncio.run(consume_all(kafka_bootstrap, topic, 1, 40, settle=0)):
            seen.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        delivery = asyncio.ensure_future(sink.deliver([OutMessage(topic, b"k", b"{}")], {}))
        await asyncio.sleep(0)  # the delivery is handed to the sink's thread
        assert seen.wait(30)  # blocks this loop: only the sink's own loop runs
        await delivery
    finally:
        await asyncio.to_thread(reader.join)
        await sink.stop()
    await sink.stop()  # a second stop does nothing
    assert "vigil-sink" not in {t.name for t in threading.enumerate()}


async def test_a_start_that_times_out_stops_the_client(kafka_bootstrap):
    """A producer that bootstrapped, then hung in its transactional handshake (a coordinator
    that does not answer), is stopped when its start times out: no connection or
    background task of it outlives the failed start, as they would at every retry."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id="hangs")
    handshake = asyncio.Event()

    async def hang() -> None:
        handshake.set()
        await asyncio.Event().wait()

    producer._sender._maybe_wait_for_pid = hang
    before = asyncio.all_tasks()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5):
            await start_client(producer, kafka_bootstrap, PLAINTEXT)
    assert handshake.is_set()  # the timeout came after the bootstrap, not before
    assert producer.client._conns == {}
    assert asyncio.all_tasks() - before == set()


@pytest.mark.parametrize("side", ["sink", "source"])
async def test_a_client_whose_start_failed_starts_again(kafka_bootstrap, monkeypatch, side):
    """The first start of the sink's producer (or the source's consumer) bootstraps, then
    fails and is stopped; the next start runs on a new client and that client works."""
    real, failed = kafka_connector.start_client, []

    async def failing_once(client, servers, security) -> None:
        await real(client, servers, security)
        if not failed:
            failed.append(client)
            await client.stop()
            raise BrokerUnavailable("the broker went away")

    monkeypatch.setattr(kafka_connector, "start_client", failing_once)
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)
    if side == "sink":
        sink = KafkaSink(kafka_bootstrap, "g")
        with pytest.raises(BrokerUnavailable):
            await sink.start()
        await sink.start()
        try:
            await sink.deliver([OutMessage(topic, b"k", b'{"started": 2}')], {})
        finally:
            await sink.stop()
        assert await consume_all(kafka_bootstrap, topic, 1, 30, settle=0) == [{"started": 2}]
    else:
        await produce(kafka_bootstrap, topic, [b"one"])
        source = KafkaSource([topic], kafka_bootstrap, f"g-{topic}")
        with pytest.raises(BrokerUnavailable):
            await source.start(nothing, nothing)
        await source.start(nothing, nothing)
        try:
            async with asyncio.timeout(30):
                records = []
                while not records:
                    records = await source.fetch(10, 200)
        finally:
            await source.stop()
        assert [r.value for r in records] == [b"one"]


@pytest.mark.parametrize("exactly_once", [False, True])
@pytest.mark.parametrize("limit", ["topic", "client"])
async def test_a_message_refused_for_its_size_names_its_topic_and_size(
    kafka_bootstrap, exactly_once, limit
):
    topic = f"small-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic, configs={"max.message.bytes": "2000"})
    size = 5000 if limit == "topic" else kafka_connector.MAX_REQUEST_BYTES + 1
    txn = f"refused-{topic}" if exactly_once else None
    group = f"g-{topic}"
    sink = KafkaSink(kafka_bootstrap, group, transactional_id=txn, topics=[topic])
    await sink.start()
    # exactly-once, the offsets go to the transaction while its messages are produced
    offsets = {(topic, 0): 1} if exactly_once else {}
    try:
        fits = OutMessage(topic, b"k", b'{"fits": 1}')
        with pytest.raises(MessageRefused) as refused:
            async with asyncio.timeout(30):
                await sink.deliver([fits, OutMessage(topic, b"k", b"x" * (size - 1))], offsets)
        assert f"topic {topic!r}" in str(refused.value)
        assert f"{size:,} bytes" in str(refused.value)
    finally:
        await sink.stop()
    # exactly-once: the refused delivery's transaction is aborted whole, offsets and all
    want = [] if exactly_once else [{"fits": 1}]
    assert await consume_all(kafka_bootstrap, topic, len(want), 10) == want
    assert await committed(kafka_bootstrap, group, topic) is None


async def committed(bootstrap: str, group: str, topic: str) -> int | None:
    """The offset ``group`` has committed for partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


async def test_a_transactions_offsets_go_to_the_broker_while_its_messages_are_produced(
    kafka_bootstrap, monkeypatch
):
    """The offsets' two round trips (to the transaction's and the group's coordinator) are
    not queued behind the messages' acknowledgement: a transaction costs the longer of the
    two, not their sum."""
    topic = f"overlap-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic)
    group = f"g-{topic}"
    events: list[str] = []
    produce_request = Sender._send_produce_req
    add_offsets = AddOffsetsToTxnHandler.do

    async def slow_produce(self, node_id, batches):
        await asyncio.sleep(0.5)  # a produce request the broker is slow to acknowledge
        result = await produce_request(self, node_id, batches)
        events.append("produced")
        return result

    async def adding_offsets(self, node_id):
        events.append("offsets")
        return await add_offsets(self, node_id)

    monkeypatch.setattr(Sender, "_send_produce_req", slow_produce)
    monkeypatch.setattr(AddOffsetsToTxnHandler, "do", adding_offsets)
    sink = KafkaSink(kafka_bootstrap, group, transactional_id=f"o-{topic}", topics=[topic])
    await sink.start()
    try:
        async with asyncio.timeout(30):
            await sink.deliver([OutMessage(topic, b"k", b'{"alert": 1}')], {(topic, 0): 5})
    finally:
        await sink.stop()
    assert events.index("offsets") < events.index("produced")  # (asked again if refused)
    assert await consume_all(kafka_bootstrap, topic, 1, 10) == [{"alert": 1}]
    assert await committed(kafka_bootstrap, group, topic) == 5


@pytest.mark.parametrize("exactly_once", [False, True])
async def test_a_delivery_larger_than_its_topics_message_limit_is_sent_in_batches_that_fit(
    kafka_bootstrap, exactly_once
):
    # the broker refuses a record batch over the topic's max.message.bytes whole, and
    # aiokafka does not split it: the sink must make batches that fit
    small, unknown = f"small-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, small, configs={"max.message.bytes": "2000"})
    limits = await kafka_connector.message_limits(kafka_bootstrap, [small, unknown])
    assert limits[small] == 2000
    assert limits[unknown] > 2000  # the broker's default, for a topic created on first use
    txn = f"batches-{small}" if exactly_once else None
    sink = KafkaSink(kafka_bootstrap, "g", transactional_id=txn, topics=[small, unknown])
    await sink.start()
    values = [{"i": i, "pad": "x" * 100} for i in range(200)]
    try:
        async with asyncio.timeout(30):
            await sink.deliver([OutMessage(small, b"k", orjson.dumps(v)) for v in values], {})
    finally:
        await sink.stop()
    assert await consume_all(kafka_bootstrap, small, len(values), 30) == values
