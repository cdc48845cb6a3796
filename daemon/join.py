"""Requests waiting for their responses (and responses for their requests) of one partition,
in stream order: the state of the join that turns a serving stack's traffic into decisions.

Time is stream time, the largest record timestamp seen, so a replay of the same records
pairs and expires exactly as the first pass did. An entry expires (it is reported, never
dropped silently) once stream time has passed its timestamp by ``timeout_ms`` (checked
from the oldest arrival on: one that arrived behind a younger entry waits for it), or when
a second record of the same side and key arrives (the earlier one goes). Nothing else
bounds it: the records come merged in time order (daemon/merge.py), so what waits is what
went unanswered within the timeout.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import orjson

from vigil.connectors.events import Record
from vigil.connectors.serving.message import Inference, Role


class Waiting(msgspec.Struct, gc=False):
    """One side of an inference and the record it came from (snapshots keep the record).
    Built once per record and never modified; a struct, as ``Record`` is."""

    inference: Inference
    record: Record
    timestamp_ms: int


@dataclass(frozen=True)
class Expired:
    waiting: Waiting
    why: str  # "timeout" or "superseded"


class Join:
    """The waiting side of each unpaired inference, oldest first."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.stream_time = -1
        # arrival order; an OrderedDict finds its oldest entry at once, where a dict walks
        # past every entry removed from its front since it was last resized
        self._waiting: OrderedDict[tuple[str, Role], Waiting] = OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[Waiting]:
        return list(self._waiting.values())

    def add(
        self, inference: Inference, record: Record, timestamp_ms: int
    ) -> tuple[tuple[Waiting, Waiting] | None, list[Expired]]:
        """Take one side: the (request, response) pair it completes, if any, and the entries
        this arrival expired."""
        partner, expired = self.take(inference.join_key, inference.role, timestamp_ms)
        arrived = Waiting(inference, record, timestamp_ms)
        if partner is not None:
            pair = (partner, arrived) if inference.role == "response" else (arrived, partner)
            return pair, expired
        superseded = self.put(arrived)
        if superseded is not None:
            expired.append(superseded)
        return None, expired

    def take(
        self, join_key: str, role: Role, timestamp_ms: int
    ) -> tuple[Waiting | None, list[Expired]]:
        """The first step of an arrival: stream time moved to it, the entries that expired,
        and the other side of its inference when that waits (taken out). Without one, the
        arrival is to be ``put``; a caller that needs no ``Waiting`` for a side that pairs
        at once builds none."""
        if timestamp_ms > self.stream_time:
            self.stream_time = timestamp_ms
        waiting = self._waiting
        expired: list[Expired] = []
        cutoff = self.stream_time - self.timeout_ms
        if waiting and next(iter(waiting.values())).timestamp_ms < cutoff:
            expired = self._expire(cutoff)
        other: Role = "response" if role == "request" else "request"
        return waiting.pop((join_key, other), None), expired

    def put(self, arrived: Waiting) -> Expired | None:
        """The second step of an arrival its ``take`` did not pair: it waits, and an earlier
        one of the same side and key goes (returned)."""
        key = (arrived.inference.join_key, arrived.inference.role)
        earlier = self._waiting.pop(key, None)
        self._waiting[key] = arrived
        return None if earlier is None else Expired(earlier, "superseded")

    def _expire(self, cutoff: int) -> list[Expired]:
        """Oldest arrivals first, up to the first still in time, at ``cutoff`` or later
        (timestamps come nearly in order; one behind a younger arrival waits for it)."""
        waiting = self._waiting
        out = []
        while waiting:
            key, oldest = next(iter(waiting.items()))
            if oldest.timestamp_ms >= cutoff:
                break
            out.append(Expired(waiting.pop(key), "timeout"))
        return out

    def snapshot(self) -> bytes:
        """The waiting records and the stream time, as bytes."""
        return orjson.dumps(
            {
                "stream_time": self.stream_time,
                "waiting": [_record_json(w.record, w.timestamp_ms) for w in self._waiting.values()],
            }
        )

    @classmethod
    def restore(
        cls,
        blob: bytes,
        decode: Callable[[Record], Inference],
        timeout_ms: int,
    ) -> Join:
        """A join from ``snapshot``'s bytes; ``decode`` reads each waiting record again."""
        state = orjson.loads(blob)
        join = cls(timeout_ms)
        join.stream_time = state["stream_time"]
        for item in state["waiting"]:
            record, timestamp = _record_of(item)
            inference = decode(record)
            join._waiting[(inference.join_key, inference.role)] = Waiting(
                inference, record, timestamp
            )
        return join


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _record_json(record: Record, timestamp_ms: int) -> list:
    headers = [[name, _b64(value)] for name, value in record.headers]
    return [
        record.topic,
        record.partition,
        record.offset,
        timestamp_ms,
        _b64(record.key),
        _b64(record.value),
        headers,
    ]


def _record_of(item: list) -> tuple[Record, int]:
    topic, partition, offset, timestamp, key, value, headers = item
    pairs = tuple((name, _bytes(v) or b"") for name, v in headers)
    return Record(topic, partition, offset, _bytes(value), _bytes(key), pairs), timestamp
