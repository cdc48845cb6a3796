"""A request's decisions as one binary record: how a serving-stack rule's join hands its
pairs to the checker (its decisions topic), read straight into arrays.

The value is a JSON head and a newline, then the rows: ``x`` as little-endian float64,
``rows`` x ``columns``, then ``y``, int64 labels (``outputs`` 0) or float64 rows of
``outputs`` probabilities. The record carries ``BATCH_HEADER`` with the layout's version.
"""

from __future__ import annotations

import numpy as np
import orjson

from vigil.connectors.events import BadEvent, Decision, Record

BATCH_HEADER = "vigil-decisions"
LAYOUT = b"2"
"""The layout written and read (1 was JSON rows)."""
HEADERS = ((BATCH_HEADER, LAYOUT),)


def encode_batch(ident: str, model: str, x: np.ndarray, y: np.ndarray) -> bytes:
    """The record value of a request's ``x`` (rows of features) and ``y`` (labels, or rows
    of probabilities)."""
    outputs = 0 if y.ndim == 1 else y.shape[1]
    head = {"id": ident, "model": model, "rows": len(x), "columns": x.shape[1], "outputs": outputs}
    y = y.astype("<i8") if outputs == 0 else y.astype("<f8")
    return b"".join((orjson.dumps(head), b"\n", x.astype("<f8").tobytes(), y.tobytes()))


def decode_batch(record: Record) -> list[Decision]:
    """The decisions of a record with ``BATCH_HEADER``, in row order, all at its offset and
    named ``<id>/<row>``; ``x`` of each is a row of one array, ``y`` a label or a list."""
    layout = record.header(BATCH_HEADER)
    if layout != LAYOUT:
        error = f"a decisions record of layout {layout!r}; this version reads {LAYOUT!r}"
        raise BadEvent("schema", error)
    value = record.value or b""
    end = value.find(b"\n")
    try:
        head = orjson.loads(value[:end]) if end >= 0 else None
    except orjson.JSONDecodeError:
        head = None
    shape = _shape(head)
    if shape is None:
        error = "a decisions record needs a head with id, model, rows, columns and outputs"
        raise BadEvent("schema", error)
    rows, columns, outputs = shape
    body = memoryview(value)[end + 1 :]
    expected = 8 * rows * (columns + max(outputs, 1))
    if len(body) != expected:
        error = f"a decisions record of {rows} rows needs {expected} bytes of rows, has {len(body)}"
        raise BadEvent("schema", error)
    x = np.frombuffer(body, "<f8", rows * columns).reshape(rows, columns)
    at = 8 * rows * columns
    if outputs == 0:
        y = np.frombuffer(body, "<i8", rows, at).tolist()
    else:
        y = np.frombuffer(body, "<f8", rows * outputs, at).reshape(rows, outputs).tolist()
    ident, model = head["id"], head["model"]
    return [Decision(record, f"{ident}/{row}", model, x[row], y[row], head) for row in range(rows)]


def _shape(head: object) -> tuple[int, int, int] | None:
    if not (type(head) is dict and type(head.get("id")) is str and type(head.get("model")) is str):
        return None
    shape = tuple(head.get(k) for k in ("rows", "columns", "outputs"))
    if not all(type(v) is int and v >= 0 for v in shape):
        return None
    return shape  # type: ignore[return-value]
