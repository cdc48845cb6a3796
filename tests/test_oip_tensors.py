"""OIP tensors from the bytes a serving stack writes: raw and typed protobuf contents of every
datatype, JSON with flat and nested data, and what is refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vigil.connectors.events import BadEvent
from vigil.connectors.serving import grpc_predict_v2_pb2 as pb
from vigil.connectors.serving.oip import (
    FIXED,
    from_json,
    request_tensors,
    response_tensors,
)

TYPED_FIELD = {
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
}


def arrays(datatype: str) -> st.SearchStrategy[np.ndarray]:
    dtype = np.dtype(FIXED[datatype])
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=False)
    return hnp.arrays(dtype, st.tuples(st.integers(1, 5), st.integers(1, 4)), elements=elements)


def request(datatype: str, x: np.ndarray, raw: bool) -> bytes:
    """A ModelInferRequest as a client library writes it, serialized."""
    message = pb.ModelInferRequest(model_name="m", id="r1")
    tensor = message.inputs.add(name="input-0", datatype=datatype, shape=list(x.shape))
    if raw:
        message.raw_input_contents.append(x.astype(x.dtype.newbyteorder("<")).tobytes())
    else:
        getattr(tensor.contents, TYPED_FIELD[datatype]).extend(x.ravel().tolist())
    return message.SerializeToString()


@pytest.mark.parametrize("datatype", sorted(FIXED))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fixed_width_raw_contents_read_back_exactly(datatype, data):
    x = data.draw(arrays(datatype))
    parsed = pb.ModelInferRequest.FromString(request(datatype, x, raw=True))
    (tensor,) = request_tensors(parsed)
    assert tensor.shape == x.shape and tensor.datatype == datatype
    np.testing.assert_array_equal(tensor.data, x)


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELD))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_typed_contents_read_back_exactly(datatype, data):
    x = data.draw(arrays(datatype))
    parsed = pb.ModelInferRequest.FromString(request(datatype, x, raw=False))
    (tensor,) = request_tensors(parsed)
    np.testing.assert_array_equal(tensor.data, x)
    assert tensor.data.dtype == np.dtype(FIXED[datatype])


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.integers(1, 12),
        elements=st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False),
    )
)
def test_bf16_is_the_upper_half_of_float32(values):
    upper = (values.view("<u4") >> 16).astype("<u2")  # bf16 by truncation
    message = pb.ModelInferResponse(model_name="m", id="r1")
    message.outputs.add(name="out", datatype="BF16", shape=[len(values)])
    message.raw_output_contents.append(upper.tobytes())
    (tensor,) = response_tensors(pb.ModelInferResponse.FromString(message.SerializeToString()))
    expected = (upper.astype("<u4") << 16).view("<f4")
    np.testing.assert_array_equal(tensor.data, expected)
    assert np.all(np.abs(tensor.data - values) <= np.abs(values) * 2**-7)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=20), min_size=1, max_size=8))
def test_bytes_raw_contents_are_length_prefixed_elements(items):
    raw = b"".join(struct.pack("<I", len(b)) + b for b in items)
    message = pb.ModelInferRequest(id="r")
    message.inputs.add(name="s", datatype="BYTES", shape=[len(items), 1])
    message.raw_input_contents.append(raw)
    (tensor,) = request_tensors(message)
    assert tensor.shape == (len(items), 1) and tensor.data.ravel().tolist() == items


def test_bytes_typed_contents():
    message = pb.ModelInferRequest(id="r")
    t = message.inputs.add(name="s", datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend([b"a", b"bc"])
    assert request_tensors(message)[0].data.tolist() == [b"a", b"bc"]


def test_several_raw_tensors_pair_with_their_contents_by_position():
    message = pb.ModelInferRequest(id="r")
    message.inputs.add(name="a", datatype="FP64", shape=[2, 1])
    message.inputs.add(name="b", datatype="INT32", shape=[2, 1])
    message.raw_input_contents.extend(
        [np.array([1.5, 2.5], "<f8").tobytes(), np.array([7, -8], "<i4").tobytes()]
    )
    a, b = request_tensors(message)
    assert a.data.ravel().tolist() == [1.5, 2.5] and b.data.ravel().tolist() == [7, -8]


@pytest.mark.parametrize(
    ("tensor", "error"),
    [
        ({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}, "1 values"),
        ({"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1.0]}, "unknown datatype"),
        ({"name": "x", "shape": [1], "datatype": "FP32"}, "lacks data"),
        ({"name": "x", "shape": [1], "datatype": "INT32", "data": ["a"]}, "are not INT32"),
        ({"name": "x", "shape": "2", "datatype": "FP32", "data": [1.0, 2.0]}, "not a list"),
    ],
)
def test_bad_json_tensors_name_what_is_wrong(tensor, error):
    with pytest.raises(BadEvent, match=error) as e:
        from_json(tensor)
    assert e.value.reason == "schema"


def test_json_data_flat_and_nested_read_the_same():
    nested = {"name": "x", "shape": [2, 3], "datatype": "FP64", "data": [[1, 2, 3], [4, 5, 6]]}
    flat = {**nested, "data": [1, 2, 3, 4, 5, 6]}
    np.testing.assert_array_equal(from_json(nested).data, from_json(flat).data)
    assert from_json(flat).data.tolist() == [[1, 2, 3], [4, 5, 6]]
    strings = from_json({"name": "c", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]})
    assert strings.data.ravel().tolist() == [b"a", b"b"]


@pytest.mark.parametrize(
    ("datatype", "raw", "error"),
    [
        ("FP32", b"\x00" * 7, "raw contents of 7 bytes"),
        ("BYTES", b"\x05\x00\x00\x00ab", "runs past the end"),
        ("BYTES", b"\x01\x00\x00\x00a\x00", "end inside element 1"),
        ("BYTES", b"\x00\x00\x00\x00" * 2 + b"!", "1 bytes after 2 elements"),
        ("FP16", None, "raw contents only"),
    ],
)
def test_contents_that_do_not_fit_the_shape_are_refused(datatype, raw, error):
    message = pb.ModelInferRequest(id="r")
    message.inputs.add(name="t", datatype=datatype, shape=[2])
    if raw is not None:
        message.raw_input_contents.append(raw)
    with pytest.raises(BadEvent, match=error):
        request_tensors(message)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from(["FP64", "FP32", "INT64"]),
            st.sampled_from([(1, 3), (3, 1), (2, 3)]),
            st.sampled_from([0, 0, 0, -1, 8]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_repeated_layouts_read_as_each_message_says(messages):
    """Raw tensors of a few layouts, repeated (as a model's traffic repeats its own), each
    read as its own spec says, and a wrong length refused every time, not only the first."""
    for name, datatype, shape, off in messages:
        width = np.dtype(FIXED[datatype]).itemsize
        raw = bytes(range(width * shape[0] * shape[1] + off))
        message = pb.ModelInferRequest()
        message.inputs.add(name=name, datatype=datatype, shape=list(shape))
        message.raw_input_contents.append(raw)
        parsed = pb.ModelInferRequest.FromString(message.SerializeToString())
        if off:
            with pytest.raises(BadEvent, match=f"raw contents of {len(raw)} bytes"):
                request_tensors(parsed)
            continue
        (tensor,) = request_tensors(parsed)
        assert (tensor.name, tensor.datatype, tensor.shape) == (name, datatype, shape)
        want = np.frombuffer(raw, FIXED[datatype]).reshape(shape)
        np.testing.assert_array_equal(tensor.data, want)


def test_kept_layouts_stay_bounded():
    """Many distinct specs, and specs made long by parameters, are read right and do not
    grow the kept layouts past their bounds."""
    from vigil.connectors.serving import oip

    for i in range(oip._LAYOUTS_KEPT + 50):
        name = f"t{i}" if i % 2 else f"t{i}" + "p" * 2000
        message = pb.ModelInferRequest()
        message.inputs.add(name=name, datatype="FP32", shape=[1, 2])
        message.raw_input_contents.append(np.array([i, -i], "<f4").tobytes())
        parsed = pb.ModelInferRequest.FromString(message.SerializeToString())
        (tensor,) = request_tensors(parsed)
        assert tensor.name == name and tensor.data.tolist() == [[i, -i]]
    assert len(oip._LAYOUTS) <= oip._LAYOUTS_KEPT
    assert all(len(key) <= oip._LAYOUT_KEY_BYTES for key in oip._LAYOUTS)
