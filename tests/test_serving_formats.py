"""Records exactly as Seldon Core 2 and KServe's inference logger write them to Kafka, read as
inferences and then as decision rows."""

from __future__ import annotations

import base64
import struct

import numpy as np
import orjson
import pytest

from vigil.connectors.events import BadEvent, Record
from vigil.connectors.serving import grpc_predict_v2_pb2 as pb
from vigil.connectors.serving import kserve, seldon
from vigil.connectors.serving.layouts import Layouts
from vigil.connectors.serving.rows import TensorSelection, decision_rows, input_rows

INPUTS, OUTPUTS = seldon.topics("seldon", "seldon-mesh", "model", "iris")
XID = "cn5ab8k3q5jc73a0e6dg"  # a 20-character xid, as the gateway makes request ids
HEADERS = (
    ("pipeline", b"iris"),
    ("x-request-id", XID.encode()),
    ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
)


def raw_request(x: np.ndarray) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="iris")
    message.inputs.add(name="predict", datatype="FP64", shape=list(x.shape))
    message.raw_input_contents.append(x.astype("<f8").tobytes())
    return message


def typed_response(labels: list[int]) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name="iris", id="r")
    out = message.outputs.add(name="predict", datatype="INT64", shape=[len(labels), 1])
    out.contents.int64_contents.extend(labels)
    return message


def record(topic: str, value: bytes, key: bytes | None, headers=HEADERS) -> Record:
    return Record(topic, 3, 17, value, key, tuple(headers))


def test_topic_names_and_roles():
    assert (INPUTS, OUTPUTS) == (
        "seldon.seldon-mesh.model.iris.inputs",
        "seldon.seldon-mesh.model.iris.outputs",
    )
    assert seldon.topics("p", "", "pipeline", "a.b")[0] == "p.default.pipeline.a.b.inputs"
    assert seldon.role_of(INPUTS) == "request" and seldon.role_of(OUTPUTS) == "response"
    with pytest.raises(ValueError, match="not a Seldon inputs or outputs topic"):
        seldon.role_of("seldon.default.errors.errors")


@pytest.mark.parametrize(
    "key", [f"3.iris.{XID}", f"iris.{XID}", f"0.my.dotted.model.{XID}"], ids=["2.10", "2.9", "dots"]
)
def test_both_key_forms_give_the_request_id_and_pair_by_the_whole_key(key):
    x = np.arange(8.0).reshape(2, 4)
    request = seldon.decode(
        record(INPUTS, raw_request(x).SerializeToString(), key.encode()), "iris"
    )
    response = seldon.decode(
        record(OUTPUTS, typed_response([0, 2]).SerializeToString(), key.encode()), "iris"
    )
    assert request.request_id == response.request_id == XID
    assert request.join_key == response.join_key == key
    assert (request.role, response.role) == ("request", "response")
    x_rows, y_rows = decision_rows(request, response, TensorSelection())
    np.testing.assert_array_equal(x_rows, x)
    assert y_rows.tolist() == [0, 2]


def test_a_request_whose_bytes_parse_as_a_response_is_read_by_its_topic():
    x = np.array([[1.0, 2.0]])
    payload = raw_request(x).SerializeToString()
    as_response = pb.ModelInferResponse.FromString(payload)  # no error: the fields line up
    assert as_response.model_name == "iris" and list(as_response.raw_output_contents) == []
    request = seldon.decode(record(INPUTS, payload, b"0.iris.a"), "iris")
    np.testing.assert_array_equal(input_rows(request.tensors, TensorSelection()), x)


def test_a_response_on_an_inputs_topic_says_so_in_its_type_header():
    headers = (*HEADERS, ("seldon-infer-type", b"proto/InferModelResponse"))
    value = typed_response([1]).SerializeToString()
    assert seldon.decode(record(INPUTS, value, b"k.1", headers), "iris").role == "response"


@pytest.mark.parametrize("indexes", [b"\x00", b"\x04\x02\x00"], ids=["[0]", "[1, 0]"])
def test_schema_registry_framing_is_stripped(indexes):
    x = np.array([[0.5, -1.5]])
    framed = b"\x00" + struct.pack(">I", 100042) + indexes + raw_request(x).SerializeToString()
    request = seldon.decode(record(INPUTS, framed, b"1.iris.z"), "iris")
    np.testing.assert_array_equal(input_rows(request.tensors, TensorSelection()), x)


