"""What the pipeline needs from a source and a sink."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from vigil.connectors.events import Record

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]
"""Per partition, the offset of the next record to read (Kafka's commit convention)."""

AssignCallback = Callable[[list[TopicPartition]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class OutMessage:
    """One message to produce; ``headers`` and ``timestamp_ms`` (the record's time, None
    for now) pass a record on to an internal topic as it came."""

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


class Source(Protocol):
    async def start(self, on_assign: AssignCallback, on_revoke: AssignCallback) -> None:
        """Begin consuming; the callbacks run on every (re)assignment of partitions."""

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        """The next records, in offset order within each partition."""

    async def commit(self, offsets: Offsets) -> None: ...

    async def committed(self, tp: TopicPartition) -> int | None:
        """The committed next offset of a partition, or None if nothing was committed."""

    async def start_offset(self, tp: TopicPartition) -> int:
        """Where a partition with no committed offset is read from (the reset policy)."""

    async def first_offset(self, tp: TopicPartition) -> int:
        """The offset of the partition's first retained record (retention deletes the ones
        before it)."""

    async def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def lag(self) -> dict[TopicPartition, int]:
        """Per assigned partition, records between the read position and the end."""

    def end_offset(self, tp: TopicPartition) -> int | None:
        """The offset after the partition's last readable record, as of the last fetch
        (None while unknown)."""

    def pause_only(self, tps: set[TopicPartition]) -> None:
        """Fetch nothing more of ``tps`` (of the assigned partitions), and again from every
        other partition, until the next call."""

    def assignment(self) -> list[TopicPartition]: ...

    async def stop(self) -> None: ...


class Sink(Protocol):
    commits_offsets: bool
    """True when ``deliver`` commits the source offsets itself (Kafka transactions)."""

    async def start(self) -> None: ...

    async def deliver(self, messages: list[OutMessage], offsets: Offsets) -> None:
        """Return once every message is durably acknowledged (and, when ``commits_offsets``,
        the offsets committed atomically with them)."""

    async def stop(self) -> None: ...
