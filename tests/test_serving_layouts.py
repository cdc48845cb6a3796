"""OIP protobuf messages read by their layout give exactly what parsing them gives: the same
tensors, or the same error, for every message of a stream (the oracle is the protobuf
parse itself, ``layouts.parse``)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vigil.connectors.events import BadEvent
from vigil.connectors.serving import grpc_predict_v2_pb2 as pb
from vigil.connectors.serving import layouts as layouts_module
from vigil.connectors.serving import seldon
from vigil.connectors.serving.layouts import Layouts, parse
from vigil.connectors.serving.oip import FIXED
from vigil.connectors.serving.rows import TensorSelection, input_rows, output_rows
from vigil.connectors.serving.seldon import decode

from .test_oip_tensors import TYPED_FIELD

DATATYPES = sorted(FIXED)


def message(role: str, ident: str, tensors: list, raw: bool, extra: dict) -> bytes:
    """A request or response of ``tensors`` ((name, datatype, array) each), serialized."""
    m = pb.ModelInferRequest() if role == "request" else pb.ModelInferResponse()
    m.model_name, m.id = extra.get("model", "m"), ident
    for key, value in extra.get("parameters", {}).items():
        m.parameters[key].string_param = value
    specs = m.inputs if role == "request" else m.outputs
    contents = m.raw_input_contents if role == "request" else m.raw_output_contents
    for name, datatype, x in tensors:
        spec = specs.add(name=name, datatype=datatype, shape=list(x.shape))
        if raw:
            contents.append(x.astype(x.dtype.newbyteorder("<")).tobytes())
        else:
            getattr(spec.contents, TYPED_FIELD[datatype]).extend(x.ravel().tolist())
    if role == "request" and extra.get("requested"):
        m.outputs.add(name=extra["requested"])
    return m.SerializeToString()


def values(datatype: str, shape: tuple, draw) -> np.ndarray:
    dtype = np.dtype(FIXED[datatype])
    count = int(np.prod(shape))
    if dtype.kind == "f":
        width = dtype.itemsize * 8
        items = st.floats(width=width, allow_nan=False) | st.sampled_from([0.0, 1.0, 2.0])
    elif dtype.kind == "b":
        items = st.booleans()
    else:
        info = np.iinfo(dtype)
        small = st.integers(0, min(int(info.max), 200))  # around one-byte varints' edge
        items = small | st.integers(int(info.min), int(info.max))
    return np.array(draw(st.lists(items, min_size=count, max_size=count)), dtype).reshape(shape)


def outcome(read, payload: bytes):
    """The tensors as (name, datatype, shape, dtype, values), or the error's type; a NaN
    (a corrupted float's bits) as "nan", so that two NaNs compare equal."""
    try:
        tensors = read(payload)
    except (DecodeError, BadEvent) as e:
        return type(e).__name__
    return [
        (
            t.name,
            t.datatype,
            t.shape,
            t.data.dtype,
            [_nan_named(v) for v in t.data.ravel().tolist()],
        )
        for t in tensors
    ]


def _nan_named(value):
    return "nan" if isinstance(value, float) and value != value else value


@st.composite
def streams(draw):
    """A stream's messages: one layout (role, tensors' names, types and shapes, raw or
    typed) with ids and values drawn anew for each message, some bytes corrupted."""
    role = draw(st.sampled_from(["request", "response"]))
    raw = draw(st.booleans())
    count = draw(st.integers(1, 3))
    kinds = [
        (
            f"t{i}",
            draw(st.sampled_from(DATATYPES if raw else sorted(TYPED_FIELD))),
            (draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        )
        for i in range(count)
    ]
    extra = {
        "model": draw(st.sampled_from(["m", "iris", "\x1a\x01"])),
        "parameters": draw(
            st.dictionaries(st.sampled_from(["a", "content_type"]), st.text(max_size=4), max_size=2)
        ),
        "requested": draw(st.sampled_from([None, "t0"])),
    }
    same_length_ids = draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(2, 8))):
        if same_length_ids:
            ident = draw(st.text(alphabet="abcdef0123456789-", min_size=8, max_size=8))
        else:
            ident = draw(st.text(max_size=12))
        tensors = [
            (name, datatype, values(datatype, shape, draw)) for name, datatype, shape in kinds
        ]
        payload = message(role, ident, tensors, raw, extra)
        if draw(st.integers(0, 4)) == 0:  # a corrupted copy: one byte changed
            at = draw(st.integers(0, len(payload) - 1))
            flipped = bytearray(payload)
            flipped[at] = draw(st.integers(0, 255))
            payload = bytes(flipped)
        out.append(payload)
    return role, out


