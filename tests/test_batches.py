"""The decisions record a serving-stack rule's join writes and its checker reads."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vigil.connectors.batches import BATCH_HEADER, HEADERS, decode_batch, encode_batch
from vigil.connectors.events import BadEvent, Record


def record(value: bytes, headers=HEADERS) -> Record:
    return Record("g.rule.decisions", 0, 7, value, b"iris", tuple(headers))


def test_the_layout_is_a_json_head_then_little_endian_rows():
    x = np.array([[1.5, -2.0], [0.25, 3.0], [7.0, 8.0]])
    value = encode_batch("req-9", "iris", x, np.array([2, 0, 1]))
    head, body = value.split(b"\n", 1)
    assert orjson.loads(head) == {
        "id": "req-9",
        "model": "iris",
        "rows": 3,
        "columns": 2,
        "outputs": 0,
    }
    assert body == struct.pack("<6d3q", 1.5, -2.0, 0.25, 3.0, 7.0, 8.0, 2, 0, 1)


def test_bytes_written_by_hand_read_as_rows_in_order():
    head = orjson.dumps({"id": "r", "model": "m", "rows": 2, "columns": 3, "outputs": 2})
    body = struct.pack("<6d4d", 1, 2, 3, 4, 5, 6, 0.9, 0.1, 0.2, 0.8)
    decisions = decode_batch(record(head + b"\n" + body))
    assert [d.id for d in decisions] == ["r/0", "r/1"]
    assert [d.model for d in decisions] == ["m", "m"]
    assert [d.x.tolist() for d in decisions] == [[1, 2, 3], [4, 5, 6]]
    assert [d.y for d in decisions] == [[0.9, 0.1], [0.2, 0.8]]
    assert all(d.record.offset == 7 for d in decisions)


@given(
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6)),
    st.integers(0, 4),
    st.data(),
)
def test_what_is_encoded_decodes_bit_for_bit(x, outputs, data):
    rows = len(x)
    if outputs:
        y = data.draw(hnp.arrays(np.float64, (rows, outputs)))
    else:
        y = data.draw(hnp.arrays(np.int64, rows))
    decisions = decode_batch(record(encode_batch("id", "m", x, y)))
    assert len(decisions) == rows
    for i, d in enumerate(decisions):
        assert d.x.tobytes() == x[i].tobytes()
        expected = y[i].tolist()
        assert np.asarray(d.y).tobytes() == np.asarray(expected, dtype=y.dtype).tobytes()


@pytest.mark.parametrize(
    ("value", "headers", "names"),
    [
        (b'{"id":"r","model":"m","rows":1,"columns":2,"outputs":0}\n' + bytes(16), HEADERS, "24"),
        (b'{"id":"r","model":"m","rows":1,"columns":2}\n' + bytes(24), HEADERS, "head"),
        (b'{"id":"r","model":"m","rows":-1,"columns":2,"outputs":0}\n', HEADERS, "head"),
        (b"not json\n" + bytes(24), HEADERS, "head"),
        (bytes(24), HEADERS, "head"),
        (
            b'{"id":"r","model":"m","x":[[1]],"y":[0]}',
            ((BATCH_HEADER, b"1"),),
            "layout b'1'",
        ),
    ],
)
def test_a_malformed_record_is_a_schema_error_saying_what(value, headers, names):
    with pytest.raises(BadEvent) as e:
        decode_batch(record(value, headers))
    assert e.value.reason == "schema" and names in str(e.value)
