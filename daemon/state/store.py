"""Where rules' snapshots live, and the local-directory store.

A store keeps, per rule and source partition, snapshots with the source offset each
reflects, where the state begins when no snapshot holds it (its origin) and whether it lacks
records retention deleted (a gap). ``FileStore`` keeps them in a directory (one host's copy);
``KafkaStore`` (kafka_store.py) in a compacted topic, so they move with their partitions.

``FileStore`` layout: ``<dir>/<rule>/<topic>.<partition>/<offset>.snap``. A file is a JSON
header line (offset, length, sha256) followed by the checker's bytes; it is written
atomically, and a file whose header or checksum does not match is skipped for the previous
one.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
import structlog

from vigil.connectors.base import TopicPartition
from vigil.connectors.files import atomic_write
from vigil.daemon.adapters.base import StatePart

log = structlog.get_logger("vigil.state")

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_ORIGIN = "origin.json"
_GAP = "gap.json"


@dataclass(frozen=True)
class Snapshot:
    """A rule's state of a partition after every record before ``offset``: a base and the
    segments that continue it."""

    offset: int
    parts: list[bytes]


class StateStore(Protocol):
    """What recovery and the pipeline need of a store. ``open`` comes before the reads of a
    partition; ``take`` and ``save`` of one rule and partition come in order."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def open(self, tp: TopicPartition) -> None: ...
    def close(self, tp: TopicPartition) -> None: ...
    async def load(
        self, rule: str, tp: TopicPartition, at_most: int | None = None
    ) -> tuple[Snapshot | None, int]: ...
    def forget(self, rule: str, tp: TopicPartition) -> None: ...
    def take(
        self,
        rule: str,
        tp: TopicPartition,
        snapshot: Callable[[int | None], StatePart | None],
    ) -> StatePart | None: ...
    async def save(
        self, rule: str, tp: TopicPartition, offset: int, part: StatePart, committed: int = 0
    ) -> None: ...
    def origin(self, rule: str, tp: TopicPartition) -> int: ...
    async def mark_origin(self, rule: str, tp: TopicPartition, offset: int) -> None: ...
    def gap(self, rule: str, tp: TopicPartition) -> int | None: ...
    async def mark_gap(self, rule: str, tp: TopicPartition, offset: int) -> None: ...
    async def clear_gap(self, rule: str, tp: TopicPartition) -> None: ...


