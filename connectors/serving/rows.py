"""A request's and its response's tensors as decision rows: the inputs as an ``(n, d)``
matrix, the outputs as ``n`` labels or an ``(n, k)`` matrix of probabilities.

Which tensors are read is the rule's choice (``TensorSelection``): one input tensor (by
name, or the first), or one ``[n, 1]`` tensor per named feature in the rule's order (as
MLServer's pandas codec sends a DataFrame). A BYTES tensor is categorical: its values,
listed in the rule's ``categories``, are one-hot encoded in that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from vigil.connectors.events import BadEvent
from vigil.connectors.serving.message import Inference, Role
from vigil.connectors.serving.oip import Tensor

if TYPE_CHECKING:
    from vigil.connectors.serving.layouts import Values

INTEGER_TYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")


@dataclass(frozen=True)
class TensorSelection:
    """Which tensors make a decision's input and output, and how strings are encoded."""

    input_tensor: str | None = None
    output_tensor: str | None = None
    features: tuple[str, ...] | None = None
    categories: Mapping[str, Sequence[str]] = field(default_factory=dict)


def input_rows(tensors: Sequence[Tensor], selection: TensorSelection) -> np.ndarray:
    """The decisions' inputs, one float64 row per request row."""
    if selection.features is not None:
        chosen = [_named(tensors, name, "input") for name in selection.features]
    else:
        chosen = [_pick(tensors, selection.input_tensor, "input")]
    for t in chosen:
        _has_rows(t)
    if len(chosen) == 1:
        return _columns(chosen[0], selection)
    rows = {t.rows for t in chosen}
    if len(rows) > 1:
        sizes = ", ".join(f"{t.name!r}: {t.rows}" for t in chosen)
        raise BadEvent("schema", f"input tensors disagree on the number of rows ({sizes})")
    return np.hstack([_columns(t, selection) for t in chosen])


def output_rows(tensors: Sequence[Tensor], selection: TensorSelection) -> np.ndarray:
    """The decisions' outputs: int64 labels (an integer or categorical tensor of one column)
    or float64 probability rows (a floating tensor)."""
    tensor = _has_rows(_pick(tensors, selection.output_tensor, "output"))
    data = tensor.data.reshape(tensor.rows, -1)
    if tensor.datatype == "BYTES":
        if data.shape[1] != 1:
            raise BadEvent("schema", f"output tensor {tensor.name!r}: one string per row")
        return _one_hot(tensor, data[:, 0], selection).argmax(axis=1)
    if tensor.datatype in INTEGER_TYPES:
        if data.shape[1] != 1:
            raise BadEvent(
                "schema", f"output tensor {tensor.name!r}: one label per row, not {data.shape[1]}"
            )
        return data[:, 0].astype(np.int64)
    return data.astype(np.float64)


def _has_rows(tensor: Tensor) -> Tensor:
    if tensor.rows == 0 or tensor.data.size == 0:
        raise BadEvent(
            "schema", f"tensor {tensor.name!r} has no values (shape {list(tensor.shape)})"
        )
    return tensor


def _pick(tensors: Sequence[Tensor], name: str | None, kind: str) -> Tensor:
    if name is not None:
        return _named(tensors, name, kind)
    if not tensors:
        raise BadEvent("schema", f"no {kind} tensor")
    return tensors[0]


def _named(tensors: Sequence[Tensor], name: str, kind: str) -> Tensor:
    for t in tensors:
        if t.name == name:
            return t
    present = ", ".join(repr(t.name) for t in tensors) or "none"
    raise BadEvent("schema", f"no {kind} tensor {name!r} (tensors: {present})")


def _columns(tensor: Tensor, selection: TensorSelection) -> np.ndarray:
    data = tensor.data.reshape(tensor.rows, -1)
    if tensor.datatype != "BYTES":
        return data.astype(np.float64, copy=False)
    if data.shape[1] != 1:
        raise BadEvent("schema", f"tensor {tensor.name!r}: one string per row, not {data.shape[1]}")
    return _one_hot(tensor, data[:, 0], selection)


