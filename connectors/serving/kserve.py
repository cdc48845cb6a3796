"""KServe's inference logger as a Knative KafkaSink writes it: one CloudEvent per request
(``org.kubeflow.serving.inference.request``) and one per response (``...response``), with
the same ``id``, in binary mode (``ce_*`` headers, the HTTP body as the value, no key) or
structured mode (``application/cloudevents+json``: the attributes and ``data`` in one JSON
object). Bodies are Open Inference Protocol JSON (``inputs`` / ``outputs``) or KServe's v1
protocol (``instances`` / ``predictions``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from vigil.connectors.events import BadEvent, Record
from vigil.connectors.serving.message import Inference, Role
from vigil.connectors.serving.oip import Tensor, from_json

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
STRUCTURED = b"application/cloudevents+json"
SERVICE = "inferenceservicename"


def decode(record: Record) -> Inference:
    """The request or response CloudEvent in ``record``; its ``model`` is the
    InferenceService that logged it."""
    attributes, body = _event(record)
    event_id, service = _identity(attributes)
    kind = attributes.get("type")
    if kind == REQUEST_TYPE:
        role: Role = "request"
    elif kind == RESPONSE_TYPE:
        role = "response"
    else:
        raise BadEvent(
            "schema", f"CloudEvent type {kind!r} is not an inference request or response"
        )
    return Inference(event_id, event_id, role, service, body_tensors(body(), role))


def identify(record: Record) -> tuple[str, str]:
    """The event id and InferenceService of ``record``, its body left unread (in binary
    mode the headers carry them)."""
    attributes, _ = _event(record)
    return _identity(attributes)


def _identity(attributes: dict[str, str]) -> tuple[str, str]:
    event_id = attributes.get("id")
    if not event_id:
        raise BadEvent("schema", "a CloudEvent without an id cannot be paired")
    service = attributes.get(SERVICE)
    if not service:
        raise BadEvent("schema", f"the CloudEvent lacks the {SERVICE} extension")
    return event_id, service


def _event(record: Record) -> tuple[dict[str, str], Callable[[], object]]:
    """The event's attributes, and what reads its body, in either content mode."""
    value = record.value or b""
    content_type = record.header("content-type") or b""
    if record.header("ce_specversion") is None or content_type.startswith(STRUCTURED):
        event = _json(value, "a structured CloudEvent")
        if not isinstance(event, dict) or "specversion" not in event:
            raise BadEvent("schema", "neither ce_* headers nor a structured CloudEvent")
        attributes = {k: str(v) for k, v in event.items() if k not in ("data", "data_base64")}
        if "data_base64" in event:
            return attributes, lambda: _json(_base64(event["data_base64"]), "the event's data")
        return attributes, lambda: event.get("data")
    attributes = {
        name.removeprefix("ce_"): v.decode(errors="replace")
        for name, v in record.headers
        if name.startswith("ce_")
    }
    return attributes, lambda: _json(value, "the event's body")


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError) as e:
        raise BadEvent("undecodable", f"data_base64 is not base64: {e}") from e


def _json(value: bytes, what: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise BadEvent("undecodable", f"{what} is not JSON: {e}") from e


def body_tensors(body: object, role: Role) -> list[Tensor]:
    """The tensors of an OIP JSON or v1 body."""
    if not isinstance(body, dict):
        raise BadEvent(
            "schema", f"an inference body must be a JSON object, not {type(body).__name__}"
        )
    oip, v1 = ("inputs", "instances") if role == "request" else ("outputs", "predictions")
    tensors = body.get(oip)
    if (
        isinstance(tensors, list)
        and tensors
        and all(isinstance(t, dict) and "datatype" in t for t in tensors)
    ):
        return [from_json(t) for t in tensors]
    rows = body.get(v1, tensors)  # KServe's v1 also takes "inputs" holding instances
    if not isinstance(rows, list) or not rows:
        raise BadEvent("schema", f"the {role} body has neither {oip!r} tensors nor {v1!r}")
    if all(isinstance(r, dict) for r in rows):
        names = list(rows[0])
        if any(list(r) != names for r in rows):
            raise BadEvent("schema", f"the {v1} objects do not all have the same keys")
        return [_v1_tensor(name, [[r[name]] for r in rows]) for name in names]
    return [_v1_tensor(v1, rows)]


def _v1_tensor(name: str, rows: list) -> Tensor:
    """A v1 list of rows as a tensor: numbers as FP64 (INT64 when all are integers, so
    labels stay labels), strings as BYTES."""
    try:
        data = np.asarray(rows)
    except ValueError as e:
        raise BadEvent("schema", f"{name}: rows of different lengths ({e})") from e
    if data.dtype.kind in "iub":
        datatype, data = "INT64", data.astype(np.int64)
    elif data.dtype.kind == "f":
        datatype = "FP64"
    elif data.dtype.kind == "U":
        datatype, flat = "BYTES", [v.encode() for v in data.ravel().tolist()]
        data = np.empty(len(flat), dtype=object)
        data[:] = flat
        data = data.reshape(np.asarray(rows).shape)
    else:
        raise BadEvent("schema", f"{name}: values must be numbers or strings")
    return Tensor(name, datatype, data.shape, data)