class FileStore:
    """Whole snapshots in a local directory: the default, and the only store of the file
    source. A host replaced with an empty directory rebuilds by replaying its partitions."""

    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = keep

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def open(self, tp: TopicPartition) -> None:
        return None

    def close(self, tp: TopicPartition) -> None:
        return None

    def forget(self, rule: str, tp: TopicPartition) -> None:
        return None

    def take(
        self,
        rule: str,
        tp: TopicPartition,
        snapshot: Callable[[int | None], StatePart | None],
    ) -> StatePart | None:
        """A base always: each file holds a whole snapshot."""
        return snapshot(None)

    def _dir(self, rule: str, tp: TopicPartition) -> Path:
        topic, partition = tp
        return self.root / _SAFE.sub("_", rule) / f"{_SAFE.sub('_', topic)}.{partition}"

    async def save(
        self, rule: str, tp: TopicPartition, offset: int, part: StatePart, committed: int = 0
    ) -> None:
        """Write a snapshot taken after every record before ``offset`` was applied (in a
        thread), and drop all but the newest ``keep`` — except the newest at or before
        ``committed``, the one a restart would use while the commit is behind the newer
        ones."""
        await asyncio.to_thread(self._save, rule, tp, offset, part.blob, committed)

    def _save(
        self, rule: str, tp: TopicPartition, offset: int, blob: bytes, committed: int
    ) -> None:
        folder = self._dir(rule, tp)
        header = {"offset": offset, "length": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        path = folder / f"{offset:020d}.snap"
        atomic_write(path, orjson.dumps(header) + b"\n" + blob)
        saved = sorted(folder.glob("*.snap"))
        usable = [p for p in saved if p.stem.isdigit() and int(p.stem) <= committed][-1:]
        for old in saved[: -self.keep]:
            if old not in usable:
                old.unlink(missing_ok=True)

    async def load(
        self, rule: str, tp: TopicPartition, at_most: int | None = None
    ) -> tuple[Snapshot | None, int]:
        """The newest valid snapshot (or None) at offset ``at_most`` or before, and how many
        corrupt ones were skipped. A snapshot past ``at_most`` (the committed offset: its
        records' outputs may not have been delivered, or the group's offsets were reset
        back) is removed in favour of an older one."""
        skipped = 0
        for path in sorted(self._dir(rule, tp).glob("*.snap"), reverse=True):
            if at_most is not None and path.stem.isdigit() and int(path.stem) > at_most:
                # the replay will take newer ones; left here, this would outlive them
                log.info("snapshot_ahead_of_commit_removed", path=str(path), committed=at_most)
                path.unlink(missing_ok=True)
                continue
            snapshot = _read(path)
            if snapshot is not None and (at_most is None or snapshot.offset <= at_most):
                return snapshot, skipped
            skipped += 1
            log.warning("snapshot_corrupt_skipped", path=str(path))
        return None, skipped

    def origin(self, rule: str, tp: TopicPartition) -> int:
        """Where ``rule``'s state of ``tp`` begins when no snapshot holds it: 0, or the
        offset recorded by ``mark_origin``."""
        offset = self._marker(rule, tp, _ORIGIN, corrupt=0)
        return 0 if offset is None else offset

    async def mark_origin(self, rule: str, tp: TopicPartition, offset: int) -> None:
        """Record that ``rule``'s state of ``tp`` begins at ``offset`` (a group that started
        at the end of the partition, or a rule with no decision there yet), so a restart
        before its first snapshot replays from there rather than from the first record."""
        await self._mark(rule, tp, _ORIGIN, offset)

    def gap(self, rule: str, tp: TopicPartition) -> int | None:
        """The offset after the records ``rule``'s state of ``tp`` lacks, or None when its
        history is complete (an unreadable marker counts as a gap from 0)."""
        return self._marker(rule, tp, _GAP, corrupt=0)

    async def mark_gap(self, rule: str, tp: TopicPartition, offset: int) -> None:
        """Record that ``rule``'s state of ``tp`` lacks records before ``offset`` that its
        group had read (retention deleted them before a snapshot covered them). It stays
        so, through snapshots and restarts, until the state is rebuilt (``clear_gap``)."""
        await self._mark(rule, tp, _GAP, offset)

    async def clear_gap(self, rule: str, tp: TopicPartition) -> None:
        (self._dir(rule, tp) / _GAP).unlink(missing_ok=True)

    async def _mark(self, rule: str, tp: TopicPartition, name: str, offset: int) -> None:
        """Write a marker in a thread: origins are written at every snapshot, and the
        write's fsyncs would stall the event loop."""
        path = self._dir(rule, tp) / name
        await asyncio.to_thread(atomic_write, path, orjson.dumps({"offset": offset}))

    def _marker(self, rule: str, tp: TopicPartition, name: str, corrupt: int) -> int | None:
        path = self._dir(rule, tp) / name
        try:
            return int(orjson.loads(path.read_bytes())["offset"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("marker_corrupt", path=str(path), taken_as=corrupt)
            return corrupt


def _read(path: Path) -> Snapshot | None:
    try:
        data = path.read_bytes()
        head, _, blob = data.partition(b"\n")
        header = orjson.loads(head)
        if len(blob) != header["length"] or hashlib.sha256(blob).hexdigest() != header["sha256"]:
            return None
        return Snapshot(int(header["offset"]), [blob])
    except (OSError, ValueError, KeyError, TypeError):
        return None