def test_oip_json_on_the_same_topics():
    body = {
        "id": "j1",
        "inputs": [{"name": "predict", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}],
    }
    request = seldon.decode(record(INPUTS, orjson.dumps(body), b"2.iris.j1"), "iris")
    assert input_rows(request.tensors, TensorSelection()).tolist() == [[1, 2], [3, 4]]
    answer = {
        "model_name": "iris",
        "outputs": [{"name": "p", "shape": [2], "datatype": "INT64", "data": [1, 0]}],
    }
    response = seldon.decode(record(OUTPUTS, orjson.dumps(answer), b"2.iris.j1"), "iris")
    assert response.tensors[0].data.tolist() == [1, 0]


def test_an_error_record_is_a_failed_response():
    headers = (*HEADERS, ("seldon-pipeline-errors", b"iris"))
    failed = seldon.decode(
        record(OUTPUTS, b"rpc error: code = Unavailable", b"0.iris.q", headers), "iris"
    )
    assert failed.role == "response" and failed.tensors == []
    assert failed.error == "rpc error: code = Unavailable"


def test_a_record_without_key_pairs_by_its_request_id_header():
    inference = seldon.decode(
        record(INPUTS, raw_request(np.ones((1, 1))).SerializeToString(), None), "iris"
    )
    assert inference.join_key == inference.request_id == XID
    with pytest.raises(BadEvent, match="no record key and no x-request-id header"):
        seldon.decode(record(INPUTS, b"", None, headers=()), "iris")


@pytest.mark.parametrize("cut", [3, 11, -2])
def test_truncated_protobuf_is_undecodable(cut):
    payload = raw_request(np.arange(6.0).reshape(3, 2)).SerializeToString()
    with pytest.raises(BadEvent) as e:
        seldon.decode(record(INPUTS, payload[:cut], b"0.iris.t"), "iris")
    assert e.value.reason in ("undecodable", "schema")


def pandas_request(ages: list[float], races: list[str]) -> pb.ModelInferRequest:
    """A DataFrame as MLServer's pandas codec sends it: one [n, 1] input per column, strings as
    BYTES (content type "str")."""
    message = pb.ModelInferRequest(model_name="credit")
    message.parameters["content_type"].string_param = "pd"
    n = len(ages)
    age = message.inputs.add(name="age", datatype="FP64", shape=[n, 1])
    race = message.inputs.add(name="race", datatype="BYTES", shape=[n, 1])
    race.parameters["content_type"].string_param = "str"
    priors = message.inputs.add(name="priors", datatype="INT64", shape=[n, 1])
    message.raw_input_contents.extend(
        [
            np.asarray(ages, "<f8").tobytes(),
            b"".join(struct.pack("<I", len(r)) + r.encode() for r in races),
            np.arange(n, dtype="<i8").tobytes(),
        ]
    )
    del age, priors
    return message


def test_pandas_columns_are_features_in_the_rules_order_with_categories_one_hot():
    value = pandas_request([30.0, 41.5], ["b", "a"]).SerializeToString()
    request = seldon.decode(record(INPUTS, value, b"0.credit.p"), "credit")
    selection = TensorSelection(
        features=("priors", "race", "age"), categories={"race": ["a", "b", "c"]}
    )
    rows = input_rows(request.tensors, selection)
    assert rows.tolist() == [[0, 0, 1, 0, 30.0], [1, 1, 0, 0, 41.5]]


@pytest.mark.parametrize(
    ("selection", "reason", "error"),
    [
        (TensorSelection(features=("age", "race")), "category", "'race' holds strings"),
        (
            TensorSelection(features=("race",), categories={"race": ["a"]}),
            "category",
            "tensor 'race': value 'b' is not among its categories",
        ),
        (TensorSelection(features=("income",)), "schema", "no input tensor 'income'"),
        (TensorSelection(input_tensor="x"), "schema", "no input tensor 'x'"),
    ],
)
def test_bad_selections_are_dead_letters_naming_tensor_and_value(selection, reason, error):
    value = pandas_request([30.0, 41.5], ["a", "b"]).SerializeToString()
    request = seldon.decode(record(INPUTS, value, b"0.credit.p"), "credit")
    with pytest.raises(BadEvent, match=error) as e:
        input_rows(request.tensors, selection)
    assert e.value.reason == reason


def test_a_response_with_the_wrong_row_count_cannot_be_paired():
    request = seldon.decode(
        record(INPUTS, raw_request(np.ones((3, 2))).SerializeToString(), b"k.r"), "iris"
    )
    response = seldon.decode(
        record(OUTPUTS, typed_response([1, 0]).SerializeToString(), b"k.r"), "iris"
    )
    with pytest.raises(BadEvent, match="2 rows for a request of 3"):
        decision_rows(request, response, TensorSelection())


