"""ONNX graph -> a chain of affine layers with ReLUs between them (what every verifier takes).

The graph is walked in its (topological) node order with one converter per operator
(``ops.CONVERTERS``). Every data tensor is kept as an affine function of the neurons of the
layer being built; a ReLU closes that layer. A tensor still needed after the ReLU (a
residual branch) is carried through it exactly: a neuron after an earlier ReLU is
non-negative, so its ReLU is itself; a network input ``x`` is carried as ``relu(x)`` and
``relu(-x)``. So graphs with skip connections, convolutions and normalisations become the
same ``(W_i, b_i)`` chain, and the chain computes what the graph computes.

Given a floating-point ``Precision``, the importer also bounds the rounding of the graph's
own evaluation in that type, per layer: the computed pre-activations ``z`` of layer ``i``
differ from ``W_i h + b_i``, with ``h`` the computed neurons of the layer before, by at most
``R_i |h| + r_i`` (``Imported.rounding``). A ReLU itself is exact, so the computed network
is the chain with a bounded error added before each ReLU.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from vigil.rules.graph.folding import FOLDED, fold
from vigil.rules.graph.ops import CONVERTERS, Node
from vigil.rules.graph.precision import ONNX_TYPES, Precision, Tracked
from vigil.rules.graph.values import (
    Affine,
    UnsupportedModel,
    Value,
    add,
    broadcast,
    concatenate,
    lift,
    linear,
    scale,
)

OUTPUT_HEADS = ("none", "sigmoid", "softmax")
HIDDEN_ACTIVATIONS = ("relu", "sigmoid", "tanh", "square", "power")
TANH, SQUARE, POWER = (HIDDEN_ACTIVATIONS.index(a) for a in ("tanh", "square", "power"))
"""A hidden neuron's activation, by its code in ``Imported.activations``: a Sigmoid, Tanh,
square (Pow 2, and a product of two computed tensors as a difference of squares) or power
(Pow to a positive non-integer exponent, ``Imported.exponents``) inside the graph closes a
layer as a ReLU does, its neurons marked with their code."""


@dataclass(frozen=True)
class Imported:
    """A graph as layers ``(W (out, in), b)`` over its flattened input, and its output
    head (``OUTPUT_HEADS``); with a precision, each layer's rounding bound ``(R (out, in),
    r (out,))``, both non-negative, and the peak magnitude ``(p (in,), q)`` any tensor
    computed in the layer may reach, ``p . |h| + q`` (``precision.Tracked``)."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    output: str
    rounding: list[tuple[np.ndarray, np.ndarray]] | None = None
    peaks: list[tuple[np.ndarray, float]] | None = None
    activations: list[np.ndarray] | None = None
    """Per hidden layer, each neuron's code in ``HIDDEN_ACTIVATIONS``; None: all ReLUs."""
    exponents: list[np.ndarray] | None = None
    """Per hidden layer, each power neuron's exponent (NaN for the others); None: no power
    neurons."""


def data_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph's inputs that are data, not weights (exporters list weights as inputs too)."""
    weights = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in weights]


def element_type(model: onnx.ModelProto) -> str:
    """The element type of the model's data input as VNN-LIB names it (``float32``, ...),
    or the ONNX type's name when it is not a floating-point type the bounds cover."""
    inputs = data_inputs(model.graph)
    number = inputs[0].type.tensor_type.elem_type if inputs else 0
    return ONNX_TYPES.get(number, onnx.TensorProto.DataType.Name(number).lower())


