"""Daemon offload entry point: certify the counterfactuals that arrive with decisions.

Request (JSON-decoded dict):
    onnx      str, required   base64 of the ONNX model (feed-forward ReLU network)
    cfx       list, required  one counterfactual per row, each a list of input_dim numbers
    target    int = 1         the class the counterfactuals claim
    gamma     float = 0.999   confidence of the APΔS guarantee, in (0, 1)
    R         float = 0.995   fraction of shifts guaranteed robust, in (0, 1); the sample
                              size they need is capped (apas.MAX_SAMPLED)
    provable  bool = False    also compute the largest provable delta (MILP)
    seed      int | None = 0  seed of the realisations sampled, >= 0

Result: {"results": [{"row", "delta_max", "samples", "provable_delta"?, "seconds"}, ...]},
one entry per row in order, the same objects `vigil certify cfx` prints.
"""

from __future__ import annotations

import base64
import binascii

from vigil.rules.certify.cfx.certify import as_rows, certify_rows
from vigil.rules.reach.network import load_checked


class InvalidRequest(ValueError):
    """A request field is missing or has the wrong type or value."""


def _field(request: dict, name: str, kinds: tuple[type, ...], default: object = ...) -> object:
    if name not in request:
        if default is ...:
            raise InvalidRequest(f"request field {name!r} is required")
        return default
    value = request[name]
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequest(f"request field {name!r} must be {kinds[0].__name__}, got bool")
    if not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InvalidRequest(f"request field {name!r} must be {names}, got {type(value).__name__}")
    return value


def run_job(request: dict) -> dict:
    """Certify each counterfactual in ``request``; see the module docstring for the fields."""
    if not isinstance(request, dict):
        raise InvalidRequest(f"request must be an object, got {type(request).__name__}")
    encoded = _field(request, "onnx", (str,))
    try:
        model = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest(f"request field 'onnx' is not base64: {e}") from None
    cfx = _field(request, "cfx", (list,))
    target = _field(request, "target", (int,), 1)
    gamma = float(_field(request, "gamma", (int, float), 0.999))
    R = float(_field(request, "R", (int, float), 0.995))
    provable = _field(request, "provable", (bool,), False)
    seed = _field(request, "seed", (int, type(None)), 0)
    if seed is not None and seed < 0:
        raise InvalidRequest(f"request field 'seed' must be >= 0 or null, got {seed}")
    try:
        network, _ = load_checked(model)
    except Exception as e:
        raise InvalidRequest(f"request field 'onnx' is not a supported model: {e}") from None
    try:
        rows = as_rows(cfx, network, "request field 'cfx'")
        results = list(certify_rows(network, rows, target, gamma, R, provable, seed))
    except ValueError as e:
        raise InvalidRequest(f"request: {e}") from None
    return {"results": results}
