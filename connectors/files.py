"""JSON-lines files as source and sink: the embedded default that needs no broker.

The source is one partition (a configured topic name, partition 0, offset = line index);
its committed offset lives in a small JSON file written atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path

from vigil.connectors.base import AssignCallback, Offsets, OutMessage, TopicPartition
from vigil.connectors.events import Record


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file of its own, fsync, rename: readers see the old or the new
    file, and two writers of one path never share a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class SourceFileError(ValueError):
    """The decisions file cannot be read (it is missing, or not a file)."""


class JsonLinesSource:
    """Reads an existing JSON-lines file; a missing one fails when the source is made, before
    a sink opens (and creates) any output file."""

    def __init__(self, path: Path, topic: str, offsets_file: Path) -> None:
        self.path = Path(path)
        self.tp: TopicPartition = (topic, 0)
        self._offsets_file = Path(offsets_file)
        self._lines: list[bytes] = []
        self._next = 0
        if not self.path.is_file():
            problem = "is not a file" if self.path.exists() else "no such file"
            raise SourceFileError(f"decisions file {self.path}: {problem}")

    async def start(self, on_assign: AssignCallback, on_revoke: AssignCallback) -> None:
        try:
            self._lines = self.path.read_bytes().splitlines()
        except OSError as e:
            raise SourceFileError(f"decisions file {self.path}: {e.strerror}") from None
        self._on_revoke = on_revoke
        await on_assign([self.tp])

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Record]:
        """The next lines; at the end of the file, nothing after ``timeout_ms`` (so the loop
        waits, and a signal is handled, instead of spinning)."""
        start, stop = self._next, min(self._next + max_records, len(self._lines))
        if start == stop:
            await asyncio.sleep(timeout_ms / 1000)
            return []
        self._next = stop
        topic, partition = self.tp
        return [Record(topic, partition, i, self._lines[i]) for i in range(start, stop)]

    async def commit(self, offsets: Offsets) -> None:
        if self.tp in offsets:
            atomic_write(self._offsets_file, json.dumps({"offset": offsets[self.tp]}).encode())

    async def committed(self, tp: TopicPartition) -> int | None:
        try:
            return int(json.loads(self._offsets_file.read_text())["offset"])
        except FileNotFoundError:
            return None

    async def start_offset(self, tp: TopicPartition) -> int:
        return 0

    async def first_offset(self, tp: TopicPartition) -> int:
        return 0

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self._next = offset

    async def lag(self) -> dict[TopicPartition, int]:
        return {self.tp: len(self._lines) - self._next}

    def end_offset(self, tp: TopicPartition) -> int | None:
        return len(self._lines)

    def pause_only(self, tps: set[TopicPartition]) -> None:
        return None  # one partition: the merge never holds it back

    def assignment(self) -> list[TopicPartition]:
        return [self.tp]

    async def stop(self) -> None:
        await self._on_revoke([self.tp])


class JsonLinesSink:
    """Appends each message's value as a line to the file mapped to its topic."""

    commits_offsets = False

    def __init__(self, files: dict[str, Path]) -> None:
        self._paths = {topic: Path(p) for topic, p in files.items()}
        self._handles: dict = {}

    async def start(self) -> None:
        for topic, path in self._paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handles[topic] = open(path, "ab")  # noqa: SIM115 - closed in stop()

    async def deliver(self, messages: list[OutMessage], offsets: Offsets) -> None:
        touched = set()
        for m in messages:
            self._handles[m.topic].write(m.value + b"\n")
            touched.add(m.topic)
        for topic in touched:
            self._handles[topic].flush()
            os.fsync(self._handles[topic].fileno())

    async def stop(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()