@settings(max_examples=300, deadline=None)
@given(stream=streams())
def test_every_message_reads_as_its_parse(stream):
    role, payloads = stream
    layouts = Layouts()
    for payload in payloads:
        assert outcome(lambda p: layouts.tensors(role, p), payload) == outcome(
            lambda p: parse(role, p)[1], payload
        )


def _one_row(ident: str, x: np.ndarray, label: int) -> tuple[bytes, bytes]:
    request = message("request", ident, [("predict", "FP64", x)], True, {"requested": "predict"})
    response = message("response", ident, [("predict", "INT64", np.array([[label]]))], False, {})
    return request, response


def test_a_repeated_layout_is_read_without_parsing(monkeypatch):
    """One-row traffic as a model server writes it: after the first request and response,
    the next ones are read by their layout (a parse here would fail the test)."""
    rng = np.random.default_rng(0)
    layouts = Layouts()
    first = _one_row("5f0c7a1e-0000", rng.random((1, 6)), 1)
    layouts.tensors("request", first[0])
    layouts.tensors("response", first[1])
    assert len(layouts) == 2

    def refused(role, payload):
        raise AssertionError("parsed")

    monkeypatch.setattr(layouts_module, "parse", refused)
    x = rng.random((1, 6))
    request, response = _one_row("9b1d22c4-0001", x, 0)
    (got,) = layouts.tensors("request", request)
    assert got.data.tolist() == x.tolist() and got.shape == (1, 6)
    (label,) = layouts.tensors("response", response)
    assert label.data.tolist() == [[0]] and label.data.dtype == np.dtype("<i8")
    with pytest.raises(AssertionError, match="parsed"):  # a label of 128 takes two bytes
        layouts.tensors("response", _one_row("9b1d22c4-0002", x, 200)[1][:-1] + b"\x01")


def test_seldon_decode_with_layouts_gives_the_same_inference():
    from vigil.connectors.events import Record

    layouts = Layouts()
    rng = np.random.default_rng(1)
    for i in range(5):
        request, response = _one_row(f"id-{i:04d}", rng.random((1, 4)), i % 3)
        for topic, payload in (("s.d.model.m.inputs", request), ("s.d.model.m.outputs", response)):
            record = Record(topic, 0, i, payload, f"0.m.id-{i:04d}".encode(), (), 1000 + i)
            fast, slow = decode(record, "m", layouts), decode(record, "m")
            assert (fast.join_key, fast.role, fast.request_id) == (
                slow.join_key,
                slow.role,
                slow.request_id,
            )
            assert [(t.name, t.shape, t.data.tolist()) for t in fast.tensors] == [
                (t.name, t.shape, t.data.tolist()) for t in slow.tensors
            ]
    assert len(layouts) == 2


def _rows_outcome(role: str, tensors: list, selection: TensorSelection):
    """The one decision row the tensors give under ``selection`` (as ``Decision`` holds it),
    or None when they give an error or several rows."""
    try:
        if role == "request":
            rows = input_rows(tensors, selection)
            return [_nan_named(v) for v in rows[0].tolist()] if len(rows) == 1 else None
        rows = output_rows(tensors, selection)
    except BadEvent:
        return None
    if len(rows) != 1:
        return None
    value = rows[0].tolist()
    return [_nan_named(v) for v in value] if isinstance(value, list) else value


_T0_BOOLS = b"*\x1b\n\x02t0\x12\x04BOOL\x1a\x02\x03\x03*\x0b\n\t"
_T1_BOOLS = b"*\x14\n\x02t1\x12\x04BOOL\x1a\x02\x01\x02*\x04\n\x02\x00\x00"
_ONE_BOOL = (
    b"\n\x01m*\x13\n\x02t0\x12\x04BOOL\x1a\x02\x01\x01*\x03\n\x01"  # one [1, 1] BOOL, its byte next
)
_HEAD = b'\n\x01m"\x12\n\x0ccontent_type\x12\x02\x1a\x00"\x07\n\x01a\x12\x02\x1a\x00'


