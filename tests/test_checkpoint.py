"""The commit order when deliveries overlap: at least once, the next delivery's answers go out
while the commit before them is under way, and commits still follow each other in order."""

from __future__ import annotations

import asyncio

import pytest

from vigil.connectors.base import OutMessage
from vigil.connectors.memory import MemorySink, MemorySource
from vigil.daemon.adapters import Answer
from vigil.daemon.checkpoint import Checkpoint
from vigil.daemon.metrics import Metrics

TP = ("t", 0)


def _answer(offset: int) -> Answer:
    return Answer(TP, offset, OutMessage("alerts", None, str(offset).encode()))


class _SlowCommits(MemorySource):
    """Commits after a pause, logging each commit's start and end; refuses the commits
    numbered in ``refused`` (from 1)."""

    def __init__(self, log: list[str], refused: frozenset[int] = frozenset()) -> None:
        super().__init__("t", [])
        self.log, self.refused, self.calls = log, refused, 0

    async def commit(self, offsets) -> None:
        self.calls += 1
        self.log.append(f"commit {offsets[TP]}")
        await asyncio.sleep(0.01)
        if self.calls in self.refused:
            raise OSError("the coordinator refused the commit")
        await super().commit(offsets)
        self.log.append(f"committed {offsets[TP]}")


class _LoggedSink(MemorySink):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def deliver(self, messages, offsets) -> None:
        self.log.append(f"deliver {len(self.deliveries)}")
        await super().deliver(messages, offsets)


def test_the_next_answers_go_out_during_a_commit_and_the_commits_stay_in_order():
    log: list[str] = []
    source, sink = _SlowCommits(log), _LoggedSink(log)
    checkpoint = Checkpoint(source, sink, Metrics())
    checkpoint.assign(TP, 0)

    async def run() -> None:
        for k in range(3):
            await checkpoint.send([_answer(k)], {TP: k + 1})
            assert checkpoint.target(TP) == k + 1
        await checkpoint.settle()

    asyncio.run(run())
    # each commit after its own delivery and after the commit before it has ended
    for k in range(3):
        assert log.index(f"deliver {k}") < log.index(f"commit {k + 1}")
        if k:
            assert log.index(f"committed {k}") < log.index(f"commit {k + 1}")
    assert log.index("deliver 1") < log.index("committed 1")  # went out meanwhile
    assert source.commits == [{TP: 1}, {TP: 2}, {TP: 3}]
    assert checkpoint.committed[TP] == checkpoint.target(TP) == 3


def test_a_refused_commit_stops_the_commits_after_it_and_is_raised():
    """The delivery after a refused commit has sent its answers (at least once allows it:
    the restart answers those records again) but commits nothing."""
    log: list[str] = []
    source, sink = _SlowCommits(log, refused=frozenset({1})), _LoggedSink(log)
    checkpoint = Checkpoint(source, sink, Metrics())
    checkpoint.assign(TP, 0)

    async def run() -> None:
        await checkpoint.send([_answer(0)], {TP: 1})
        await checkpoint.send([_answer(1)], {TP: 2})
        with pytest.raises(OSError, match="refused"):
            await checkpoint.settle()
        with pytest.raises(OSError, match="refused"):
            await checkpoint.send([_answer(2)], {TP: 3})

    asyncio.run(run())
    assert log == ["deliver 0", "commit 1", "deliver 1"]
    assert source.commits == []
    assert checkpoint.failed and checkpoint.committed[TP] == 0


def test_exactly_once_a_delivery_waits_for_the_transaction_before_it_whole():
    """A sink that commits offsets in its transaction: one delivery at a time."""
    events: list[str] = []

    class SlowTransactions(MemorySink):
        async def deliver(self, messages, offsets) -> None:
            events.append(f"begin {offsets[TP]}")
            await asyncio.sleep(0.01)
            await super().deliver(messages, offsets)
            events.append(f"end {offsets[TP]}")

    checkpoint = Checkpoint(
        MemorySource("t", []), SlowTransactions(commits_offsets=True), Metrics()
    )
    checkpoint.assign(TP, 0)

    async def run() -> None:
        for k in range(3):
            await checkpoint.send([_answer(k)], {TP: k + 1})
        await checkpoint.settle()

    asyncio.run(run())
    assert events == ["begin 1", "end 1", "begin 2", "end 2", "begin 3", "end 3"]
    assert checkpoint.committed[TP] == 3
