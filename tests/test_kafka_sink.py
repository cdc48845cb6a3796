"""The exactly-once sink's retry of a transaction the broker refuses while it still writes
the previous commit's markers (CONCURRENT_TRANSACTIONS), as aiokafka's own handlers see it.

Every back-to-back delivery meets this refusal, so its wait is added to every alert's
latency (bench/txn_bench.py times it against the broker)."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka.errors import ConcurrentTransactions
from aiokafka.producer.sender import AddOffsetsToTxnHandler, AddPartitionsToTxnHandler
from aiokafka.structs import TopicPartition

from vigil.connectors.kafka import TRANSACTION_RETRY_BACKOFF_MS, KafkaSink


def refused_for(topic: str) -> SimpleNamespace:
    return SimpleNamespace(errors=[(topic, [(0, ConcurrentTransactions.errno)])])


async def test_a_refused_transaction_is_asked_again_after_the_sinks_backoff():
    assert TRANSACTION_RETRY_BACKOFF_MS < 20  # below aiokafka's fixed wait for a partition
    sink = KafkaSink("127.0.0.1:1", "group", transactional_id="vigil-test")
    sender = sink._producer._sender
    expected = TRANSACTION_RETRY_BACKOFF_MS / 1000
    # a batch with alerts: the first partition of the transaction is refused
    partitions = AddPartitionsToTxnHandler(sender, [TopicPartition("alerts", 0)])
    assert partitions.handle_response(refused_for("alerts")) == expected
    # a batch of offsets only: the group's offsets are refused
    offsets = AddOffsetsToTxnHandler(sender, "group")
    assert offsets.handle_response(SimpleNamespace(error_code=ConcurrentTransactions.errno)) == (
        expected
    )