def test_probability_outputs_are_rows_of_floats():
    message = pb.ModelInferResponse(id="r")
    message.outputs.add(name="proba", datatype="FP32", shape=[2, 3])
    message.raw_output_contents.append(np.array([[0.2, 0.3, 0.5], [1, 0, 0]], "<f4").tobytes())
    response = seldon.decode(record(OUTPUTS, message.SerializeToString(), b"k.r"), "iris")
    request = seldon.decode(
        record(INPUTS, raw_request(np.ones((2, 1))).SerializeToString(), b"k.r"), "iris"
    )
    _, y = decision_rows(request, response, TensorSelection())
    np.testing.assert_allclose(y, [[0.2, 0.3, 0.5], [1, 0, 0]], rtol=1e-7)
    assert y.dtype == np.float64


# -- KServe --------------------------------------------------------------------------------


def binary_event(
    kind: str, body: object, service: str = "sklearn-iris", event_id: str = "5b0f"
) -> Record:
    """A KafkaSink record in binary mode: ce_* headers, the HTTP body, no key."""
    headers = (
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode()),
        ("ce_source", b"http://localhost:9081/"),
        ("ce_type", kind.encode()),
        ("ce_time", b"2026-11-26T08:00:00.123Z"),
        ("content-type", b"application/json"),
        ("ce_inferenceservicename", service.encode()),
        ("ce_namespace", b"default"),
        ("ce_component", b"predictor"),
        ("ce_endpoint", b""),
        ("ce_metadata", b"{}"),
    )
    return Record("kserve-logs", 0, 5, orjson.dumps(body), None, headers)


def structured_event(kind: str, body: object, encoded: bool = False) -> Record:
    event = {
        "specversion": "1.0",
        "id": "77aa",
        "source": "sklearn-iris-predictor-00001-deployment-abc",
        "type": kind,
        "datacontenttype": "application/json",
        "inferenceservicename": "sklearn-iris",
        "namespace": "default",
        "component": "predictor",
    }
    if encoded:
        event["data_base64"] = base64.b64encode(orjson.dumps(body)).decode()
    else:
        event["data"] = body
    headers = (("content-type", b"application/cloudevents+json; charset=UTF-8"),)
    return Record("kserve-logs", 0, 6, orjson.dumps(event), None, headers)


V1_REQUEST = {"instances": [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]]}
V1_RESPONSE = {"predictions": [1, 1]}
OIP_REQUEST = {
    "inputs": [
        {
            "name": "input-0",
            "shape": [2, 4],
            "datatype": "FP32",
            "data": [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]],
        }
    ]
}
OIP_RESPONSE = {
    "model_name": "sklearn-iris",
    "model_version": None,
    "id": "a-fresh-uuid",
    "outputs": [{"name": "output-0", "shape": [2], "datatype": "INT64", "data": [1, 1]}],
}


@pytest.mark.parametrize(
    ("request_body", "response_body"),
    [(V1_REQUEST, V1_RESPONSE), (OIP_REQUEST, OIP_RESPONSE)],
    ids=["v1", "oip"],
)
@pytest.mark.parametrize("mode", ["binary", "structured", "base64"])
def test_kserve_request_and_response_events_pair_by_their_id(mode, request_body, response_body):
    if mode == "binary":
        request = kserve.decode(binary_event(kserve.REQUEST_TYPE, request_body))
        response = kserve.decode(binary_event(kserve.RESPONSE_TYPE, response_body))
    else:
        request = kserve.decode(
            structured_event(kserve.REQUEST_TYPE, request_body, mode == "base64")
        )
        response = kserve.decode(
            structured_event(kserve.RESPONSE_TYPE, response_body, mode == "base64")
        )
    assert request.join_key == response.join_key and request.model == "sklearn-iris"
    x, y = decision_rows(request, response, TensorSelection())
    np.testing.assert_allclose(x, [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]], rtol=1e-6)
    assert y.tolist() == [1, 1] and y.dtype == np.int64


def test_v1_instances_as_objects_are_named_features():
    body = {"instances": [{"age": 30, "sex": "f"}, {"age": 41, "sex": "m"}]}
    request = kserve.decode(binary_event(kserve.REQUEST_TYPE, body))
    rows = input_rows(
        request.tensors, TensorSelection(features=("sex", "age"), categories={"sex": ["f", "m"]})
    )
    assert rows.tolist() == [[1, 0, 30], [0, 1, 41]]


