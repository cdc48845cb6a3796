"""Networks as computed in a floating-point type: the rounding noise of each layer over a
box, and loading a model for queries that declare such a type.

The importer bounds each layer's rounding as ``R |h| + r`` in the magnitudes of the layer
before (``rules/graph/precision.py``). Over a box those magnitudes are bounded by the
layer before's pre-activation bounds, themselves computed with the noise of the layers
before them, so the noise is found one layer at a time from the input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from vigil.rules.graph import UnsupportedModel
from vigil.rules.graph.importer import element_type
from vigil.rules.graph.precision import PRECISIONS
from vigil.rules.reach.backward import output_bounds, post_activation, pre_activation_bounds
from vigil.rules.reach.network import Network, OnnxRunner, check_agreement


def rounding_noise(network: Network, lo: np.ndarray, hi: np.ndarray) -> Network:
    """``network`` with the noise bound of every layer over the boxes [lo, hi] (B, d):
    each layer's rounding at the largest magnitude the layer before reaches on any box."""
    if network.rounding is None or network.peaks is None or network.precision is None:
        raise ValueError("the network has no rounding bounds (load it with a precision)")
    largest = float(np.finfo(network.precision.dtype).max)
    noise: list[np.ndarray] = []
    magnitude = np.maximum(np.abs(lo), np.abs(hi)).max(axis=0)
    for k, ((r_w, r_b), (p, q)) in enumerate(zip(network.rounding, network.peaks, strict=True)):
        peak = float(p @ magnitude + q)
        if not peak < largest / 2:
            raise ValueError(
                f"a value computed in layer {k + 1} may reach {peak:.3g} on this box, beyond "
                f"the {network.precision.name} range: overflow is not bounded"
            )
        noise.append(r_w @ magnitude + r_b)
        if k + 1 < len(network.rounding):
            # the noise of layers 0..k is known: bound layer k, whose ReLU feeds k + 1
            prefix = Network(
                network.weights[: k + 2],
                network.biases[: k + 2],
                precision=network.precision,
                noise=tuple(noise),
                activations=None if network.activations is None else network.activations[: k + 1],
                exponents=None if network.exponents is None else network.exponents[: k + 1],
            )
            low, high = pre_activation_bounds(prefix, lo, hi)[-1]
            post_lo, post_hi = post_activation(network, k, low, high)
            magnitude = np.maximum(np.abs(post_lo), np.abs(post_hi)).max(axis=0)
            if not magnitude.max(initial=0.0) < largest / 2:  # a square, say
                raise ValueError(
                    f"a neuron of layer {k + 1} may reach {magnitude.max():.3g} on this box, "
                    f"beyond the {network.precision.name} range: overflow is not bounded"
                )
    return network.with_noise(noise)


def load_for(
    source: bytes | str | Path, arithmetic: str, hidden: tuple[str, ...] = (), seed: int = 0
) -> tuple[Network, OnnxRunner]:
    """A model to be analysed in ``arithmetic``: ``real``, or a floating-point type
    (``PRECISIONS``) that must be its input's type. For a floating-point type the network
    carries its rounding bounds and onnxruntime evaluates it node by node. The ``hidden``
    tensors follow the outputs, in the network and in onnxruntime's results.

    On random inputs onnxruntime must agree with the loaded network: within 1e-4, or
    within the bounds the rounding of the model's own type allows at that input (a model
    whose float32 evaluation strays from its real one is still read right)."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    try:
        own = element_type(onnx.load_model_from_string(data))
    except DecodeError as e:
        raise UnsupportedModel(f"not an ONNX model: the protobuf does not parse ({e})") from e
    if arithmetic != "real" and arithmetic not in PRECISIONS:
        supported = ", ".join(["real", *PRECISIONS])
        raise ValueError(f"element type {arithmetic} is not supported ({supported} are)")
    if arithmetic != "real" and own != arithmetic:
        raise ValueError(f"the query declares {arithmetic} tensors, the model's input is {own}")
    rng = np.random.default_rng(seed)
    if arithmetic == "real":
        network, runner = Network.from_onnx(data, hidden=hidden), OnnxRunner(data, hidden=hidden)
        probe = rng.uniform(-1.0, 1.0, size=(32, network.input_dim))
        try:
            check_agreement(network, runner, probe)
            return network, runner
        except UnsupportedModel:
            if own not in PRECISIONS:
                raise
    computed = Network.from_onnx(data, PRECISIONS[own], hidden)
    probe = rng.uniform(-1.0, 1.0, size=(32, computed.input_dim))
    probe = probe.astype(PRECISIONS[own].dtype).astype(np.float64)
    exact = OnnxRunner(data, node_by_node=True, hidden=hidden)
    check_enclosure(computed, exact, probe)
    if arithmetic == "real":
        return network, runner
    return computed, exact


def check_enclosure(network: Network, runner: OnnxRunner, points: np.ndarray) -> float:
    """The largest distance of onnxruntime's output from the real network's at ``points``;
    raises when an output lies outside the bounds the rounding allows there."""
    noisy = rounding_noise(network, points, points)
    m = network.output_dim
    rows = np.vstack([np.eye(m), -np.eye(m)])
    bounds = output_bounds(noisy, points, points, rows).upper
    upper, lower = bounds[:, :m], -bounds[:, m:]
    theirs = runner(points)
    if theirs.shape != upper.shape:
        raise UnsupportedModel(
            f"loaded network gives outputs of shape {upper.shape}, onnxruntime {theirs.shape}"
        )
    outside = np.maximum(lower - theirs, theirs - upper).max(initial=-np.inf)
    if outside > 0:
        raise UnsupportedModel(
            f"onnxruntime's output lies {outside:.3g} outside the bounds of the network's "
            f"{network.precision.name if network.precision else 'real'} evaluation; the "
            "graph holds semantics this loader does not model"
        )
    return float(np.abs(theirs - network.forward(points)).max(initial=0.0))