@settings(max_examples=300, deadline=None)
@given(stream=streams(), chosen=st.sampled_from([None, "t0", "t1", "t9"]))
# t1 read as the row; t0's nine booleans (3x3) one byte each, until a byte of 128 or more
# makes them eight (a shape the parse refuses) or leaves a varint unfinished (corrupt)
@example(
    stream=(
        "request",
        [_HEAD + _T0_BOOLS + bytes(9) + _T1_BOOLS] * 2
        + [_HEAD + _T0_BOOLS + b"\x80" + bytes(8) + _T1_BOOLS],
    ),
    chosen="t1",
)
@example(
    stream=(
        "request",
        [_HEAD + _T0_BOOLS + bytes(9) + _T1_BOOLS] * 2
        + [_HEAD + _T0_BOOLS + bytes(8) + b"\x80" + _T1_BOOLS],
    ),
    chosen="t1",
)
@example(  # a boolean written as the varint 2: protobuf reads it as true, a row as 1.0
    stream=("request", [_ONE_BOOL + b"\x00", _ONE_BOOL + b"\x00", _ONE_BOOL + b"\x02"]),
    chosen=None,
)
@example(
    stream=("response", [_ONE_BOOL + b"\x01", _ONE_BOOL + b"\x01", _ONE_BOOL + b"\x05"]),
    chosen=None,
)
def test_a_row_read_by_layout_is_the_row_its_parse_gives(stream, chosen):
    """As the join reads a message: its row by layout when it has one, else its tensors.
    Every row read so is the one row the parsed tensors give under the selection."""
    role, payloads = stream
    selection = TensorSelection(input_tensor=chosen, output_tensor=chosen)
    layouts = Layouts(selection)
    for payload in payloads:
        row = layouts.row(role, payload)
        if row is None:
            outcome(lambda p: layouts.tensors(role, p), payload)  # learns, as decode does
            continue
        expected = _rows_outcome(role, parse(role, payload)[1], selection)
        if role == "request":
            assert row.dtype == np.float64  # as a Decision's x
        got = [_nan_named(v) for v in row.tolist()] if role == "request" else row
        if isinstance(got, list):
            got = [_nan_named(v) for v in got]
        assert expected is not None and got == expected


_ID_REQUEST = message("request", "abcdefgh", [("t0", "FP64", np.ones((1, 2)))], True, {})


def _row_seen(row):
    """A row as compared: its type, and its values with NaNs named."""
    if isinstance(row, np.ndarray):
        return "array", row.dtype, [_nan_named(v) for v in row.tolist()]
    if isinstance(row, list):
        return "list", [_nan_named(v) for v in row]
    return type(row).__name__, row


@settings(max_examples=300, deadline=None)
@given(
    stream=streams(),
    chosen=st.sampled_from([None, "t0", "t1"]),
    order=st.randoms(use_true_random=False),
)
@example(  # a one-byte value of 128 or more: the message holds eight booleans, not nine
    stream=(
        "request",
        [_HEAD + _T0_BOOLS + bytes(9) + _T1_BOOLS] * 2
        + [_HEAD + _T0_BOOLS + b"\x80" + bytes(8) + _T1_BOOLS],
    ),
    chosen="t1",
    order=random.Random(0),
)
@example(  # an id that is not UTF-8: the parse refuses the message
    stream=("request", [_ID_REQUEST, _ID_REQUEST.replace(b"abcdefgh", b"abc\xffefgh")]),
    chosen=None,
    order=random.Random(0),
)
def test_messages_read_together_give_the_rows_each_gives_alone(stream, chosen, order):
    """The join reads a pack's messages of one size as a block: each message's row, or
    None, is what reading it alone gives, for matching, corrupted and non-ASCII-id ones."""
    role, payloads = stream
    layouts = Layouts(TensorSelection(input_tensor=chosen, output_tensor=chosen))
    for payload in payloads:
        outcome(lambda p: layouts.tensors(role, p), payload)  # learns, as decode does
    block = payloads * layouts_module.BLOCK_FROM  # each size at least a block's worth
    order.shuffle(block)
    together = layouts.rows(role, block)
    assert [_row_seen(r) for r in together] == [_row_seen(layouts.row(role, p)) for p in block]


