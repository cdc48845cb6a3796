"""Event records and the JSON codec (orjson) for the event kinds in connectors/schemas/."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import chain
from typing import Annotated, Any, NamedTuple, overload

import msgspec
import numpy as np
import orjson


def now_iso() -> str:
    """The current UTC time as the events' timestamp format (milliseconds, ``Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Record(msgspec.Struct, gc=False):
    """One message from a source; ``offset`` orders it within its partition.

    Records and decisions are built once per message and never modified. They are structs
    built in C, untracked by the cyclic collector (they hold no cycles): a slotted
    dataclass took twice as long to build and counted towards every young collection
    (docs/benchmarks.md)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (Kafka allows repeats), or None."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return None

    @property
    def source(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


class BadEvent(ValueError):
    """An event that cannot be processed; ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Decision(msgspec.Struct, gc=False):
    """A decoded decision event; ``x`` and ``y`` are validated per rule, in batches. ``x`` is
    None when the event names its inputs in ``features`` instead. ``event`` is the whole
    parsed event, for rules that read other fields (``features``, ``embedding``, ``cfx``);
    a decision decoded from its envelope alone parses it on first use."""

    record: Record
    id: str | int
    model: str
    x: Any
    y: Any
    parsed: dict[str, Any] | None = None

    @property
    def event(self) -> dict[str, Any]:
        if self.parsed is None:
            self.parsed = orjson.loads(self.record.value)
        return self.parsed


_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An integer orjson reads as one (it reads those past 64 bits as floats; the unsigned
range above int64 is left to the checked path)."""


class _Envelope(msgspec.Struct, gc=False):
    """The common decision shape, typed so that the decoder checks it in one pass: the
    numbers of ``x`` arrive as floats, any other shape fails to decode."""

    id: _Int64 | str
    model: str
    x: list[float]
    y: _Int64 | float | list[float]
    features: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # only seen, not built


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def decode_decision(record: Record) -> Decision:
    """Parse and check the decision envelope; raises ``BadEvent`` naming what is wrong.

    The common shape (``id``, ``model``, ``x``, ``y``, no ``features``) is read by the
    typed envelope decoder, which builds no dict for the event (docs/benchmarks.md);
    anything else is parsed whole and goes through ``_check_envelope``, which gives the
    errors. Both read every event alike (tests/test_decode_fast_path.py)."""
    if record.value is None:
        raise BadEvent("undecodable", "empty message (tombstone)")
    e = _common(record.value)
    if e is not None:
        return Decision(record, e.id, e.model, e.x, e.y)
    try:
        event = orjson.loads(record.value)
    except orjson.JSONDecodeError as err:
        raise _classify_undecodable(record.value, err) from None
    return _check_envelope(record, event)


class Envelopes(NamedTuple):
    """The typed envelopes among a batch's values, in a form that crosses to another process
    cheaply: their inputs as one float64 matrix, not lists of Python floats."""

    read: list[int]
    """Positions in the batch of the values read."""
    ids: list[int | str]
    models: list[str]
    ys: list[Any]
    x: np.ndarray


def read_envelopes(values: list[bytes | None]) -> Envelopes:
    """The values ``decode_decision`` reads with its typed envelope, whose ``x`` has the
    batch's most common length; the others are left to ``decode_decision``. One pass over
    the values, the inputs copied once into the matrix: this is the decode worker's whole
    job, and at 100,000 decisions/s it can be the pipeline's slower half."""
    read, envelopes = [], []
    for i, value in enumerate(values):
        if value is not None and (e := _common(value)) is not None:
            read.append(i)
            envelopes.append(e)
    lengths = [len(e.x) for e in envelopes]
    width = min(lengths, default=0)
    if width != max(lengths, default=0):  # mixed shapes: keep the most common one
        width = Counter(lengths).most_common(1)[0][0]
        kept = [k for k, n in enumerate(lengths) if n == width]
        read, envelopes = [read[k] for k in kept], [envelopes[k] for k in kept]
    rows = chain.from_iterable(e.x for e in envelopes)
    x = np.fromiter(rows, np.float64, count=len(envelopes) * width)
    return Envelopes(
        read,
        [e.id for e in envelopes],
        [sys.intern(e.model) for e in envelopes],  # pickled once per batch, not once per event
        [e.y for e in envelopes],
        x.reshape(len(envelopes), width),
    )


