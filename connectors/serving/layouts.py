"""OIP protobuf messages read by their layout: a model's traffic repeats a few message
layouts in which only the request id and the tensors' values change, so a message whose
bytes equal a known layout's everywhere but there is read by slicing instead of parsing.

The first message of each size is parsed, and where its id and each tensor's values lie
in its bytes is found and confirmed: the message parsed again with those bytes changed
must differ from it in exactly those fields. Protobuf frames every length-delimited field
by bytes outside its contents, so a later message of the same size whose other bytes all
match parses to the same fields with its own contents there. Only contents whose values
follow from their bytes alone are read so: fixed-width raw contents, packed float and
double contents, and packed integer or boolean contents of one byte a value (labels
under 128). Any other message, or one that differs anywhere else, is parsed.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import compress, repeat
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from vigil.connectors.serving import grpc_predict_v2_pb2 as pb
from vigil.connectors.serving.message import Role
from vigil.connectors.serving.oip import (
    FIXED,
    TYPED,
    Tensor,
    request_tensors,
    response_tensors,
)
from vigil.connectors.serving.rows import Row, RowReader, TensorSelection, row_reader

KEPT = 64
"""Message sizes whose layouts are kept: a model's traffic has a few."""
MAX_BYTES = 1 << 16
"""Larger messages are parsed: their tensors' bytes, not the parse, take their time."""
BLOCK_FROM = 8
"""Messages of one size from which ``Layouts.rows`` reads them as a block."""
RELEARN_EVERY = 256
"""A size whose layout could not be found, or whose messages stopped matching it, is
looked at again after this many parsed messages of that size."""
MAX_CANDIDATES = 16
"""Places tried for one field's contents before its layout is given up."""


def _tag(message: Any, field: str) -> int:
    """A length-delimited field's tag byte (all those read here have numbers under 16)."""
    return message.DESCRIPTOR.fields_by_name[field].number << 3 | 2


_TAG_ID = {
    "request": _tag(pb.ModelInferRequest, "id"),
    "response": _tag(pb.ModelInferResponse, "id"),
}
_TAG_RAW = {
    "request": _tag(pb.ModelInferRequest, "raw_input_contents"),
    "response": _tag(pb.ModelInferResponse, "raw_output_contents"),
}
_FLOATS = ("FP32", "FP64")
"""Typed contents of fixed width (packed float and double); the others' values are varints,
one byte each when every value is under 128."""


@dataclass(frozen=True, slots=True)
class Values:
    """Where one tensor's values lie in a message of the layout, and how they read."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    start: int  # in the message; 0 until the field is placed
    count: int
    dtype: np.dtype
    one_byte: bool  # varints of one byte each: read as uint8, all under 128


@dataclass(frozen=True, slots=True)
class Layout:
    """One message layout: the bytes that must match, where the id lies (valid UTF-8 is
    all it must be), the tensors' values, and where values of one byte each lie (each must
    be under 128, or the message holds fewer values there than the layout)."""

    constant: tuple[tuple[int, bytes], ...]
    text: tuple[tuple[int, int], ...]
    values: tuple[Values, ...]
    one_byte: tuple[tuple[int, int], ...]

    def matches(self, payload: bytes) -> bool:
        """Whether a message of this layout's size is of it: every tensor's values where
        the layout has them, selected for a row or not."""
        for at, run in self.constant:
            if not payload.startswith(run, at):
                return False
        for start, stop in self.one_byte:
            if not payload[start:stop].isascii():
                return False  # a value of 128 or more: more bytes than the layout's
        for start, stop in self.text:
            chunk = payload[start:stop]
            if not chunk.isascii():
                try:
                    chunk.decode()
                except UnicodeDecodeError:
                    return False  # the parse names the error
        return True

    def matching(self, block: np.ndarray) -> np.ndarray:
        """Which messages of an ``(n, size)`` block of this layout's size are of it, as
        ``matches`` says, but for an id of non-ASCII text: that message is not counted in
        (``matches`` tells it alone)."""
        ok = np.ones(len(block), dtype=bool)
        for at, run in self.constant:
            ok &= (block[:, at : at + len(run)] == np.frombuffer(run, _BYTE)).all(axis=1)
        for start, stop in (*self.one_byte, *self.text):
            ok &= (block[:, start:stop] < 128).all(axis=1)
        return ok

    def read(self, payload: bytes) -> list[Tensor] | None:
        """The tensors of a message of this layout's size, or None when it is not of it."""
        if not self.matches(payload):
            return None
        out = []
        for v in self.values:
            if v.one_byte:
                data = np.ndarray(v.shape, _BYTE, payload, v.start).astype(v.dtype)
            else:
                data = np.ndarray(v.shape, v.dtype, payload, v.start)
            out.append(Tensor(v.name, v.datatype, v.shape, data))
        return out