def test_one_row_traffic_is_read_as_rows_after_its_first_messages():
    rng = np.random.default_rng(2)
    layouts = Layouts(TensorSelection())
    first = _one_row("5f0c7a1e-0000", rng.random((1, 6)), 1)
    assert layouts.row("request", first[0]) is None  # not learned yet
    layouts.tensors("request", first[0])
    layouts.tensors("response", first[1])
    x = rng.random((1, 6))
    request, response = _one_row("9b1d22c4-0001", x, 0)
    row = layouts.row("request", request)
    assert row.dtype == np.float64 and row.tolist() == x[0].tolist()
    assert layouts.row("response", response) == 0
    assert layouts.row("response", _one_row("9b1d22c4-0002", x, 127)[1]) == 127
    # a label of 128 takes two bytes: another size, so not this layout's
    assert layouts.row("response", _one_row("9b1d22c4-0003", x, 128)[1]) is None
    # a two-row request has another layout, read as tensors
    two = message("request", "9b1d22c4-0004", [("predict", "FP64", x.repeat(2, 0))], True, {})
    layouts.tensors("request", two)
    assert layouts.row("request", two) is None


def test_named_features_are_read_as_tensors():
    layouts = Layouts(TensorSelection(features=("predict",)))
    request, _ = _one_row("5f0c7a1e-0000", np.ones((1, 6)), 1)
    layouts.tensors("request", request)
    assert len(layouts) == 1 and layouts.row("request", request) is None


def test_a_layout_that_could_begin_json_text_gives_no_rows():
    """The join tries a record's value by layout before telling it from JSON, so no layout
    whose messages could begin as a JSON object does is read as rows: a model name of 123
    bytes makes a message begin with "\\n{" (its tag and its length)."""
    x = np.ones((1, 6))
    for name, rows in (("m" * 123, False), (" " * 9 + "m", True), ("m" * 9, True)):
        layouts = Layouts(TensorSelection())
        first, again = (
            message("request", ident, [("predict", "FP64", x)], True, {"model": name})
            for ident in ("5f0c7a1e-0000", "9b1d22c4-0001")
        )
        layouts.tensors("request", first)
        assert len(layouts) == 1
        assert (layouts.row("request", again) is not None) is rows, name


_SELDON_HEADERS = (
    (),
    (("x-request-id", b"r1"), ("pipeline", b"iris")),
    (("seldon-pipeline-errors", b"iris"),),
    (("seldon-infer-type", b"proto/InferModelResponse"),),
)


@settings(max_examples=200, deadline=None)
@given(
    role=st.sampled_from(["request", "response"]),
    sides=st.lists(
        st.tuples(
            st.integers(0, 50),  # which message: its id and label
            st.sampled_from(["plain", "framed", "empty", "garbage"]),
            st.sampled_from(_SELDON_HEADERS),
        ),
        max_size=40,
    ),
)
@example(role="request", sides=[(1, "empty", ()), (2, "framed", ())])  # the smallest: empty
def test_seldon_records_read_together_give_the_rows_each_gives_alone(role, sides):
    """The join's reading of a pack's records of one topic: plain, schema-registry framed,
    empty or unreadable values, with the headers a gateway writes, an error's, or a type's."""
    layouts = Layouts(TensorSelection())
    first_request, first_response = _one_row("5f0c7a1e-0000", np.ones((1, 6)), 1)
    layouts.tensors("request", first_request)  # learned, as the join's first records are
    layouts.tensors("response", first_response)
    values, headers = [], []
    for which, shape, named in sides:
        request, response = _one_row(f"9b1d22c4-{which:04d}", np.full((1, 6), which), which)
        payload = request if role == "request" else response
        values.append(
            {
                "plain": payload,
                "framed": b"\0\0\0\0\x07\0" + payload,
                "empty": b"",
                "garbage": bytes(len(payload)),
            }[shape]
        )
        headers.append(named)
    alone = [seldon.layout_row(role, v, h, layouts) for v, h in zip(values, headers, strict=True)]
    together = seldon.layout_rows(role, values, headers, layouts)
    assert [_row_seen(r) for r in together] == [_row_seen(r) for r in alone]
