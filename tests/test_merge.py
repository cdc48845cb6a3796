"""The time-ordered merge of several partitions against an obviously correct oracle: a k-way
merge of each partition's whole sequence, whatever order and sizes the fetches come in."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.base import OutMessage
from vigil.connectors.events import Record
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import Answer
from vigil.daemon.checkpoint import Checkpoint
from vigil.daemon.merge import TimeMerge
from vigil.daemon.metrics import Metrics

TPS = [("seldon.m.inputs", 0), ("seldon.m.outputs", 0), ("seldon.m.outputs", 1)]


def partitions(draw_timestamps: list[list[int]]) -> dict[tuple[str, int], list[Record]]:
    return {
        tp: [Record(tp[0], tp[1], i, b"v", timestamp_ms=t) for i, t in enumerate(ts)]
        for tp, ts in zip(TPS, draw_timestamps, strict=False)
    }


def oracle(streams: dict[tuple[str, int], list[Record]]) -> list[Record]:
    """The oldest head first, ties by topic then partition, each partition in offset order."""
    heads = {tp: 0 for tp in streams}
    out = []
    while any(heads[tp] < len(rs) for tp, rs in streams.items()):
        tp = min(
            (tp for tp in streams if heads[tp] < len(streams[tp])),
            key=lambda tp: (streams[tp][heads[tp]].timestamp_ms, tp),
        )
        out.append(streams[tp][heads[tp]])
        heads[tp] += 1
    return out


timestamps = st.lists(st.lists(st.integers(0, 50), max_size=25), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(timestamps, st.data(), st.integers(1, 6))
def test_any_fetch_order_gives_the_order_of_time(ts, data, limit):
    """Fetches of random partitions and sizes, a paused partition never fetched: the
    released sequence is the oracle's, no partition ever holds more than a fetch past the
    limit, and everything is released once every partition is at its end."""
    streams = partitions(ts)
    merge = TimeMerge(idle_ms=10**9, limit=limit, clock=lambda: 0.0)
    read = dict.fromkeys(streams, 0)
    for tp in streams:
        merge.assign(tp)
    released: list[Record] = []
    paused: set = set()
    for _ in range(10_000):
        readable = [tp for tp in streams if read[tp] < len(streams[tp]) and tp not in paused]
        if not readable:
            break
        tp = data.draw(st.sampled_from(readable))
        size = data.draw(st.integers(1, 4))
        merge.add(tp, streams[tp][read[tp] : read[tp] + size])
        read[tp] = min(read[tp] + size, len(streams[tp]))
        released += merge.release(lambda tp: read[tp] < len(streams[tp]))
        assert all(held < limit + 4 for held in merge.held().values())
        paused = merge.full()
    assert not any(read[tp] < len(streams[tp]) for tp in streams), "a paused merge stalled"
    released += merge.release(lambda tp: False)
    assert released == oracle(streams)
    assert len(merge) == 0


@settings(max_examples=100, deadline=None)
@given(timestamps, st.data())
def test_the_hold_is_the_first_record_not_released(ts, data):
    streams = partitions(ts)
    merge = TimeMerge(idle_ms=10**9, limit=10**9, clock=lambda: 0.0)
    cuts = {tp: data.draw(st.integers(0, len(records))) for tp, records in streams.items()}
    for tp, records in streams.items():
        merge.add(tp, records[: cuts[tp]])
    out = merge.release(lambda tp: True)
    for tp in streams:
        taken = [r.offset for r in out if (r.topic, r.partition) == tp]
        assert taken == list(range(len(taken)))  # a prefix, in offset order
        assert merge.hold(tp) == (len(taken) if len(taken) < cuts[tp] else None)


def test_a_partition_behind_is_waited_for_its_idle_time_then_passed():
    now = [0.0]
    merge = TimeMerge(idle_ms=2000, limit=100, clock=lambda: now[0])
    requests = [Record("t.inputs", 0, i, b"v", timestamp_ms=10 * i) for i in range(3)]
    merge.add(("t.inputs", 0), requests)
    merge.assign(("t.outputs", 0))
    behind = {("t.inputs", 0): False, ("t.outputs", 0): True}
    assert merge.release(behind.__getitem__) == []  # outputs has records not yet fetched
    now[0] = 1.9
    assert merge.release(behind.__getitem__) == []
    assert merge.hold(("t.inputs", 0)) == 0
    now[0] = 2.0
    assert merge.release(behind.__getitem__) == requests  # waited long enough: time moves on
    late = Record("t.outputs", 0, 0, b"v", timestamp_ms=5)
    merge.add(("t.outputs", 0), [late])  # it came back: waited for again when it empties
    assert merge.release(behind.__getitem__) == [late]
    merge.add(("t.inputs", 0), [Record("t.inputs", 0, 3, b"v", timestamp_ms=40)])
    assert merge.release(behind.__getitem__) == []


def test_a_partition_at_its_end_holds_nothing_back():
    merge = TimeMerge(idle_ms=10**9, limit=100, clock=lambda: 0.0)
    merge.assign(("t.outputs", 0))
    request = Record("t.inputs", 0, 0, b"v", timestamp_ms=7)
    merge.add(("t.inputs", 0), [request])
    assert merge.release(lambda tp: False) == [request]


def test_a_dropped_partition_forgets_what_it_held():
    merge = TimeMerge(idle_ms=0, limit=2, clock=lambda: 0.0)
    merge.add(("t.inputs", 0), [Record("t.inputs", 0, i, b"v") for i in range(3)])
    assert merge.full() == {("t.inputs", 0)}
    merge.drop(("t.inputs", 0))
    assert merge.full() == set() and merge.hold(("t.inputs", 0)) is None and len(merge) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TPS), st.integers(0, 30)), max_size=40), st.data())
def test_a_delivery_keeps_the_merged_order_across_partitions(answered, data):
    """Exactly-once delivery puts each partition's answers in record order and leaves the
    order across partitions as the rules gave it (a merge's time order)."""
    answers = [
        Answer(tp, offset, OutMessage("out", None, str(i).encode()))
        for i, (tp, offset) in enumerate(answered)
    ]
    sink = MemorySink(commits_offsets=True)
    checkpoint = Checkpoint(MemorySource("t", []), sink, Metrics())
    for tp in TPS:
        checkpoint.assign(tp, 0)

    async def deliver() -> None:
        await checkpoint.send(answers, {tp: 31 for tp in TPS})
        await checkpoint.settle()

    asyncio.run(deliver())
    ((sent, _),) = sink.deliveries
    order = list(answers)
    for tp in TPS:  # the oracle: each partition's slots refilled with its answers sorted
        slots = [i for i, a in enumerate(answers) if a.tp == tp]
        for i, a in zip(
            slots, sorted((answers[i] for i in slots), key=lambda a: a.offset), strict=True
        ):
            order[i] = a
    assert sent == [a.message for a in order]
