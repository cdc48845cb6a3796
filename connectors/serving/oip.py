"""Open Inference Protocol tensors as numpy arrays, from protobuf (typed or raw contents)
and from JSON (flat or nested ``data``).

Raw contents are little-endian and row-major; FP16 and BF16 exist only as raw contents;
a BYTES element is a 4-byte little-endian length and that many bytes. Fixed-width raw
contents are read with one ``np.frombuffer``; typed contents with one ``np.asarray`` per
tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vigil.connectors.events import BadEvent
from vigil.connectors.serving import grpc_predict_v2_pb2 as pb

FIXED: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
"""Datatypes of a fixed width, as numpy dtypes (BF16 is read through FP32, BYTES apart)."""
_WIDTH = {datatype: np.dtype(dtype).itemsize for datatype, dtype in FIXED.items()}

DATATYPES = (*FIXED, "BF16", "BYTES")
_KNOWN = frozenset(DATATYPES)

TYPED = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The ``InferTensorContents`` field of each datatype that has one."""


@dataclass(slots=True)
class Tensor:
    """One named tensor; ``data`` has ``shape`` (BYTES: an object array of ``bytes``).
    Never modified; not frozen, as ``Inference`` is not."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def rows(self) -> int:
        """The first dimension: the batch (a scalar tensor is one row)."""
        return self.shape[0] if self.shape else 1


def from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """A tensor from raw contents."""
    shape = _checked_shape(name, datatype, shape)
    count = math.prod(shape)
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, _bytes_elements(name, raw, count).reshape(shape))
    if datatype == "BF16":
        width, dtype = 2, "<u2"
    else:
        dtype, width = FIXED[datatype], _WIDTH[datatype]
    if len(raw) != count * width:
        raise BadEvent(
            "schema",
            f"tensor {name!r}: raw contents of {len(raw)} bytes, but {datatype} {list(shape)} "
            f"takes {count * width}",
        )
    data = np.frombuffer(raw, dtype)
    if datatype == "BF16":  # the upper half of a float32
        data = (data.astype("<u4") << 16).view("<f4")
    return Tensor(name, datatype, shape, data.reshape(shape))


def from_contents(
    name: str, datatype: str, shape: Sequence[int], contents: pb.InferTensorContents
) -> Tensor:
    """A tensor from typed contents (FP16 and BF16 have none: raw only)."""
    shape = _checked_shape(name, datatype, shape)
    field = TYPED.get(datatype)
    if field is None:
        raise BadEvent("schema", f"tensor {name!r}: {datatype} is sent as raw contents only")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise BadEvent(
            "schema",
            f"tensor {name!r}: {len(values)} values in {field}, but shape {list(shape)} "
            f"holds {count}",
        )
    if datatype == "BYTES":
        data = np.empty(count, dtype=object)
        data[:] = list(values)
    else:
        try:
            data = np.fromiter(values, FIXED[datatype], count)
        except OverflowError:  # typed contents are wider than INT8-16, UINT8-16
            raise BadEvent("schema", f"tensor {name!r}: a value does not fit {datatype}") from None
    return Tensor(name, datatype, shape, data.reshape(shape))


def request_tensors(message: pb.ModelInferRequest) -> list[Tensor]:
    """The inputs of a request, raw contents (by position) or typed."""
    return _tensors(message.inputs, message.raw_input_contents)


def response_tensors(message: pb.ModelInferResponse) -> list[Tensor]:
    """The outputs of a response, raw contents (by position) or typed."""
    return _tensors(message.outputs, message.raw_output_contents)


def _tensors(specs: Sequence[Any], raw: Sequence[bytes]) -> list[Tensor]:
    """By index: iterating upb's lists costs a microsecond more per message."""
    count = len(specs)
    if not raw:
        return [_typed_tensor(specs[i]) for i in range(count)]
    if len(raw) != count:
        raise BadEvent("schema", f"{len(raw)} raw contents for {count} tensors: one each is needed")
    return [_raw_tensor(specs[i], raw[i]) for i in range(count)]


def _typed_tensor(spec: Any) -> Tensor:
    return from_contents(spec.name, spec.datatype, spec.shape, spec.contents)


