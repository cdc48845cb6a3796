"""Several partitions' records as one sequence in record-timestamp order, as Kafka Streams
reads a task's input partitions: the partition whose buffered head is oldest goes first
(ties by topic, then partition), so a backlog read in whatever order fetches bring it comes
out in the order it was written in time.

A partition with nothing buffered holds the merge back while records of it are known to
exist past the read position (it is behind), for at most ``idle_ms``: after that, time
moves past it until records of it arrive again. A partition at its end holds nothing back
(live traffic is not delayed by a quiet partition). A partition holding ``limit`` records
is full: the reader pauses it, so memory stays bounded and the partition that is behind
is read meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush

from vigil.connectors.base import TopicPartition
from vigil.connectors.events import Record


class TimeMerge:
    """The records taken from a set of partitions and not yet released, per partition."""

    def __init__(self, idle_ms: int, limit: int, clock: Callable[[], float] = time.monotonic):
        self.idle_ms, self.limit, self._clock = idle_ms, limit, clock
        self._buffers: dict[TopicPartition, deque[Record]] = {}
        self._empty_since: dict[TopicPartition, float] = {}  # behind and empty, since when
        self._given_up: set[TopicPartition] = set()  # waited ``idle_ms`` for: passed over

    def __len__(self) -> int:
        return sum(map(len, self._buffers.values()))

    def assign(self, tp: TopicPartition) -> None:
        self._buffers.setdefault(tp, deque())

    def drop(self, tp: TopicPartition) -> None:
        """Forget a partition and what it buffered (its next reader reads it again)."""
        self._buffers.pop(tp, None)
        self._empty_since.pop(tp, None)
        self._given_up.discard(tp)

    def add(self, tp: TopicPartition, records: list[Record]) -> None:
        """Take a partition's next records (in offset order)."""
        if records:
            self._buffers.setdefault(tp, deque()).extend(records)
            self._empty_since.pop(tp, None)
            self._given_up.discard(tp)

    def hold(self, tp: TopicPartition) -> int | None:
        """The offset of the partition's oldest record not yet released (a commit must stay
        behind it), or None."""
        buffer = self._buffers.get(tp)
        return buffer[0].offset if buffer else None

    def held(self) -> dict[TopicPartition, int]:
        """Records held per partition."""
        return {tp: len(buffer) for tp, buffer in self._buffers.items()}

    def full(self) -> set[TopicPartition]:
        """The partitions holding ``limit`` records or more: to be paused."""
        return {tp for tp, b in self._buffers.items() if len(b) >= self.limit}

    def _waiting_for(self, behind: Callable[[TopicPartition], bool]) -> list[TopicPartition]:
        """The partitions the merge waits for now: nothing buffered, behind their end, and
        not yet waited for ``idle_ms`` (the wait starts now for one found so first)."""
        now = self._clock()
        return [
            tp
            for tp, buffer in self._buffers.items()
            if not buffer and self._waits(tp, behind, now)
        ]

    def release(self, behind: Callable[[TopicPartition], bool]) -> list[Record]:
        """The records whose turn has come, oldest first: up to the point where a partition
        the merge waits for runs out of buffered records."""
        if not any(self._buffers.values()) or self._waiting_for(behind):
            return []
        heads = [
            (buffer[0].timestamp_ms, tp, buffer) for tp, buffer in self._buffers.items() if buffer
        ]
        heapify(heads)
        out: list[Record] = []
        while heads:
            _, tp, buffer = heappop(heads)
            if heads:  # its run before the next partition's head goes at once
                next_time, next_tp, _ = heads[0]
                out.append(buffer.popleft())
                while buffer and (
                    (time_ms := buffer[0].timestamp_ms) < next_time
                    or (time_ms == next_time and tp < next_tp)
                ):
                    out.append(buffer.popleft())
            else:
                out += buffer
                buffer.clear()
            if buffer:
                heappush(heads, (buffer[0].timestamp_ms, tp, buffer))
            elif self._waits(tp, behind, self._clock()):
                break
        return out

    def _waits(
        self, tp: TopicPartition, behind: Callable[[TopicPartition], bool], now: float
    ) -> bool:
        """Whether the merge waits for ``tp``, which has nothing buffered."""
        if tp in self._given_up:
            return False
        if not behind(tp):
            self._empty_since.pop(tp, None)
            return False
        since = self._empty_since.setdefault(tp, now)
        if (now - since) * 1000 < self.idle_ms:
            return True
        self._given_up.add(tp)
        del self._empty_since[tp]
        return False
