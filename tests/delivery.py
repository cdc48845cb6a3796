"""Checking what a transactional in-memory sink was given."""

from __future__ import annotations

import orjson

from vigil.connectors.base import TopicPartition
from vigil.connectors.memory import MemorySink


def answers_within_commits(
    sink: MemorySink, tp: TopicPartition
) -> tuple[list[tuple[str, dict]], int]:
    """Every (topic, event) the sink received, in order, after asserting that each answers a
    record of ``tp`` below the commit delivered with it; and the last commit."""
    committed, answered = 0, []
    for messages, offsets in sink.deliveries:
        committed = offsets.get(tp, committed)
        for m in messages:
            event = orjson.loads(m.value)
            offset = event["source"]["offset"]
            assert offset < committed, f"record {offset} answered before its commit"
            answered.append((m.topic, event))
    return answered, committed