_BYTE = np.dtype(np.uint8)


class Layouts:
    """The layouts of one stream's requests and responses, learned from its messages; with
    a tensor selection, also how each layout's messages give their decision row."""

    def __init__(self, selection: TensorSelection | None = None) -> None:
        self.selection = selection
        self._known: dict[tuple[Role, int], Layout | None] = {}
        self._parsed: dict[tuple[Role, int], int] = {}  # since the size was first seen
        # by role, then size: no key tuple built per message
        self._rows: dict[Role, dict[int, tuple[Layout, RowReader]]] = {
            "request": {},
            "response": {},
        }

    def __len__(self) -> int:
        return sum(layout is not None for layout in self._known.values())

    def row(self, role: Role, payload: bytes) -> Row | None:
        """The decision row of a message of a known layout whose selected tensor holds one
        row (``rows.RowReader``), read from its bytes; None when the message is to be read
        as tensors. Bytes it reads are never JSON text (``_json_like``), so a record's value
        may be tried here before it is told from JSON."""
        known = self._rows[role].get(len(payload))
        if known is None or not known[0].matches(payload):
            return None
        return known[1](payload)

    def rows(self, role: Role, payloads: Sequence[bytes]) -> list[Row | None]:
        """``row`` of each payload, in order; the messages of one size are read together,
        as one block of bytes (a fraction of the time a message read alone takes)."""
        known = self._rows[role]
        sizes = list(map(len, payloads))
        out: list[Row | None] = [None] * len(payloads)
        for size in known.keys() & set(sizes):
            mine = list(map(operator.eq, sizes, repeat(size)))
            where = list(compress(range(len(payloads)), mine))
            if len(where) < BLOCK_FROM:
                for i in where:
                    out[i] = self.row(role, payloads[i])
                continue
            layout, reader = known[size]
            block = np.frombuffer(b"".join(compress(payloads, mine)), _BYTE)
            block = block.reshape(len(where), size)
            read = reader.many(block)
            matching = layout.matching(block)
            if len(where) == len(payloads) and matching.all():
                return read  # one layout's messages, all of it: the usual case
            for i, ok, row in zip(where, matching.tolist(), read, strict=True):
                out[i] = row if ok else self.row(role, payloads[i])
        return out

    def tensors(self, role: Role, payload: bytes) -> list[Tensor]:
        """The tensors of a request's or a response's protobuf bytes; raises protobuf's
        ``DecodeError`` or ``BadEvent`` as parsing them does."""
        key = (role, len(payload))
        layout = self._known.get(key)
        if layout is not None:
            tensors = layout.read(payload)
            if tensors is not None:
                return tensors
        message, tensors = parse(role, payload)
        if len(payload) <= MAX_BYTES:
            self._learn(key, payload, message, tensors)
        return tensors

    def _learn(
        self, key: tuple[Role, int], payload: bytes, message: Any, tensors: list[Tensor]
    ) -> None:
        """Learn the size's layout from its first parsed message, and again after every
        ``RELEARN_EVERY`` more (a layout that was not found, or that changed)."""
        parsed = self._parsed.get(key)
        if parsed is None:
            if len(self._known) >= KEPT:
                return
            parsed = 0
        self._parsed[key] = parsed + 1
        if parsed % RELEARN_EVERY == 0:
            layout = self._known[key] = learn(key[0], payload, message, tensors)
            reader = None
            if layout is not None and self.selection is not None and not _json_like(layout):
                reader = row_reader(layout.values, key[0], self.selection)
            if reader is None:
                self._rows[key[0]].pop(key[1], None)
            else:
                self._rows[key[0]][key[1]] = (layout, reader)