class DecisionRun(Sequence[Decision]):
    """Consecutive decisions of a batch the decode worker read, held as its columns: their
    records, ids, models and labels, and their inputs as rows of one matrix. A ``Decision``
    is built only for one asked for (the i.o.r. rule reads the columns, and builds one for a
    decision it alerts on), and is the one ``decode_decision`` gives, with ``x`` a row of
    the matrix."""

    __slots__ = ("_built", "ids", "models", "records", "x", "ys")

    def __init__(
        self,
        records: list[Record],
        ids: list[int | str],
        models: list[str],
        ys: list[Any],
        x: np.ndarray,
    ) -> None:
        self.records, self.ids, self.models, self.ys, self.x = records, ids, models, ys, x
        self._built: dict[int, Decision] = {}

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, i: int) -> Decision: ...
    @overload
    def __getitem__(self, i: slice) -> DecisionRun: ...
    def __getitem__(self, i: int | slice) -> Decision | DecisionRun:
        if isinstance(i, slice):
            return DecisionRun(self.records[i], self.ids[i], self.models[i], self.ys[i], self.x[i])
        i = range(len(self.records))[i]  # a negative index counts from the end
        built = self._built.get(i)
        if built is None:
            built = self._built[i] = Decision(
                self.records[i], self.ids[i], self.models[i], self.x[i], self.ys[i]
            )
        return built


def _common(value: bytes) -> _Envelope | None:
    """The event read by the typed envelope if it has the common shape, else None."""
    try:
        e = _ENVELOPE.decode(value)
    except msgspec.MsgspecError:
        return None
    return e if e.features is msgspec.UNSET else None


def _check_envelope(record: Record, event: Any) -> Decision:
    """The decision in a parsed event, checked field by field; ``BadEvent`` names the first
    problem found."""
    if not isinstance(event, dict):
        raise BadEvent("schema", f"expected a JSON object, got {type(event).__name__}")
    missing = [k for k in ("id", "model", "y") if k not in event]
    if "x" not in event and "features" not in event:
        missing.append("x (or features)")
    if missing:
        raise BadEvent("schema", f"missing field(s): {', '.join(missing)}")
    ident, model, x, y = event["id"], event["model"], event.get("x"), event["y"]
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        raise BadEvent("schema", f"id must be a string or integer, got {type(ident).__name__}")
    if not isinstance(model, str):
        raise BadEvent("schema", f"model must be a string, got {type(model).__name__}")
    if "x" in event and not isinstance(x, list):
        raise BadEvent("schema", f"x must be an array of numbers, got {type(x).__name__}")
    if "features" in event and not isinstance(event["features"], dict):
        raise BadEvent("schema", "features must be an object of named numbers")
    if isinstance(y, bool) or not isinstance(y, int | float | list):
        raise BadEvent("schema", f"y must be a label or an array, got {type(y).__name__}")
    return Decision(record, ident, model, x, y, event)


def _classify_undecodable(value: bytes, error: Exception) -> BadEvent:
    """Tell NaN/Infinity literals and numbers beyond float range (valid for many JSON writers)
    from garbage, such as a lone surrogate escape that Python's parser accepts but orjson
    rightly does not, or nesting too deep for either parser."""
    non_finite: list[str] = []

    def constant(text: str) -> float:
        non_finite.append(text)
        return math.nan

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            non_finite.append(text)
        return value

    try:
        json.loads(value, parse_constant=constant, parse_float=number)
    except (ValueError, UnicodeDecodeError, RecursionError):
        non_finite.clear()
    if not non_finite:
        return BadEvent("undecodable", f"not valid JSON: {error}")
    return BadEvent("non_finite", f"{non_finite[0]} in the event")


PAYLOAD_LIMIT = 256 * 1024
"""Original bytes kept in a dead letter: more would not fit Kafka's default 1 MiB message
(and a dead letter that cannot be produced would stop the daemon); a longer payload is
truncated, with its length and SHA-256 to match it against the source record."""


def dead_letter(record: Record, reason: str, error: str, detected_at: str) -> dict[str, Any]:
    """The dead-letter event for a record: its reason, coordinates and original bytes (the
    first ``PAYLOAD_LIMIT`` of them)."""
    payload = record.value or b""
    kept = payload[:PAYLOAD_LIMIT]
    try:
        text: dict[str, Any] = {"payload": kept.decode("utf-8")}
    except UnicodeDecodeError:
        text = {"payload_base64": base64.b64encode(kept).decode("ascii")}
    if len(kept) < len(payload):
        text.update(
            payload_truncated=True,
            payload_bytes=len(payload),
            payload_sha256=hashlib.sha256(payload).hexdigest(),
        )
    return {
        "kind": "dead_letter",
        "reason": reason,
        "error": error,
        "source": record.source,
        **text,
        "detected_at": detected_at,
    }


def encode(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY)
