"""Feed-forward ReLU networks: loaded from ONNX into numpy layers, evaluated, exported back.

The verifiers (reachability, MILP encodings, interval networks) need the weights as plain
arrays; onnxruntime stays the reference evaluator, and `check_agreement` ties the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from vigil.rules.graph import UnsupportedModel, import_graph
from vigil.rules.graph.importer import HIDDEN_ACTIVATIONS, OUTPUT_HEADS
from vigil.rules.graph.precision import Precision

OUTPUT_ACTIVATIONS = OUTPUT_HEADS
RELU, SIGMOID, TANH, SQUARE, POWER = (HIDDEN_ACTIVATIONS.index(a) for a in HIDDEN_ACTIVATIONS)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z), without overflow where e^-z would."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only float64 array no one else can write to."""
    a = np.asarray(a, dtype=np.float64)
    if a.flags.writeable or not a.flags.owndata:
        a = a.copy()
        a.flags.writeable = False
    return a


@dataclass(frozen=True)
class Network:
    """f = L_n o ReLU o ... o ReLU o L_1 with affine L_i(z) = W_i z + b_i, W_i of shape (out, in).

    ``output`` names a monotone activation applied after the last layer (sigmoid or softmax
    for models that emit probabilities); the layers themselves end in logits. The arrays are
    read-only float64 (writable ones are copied), so a layer array shared between two networks
    is the same layer: the online verifier skips comparing it.

    A network analysed as computed in a floating-point type has a ``precision``, the
    importer's ``rounding`` and ``peaks`` bounds per layer, and once a box is known
    (``with_noise``) the ``noise``: per layer, how far each computed pre-activation may be
    from ``W h + b`` on that box. Bounds and MILPs (``backward``, ``milp``) treat the noise
    as an interval added to each bias, so they enclose the computed network as well as the
    real one.

    ``activations``, when given, holds per hidden layer each neuron's activation code
    (``HIDDEN_ACTIVATIONS``): a network with a sigmoid, tanh, square or power inside is
    verified by bounds alone (``relu_only`` is False, and the MILP finisher does not apply).
    ``exponents`` holds per hidden layer each power neuron's exponent (NaN elsewhere): z^p,
    NaN for z < 0 as onnxruntime computes it.
    """

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    output: str = "none"
    precision: Precision | None = None
    rounding: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None
    peaks: tuple[tuple[np.ndarray, float], ...] | None = None
    noise: tuple[np.ndarray, ...] | None = None
    activations: tuple[np.ndarray, ...] | None = None
    exponents: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", tuple(_frozen(w) for w in self.weights))
        object.__setattr__(self, "biases", tuple(_frozen(b) for b in self.biases))
        if not self.weights or len(self.weights) != len(self.biases):
            raise ValueError("a network needs at least one layer and one bias per layer")
        width = self.weights[0].shape[1]
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            if w.ndim != 2 or b.shape != (w.shape[0],):
                raise ValueError(f"layer {i}: weight {w.shape} and bias {b.shape} do not match")
            if w.shape[1] != width:
                raise ValueError(f"layer {i}: expects {w.shape[1]} inputs, gets {width}")
            width = w.shape[0]
        if self.output not in OUTPUT_ACTIVATIONS:
            raise ValueError(f"output must be one of {OUTPUT_ACTIVATIONS}, got {self.output!r}")
        if self.activations is not None and [len(a) for a in self.activations] != [
            w.shape[0] for w in self.weights[:-1]
        ]:
            raise ValueError("one activation code per hidden neuron is needed")
        powers = self.activations is not None and any((a == POWER).any() for a in self.activations)
        if powers and (
            self.exponents is None
            or [len(e) for e in self.exponents] != [len(a) for a in self.activations]  # type: ignore[union-attr]
        ):
            raise ValueError("one exponent per hidden neuron is needed with power neurons")

    @property
    def relu_only(self) -> bool:
        """Whether every hidden neuron is a ReLU (what the MILP encodings require)."""
        return self.activations is None or not any(a.any() for a in self.activations)

    def relus(self, k: int) -> np.ndarray | bool:
        """Which neurons of hidden layer ``k`` are ReLUs (all: True)."""
        return True if self.activations is None else self.activations[k] == RELU

    def hidden(self, k: int, z: np.ndarray) -> np.ndarray:
        """Hidden layer ``k``'s activations of its pre-activations z (n, width)."""
        out = np.maximum(z, 0.0)
        if self.activations is not None and self.activations[k].any():
            kinds = self.activations[k]
            out[:, kinds == SIGMOID] = sigmoid(z[:, kinds == SIGMOID])
            out[:, kinds == TANH] = np.tanh(z[:, kinds == TANH])
            out[:, kinds == SQUARE] = z[:, kinds == SQUARE] ** 2
            power = kinds == POWER
            if power.any():
                with np.errstate(invalid="ignore"):
                    out[:, power] = np.power(z[:, power], self.exponents[k][power])  # type: ignore[index]
        return out

    def slope(self, k: int, z: np.ndarray) -> np.ndarray:
        """The derivative of hidden layer ``k``'s activations at z (n, width)."""
        out = (z > 0).astype(np.float64)
        if self.activations is not None and self.activations[k].any():
            kinds = self.activations[k]
            s = sigmoid(z[:, kinds == SIGMOID])
            out[:, kinds == SIGMOID] = s * (1.0 - s)
            out[:, kinds == TANH] = 1.0 - np.tanh(z[:, kinds == TANH]) ** 2
            out[:, kinds == SQUARE] = 2.0 * z[:, kinds == SQUARE]
            power = kinds == POWER
            if power.any():  # 0 where the power is NaN or its slope infinite
                base, p = z[:, power], self.exponents[k][power]  # type: ignore[index]
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[:, power] = np.where(base > 0, p * np.power(base, p - 1), 0.0)
        return out

    @classmethod
    def from_arrays(
        cls, layers: list[tuple[np.ndarray, np.ndarray]], output: str = "none"
    ) -> Network:
        """A network from (W (out, in), b) pairs as float64 (read-only arrays are not copied)."""
        biases = [np.asarray(b, dtype=np.float64) for _, b in layers]
        return cls(
            tuple(np.asarray(w, dtype=np.float64) for w, _ in layers),
            tuple(b if b.ndim == 1 else b.reshape(-1) for b in biases),
            output,
        )

    @classmethod
    def from_onnx(
        cls,
        source: bytes | str | Path,
        precision: Precision | None = None,
        hidden: tuple[str, ...] = (),
    ) -> Network:
        """The ReLU network an ONNX graph computes (``vigil.rules.graph``), with its
        rounding bounds in ``precision`` when given, and the ``hidden`` tensors as outputs
        after the graph's own; an operator it cannot read is named in
        ``UnsupportedModel``."""
        try:
            model = (
                onnx.load_model_from_string(source)
                if isinstance(source, bytes)
                else onnx.load(str(source))
            )
        except DecodeError as e:
            raise UnsupportedModel(f"not an ONNX model: the protobuf does not parse ({e})") from e
        imported = import_graph(model, precision, hidden)
        network = cls.from_arrays(imported.layers, imported.output)
        if imported.activations is not None:
            exponents = None if imported.exponents is None else tuple(imported.exponents)
            network = replace(network, activations=tuple(imported.activations), exponents=exponents)
        if imported.rounding is None or imported.peaks is None:
            return network
        return replace(
            network,
            precision=precision,
            rounding=tuple(imported.rounding),
            peaks=tuple(imported.peaks),
        )

    def with_noise(self, noise: list[np.ndarray]) -> Network:
        """The same network with each layer's rounding noise bound (``backward.rounding_noise``)."""
        if len(noise) != len(self.weights):
            raise ValueError(f"{len(noise)} noise bounds for {len(self.weights)} layers")
        return replace(self, noise=tuple(_frozen(n) for n in noise))

    @property
    def input_dim(self) -> int:
        return self.weights[0].shape[1]

    @property
    def output_dim(self) -> int:
        return self.weights[-1].shape[0]

    @property
    def hidden_sizes(self) -> list[int]:
        return [w.shape[0] for w in self.weights[:-1]]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Last-layer values (before ``output``) for a batch (n, input_dim)."""
        h = np.asarray(x, dtype=np.float64)
        for k, (w, b) in enumerate(zip(self.weights[:-1], self.biases[:-1], strict=True)):
            h = self.hidden(k, h @ w.T + b)
        return h @ self.weights[-1].T + self.biases[-1]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The network's outputs, ``output`` activation included, for a batch (n, input_dim)."""
        return self.activate(self.logits(x))

    def activate(self, z: np.ndarray) -> np.ndarray:
        """The ``output`` activation of last-layer values (n, output_dim)."""
        if self.output == "sigmoid":
            return sigmoid(z)
        if self.output == "softmax":
            e = np.exp(z - z.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        return z

    def pre_activations(self, x: np.ndarray) -> list[np.ndarray]:
        """Each hidden layer's values before its activations, for a batch."""
        out = []
        h = np.asarray(x, dtype=np.float64)
        for k, (w, b) in enumerate(zip(self.weights[:-1], self.biases[:-1], strict=True)):
            z = h @ w.T + b
            out.append(z)
            h = self.hidden(k, z)
        return out

    def to_onnx(self, dtype: type = np.float32) -> bytes:
        """The network as an ONNX model (input ``x`` of shape (n, input_dim), output ``y``);
        ReLU networks only."""
        if not self.relu_only:
            raise ValueError("only a ReLU network is exported")
        elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
        nodes, inits = [], []
        current = "x"
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            inits += [
                numpy_helper.from_array(w.astype(dtype), f"W{i}"),
                numpy_helper.from_array(b.astype(dtype), f"B{i}"),
            ]
            z = f"z{i}"
            nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [z], transB=1))
            if i < last:
                nodes.append(helper.make_node("Relu", [z], [f"h{i}"]))
                current = f"h{i}"
            else:
                current = z
        if self.output == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [current], ["y"]))
        elif self.output == "softmax":
            nodes.append(helper.make_node("Softmax", [current], ["y"], axis=1))
        else:
            nodes.append(helper.make_node("Identity", [current], ["y"]))
        graph = helper.make_graph(
            nodes,
            "vigil-relu-network",
            [helper.make_tensor_value_info("x", elem, ["n", self.input_dim])],
            [helper.make_tensor_value_info("y", elem, ["n", self.output_dim])],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model.SerializeToString()


_INPUT_TYPES = {"tensor(double)": np.float64, "tensor(float16)": np.float16}


class OnnxRunner:
    """onnxruntime session for a model, fed float64 batches in the model's own dtype and
    shape: each row is every input's values, flattened and joined in the graph's order,
    and each result row every output's values so joined, then the ``hidden`` tensors'.
    ``node_by_node`` turns graph optimizations off, so every node runs as its own kernel in
    the model's type (no fused or pre-computed weights): the evaluation whose rounding the
    importer bounds."""

    def __init__(
        self,
        source: bytes | str | Path,
        node_by_node: bool = False,
        hidden: tuple[str, ...] = (),
    ) -> None:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        if hidden:
            model = onnx.load_model_from_string(data)
            model.graph.output.extend(helper.make_empty_tensor_value_info(h) for h in hidden)
            data = model.SerializeToString()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        if node_by_node:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self._session = ort.InferenceSession(
            data, sess_options=options, providers=["CPUExecutionProvider"]
        )
        inputs = self._session.get_inputs()
        self._names = [i.name for i in inputs]
        self._types = [_INPUT_TYPES.get(i.type, np.float32) for i in inputs]
        self._shapes = [[d if isinstance(d, int) else 1 for d in i.shape] for i in inputs]
        self._cuts = np.cumsum([0, *(int(np.prod(shape)) for shape in self._shapes)])
        # models exported for a fixed batch (VNN-COMP's of one row), or with a 1-D input:
        # each point is one whole input, run one by one
        self._batched = all(len(i.shape) > 1 and not isinstance(i.shape[0], int) for i in inputs)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        batch = np.asarray(x, dtype=np.float64)
        n = batch.shape[0]
        parts = [batch[:, a:b] for a, b in zip(self._cuts[:-1], self._cuts[1:], strict=True)]
        if self._batched:
            return self._run(
                [p.reshape(n, *s[1:]) for p, s in zip(parts, self._shapes, strict=True)], n
            )
        rows = [
            self._run([p[k].reshape(s) for p, s in zip(parts, self._shapes, strict=True)], 1)
            for k in range(n)
        ]
        return np.vstack(rows) if rows else np.zeros((0, 0))

    def _run(self, parts: list[np.ndarray], n: int) -> np.ndarray:
        feeds = {
            name: part.astype(kind)
            for name, part, kind in zip(self._names, parts, self._types, strict=True)
        }
        outputs = self._session.run(None, feeds)
        return np.hstack([np.asarray(o, dtype=np.float64).reshape(n, -1) for o in outputs])


def check_agreement(
    network: Network,
    runner: OnnxRunner,
    samples: np.ndarray,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> float:
    """Largest |numpy - onnxruntime| on ``samples``; raises when the two disagree."""
    ours = network.forward(samples)
    theirs = runner(samples)
    if ours.shape != theirs.shape:
        raise UnsupportedModel(
            f"loaded network gives outputs of shape {ours.shape}, onnxruntime {theirs.shape}"
        )
    error = float(np.max(np.abs(ours - theirs), initial=0.0))
    if not np.allclose(ours, theirs, atol=atol, rtol=rtol):
        raise UnsupportedModel(
            f"loaded network disagrees with onnxruntime by up to {error:.3g}; "
            "the graph holds semantics this loader does not model"
        )
    return error


def load_checked(source: bytes | str | Path, seed: int = 0) -> tuple[Network, OnnxRunner]:
    """Load a model and confirm numpy and onnxruntime agree on random inputs."""
    network = Network.from_onnx(source)
    if not network.relu_only:
        raise UnsupportedModel(
            "a sigmoid or tanh inside the network: only `vigil verify vnnlib` (by bounds) "
            "handles it; these verifiers need ReLU networks"
        )
    runner = OnnxRunner(source)
    probe = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(32, network.input_dim))
    check_agreement(network, runner, probe)
    return network, runner