def import_graph(
    model: onnx.ModelProto, precision: Precision | None = None, hidden: tuple[str, ...] = ()
) -> Imported:
    """The network an ONNX model computes, with its rounding bounds in ``precision`` when
    given; ``UnsupportedModel`` names what it cannot read.

    Several graph inputs are one input vector, their flattened values in the graph's
    order; several outputs likewise one output vector, followed by the ``hidden`` tensors
    (names of tensors computed inside the graph) in the order given."""
    graph = model.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consts = {name: a.astype(np.float64) for name, a in arrays.items()}
    inputs = data_inputs(graph)
    if not inputs:
        raise UnsupportedModel("the graph has no input")
    produced = {o for n in graph.node for o in n.output}
    unknown = [name for name in hidden if name not in produced]
    if unknown:
        raise UnsupportedModel(f"hidden node {unknown[0]!r} is not a tensor the graph computes")
    builder = _Builder(graph, consts, precision)
    builder.kinds.update({name: a.dtype for name, a in arrays.items()})
    for info, value in zip(inputs, builder.input_values([_shape(i) for i in inputs]), strict=True):
        builder.env[info.name] = value
    names = [o.name for o in graph.output] + list(hidden)
    builder.uses.update(hidden)  # kept, and carried through the ReLUs after them
    for index, proto in enumerate(graph.node):
        builder.convert(proto, proto.name or f"#{index}")
    results = [builder.env.get(name) for name in names]
    if not any(isinstance(r, Affine) for r in results):
        raise UnsupportedModel("the graph output does not depend on its input")
    if builder.output != "none" and len(names) > 1:
        raise UnsupportedModel(
            f"an output {builder.output} with several outputs or hidden nodes is not supported"
        )
    neurons = next(r for r in results if isinstance(r, Affine)).neurons
    flat = [linear(lift(r, neurons), _flatten) for r in results]  # type: ignore[arg-type]
    layers = builder.finish(concatenate(flat, 0))  # type: ignore[arg-type]
    codes = builder.activations if any(a.any() for a in builder.activations) else None
    powers = any((a == POWER).any() for a in builder.activations)
    exponents = builder.exponents if powers else None
    tracked = builder.precision
    if tracked is None:
        return Imported(layers, builder.output, activations=codes, exponents=exponents)
    return Imported(layers, builder.output, builder.rounding, tracked.peaks, codes, exponents)