_JSON_SPACE = frozenset(b" \t\n\r")


def _json_like(layout: Layout) -> bool:
    """Whether a message of the layout could begin as JSON text does: unless its first
    constant bytes hold a byte past JSON's whitespace that is not ``{`` (protobuf's first
    tag is often ``\\n``, then a length), whatever follows may be an object."""
    first = layout.constant[0] if layout.constant else None
    if first is None or first[0] != 0:
        return True
    lead = next((byte for byte in first[1] if byte not in _JSON_SPACE), None)
    return lead is None or lead == ord("{")


def parse(role: Role, payload: bytes) -> tuple[Any, list[Tensor]]:
    """A request's or a response's protobuf bytes parsed: the message and its tensors."""
    message = _message(role, payload)
    if role == "request":
        return message, request_tensors(message)
    return message, response_tensors(message)


def _message(role: Role, payload: bytes) -> Any:
    if role == "request":
        return pb.ModelInferRequest.FromString(payload)
    return pb.ModelInferResponse.FromString(payload)


@dataclass(frozen=True, slots=True)
class _Field:
    """A field whose contents vary: its bytes in the message, bytes of the same size that
    differ from them, which field it is (the id, raw contents ``i``, or tensor ``i``'s typed
    contents ``name``) and, for a tensor, how its values read."""

    prefix: bytes  # its tag and length, which precede the contents
    contents: bytes
    probe: bytes
    index: int | None  # None: the id
    typed: str | None  # the typed contents' field; None: raw contents (or the id)
    values: Values | None


def learn(role: Role, payload: bytes, message: Any, tensors: list[Tensor]) -> Layout | None:
    """The layout of a parsed message, or None when it has contents this does not read by
    layout or its fields cannot be placed."""
    fields = _fields(role, message, tensors)
    if fields is None:
        return None
    placed: list[tuple[int, _Field]] = []
    for field in fields:
        start = _place(role, payload, message, field, placed)
        if start is None:
            return None
        placed.append((start, field))
    if not _confirmed(role, payload, message, placed):
        return None
    # the tensors' values in field order (the tensors' order), each where it was placed
    values = tuple(replace(f.values, start=start) for start, f in placed if f.values is not None)
    constant, text, at = [], [], 0
    for start, field in sorted(placed, key=lambda p: p[0]):
        if start > at:
            constant.append((at, payload[at:start]))
        if field.values is None:
            text.append((start, start + len(field.contents)))
        at = start + len(field.contents)
    if at < len(payload):
        constant.append((at, payload[at:]))
    one_byte = tuple((v.start, v.start + v.count) for v in values if v.one_byte)
    return Layout(tuple(constant), tuple(text), values, one_byte)


