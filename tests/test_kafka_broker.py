"""The dev broker supports what the daemon relies on: idempotent and transactional
produce, and read_committed consumption."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def test_transactions_are_visible_only_when_committed(kafka_bootstrap):
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"smoke-{topic}"
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"end")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        seen: list[bytes] = []
        while b"end" not in seen:
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, "no records from the dev broker within 10 s"
            seen += [r.value for records in batches.values() for r in records]
    finally:
        await consumer.stop()
    assert seen == [b"committed", b"end"]
