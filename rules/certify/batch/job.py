"""Daemon offload entry point: verify a window's inputs (or a model candidate's) in a worker.

Request (JSON-decoded dict):
    onnx       base64 ONNX model (a feed-forward ReLU classifier)
    inputs     [[float, ...], ...]  one row per input
    labels     [int, ...]           the class each input should keep
    eps        float > 0            L-inf radius
    clip       [lo, hi]             optional valid input range; balls are intersected with it
    max_batch  int >= 1             optional, largest mini-batch (default 16)
    method     "baverly" | "one-by-one"   optional (default "baverly")
    bounds     "lp" | "milp"        optional, how unstable neurons are tightened (default "lp")
    bound_time float > 0            optional, seconds per neuron bound with "milp" (default 1)

Result:
    verdicts   [{"index", "verdict": "robust"|"not_robust"|"misclassified",
                 "adversarial_example"?: [float, ...]}, ...]   in input order
    summary    {"inputs", "robust", "not_robust", "misclassified", "seconds", "method", ...}
"""

from __future__ import annotations

import base64
import binascii
import math

from vigil.rules.certify.batch.runner import InvalidBatchInput, InvalidModel, verify_inputs
from vigil.rules.relu_milp import BOUNDS, DEFAULT_BOUND_TIME, Solver


def _number(request: dict, key: str) -> float:
    value = request.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidBatchInput(f"field {key!r} must be a finite number, got {value!r}")
    return float(value)


def run_job(request: dict) -> dict:
    """Verify the request's inputs; raises InvalidBatchInput (a ValueError) naming a bad field."""
    if not isinstance(request, dict):
        raise InvalidBatchInput("the request must be a JSON object")
    try:
        model = base64.b64decode(request["onnx"], validate=True)
    except KeyError:
        raise InvalidBatchInput("field 'onnx' is missing") from None
    except (binascii.Error, TypeError, ValueError):
        raise InvalidBatchInput("field 'onnx' must be base64-encoded ONNX bytes") from None
    for key in ("inputs", "labels"):
        if not isinstance(request.get(key), list):
            raise InvalidBatchInput(f"field {key!r} must be a list")
    eps = _number(request, "eps")
    clip = request.get("clip")
    if clip is not None:
        if not (isinstance(clip, list) and len(clip) == 2):
            raise InvalidBatchInput(f"field 'clip' must be [lo, hi], got {clip!r}")
        clip = (_number({"clip": clip[0]}, "clip"), _number({"clip": clip[1]}, "clip"))
    max_batch = request.get("max_batch", 16)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int):
        raise InvalidBatchInput(f"field 'max_batch' must be an integer, got {max_batch!r}")
    method = request.get("method", "baverly")
    bounds = request.get("bounds", "lp")
    if bounds not in BOUNDS:
        raise InvalidBatchInput(f"field 'bounds' must be one of {BOUNDS}, got {bounds!r}")
    bound_time = _number(request, "bound_time") if "bound_time" in request else DEFAULT_BOUND_TIME
    if bound_time <= 0:
        raise InvalidBatchInput(f"field 'bound_time' must be positive, got {bound_time!r}")
    try:
        report = verify_inputs(
            model,
            request["inputs"],
            request["labels"],
            eps,
            clip=clip,
            max_batch=max_batch,
            method=method,
            solver=Solver(bounds=bounds, bound_time=bound_time),
        )
    except InvalidModel as e:
        raise InvalidBatchInput(f"field 'onnx': {e}") from None
    return {"verdicts": report.verdicts, "summary": report.summary}