class _Builder:
    """The chain built so far, the tensors of the graph, and how often each is still used."""

    def __init__(
        self, graph: onnx.GraphProto, consts: dict[str, np.ndarray], precision: Precision | None
    ) -> None:
        self.precision = None if precision is None else Tracked(precision)
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.rounding: list[tuple[np.ndarray, np.ndarray]] = []
        self.activations: list[np.ndarray] = []
        self.exponents: list[np.ndarray] = []
        self.output = "none"
        self.node_outputs: tuple[str, ...] = ()  # of the node being converted
        self.graph_outputs = {o.name for o in graph.output}
        self.env: dict[str, Value] = dict(consts)
        self.kinds: dict[str, np.dtype] = {}  # a constant's type in the graph, where known
        self.uses = Counter(i for n in graph.node for i in n.input if i)
        self.uses.update(o.name for o in graph.output)

    def input_values(self, shapes: list[tuple[int | str, ...]]) -> list[Affine]:
        """Each input as its slice of the one input vector (a free batch dimension is 1)."""
        fixed = [tuple(d if isinstance(d, int) else 1 for d in shape) for shape in shapes]
        sizes = [int(np.prod(shape)) for shape in fixed]
        eye = np.eye(sum(sizes))
        starts = np.cumsum([0, *sizes])
        return [
            Affine(eye[:, a:b].reshape(-1, *shape), np.zeros(shape))
            for a, b, shape in zip(starts[:-1], starts[1:], fixed, strict=True)
        ]

    def convert(self, proto: onnx.NodeProto, name: str) -> None:
        if self.output != "none":
            raise UnsupportedModel(f"node {name!r} ({proto.op_type}) follows the output activation")
        converter = CONVERTERS.get(proto.op_type)
        if converter is None and proto.op_type not in FOLDED:
            raise UnsupportedModel(
                f"node {name!r}: operator {proto.op_type} is not supported "
                f"(supported: {', '.join(sorted(set(CONVERTERS) | FOLDED))})"
            )
        missing = [i for i in proto.input if i and i not in self.env]
        if missing:
            raise UnsupportedModel(f"node {name!r} ({proto.op_type}): unknown input {missing[0]!r}")
        attrs = {a.name: _attribute(a) for a in proto.attribute}
        inputs = [self.env[i] if i else None for i in proto.input]
        node = Node(proto.op_type, name, inputs, attrs, len(proto.output))
        self.node_outputs = tuple(proto.output)
        constant = not any(isinstance(v, Affine) for v in inputs)
        for i in proto.input:
            if i:
                self.uses[i] -= 1
        try:
            if proto.op_type in FOLDED and constant:
                out = self._fold(proto, inputs)
            elif converter is None:
                raise node.fail(
                    "its inputs must be constants, not tensors computed from the network input"
                )
            else:
                out = converter(node, self)
                if proto.op_type == "Constant":
                    self.kinds[proto.output[0]] = _constant_kind(attrs)
                elif proto.op_type in ("Shape", "Size"):
                    self.kinds[proto.output[0]] = np.dtype(np.int64)
        except UnsupportedModel:
            raise
        except (ValueError, IndexError, KeyError) as e:
            raise node.fail(f"cannot apply it: {e}") from e
        for i in proto.input:
            if i and self.uses[i] <= 0:
                self.env.pop(i, None)
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) < len([o for o in proto.output if o]):
            raise node.fail(f"gives {len(outs)} outputs, the node names {len(proto.output)}")
        for output, value in zip(proto.output, outs, strict=False):
            if output:
                self.env[output] = value

    def _fold(self, proto: onnx.NodeProto, inputs: list[Value | None]) -> tuple[Value, ...]:
        """A node on constants, evaluated; its outputs' types are kept for later folds."""
        kinds = [self.kinds.get(i) for i in proto.input]
        floats = np.float64 if self.precision is None else self.precision.dtype
        try:
            outputs = fold(proto, inputs, kinds, floats)  # type: ignore[arg-type]
        except Exception as e:  # the reference evaluator raises what its operators raise
            raise UnsupportedModel(
                f"node {proto.name!r} ({proto.op_type}): cannot evaluate it on its constants: {e}"
            ) from e
        for name, value in zip(proto.output, outputs, strict=False):
            self.kinds[name] = value.dtype
        return tuple(value.astype(np.float64) for value in outputs)

    def relu(self, node: Node, value: Value) -> Value:
        if not isinstance(value, Affine):
            return np.maximum(value, 0.0)
        return self._close_layer(value)

    def activation(self, node: Node, value: Value, kind: str) -> Value:
        """A Sigmoid or Tanh: the output head when its result is the graph's output and
        nothing else reads it (Sigmoid), otherwise a layer of such neurons."""
        final = all(o in self.graph_outputs and self.uses[o] == 1 for o in self.node_outputs)
        if kind == "sigmoid" and final:
            return self.head(node, value, kind)
        if not isinstance(value, Affine):
            if self.precision is not None:  # its value would enter the chain as exact
                raise node.fail(
                    f"{kind} of a constant in {self.precision.name}: onnxruntime's value of it "
                    "(exp by a polynomial) is not bounded; ask the query over real"
                )
            return 1.0 / (1.0 + np.exp(-value)) if kind == "sigmoid" else np.tanh(value)
        return self._close_layer(value, HIDDEN_ACTIVATIONS.index(kind))

    def maximum(
        self, node: Node, a: Value, b: Value, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]:
        """max(a, b) elementwise, as ``b + relu(a - b)``: one layer whose new neurons are
        the differences, ``b`` and the values ``carry`` carried through it (they follow as
        the other results). A maximum is exact in floating point (it is one of its
        arguments), so only ``a``'s and ``b``'s own errors pass on."""
        if not isinstance(a, Affine) and not isinstance(b, Affine):
            return (np.maximum(a, b), *carry)
        neurons = a.neurons if isinstance(a, Affine) else b.neurons  # type: ignore[union-attr]
        b = lift(b, neurons)
        gap = add(a, scale(b, np.float64(-1.0), self.precision, terms=0), self.precision)
        assert isinstance(gap, Affine)
        gap = Affine(gap.coef, gap.offset, _difference_error(a, b, neurons))
        rise, low, *carried = self._close_carrying(node, gap, 0, (b, *carry))
        assert isinstance(low, Affine)
        top = Affine(rise.coef + low.coef, rise.offset + low.offset, low.error)
        return (top, *carried)

    def square(
        self, node: Node, value: Value, computed: bool, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]:
        """value², as a layer of square neurons, then ``carry`` carried through it;
        ``computed``: the runtime computes the square itself (Pow), one rounding more."""
        if not isinstance(value, Affine):
            return (_rounded_square(value, self.precision), *carry)
        out, *carried = self._close_carrying(node, value, SQUARE, carry)
        if not computed or self.precision is None:
            return (out, *carried)
        p = self.precision
        error = Affine(p.unit * out.coef, np.full(out.shape, p.tiny))  # the square's neurons >= 0
        return (Affine(out.coef, out.offset, error), *carried)

    def power(self, node: Node, value: Affine, exponent: float) -> Affine:
        """value ** exponent for a positive non-integer exponent, as a layer of power
        neurons (onnxruntime's NaN below 0 is left to the verifier, ``POWER``); the
        runtime's ``pow`` is within an ulp, 2 u |y|."""
        out = self._close_layer(value, POWER, exponent)
        if self.precision is None:
            return out
        p = self.precision
        error = Affine(2 * p.unit * out.coef, np.full(out.shape, p.tiny))  # the power's >= 0
        return Affine(out.coef, out.offset, error)

    def product(
        self, node: Node, a: Value, b: Value, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]:
        """a * b elementwise (broadcast) for two computed tensors, as ((a + b)² - (a - b)²)/4:
        one layer of square neurons, ``carry`` carried through it; the runtime's one
        rounding of the product, u |a b|, is at most u ((a + b)² + (a - b)²)/4."""
        neurons = a.neurons if isinstance(a, Affine) else b.neurons  # type: ignore[union-attr]
        a, b = lift(a, neurons), lift(b, neurons)
        shape = np.broadcast_shapes(a.shape, b.shape)
        a, b = broadcast(a, shape), broadcast(b, shape)
        assert isinstance(a, Affine) and isinstance(b, Affine)
        exact = _difference_error(a, b, neurons)
        total = Affine(a.coef + b.coef, a.offset + b.offset, exact)
        gap = Affine(a.coef - b.coef, a.offset - b.offset, exact)
        pair = concatenate([_stacked(total), _stacked(gap)], 0)
        squares, *carried = self.square(node, pair, False, carry)
        assert isinstance(squares, Affine)
        upper, lower = squares.coef[:, 0], squares.coef[:, 1]
        error = None
        if self.precision is not None:
            p = self.precision
            error = Affine(p.unit * (upper + lower) / 4, np.full(shape, p.tiny))
        return (Affine((upper - lower) / 4, np.zeros(shape), error), *carried)

    def _close_carrying(
        self, node: Node, value: Affine, code: int, carry: tuple[Value, ...]
    ) -> list[Value]:
        """``_close_layer`` with the values ``carry`` held among the graph's tensors while
        the layer closes, so that they are carried through it: the layer's output, then
        them."""
        held = [f"\0carry:{node.name}:{k}" for k in range(len(carry))]
        for key, kept in zip(held, carry, strict=True):
            self.env[key], self.uses[key] = kept, 1
        out = self._close_layer(value, code)
        carried = [self.env.pop(key) for key in held]
        for key in held:
            del self.uses[key]
        return [out, *carried]

    def head(self, node: Node, value: Value, kind: str) -> Value:
        if kind == "softmax" and int(np.prod(value.shape[:-1])) > 1:
            raise node.fail(
                f"a Softmax over {int(np.prod(value.shape[:-1]))} rows: the verifiers take one "
                "output head over the whole output"
            )
        self.output = kind
        return value

    def finish(self, value: Affine) -> list[tuple[np.ndarray, np.ndarray]]:
        w = value.coef.reshape(value.neurons, -1).T
        self.rounding.append(_rounding(value))
        if self.precision is not None:
            self.precision.close(value.neurons)
        return [*self.layers, (w, value.offset.reshape(-1))]

    def _close_layer(self, value: Affine, code: int = 0, exponent: float = np.nan) -> Affine:
        """ReLU (or the activation ``code``) of ``value`` as a new layer; the tensors used
        later are carried through it as ReLUs and re-expressed over the new layer's
        neurons."""
        later = [k for k, v in self.env.items() if isinstance(v, Affine) and self.uses[k] > 0]
        n, m = value.neurons, int(np.prod(value.shape))
        used = np.zeros(n, dtype=bool)
        for k in later:
            v = self.env[k]
            used |= np.any(v.coef.reshape(n, -1) != 0, axis=1)
            if v.error is not None:
                used |= np.any(v.error.coef.reshape(n, -1) != 0, axis=1)
        cols = np.flatnonzero(used)
        # the network input, and tanh neurons, may be negative: h = relu(h) - relu(-h)
        signed = not self.layers or bool((self.activations[-1] == TANH).any())
        pick = np.eye(n)[cols]
        w = np.vstack([value.coef.reshape(n, m).T, pick, *([-pick] if signed else [])])
        self.layers.append((w, np.concatenate([value.offset.reshape(m), np.zeros(len(w) - m)])))
        width = len(w)
        self.activations.append(
            np.concatenate([np.full(m, code), np.zeros(width - m)]).astype(np.int8)
        )
        self.exponents.append(np.concatenate([np.full(m, exponent), np.full(width - m, np.nan)]))
        # the carried neurons pass the ReLU exactly: no rounding in their rows
        r_w, r_b = _rounding(value)
        if self.precision is not None:
            self.precision.close(n)
        self.rounding.append(
            (np.vstack([r_w, np.zeros((width - m, n))]), np.concatenate([r_b, np.zeros(width - m)]))
        )

        def carried(coef: np.ndarray, magnitude: bool) -> np.ndarray:
            """Coefficients over the old neurons re-expressed over the new layer: h_j is
            relu(h_j) - relu(-h_j), and |h_j| is relu(h_j) + relu(-h_j)."""
            old = coef.reshape(n, -1)[cols]
            out = np.zeros((width, old.shape[1]))
            out[m : m + cols.size] = old
            if signed:
                out[m + cols.size :] = old if magnitude else -old
            return out.reshape(width, *coef.shape[1:])

        for k in later:
            v = self.env[k]
            error = None
            if v.error is not None:
                error = Affine(carried(v.error.coef, True), v.error.offset)
            self.env[k] = Affine(carried(v.coef, False), v.offset, error)
        out = np.zeros((width, m))
        out[:m] = np.eye(m)
        return Affine(out.reshape(width, *value.shape), np.zeros(value.shape))