_LAYOUTS: dict[bytes, tuple[str, str, tuple[int, ...], str, int]] = {}
"""Checked layouts of fixed-width raw tensors (name, datatype, shape, dtype, bytes), by
their protobuf spec's bytes, which determine them: a model's traffic repeats a few."""
_LAYOUTS_KEPT = 1024
_LAYOUT_KEY_BYTES = 1024
"""Specs longer than this (parameters, ignored typed contents) are not kept: at most 1 MiB
of keys."""


def _raw_tensor(spec: Any, raw: bytes) -> Tensor:
    """``from_raw`` of a protobuf tensor spec, its layout checked once per distinct spec."""
    key = spec.SerializeToString()
    layout = _LAYOUTS.get(key)
    if layout is None:
        tensor = from_raw(spec.name, spec.datatype, spec.shape, raw)
        if (
            tensor.datatype in FIXED
            and len(_LAYOUTS) < _LAYOUTS_KEPT
            and len(key) <= _LAYOUT_KEY_BYTES
        ):
            dtype = FIXED[tensor.datatype]
            _LAYOUTS[key] = (tensor.name, tensor.datatype, tensor.shape, dtype, len(raw))
        return tensor
    name, datatype, shape, dtype, size = layout
    if len(raw) != size:
        return from_raw(name, datatype, shape, raw)  # raises, naming both sizes
    return Tensor(name, datatype, shape, np.frombuffer(raw, dtype).reshape(shape))


def from_json(tensor: object) -> Tensor:
    """A tensor of OIP JSON (``name``, ``shape``, ``datatype``, ``data`` flat or nested in
    row-major order; BYTES as strings)."""
    if not isinstance(tensor, dict):
        raise BadEvent("schema", f"a tensor must be a JSON object, not {type(tensor).__name__}")
    missing = [k for k in ("name", "shape", "datatype", "data") if k not in tensor]
    if missing:
        raise BadEvent("schema", f"tensor {tensor.get('name', '?')!r} lacks {', '.join(missing)}")
    name, datatype = str(tensor["name"]), tensor["datatype"]
    shape = _checked_shape(name, datatype, tensor["shape"])
    flat = _flatten(tensor["data"])
    if len(flat) != math.prod(shape):
        raise BadEvent(
            "schema",
            f"tensor {name!r}: {len(flat)} values, but shape {list(shape)} holds "
            f"{math.prod(shape)}",
        )
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise BadEvent("schema", f"tensor {name!r}: BYTES data must be strings")
        data = np.empty(len(flat), dtype=object)
        data[:] = [v.encode() for v in flat]
    else:
        try:
            dtype = "<f4" if datatype == "BF16" else FIXED[datatype]
            data = np.asarray(flat, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise BadEvent("schema", f"tensor {name!r}: values are not {datatype}: {e}") from e
    return Tensor(name, datatype, shape, data.reshape(shape))


def _flatten(data: object) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    out: list[Any] = []
    for item in data:
        out += _flatten(item)
    return out


def _checked_shape(name: str, datatype: object, shape: object) -> tuple[int, ...]:
    """``shape`` (a JSON list, or protobuf's repeated field) as sizes; once per tensor of
    every record, so without a context manager or a generator."""
    if datatype not in _KNOWN:
        raise BadEvent("schema", f"tensor {name!r}: unknown datatype {datatype!r}")
    dims: tuple | None = None
    if not isinstance(shape, _NOT_SHAPES):
        try:  # noqa: SIM105 (a context manager costs a microsecond a tensor)
            dims = tuple(shape[:])  # type: ignore[index] (a slice of upb's list is quicker)
        except TypeError:
            pass
    if dims is None or not _sizes(dims):
        raise BadEvent("schema", f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    return dims


_NOT_SHAPES = (str, bytes, dict)


def _sizes(dims: tuple) -> bool:
    for d in dims:  # noqa: SIM110 (a generator costs as much again)
        if type(d) is not int or d < 0:
            return False
    return True


def _bytes_elements(name: str, raw: bytes, count: int) -> np.ndarray:
    """BYTES raw contents: ``count`` length-prefixed elements filling ``raw`` exactly."""
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        if at + 4 > len(raw):
            raise BadEvent("schema", f"tensor {name!r}: BYTES contents end inside element {i}")
        (length,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + length > len(raw):
            raise BadEvent("schema", f"tensor {name!r}: BYTES element {i} runs past the end")
        out[i] = raw[at : at + length]
        at += length
    if at != len(raw):
        raise BadEvent("schema", f"tensor {name!r}: {len(raw) - at} bytes after {count} elements")
    return out
