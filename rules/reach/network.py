"""Feed-forward ReLU networks: loaded from ONNX into numpy layers, evaluated, exported back.

The verifiers (reachability, MILP encodings, interval networks) need the weights as plain
arrays; onnxruntime stays the reference evaluator, and `check_agreement` ties the two together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

OUTPUT_ACTIVATIONS = ("none", "sigmoid", "softmax")
_PASS_THROUGH = {"Flatten", "Identity", "Dropout"}


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only float64 array no one else can write to."""
    a = np.asarray(a, dtype=np.float64)
    if a.flags.writeable or not a.flags.owndata:
        a = a.copy()
        a.flags.writeable = False
    return a


class UnsupportedModel(ValueError):
    """The ONNX graph is not a feed-forward ReLU network this module can load."""


@dataclass(frozen=True)
class Network:
    """f = L_n o ReLU o ... o ReLU o L_1 with affine L_i(z) = W_i z + b_i, W_i of shape (out, in).

    ``output`` names a monotone activation applied after the last layer (sigmoid or softmax
    for models that emit probabilities); the layers themselves end in logits. The arrays are
    read-only float64 (writable ones are copied), so a layer array shared between two networks
    is the same layer: the online verifier skips comparing it.
    """

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    output: str = "none"

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
    def from_onnx(cls, source: bytes | str | Path) -> Network:
        """Load Gemm / MatMul+Add / Relu / Flatten / Identity chains; name anything else."""
        try:
            model = (
                onnx.load_model_from_string(source)
                if isinstance(source, bytes)
                else onnx.load(str(source))
            )
        except DecodeError as e:
            raise UnsupportedModel(f"not an ONNX model: the protobuf does not parse ({e})") from e
        return _parse(model.graph)

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
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            h = np.maximum(h @ w.T + b, 0.0)
        return h @ self.weights[-1].T + self.biases[-1]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The network's outputs, ``output`` activation included, for a batch (n, input_dim)."""
        z = self.logits(x)
        if self.output == "sigmoid":
            return 1.0 / (1.0 + np.exp(-z))
        if self.output == "softmax":
            e = np.exp(z - z.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        return z

    def pre_activations(self, x: np.ndarray) -> list[np.ndarray]:
        """Each hidden layer's values before its ReLU, for a batch."""
        out = []
        h = np.asarray(x, dtype=np.float64)
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            z = h @ w.T + b
            out.append(z)
            h = np.maximum(z, 0.0)
        return out

    def to_onnx(self, dtype: type = np.float32) -> bytes:
        """The network as an ONNX model (input ``x`` of shape (n, input_dim), output ``y``)."""
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


class OnnxRunner:
    """onnxruntime session for a model, fed float64 batches in the model's own dtype and shape."""

    def __init__(self, source: bytes | str | Path) -> None:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._session = ort.InferenceSession(
            data, sess_options=options, providers=["CPUExecutionProvider"]
        )
        inp = self._session.get_inputs()[0]
        self._name = inp.name
        self._dtype = np.float64 if inp.type == "tensor(double)" else np.float32
        self._shape = [d if isinstance(d, int) else -1 for d in inp.shape[1:]]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        batch = np.asarray(x, dtype=self._dtype)
        batch = batch.reshape([batch.shape[0], *self._shape])
        (out,) = self._session.run(None, {self._name: batch})
        return np.asarray(out, dtype=np.float64).reshape(batch.shape[0], -1)


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
    runner = OnnxRunner(source)
    probe = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(32, network.input_dim))
    check_agreement(network, runner, probe)
    return network, runner


def _parse(graph: onnx.GraphProto) -> Network:
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            inits[node.output[0]] = numpy_helper.to_array(node.attribute[0].t).astype(np.float64)
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise UnsupportedModel(f"expected one graph input, found {[i.name for i in inputs]}")
    dims = inputs[0].type.tensor_type.shape.dim[1:]
    if any(not d.HasField("dim_value") for d in dims):
        raise UnsupportedModel(f"input {inputs[0].name!r} needs fixed non-batch dimensions")
    width = int(np.prod([d.dim_value for d in dims]))

    layers: list[tuple[np.ndarray, np.ndarray]] = []
    pending: tuple[np.ndarray, np.ndarray] | None = None  # affine map since the last ReLU
    output = "none"
    current = inputs[0].name

    def affine(w: np.ndarray, b: np.ndarray) -> None:
        nonlocal pending, width
        if w.shape[1] != width:
            raise UnsupportedModel(f"node {name!r}: expects {w.shape[1]} inputs, gets {width}")
        pending = (w, b) if pending is None else (w @ pending[0], w @ pending[1] + b)
        width = w.shape[0]

    for node in graph.node:
        if node.op_type == "Constant":
            continue
        name = node.name or node.op_type
        data = [i for i in node.input if i and i not in inits]
        if data != [current]:
            raise UnsupportedModel(
                f"node {name!r} ({node.op_type}) does not continue the single data path"
            )
        if output != "none":
            raise UnsupportedModel(f"node {name!r} ({node.op_type}) follows the output activation")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        op = node.op_type
        if op == "Gemm":
            if attrs.get("transA", 0):
                raise UnsupportedModel(f"node {name!r}: Gemm with transA is not supported")
            b_mat = inits[node.input[1]]
            w = b_mat if attrs.get("transB", 0) else b_mat.T
            w = attrs.get("alpha", 1.0) * w
            c = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            bias = np.zeros(w.shape[0]) if c is None else attrs.get("beta", 1.0) * c
            affine(w, np.broadcast_to(bias.reshape(-1), (w.shape[0],)).copy())
        elif op == "MatMul":
            if node.input[0] != current:
                raise UnsupportedModel(
                    f"node {name!r}: MatMul must multiply the data from the left"
                )
            w = inits[node.input[1]].T
            affine(w, np.zeros(w.shape[0]))
        elif op in ("Add", "Sub"):
            const = next(i for i in node.input if i in inits)
            c = np.broadcast_to(inits[const].reshape(-1), (width,)).copy()
            if op == "Sub" and node.input[0] != current:
                raise UnsupportedModel(f"node {name!r}: only data - constant is supported")
            affine(np.eye(width), -c if op == "Sub" else c)
        elif op == "Relu":
            if pending is None:
                raise UnsupportedModel(f"node {name!r}: Relu without a preceding linear layer")
            layers.append(pending)
            pending = None
        elif op in ("Sigmoid", "Softmax"):
            if op == "Softmax" and attrs.get("axis", -1) not in (1, -1):
                raise UnsupportedModel(f"node {name!r}: Softmax must act on the feature axis")
            output = op.lower()
        elif op in _PASS_THROUGH:
            pass
        else:
            raise UnsupportedModel(
                f"node {name!r}: operator {op} is not supported "
                "(Gemm, MatMul, Add, Sub, Relu, Flatten, Identity, Dropout, Sigmoid, Softmax)"
            )
        current = node.output[0]

    if pending is None:  # the graph ends in a ReLU (or has no layer at all)
        if not layers:
            raise UnsupportedModel("the graph holds no linear layer")
        pending = (np.eye(width), np.zeros(width))
    layers.append(pending)
    return Network.from_arrays(layers, output)
