"""In-memory source and sink for unit tests of the pipeline's own logic."""

from __future__ import annotations

from vigil.connectors.base import AssignCallback, Offsets, OutMessage, TopicPartition
from vigil.connectors.events import Record


class MemorySource:
    """Serves the given records of one partition (record ``i`` with ``headers[i]``, when
    given), those before ``first`` deleted (as by retention); remembers commits."""

    def __init__(
        self,
        topic: str,
        values: list[bytes | None],
        first: int = 0,
        headers: list[tuple[tuple[str, bytes], ...]] | None = None,
    ) -> None:
        self.tp: TopicPartition = (topic, 0)
        self.values = values
        self.first = first
        self.headers = headers
        self.commits: list[Offsets] = []
        self._next = first

    async def start(self, on_assign: AssignCallback, on_revoke: AssignCallback) -> None:
        self._on_revoke = on_revoke
        await on_assign([self.tp])

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        start, stop = self._next, min(self._next + max_records, len(self.values))
        self._next = stop
        return [
            Record(
                self.tp[0], 0, i, self.values[i], headers=self.headers[i] if self.headers else ()
            )
            for i in range(start, stop)
        ]

    async def commit(self, offsets: Offsets) -> None:
        self.commits.append(dict(offsets))

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.commits[-1].get(tp) if self.commits else None

    async def start_offset(self, tp: TopicPartition) -> int:
        return self.first

    async def first_offset(self, tp: TopicPartition) -> int:
        return self.first

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self._next = max(offset, self.first)

    async def lag(self) -> dict[TopicPartition, int]:
        return {self.tp: len(self.values) - self._next}

    def end_offset(self, tp: TopicPartition) -> int | None:
        return len(self.values)

    def pause_only(self, tps: set[TopicPartition]) -> None:
        return None  # one partition: the merge never holds it back

    def assignment(self) -> list[TopicPartition]:
        return [self.tp]

    async def stop(self) -> None:
        await self._on_revoke([self.tp])


class MemorySink:
    """Keeps what it is given; with ``commits_offsets`` it stands for a transactional sink
    (each delivery's messages and offsets together in ``deliveries``)."""

    def __init__(self, commits_offsets: bool = False) -> None:
        self.commits_offsets = commits_offsets
        self.messages: list[OutMessage] = []
        self.deliveries: list[tuple[list[OutMessage], Offsets]] = []

    async def start(self) -> None:
        pass

    async def deliver(self, messages: list[OutMessage], offsets: Offsets) -> None:
        self.messages.extend(messages)
        self.deliveries.append((list(messages), dict(offsets)))

    async def stop(self) -> None:
        pass