@pytest.mark.parametrize(
    ("record_of", "reason", "error"),
    [
        (lambda: binary_event("dev.knative.other", V1_REQUEST), "schema", "not an inference"),
        (lambda: binary_event(kserve.REQUEST_TYPE, {"rows": []}), "schema", "neither 'inputs'"),
        (lambda: Record("t", 0, 0, b"{not json", None, ()), "undecodable", "not JSON"),
        (
            lambda: binary_event(kserve.REQUEST_TYPE, V1_REQUEST, service=""),
            "schema",
            "inferenceservicename",
        ),
    ],
)
def test_bad_kserve_records_name_what_is_wrong(record_of, reason, error):
    with pytest.raises(BadEvent, match=error) as e:
        kserve.decode(record_of())
    assert e.value.reason == reason


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: input_rows([_empty("x", [0, 3])], TensorSelection()), "has no values"),
        (
            lambda: kserve.decode(
                Record(
                    "t",
                    0,
                    0,
                    orjson.dumps(
                        {
                            "specversion": "1.0",
                            "id": "1",
                            "type": kserve.REQUEST_TYPE,
                            "inferenceservicename": "s",
                            "data_base64": "not*base64",
                        }
                    ),
                    None,
                    (("content-type", b"application/cloudevents+json"),),
                )
            ),
            "not base64",
        ),
        (
            lambda: kserve.body_tensors(
                {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": [1, 2]}]},
                "request",
            ),
            "BYTES data must be strings",
        ),
        (
            lambda: kserve.body_tensors(
                {"inputs": [{"name": "b", "shape": [2], "datatype": "INT8", "data": [1, 300]}]},
                "request",
            ),
            "tensor 'b': values are not INT8",
        ),
        (lambda: _typed("UINT8", "uint_contents", [256]), "tensor 't': a value does not fit UINT8"),
        (lambda: _typed("INT8", "int_contents", [300]), "tensor 't': a value does not fit INT8"),
    ],
)
def test_malformed_values_are_bad_events_not_crashes(make, error):
    with pytest.raises(BadEvent, match=error):
        make()


def _empty(name: str, shape: list[int]):
    from vigil.connectors.serving.oip import from_raw

    return from_raw(name, "FP64", shape, b"")


def _typed(datatype: str, field: str, values: list[int]):
    from vigil.connectors.serving.oip import request_tensors

    message = pb.ModelInferRequest()
    tensor = message.inputs.add(name="t", datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, field).extend(values)
    return request_tensors(message)


def test_a_side_read_by_layout_pairs_with_one_read_as_tensors():
    """The join pairs whatever it read: one side's row (a repeated layout) with the other's
    tensors (its first message, or another layout) gives the rows both tensors give."""
    from vigil.connectors.serving.layouts import Layouts

    selection = TensorSelection()
    layouts = Layouts(selection)
    key = f"0.iris.{XID}".encode()
    x = np.array([[5.1, 3.5, 1.4, 0.2]])
    inputs = record(INPUTS, raw_request(x).SerializeToString(), key)
    outputs = record(OUTPUTS, typed_response([2]).SerializeToString(), key)
    for source in (inputs, outputs):  # learn both layouts
        seldon.decode(source, "iris", layouts)
    by_layout = [seldon.decode(source, "iris", layouts) for source in (inputs, outputs)]
    parsed = [seldon.decode(source, "iris") for source in (inputs, outputs)]
    assert [s.row is not None for s in by_layout] == [True, True]
    assert [s.row for s in parsed] == [None, None]
    expected = decision_rows(parsed[0], parsed[1], selection)
    for request, response in ((by_layout[0], parsed[1]), (parsed[0], by_layout[1])):
        x_rows, y_rows = decision_rows(request, response, selection)
        np.testing.assert_array_equal(x_rows, expected[0])
        assert y_rows.tolist() == expected[1].tolist() == [2]
        assert x_rows.dtype == np.float64 and y_rows.dtype == np.int64


def test_with_a_learned_row_layout_the_type_and_error_headers_still_decide():
    """A record whose bytes match a learned row layout is read as its headers say: a
    response on an inputs topic, or a failed inference, is not taken for a row."""
    layouts = Layouts(TensorSelection())
    request = raw_request(np.array([[1.0, 2.0]])).SerializeToString()
    response = typed_response([1]).SerializeToString()
    seldon.decode(record(INPUTS, request, b"0.iris.a"), "iris", layouts)  # learned from
    seldon.decode(record(OUTPUTS, response, b"0.iris.a"), "iris", layouts)
    assert seldon.decode(record(INPUTS, request, b"0.iris.b"), "iris", layouts).row is not None
    assert seldon.decode(record(OUTPUTS, response, b"0.iris.b"), "iris", layouts).row == 1
    typed = (*HEADERS, ("seldon-infer-type", b"proto/InferModelResponse"))
    with pytest.raises(BadEvent, match="0 values in fp64_contents"):  # parsed as a response
        seldon.decode(record(INPUTS, request, b"0.iris.c", typed), "iris", layouts)
    failing = (*HEADERS, ("seldon-pipeline-errors", b"iris"))
    failed = seldon.decode(record(OUTPUTS, response, b"0.iris.d", failing), "iris", layouts)
    assert failed.error == response.decode(errors="replace") and failed.row is None
