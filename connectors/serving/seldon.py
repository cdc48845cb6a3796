"""Seldon Core 2's Kafka traffic: topic names, record keys, headers, Confluent framing, and
the Open Inference Protocol values (protobuf, or JSON) of its input and output topics.

A model's requests go to ``<prefix>.<namespace>.model.<model>.inputs`` and its responses
to ``.outputs`` (pipelines: ``.pipeline.<name>.``); a response carries its request's
record key, ``<partition>.<resource>.<requestId>`` (Seldon Core 2.10 and later) or
``<resource>.<requestId>`` (before), and goes to the same partition number (2.10 and
later). A failed inference is a text value with the header ``seldon-pipeline-errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Literal

import orjson
from google.protobuf.message import DecodeError

from vigil.connectors.events import BadEvent, Record
from vigil.connectors.serving.layouts import Layouts, parse
from vigil.connectors.serving.message import Inference, Role
from vigil.connectors.serving.oip import from_json
from vigil.connectors.serving.rows import Row

Headers = tuple[tuple[str, bytes], ...]

ERROR_HEADER = "seldon-pipeline-errors"
TYPE_HEADER = "seldon-infer-type"
REQUEST_ID_HEADER = "x-request-id"
_RESPONSE_TYPES = (b"proto/InferModelResponse", b"json/inferModelResponse")
_READING = frozenset((ERROR_HEADER, TYPE_HEADER))
"""The headers that can change how a record's value reads."""

Kind = Literal["model", "pipeline"]


def topics(prefix: str, namespace: str, kind: Kind, name: str) -> tuple[str, str]:
    """The inputs and outputs topics of a model or pipeline (an empty namespace is
    Seldon's ``default``)."""
    base = f"{prefix}.{namespace or 'default'}.{kind}.{name}"
    return f"{base}.inputs", f"{base}.outputs"


def role_of(topic: str) -> Role:
    """Requests on ``.inputs`` topics, responses on ``.outputs`` topics."""
    if topic.endswith(".inputs"):
        return "request"
    if topic.endswith(".outputs"):
        return "response"
    raise ValueError(f"{topic}: not a Seldon inputs or outputs topic")


def request_id(key: str) -> str:
    """The request id a record key ends with (``<partition>.<resource>.<id>`` or
    ``<resource>.<id>``; resource names may hold dots, ids do not)."""
    return key.rpartition(".")[2]


def unframe(value: bytes) -> bytes:
    """The protobuf bytes of a value with Confluent schema-registry framing (magic byte 0,
    a 4-byte schema id, the message indexes as zigzag varints: a single 0 for the first
    message), or the value itself (a protobuf message never starts with a 0 byte)."""
    if not value or value[0] != 0:
        return value
    if len(value) < 6:
        raise BadEvent("undecodable", f"a framed value of {len(value)} bytes has no message")
    at = 5
    count, at = _zigzag(value, at)
    for _ in range(count):  # a count of 0 stands for the index list [0]
        _, at = _zigzag(value, at)
    return value[at:]


def _zigzag(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(data):
            raise BadEvent("undecodable", "the schema-registry framing ends inside a varint")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def join_key(record: Record) -> bytes:
    """What pairs a request with its response: the record key the two share, or without
    one the ``x-request-id`` header."""
    if record.key:
        return record.key
    header = record.header(REQUEST_ID_HEADER)
    if header is None:
        raise BadEvent("schema", "no record key and no x-request-id header: cannot pair it")
    return header


def decode(record: Record, model: str, layouts: Layouts | None = None) -> Inference:
    """The request or response in ``record`` (which by its topic, unless its
    ``seldon-infer-type`` header says it holds a response), for ``model``; protobuf values
    are read by the ``layouts`` of the model's traffic when given (the same tensors, or
    the decision row, with no parse when the message repeats a known layout)."""
    key = join_key(record).decode(errors="replace")
    role = role_of(record.topic)
    value = record.value or b""
    if layouts is not None:  # one-row traffic's common case: a known layout, no parse
        row = layout_row(role, value, record.headers, layouts)
        if row is not None:
            return Inference(key, request_id(key), role, model, [], None, row)
    if record.headers:
        error = record.header(ERROR_HEADER)
        if error is not None:
            text = value.decode(errors="replace")
            return Inference(key, request_id(key), "response", model, [], text or "error")
        if record.header(TYPE_HEADER) in _RESPONSE_TYPES:
            role = "response"
    payload = unframe(value)  # JSON never starts with the framing's 0 byte
    if value[:1] == b"{" or (value[:1].isspace() and value.lstrip()[:1] == b"{"):
        return Inference(key, request_id(key), role, model, _json_tensors(value, role))
    return Inference(key, request_id(key), role, model, _parsed(role, payload, layouts))


def layout_row(role: Role, value: bytes, headers: Headers, layouts: Layouts) -> Row | None:
    """The decision row of a value from ``role``'s topic, read by a known layout: for a
    record that is neither an error nor a response on a request topic; None for any other
    (``decode`` reads it). Takes a record's fields, so the join builds no record for a side
    it pairs at once."""
    payload = _by_layout(role, value, headers)
    return None if payload is None else layouts.row(role, payload)


def layout_rows(
    role: Role, values: Sequence[bytes], headers: Sequence[Headers], layouts: Layouts
) -> list[Row | None]:
    """``layout_row`` of each of ``role``'s messages (``values`` and their ``headers``), in
    order, read together by ``Layouts.rows``."""
    # the usual case: no header that changes a message's reading, and none framed (the
    # smallest value is framed if any is, unless one is empty)
    named = set(map(itemgetter(0), chain.from_iterable(headers)))
    if named.isdisjoint(_READING) and min(values, default=b"")[:1] not in (b"", b"\0"):
        return layouts.rows(role, values)
    out: list[Row | None] = [None] * len(values)
    where, payloads = [], []
    for i, (value, named) in enumerate(zip(values, headers, strict=True)):
        payload = _by_layout(role, value, named)
        if payload is not None:
            where.append(i)
            payloads.append(payload)
    for i, row in zip(where, layouts.rows(role, payloads), strict=True):
        out[i] = row
    return out


def _by_layout(role: Role, value: bytes, headers: Headers) -> bytes | None:
    """The protobuf bytes of a value to be read by layout, or None for an error, a response
    on a request topic, or a framing ``decode`` refuses."""
    typed = None
    for name, data in headers:
        if name == ERROR_HEADER:
            return None
        if name == TYPE_HEADER:
            typed = data  # the last one counts, as in ``Record.header``
    if typed in _RESPONSE_TYPES and role == "request":
        return None
    if value[:1] == b"\0":  # schema-registry framing
        try:
            return unframe(value)
        except BadEvent:
            return None  # ``decode`` says why
    return value


def _parsed(role: Role, payload: bytes, layouts: Layouts | None = None) -> list:
    """A protobuf request's or response's tensors."""
    try:
        return layouts.tensors(role, payload) if layouts is not None else parse(role, payload)[1]
    except DecodeError as e:
        raise BadEvent("undecodable", f"not an OIP {role} (protobuf): {e}") from e


def _json_tensors(value: bytes, role: Role) -> list:
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise BadEvent("undecodable", f"not JSON: {e}") from e
    field = "inputs" if role == "request" else "outputs"
    tensors = body.get(field) if isinstance(body, dict) else None
    if not isinstance(tensors, list):
        raise BadEvent("schema", f"an OIP JSON {role} needs an {field!r} list")
    return [from_json(t) for t in tensors]
