"""Online verifiers that live in a worker process between steps.

A verifier's branch state is large and only useful to the next step, so it stays in the
process that computes the steps; callers send the input set and, when the process does not
hold it yet, the model. A restarted process starts over with a rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.reach.network import Network, OnnxRunner, load_checked
from vigil.rules.reach.online import Accelerations, OnlineVerifier
from vigil.rules.reach.sets import InputSet, OutputSpec


@dataclass
class _Lane:
    options: dict
    verifier: OnlineVerifier
    version: str | None = None
    network: Network | None = None
    runner: OnnxRunner | None = None


_LANES: dict[str, _Lane] = {}


def check_model(onnx: bytes, output_dim: int) -> dict:
    """Load a model, confirm numpy and onnxruntime agree and that it fits the rule's spec."""
    network, _ = load_checked(onnx)
    if network.output_dim != output_dim:
        raise ValueError(f"the model has {network.output_dim} outputs, the spec {output_dim}")
    return {"input_dim": network.input_dim, "output_dim": network.output_dim}


def step(
    key: str,
    options: dict,
    version: str,
    onnx: bytes | None,
    lower: np.ndarray,
    upper: np.ndarray,
) -> dict:
    """One verification step of lane ``key`` on the box [lower, upper]; ``{"need_model":
    true}`` when this process does not hold model ``version`` and ``onnx`` was not sent."""
    lane = _LANES.get(key)
    if lane is None or lane.options != options:
        spec = OutputSpec(np.array(options["C"]), np.array(options["d"]))
        accelerations = Accelerations.parse(
            options["accelerations"], rsr=options["rsr_gamma"], inn=options["inn_range"]
        )
        verifier = OnlineVerifier(
            spec,
            max_branches=options["max_branches"],
            accelerations=accelerations,
            complete_seconds=options["complete_seconds"],
        )
        lane = _LANES[key] = _Lane(options, verifier)
    if onnx is not None:
        lane.network, lane.runner = load_checked(onnx)
        lane.version = version
    if lane.version != version or lane.network is None:
        return {"need_model": True}
    # onnxruntime computes what the spec is on, the last layer, unless a head follows it
    confirm = lane.runner if lane.network.output == "none" else None
    return lane.verifier.step(InputSet(lower, upper), lane.network, confirm).to_dict()