def _one_hot(tensor: Tensor, values: np.ndarray, selection: TensorSelection) -> np.ndarray:
    categories = selection.categories.get(tensor.name)
    if categories is None:
        raise BadEvent(
            "category",
            f"tensor {tensor.name!r} holds strings: list its values in the rule's categories",
        )
    index = {c.encode(): i for i, c in enumerate(categories)}
    out = np.zeros((len(values), len(categories)))
    for row, value in enumerate(values):
        column = index.get(value)
        if column is None:
            shown = value.decode(errors="replace")
            raise BadEvent(
                "category",
                f"tensor {tensor.name!r}: value {shown!r} is not among its categories",
            )
        out[row, column] = 1.0
    return out


def decision_rows(
    request: Inference, response: Inference, selection: TensorSelection
) -> tuple[np.ndarray, np.ndarray]:
    """A request's inputs and its response's outputs, row by row: ``n`` decisions (a side's
    one ``row`` when it was read as one)."""
    x = input_rows(request.tensors, selection) if request.row is None else np.array([request.row])
    y = (
        output_rows(response.tensors, selection)
        if response.row is None
        else np.array([response.row])
    )
    if len(x) != len(y):
        raise BadEvent(
            "schema", f"the response has {len(y)} rows for a request of {len(x)}: cannot pair them"
        )
    return x, y


_FLOAT64 = np.dtype(np.float64)

Row = np.ndarray | int | list[float]
"""A decision's one row as ``Decision`` holds it: the input as a float64 vector, the output
as an int label or a list of probabilities."""


@dataclass(frozen=True, slots=True)
class RowReader:
    """One message layout's decision row, read from a message's bytes: the one row
    ``input_rows`` or ``output_rows`` gives for the selected tensor, when it holds one row
    of values the layout reads alone (no strings, one tensor)."""

    start: int
    count: int
    dtype: np.dtype
    one_byte: bool  # varints of one byte each: read as uint8, all under 128
    kind: Literal["input", "label", "probabilities"]

    def __call__(self, payload: bytes) -> Row:
        """The input as a float64 vector, the label as an int, the probabilities as a list,
        from a message its layout ``matches`` (which checks one-byte values are so)."""
        if self.one_byte:
            chunk = payload[self.start : self.start + self.count]
            if self.dtype.kind == "b":  # protobuf reads any non-zero varint as true
                data = np.frombuffer(chunk, np.uint8) != 0
                if self.kind == "label":
                    return int(data[0])
            elif self.kind == "label":
                return chunk[0]
            else:
                data = np.frombuffer(chunk, np.uint8)
        else:
            data = np.ndarray((self.count,), self.dtype, payload, self.start)
        if self.kind == "input":
            # float64s are a view of the message's bytes
            return data if data.dtype is _FLOAT64 else data.astype(np.float64)
        if self.kind == "label":
            return int(data.astype(np.int64)[0])
        return data.astype(np.float64).tolist()

    def many(self, block: np.ndarray) -> list[Row]:
        """The row of each message of an ``(n, size)`` block of bytes, each as the call
        reads it from a message its layout matches."""
        if self.one_byte:
            data = block[:, self.start : self.start + self.count]
            if self.dtype.kind == "b":
                data = data != 0
        else:
            width = self.count * self.dtype.itemsize
            chunk = np.ascontiguousarray(block[:, self.start : self.start + width])
            data = chunk.view(self.dtype)
        if self.kind == "input":
            return list(data.astype(np.float64, copy=False))
        if self.kind == "label":
            return data[:, 0].astype(np.int64).tolist()
        return data.astype(np.float64).tolist()


def row_reader(
    values: Sequence[Values], role: Role, selection: TensorSelection
) -> RowReader | None:
    """How a layout's messages give their decision row directly, or None when they must be
    read as tensors (several rows, named features, a tensor the layout lacks, or an output
    of several labels: the tensors' reading names the problem)."""
    if selection.features is not None or not values:
        return None
    name = selection.input_tensor if role == "request" else selection.output_tensor
    chosen = values[0] if name is None else next((v for v in values if v.name == name), None)
    if chosen is None or (chosen.shape[0] if chosen.shape else 1) != 1:
        return None
    if role == "request":
        kind = "input"
    elif chosen.datatype in INTEGER_TYPES:
        if chosen.count != 1:
            return None
        kind = "label"
    else:
        kind = "probabilities"
    return RowReader(chosen.start, chosen.count, chosen.dtype, chosen.one_byte, kind)