def _rounded_square(value: np.ndarray, precision: Tracked | None) -> np.ndarray:
    square = value * value
    return square if precision is None else square.astype(precision.dtype).astype(np.float64)


def _stacked(value: Affine) -> Affine:
    """``value`` with a new leading axis of size 1 (after the neuron axis)."""
    return linear(value, lambda t: t[:, None])  # type: ignore[return-value]


def _flatten(t: np.ndarray) -> np.ndarray:
    """A batch of tensors as a batch of vectors."""
    return t.reshape(len(t), -1)


def _difference_error(a: Value, b: Affine, neurons: int) -> Affine | None:
    """The error bound of ``a - b`` computed exactly from computed ``a`` and ``b``."""
    a = lift(a, neurons)
    if a.error is None and b.error is None:
        return None
    total = add(
        Affine(np.zeros_like(a.coef), np.zeros_like(a.offset)) if a.error is None else a.error,
        Affine(np.zeros_like(b.coef), np.zeros_like(b.offset)) if b.error is None else b.error,
    )
    assert isinstance(total, Affine)
    return total


def _constant_kind(attrs: dict) -> np.dtype:
    """The type of a Constant node's value."""
    if "value" in attrs:
        return np.asarray(attrs["value"]).dtype
    return np.dtype(np.int64 if "value_int" in attrs or "value_ints" in attrs else np.float32)


def _rounding(value: Affine) -> tuple[np.ndarray, np.ndarray]:
    """The rounding bound of a layer's pre-activations ``value``: (R (out, in), r (out,))."""
    n, m = value.neurons, int(np.prod(value.shape))
    if value.error is None:
        return np.zeros((m, n)), np.zeros(m)
    return value.error.coef.reshape(n, m).T.copy(), value.error.offset.reshape(m).copy()


def _shape(info: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    """An input's declared shape; every dimension but a leading batch one must be fixed. A
    fixed batch of N rows is N rows of the network's one input: the property is over all
    of them at once."""
    dims = info.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
    if any(not isinstance(d, int) for d in shape[1:]):
        raise UnsupportedModel(f"input {info.name!r} needs fixed non-batch dimensions, has {shape}")
    if not shape:
        raise UnsupportedModel(f"input {info.name!r} has no shape")
    return shape


def _attribute(a: onnx.AttributeProto):
    value = helper.get_attribute_value(a)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode()
    return value