def _fields(role: Role, message: Any, tensors: list[Tensor]) -> list[_Field] | None:
    """The message's varying fields: its id (when set) and every tensor's values."""
    out: list[_Field] = []
    if message.id:
        contents = message.id.encode()
        probe = bytes(98 if b == 97 else 97 for b in contents)  # "a"s, "b" where "a" was
        out.append(_Field(_prefix(_TAG_ID[role], contents), contents, probe, None, None, None))
    raw = _raw(role, message)
    for i, tensor in enumerate(tensors):
        count = tensor.data.size
        if count == 0 or tensor.datatype not in FIXED:
            return None
        dtype = np.dtype(FIXED[tensor.datatype])
        if raw:
            contents = bytes(raw[i])
            probe = bytes(b ^ 0x5A for b in contents)
            values = Values(tensor.name, tensor.datatype, tensor.shape, 0, count, dtype, False)
            out.append(_Field(_prefix(_TAG_RAW[role], contents), contents, probe, i, None, values))
            continue
        kind = _specs(role, message)[i].contents
        name = TYPED[tensor.datatype]
        one_byte = tensor.datatype not in _FLOATS
        if one_byte:
            numbers = [int(v) for v in getattr(kind, name)]
            if not all(0 <= v < 128 for v in numbers):
                return None
            contents = bytes(numbers)
            step = 2 if tensor.datatype == "BOOL" else 128
            probe = bytes((b + 1) % step for b in contents)
        else:
            floats = np.asarray(getattr(kind, name), dtype)
            contents = floats.tobytes()
            probe = np.where(floats == 1.0, 2.0, 1.0).astype(dtype).tobytes()
        values = Values(tensor.name, tensor.datatype, tensor.shape, 0, count, dtype, one_byte)
        tag = _tag(pb.InferTensorContents, name)
        out.append(_Field(_prefix(tag, contents), contents, probe, i, name, values))
    return out


def _prefix(tag: int, contents: bytes) -> bytes:
    """A length-delimited field's tag and length, as protobuf writes them."""
    out, size = bytearray([tag]), len(contents)
    while size >= 0x80:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


def _specs(role: Role, message: Any) -> Any:
    return message.inputs if role == "request" else message.outputs


def _raw(role: Role, message: Any) -> Any:
    return message.raw_input_contents if role == "request" else message.raw_output_contents


def _holds_probe(role: Role, message: Any, field: _Field) -> bool:
    if field.index is None:
        return message.id == field.probe.decode()
    if field.typed is None:
        return _raw(role, message)[field.index] == field.probe
    assert field.values is not None
    got = getattr(_specs(role, message)[field.index].contents, field.typed)
    read = np.uint8 if field.values.one_byte else field.values.dtype
    want = np.frombuffer(field.probe, read).astype(field.values.dtype)
    return np.array_equal(np.asarray(got, field.values.dtype), want)


def _clear(role: Role, message: Any, field: _Field) -> None:
    if field.index is None:
        message.id = ""
    elif field.typed is None:
        _raw(role, message)[field.index] = b""
    else:
        del getattr(_specs(role, message)[field.index].contents, field.typed)[:]


def _place(
    role: Role, payload: bytes, message: Any, field: _Field, placed: list[tuple[int, _Field]]
) -> int | None:
    """Where the field's contents lie: the first place after their tag and length, clear
    of those already found, where changing them changes that field alone."""
    needle, skip = field.prefix + field.contents, len(field.prefix)
    found, tried = payload.find(needle), 0
    while found >= 0 and tried < MAX_CANDIDATES:
        start = found + skip
        stop = start + len(field.contents)
        if all(stop <= s or start >= s + len(f.contents) for s, f in placed):
            tried += 1
            if _confirmed(role, payload, message, [(start, field)]):
                return start
        found = payload.find(needle, found + 1)
    return None


def _confirmed(role: Role, payload: bytes, message: Any, placed: list[tuple[int, _Field]]) -> bool:
    """Whether the message with each placed field's bytes swapped for its probe parses to
    the same message but for those fields, which hold their probes."""
    changed = bytearray(payload)
    for start, field in placed:
        changed[start : start + len(field.contents)] = field.probe
    try:
        probed = _message(role, bytes(changed))
    except DecodeError:
        return False
    if not all(_holds_probe(role, probed, field) for _, field in placed):
        return False
    original = type(message)()
    original.CopyFrom(message)
    for _, field in placed:
        _clear(role, probed, field)
        _clear(role, original, field)
    return probed == original
