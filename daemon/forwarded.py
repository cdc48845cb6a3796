"""The join topic's record format: many of the serving stack's records, as they came (topic,
partition, offset, timestamp, key, headers, value), in one join-topic record.

One produce and one consume per forward step instead of one per record: the Kafka client
costs microseconds a record (docs/benchmarks.md), twice per forwarded record. A frame is a
fixed little-endian head, then the topic, key, value and headers' bytes; a missing key or
value is length -1.
"""

from __future__ import annotations

import struct

from vigil.connectors.events import Record

PACK_HEADER = "vigil-records"
"""Marks a join-topic record holding packed records (its value: their frames)."""
PACK_BYTES = 256 << 10
"""Frames per join-topic record, in bytes, at most (one larger record goes alone): under the
producer's batch (512 KiB) and the broker's default message limit (1 MiB)."""

_HEAD = struct.Struct("<HiqqiiH")  # topic length, partition, offset, timestamp, key, value, headers
_HEADER = struct.Struct("<Hi")  # name length, value length


def frame(record: Record, topic: bytes) -> bytes:
    """One record as a frame (``topic``: its topic, encoded)."""
    key, value, headers = record.key, record.value, record.headers
    head = _HEAD.pack(
        len(topic),
        record.partition,
        record.offset,
        record.timestamp_ms,
        -1 if key is None else len(key),
        -1 if value is None else len(value),
        len(headers),
    )
    if not headers:
        return b"".join((head, topic, key or b"", value or b""))
    parts = [head, topic, key or b"", value or b""]
    for name, data in headers:
        encoded = name.encode()
        parts += (_HEADER.pack(len(encoded), len(data or b"")), encoded, data or b"")
    return b"".join(parts)


Fields = tuple[str, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]
"""A packed record's fields in ``Record``'s order (``Record(*fields)`` builds it): a tuple,
as the join builds a record only for what it keeps (docs/benchmarks.md)."""


def unpack(value: bytes) -> list[Fields]:
    """The fields of a packed value's records, in order; raises ``ValueError`` for bytes
    that are not whole frames."""
    out: list[Fields] = []
    topics: dict[bytes, str] = {}  # each decoded once: one string for all its frames
    head, head_size = _HEAD.unpack_from, _HEAD.size
    at, end = 0, len(value)
    try:
        while at < end:
            size, partition, offset, timestamp, klen, vlen, count = head(value, at)
            if klen < -1 or vlen < -1:
                raise ValueError("a frame's key or value length is negative")
            at += head_size
            raw = value[at : at + size]
            topic = topics.get(raw)
            if topic is None:
                topic = topics[raw] = raw.decode()
            at += size
            key = None
            if klen >= 0:
                key = value[at : at + klen]
                at += klen
            data = None
            if vlen >= 0:
                data = value[at : at + vlen]
                at += vlen
            headers: tuple[tuple[str, bytes], ...] = ()
            if count:
                headers, at = _headers(value, at, count)
            if at > end:
                raise ValueError("a frame runs past the end")
            out.append((topic, partition, offset, data, key, headers, timestamp))
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not packed records: {e}") from None
    return out


def _headers(value: bytes, at: int, count: int) -> tuple[tuple[tuple[str, bytes], ...], int]:
    headers = []
    for _ in range(count):
        nlen, hlen = _HEADER.unpack_from(value, at)
        if hlen < 0:  # read on, it would move backwards
            raise ValueError("a header's length is negative")
        at += _HEADER.size
        name = value[at : at + nlen].decode()
        headers.append((name, value[at + nlen : at + nlen + hlen]))
        at += nlen + hlen
    return tuple(headers), at
