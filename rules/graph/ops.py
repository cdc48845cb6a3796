"""One converter per ONNX operator family, registered in ``CONVERTERS``.

A converter gets the node (its input values, attributes and name) and the builder of the
network, and returns the node's output value. Linear maps act on ``Affine`` coefficients
as on a batch (``values.linear``); what closes a layer (ReLU, Sigmoid, Tanh, squares and
elementwise products of computed tensors, MaxPool's maxima) and the output head are the
builder's. An operator outside these is refused by name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from vigil.rules.graph.precision import Precision, Tracked
from vigil.rules.graph.values import (
    Affine,
    UnsupportedModel,
    Value,
    add,
    broadcast,
    concatenate,
    linear,
    product,
    scale,
    select,
    watch,
)


@dataclass(frozen=True)
class Node:
    """A node to convert: its operator, name, input values (None where omitted) and
    attributes."""

    op: str
    name: str
    inputs: list[Value | None]
    attrs: dict[str, Any]
    outputs: int = 1

    def fail(self, why: str) -> UnsupportedModel:
        return UnsupportedModel(f"node {self.name!r} ({self.op}): {why}")

    def const(self, i: int, what: str) -> np.ndarray:
        """Input ``i``, which must be a constant (weights, shapes)."""
        value = self.inputs[i] if i < len(self.inputs) else None
        if value is None:
            raise self.fail(f"needs its {what}")
        if isinstance(value, Affine):
            raise self.fail(f"its {what} must be a constant, not computed from the input")
        return value

    def data(self, i: int = 0) -> Value:
        value = self.inputs[i] if i < len(self.inputs) else None
        if value is None:
            raise self.fail(f"input {i} is missing")
        return value


class Builder(Protocol):
    """What converters need of the network being built: with a ``precision``, every
    converter also bounds the rounding of its operation in that type (``values``)."""

    precision: Tracked | None

    def relu(self, node: Node, value: Value) -> Value: ...

    def head(self, node: Node, value: Value, kind: str) -> Value: ...

    def activation(self, node: Node, value: Value, kind: str) -> Value: ...

    def square(
        self, node: Node, value: Value, computed: bool, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]: ...

    def product(
        self, node: Node, a: Value, b: Value, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]: ...

    def power(self, node: Node, value: Affine, exponent: float) -> Affine: ...

    def maximum(
        self, node: Node, a: Value, b: Value, carry: tuple[Value, ...] = ()
    ) -> tuple[Value, ...]: ...


Converter = Callable[[Node, Builder], Value | tuple[Value, ...]]
"""A node's output value, or one per output (Split)."""
CONVERTERS: dict[str, Converter] = {}


def converts(*ops: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for op in ops:
            CONVERTERS[op] = fn
        return fn

    return register


# -- activations ------------------------------------------------------------------------


@converts("Relu")
def _relu(node: Node, builder: Builder) -> Value:
    return builder.relu(node, node.data())


@converts("Softmax")
def _head(node: Node, builder: Builder) -> Value:
    value = node.data()
    if node.attrs.get("axis", -1) not in (-1, len(value.shape) - 1):
        raise node.fail("Softmax must act on the last axis")
    return builder.head(node, value, "softmax")


@converts("Sigmoid", "Tanh")
def _squash(node: Node, builder: Builder) -> Value:
    """The output head (a final Sigmoid), or a layer of sigmoid or tanh neurons."""
    return builder.activation(node, node.data(), node.op.lower())


# -- pass-through and constants -----------------------------------------------------------


@converts("Identity", "Dropout")
def _identity(node: Node, builder: Builder) -> Value:
    return node.data()


@converts("Constant")
def _constant(node: Node, builder: Builder) -> Value:
    """A numeric constant in any of its attribute forms (a tensor, or a scalar or list)."""
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            return np.asarray(node.attrs[key], dtype=np.float64)
    given = ", ".join(node.attrs) or "none"
    raise node.fail(
        f"only numeric constants (value, value_float(s), value_int(s)) are supported, "
        f"got attribute {given}"
    )


# -- arithmetic with constants ------------------------------------------------------------


@converts("Add", "Sub")
def _add(node: Node, builder: Builder) -> Value:
    a, b = node.data(0), node.data(1)
    p = builder.precision
    return add(a, b if node.op == "Add" else scale(b, np.float64(-1.0), p, terms=0), p)


@converts("Neg")
def _neg(node: Node, builder: Builder) -> Value:
    return scale(node.data(), np.float64(-1.0), builder.precision, terms=0)


@converts("Mul", "Div")
def _mul(node: Node, builder: Builder) -> Value:
    a, b = node.data(0), node.data(1)
    if isinstance(a, Affine) and isinstance(b, Affine) and node.op == "Mul":
        return builder.product(node, a, b)[0]
    if node.op == "Div":
        if isinstance(b, Affine):
            raise node.fail("division by a tensor computed from the input")
        return scale(a, 1.0 / b, builder.precision)
    if isinstance(b, Affine):
        a, b = b, a
    return scale(a, b, builder.precision)


# -- linear layers ---------------------------------------------------------------------------


MAX_POWER = 8
"""The largest integer power of a computed tensor read as products (each power above 2 is
a layer)."""


@converts("Pow")
def _pow(node: Node, builder: Builder) -> Value:
    """A tensor to a constant power. Of a computed tensor: 1 is itself, 2 a layer of
    squares, integers n > 2 products with the tensor, one layer each, and the runtime's
    one rounding of ``pow`` (up to an ulp) on top of the products' own; a positive
    non-integer exponent a layer of power neurons."""
    x, exponent = node.data(0), node.const(1, "exponent")
    if not isinstance(x, Affine):
        with np.errstate(invalid="ignore", divide="ignore"):
            return scale(np.power(x, exponent), np.float64(1.0), builder.precision)
    power = float(np.ravel(exponent)[0]) if np.size(exponent) == 1 else np.nan
    if power > 0 and not power.is_integer():
        return builder.power(node, x, power)
    if not (power.is_integer() and 1 <= power <= MAX_POWER):
        raise node.fail(
            f"a computed tensor to the power {np.ravel(exponent).tolist()}: integer powers "
            f"1 to {MAX_POWER} and positive non-integer ones (one exponent for the whole "
            f"tensor) are supported"
        )
    if power == 1:
        return x
    if power == 2:
        return builder.square(node, x, True)[0]
    result = x
    for _ in range(int(power) - 1):  # x carried through each product's layer
        result, x = builder.product(node, result, x, (x,))
    return scale(result, np.float64(1.0), builder.precision)


@converts("MatMul")
def _matmul(node: Node, builder: Builder) -> Value:
    a, b = node.data(0), node.data(1)
    p = builder.precision
    if isinstance(a, Affine) and isinstance(b, Affine):
        # a 1-D operand is a matrix of one row (a) or one column (b), dropped afterwards
        vector_a, vector_b = len(a.shape) == 1, len(b.shape) == 1
        a = linear(a, lambda t: t[..., None, :]) if vector_a else a
        b = linear(b, lambda t: t[..., None]) if vector_b else b
        # every product a_il b_lj at once (one layer of squares), then the sums over l
        rows = linear(a, lambda t: t[..., None])
        cols = linear(b, lambda t: t[..., None, :, :])
        terms = builder.product(node, rows, cols)[0]
        total = lambda t: t.sum(axis=-2)  # noqa: E731
        out = product(terms, total, total, a.shape[-1], p)
        out = linear(out, lambda t: t[..., 0, :]) if vector_a else out
        return linear(out, lambda t: t[..., 0]) if vector_b else out
    if isinstance(b, Affine):
        terms = a.shape[-1]
        return product(b, lambda t: np.matmul(a, t), lambda t: np.matmul(np.abs(a), t), terms, p)
    terms = b.shape[-2] if b.ndim > 1 else b.shape[0]
    return product(a, lambda t: np.matmul(t, b), lambda t: np.matmul(t, np.abs(b)), terms, p)


@converts("Gemm")
def _gemm(node: Node, builder: Builder) -> Value:
    a = node.data(0)
    b = node.const(1, "weight matrix B")
    if len(a.shape) != 2:
        raise node.fail(f"expects a matrix, gets a tensor of shape {list(a.shape)}")
    b = b.T if node.attrs.get("transB", 0) else b
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    weight = alpha * b
    # alpha and beta scale the sum and the bias: one rounding more each
    terms = b.shape[0] + (alpha != 1.0)
    if node.attrs.get("transA", 0):
        fn, size = (lambda m: lambda t: np.swapaxes(t, -1, -2) @ m), np.abs(weight)
    else:
        fn, size = (lambda m: lambda t: t @ m), np.abs(weight)
    out = product(a, fn(weight), fn(size), terms, builder.precision)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        # the bias may be added among the product's terms
        bias = beta * node.const(2, "bias C")
        out = add(out, bias, builder.precision, terms=terms + 1 + (beta != 1.0))
    return out


@converts("Conv")
def _conv(node: Node, builder: Builder) -> Value:
    x = node.data(0)
    weight = node.const(1, "weights")
    if len(x.shape) != 4 or weight.ndim != 4:
        raise node.fail("only 2-D convolutions (N, C, H, W) are supported")
    pads = _pads(node, x.shape[2:], weight.shape[2:])
    strides = node.attrs.get("strides", [1, 1])
    dilations = node.attrs.get("dilations", [1, 1])
    group = node.attrs.get("group", 1)
    if x.shape[1] != weight.shape[1] * group:
        raise node.fail(f"{x.shape[1]} input channels for weights {list(weight.shape)}")
    terms = int(np.prod(weight.shape[1:]))
    out = product(
        x,
        lambda t: _conv2d(t, weight, pads, strides, dilations, group),
        lambda t: _conv2d(t, np.abs(weight), pads, strides, dilations, group),
        terms,
        builder.precision,
    )
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = node.const(2, "bias").reshape(1, -1, 1, 1)
        out = add(out, bias, builder.precision, terms=terms + 1)
    return out


@converts("AveragePool")
def _average_pool(node: Node, builder: Builder) -> Value:
    x = node.data(0)
    if len(x.shape) != 4:
        raise node.fail("only 2-D pooling (N, C, H, W) is supported")
    if node.attrs.get("ceil_mode", 0):
        raise node.fail("ceil_mode is not supported")
    kernel = node.attrs["kernel_shape"]
    pads = _pads(node, x.shape[2:], kernel)
    strides = node.attrs.get("strides", [1, 1])
    channels = x.shape[1]
    ones = np.ones((channels, 1, *kernel))
    window = lambda t: _conv2d(t, ones, pads, strides, [1, 1], channels)  # noqa: E731
    summed = product(x, window, window, int(np.prod(kernel)), builder.precision)
    if node.attrs.get("count_include_pad", 0):
        count = np.full((1, 1, 1, 1), float(np.prod(kernel)))
    else:
        inside = np.ones((1, 1, *x.shape[2:]))
        count = _conv2d(inside[None], np.ones((1, 1, *kernel)), pads, strides, [1, 1], 1)[0]
    return scale(summed, 1.0 / count, builder.precision, terms=2)  # 1/count rounded too


@converts("MaxPool")
def _max_pool(node: Node, builder: Builder) -> Value:
    """The maximum of each window by pairs, ``max(a, b) = b + relu(a - b)``: a window of k
    values takes ceil(log2 k) ReLU layers, all windows at once in each."""
    x = node.data(0)
    if len(x.shape) != 4:
        raise node.fail("only 2-D pooling (N, C, H, W) is supported")
    if node.attrs.get("ceil_mode", 0) or node.attrs.get("storage_order", 0):
        raise node.fail("ceil_mode and storage_order are not supported")
    if node.outputs > 1:
        raise node.fail("the Indices output is not supported")
    kernel = list(node.attrs["kernel_shape"])
    pads = _pads(node, x.shape[2:], kernel)
    strides = node.attrs.get("strides", [1, 1])
    dilations = node.attrs.get("dilations", [1, 1])
    height, width = x.shape[2:]
    top, left, bottom, right = pads
    rows = (height + top + bottom - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    cols = (width + left + right - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    out_r = np.arange(rows)[:, None] * strides[0] - top
    out_c = np.arange(cols)[None, :] * strides[1] - left
    picks = []  # per kernel offset, the flat input position of each window's element
    for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
        r, c = out_r + i * dilations[0], out_c + j * dilations[1]
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        picks.append((np.where(inside, r * width + c, -1), inside))
    # padding never wins a maximum: an element outside takes the window's first inside one
    first = np.full((rows, cols), -1)
    for flat, inside in reversed(picks):
        first = np.where(inside, flat, first)
    if (first < 0).any():
        raise node.fail("a window lies wholly in the padding")
    values = [linear(x, _gather_spatial(np.where(inside, flat, first))) for flat, inside in picks]
    size = x.shape[0]
    while len(values) > 1:
        pairs = len(values) // 2
        a = concatenate(values[0 : 2 * pairs : 2], axis=0)
        b = concatenate(values[1 : 2 * pairs : 2], axis=0)
        best, *rest = builder.maximum(node, a, b, tuple(values[2 * pairs :]))
        values = [linear(best, _rows(k * size, (k + 1) * size)) for k in range(pairs)] + rest
    return values[0]


def _gather_spatial(at: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The map taking (L, N, C, H, W) to the flat spatial positions ``at`` (rows, cols)."""
    return lambda t: t.reshape(*t.shape[:3], -1)[..., at]


def _rows(start: int, end: int) -> Callable[[np.ndarray], np.ndarray]:
    """The map taking rows start:end of the batch axis (after the neuron axis)."""
    return lambda t: t[:, start:end]


@converts("BatchNormalization")
def _batch_norm(node: Node, builder: Builder) -> Value:
    x = node.data(0)
    gamma, beta = node.const(1, "scale"), node.const(2, "bias")
    mean, var = node.const(3, "mean"), node.const(4, "variance")
    if node.attrs.get("training_mode", 0):
        raise node.fail("training mode is not supported")
    factor = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (len(x.shape) - 2)
    shift = (beta - mean * factor).reshape(shape)
    p = builder.precision
    # the runtime computes the factor (a sum, a square root, a division: 3 roundings) and
    # the shift from the mean, whose cancellation the terms below bound
    out = add(scale(x, factor.reshape(shape), p, terms=4), shift, p, terms=4)
    if p is None or not isinstance(out, Affine) or out.error is None:
        return out
    cancel = p.gamma(4) * (np.abs(beta) + np.abs(mean * factor)).reshape(shape)
    error = Affine(out.error.coef, out.error.offset + cancel)
    return Affine(out.coef, out.offset, error)


# -- shapes -------------------------------------------------------------------------------


@converts("Flatten")
def _flatten(node: Node, builder: Builder) -> Value:
    x = node.data()
    axis = node.attrs.get("axis", 1) % max(len(x.shape), 1)
    shape = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
    return linear(x, lambda t: t.reshape(t.shape[0], *shape))


@converts("Reshape")
def _reshape(node: Node, builder: Builder) -> Value:
    x = node.data()
    target = [int(s) for s in node.const(1, "shape")]
    if node.attrs.get("allowzero", 0) and 0 in target:
        raise node.fail("allowzero with a zero dimension is not supported")
    target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    shape = np.empty(x.shape).reshape(target).shape  # resolves -1, checks the size
    return linear(x, lambda t: t.reshape(t.shape[0], *shape))


@converts("Transpose")
def _transpose(node: Node, builder: Builder) -> Value:
    x = node.data()
    perm = node.attrs.get("perm", list(range(len(x.shape)))[::-1])
    return linear(x, lambda t: t.transpose(0, *(p + 1 for p in perm)))


@converts("Concat")
def _concat(node: Node, builder: Builder) -> Value:
    values = [v for v in node.inputs if v is not None]
    axis = node.attrs["axis"] % len(values[0].shape)
    return concatenate(values, axis)


def _axes(node: Node, rank: int, position: int = 1) -> list[int] | None:
    """The ``axes`` of a node, an attribute before opset 13 and an input since (None when
    neither is given), each in [0, rank)."""
    if "axes" in node.attrs:
        given = node.attrs["axes"]
    elif len(node.inputs) > position and node.inputs[position] is not None:
        given = node.const(position, "axes")
    else:
        return None
    return sorted(int(a) % rank for a in np.ravel(given))


@converts("Squeeze")
def _squeeze(node: Node, builder: Builder) -> Value:
    x = node.data()
    axes = _axes(node, len(x.shape))
    if axes is None:
        axes = [i for i, size in enumerate(x.shape) if size == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise node.fail(f"axes {axes} of a tensor of shape {list(x.shape)} are not all 1")
    shape = tuple(size for i, size in enumerate(x.shape) if i not in axes)
    return linear(x, lambda t: t.reshape(t.shape[0], *shape))


@converts("Unsqueeze")
def _unsqueeze(node: Node, builder: Builder) -> Value:
    x = node.data()
    given = node.attrs.get("axes")
    given = node.const(1, "axes") if given is None else given
    rank = len(x.shape) + len(np.ravel(given))
    axes = sorted(int(a) % rank for a in np.ravel(given))
    sizes = iter(x.shape)
    shape = tuple(1 if i in axes else next(sizes) for i in range(rank))
    return linear(x, lambda t: t.reshape(t.shape[0], *shape))


@converts("Slice")
def _slice(node: Node, builder: Builder) -> Value:
    x = node.data()
    if "starts" in node.attrs:  # before opset 10
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = node.const(1, "starts"), node.const(2, "ends")
        axes, steps = (
            node.const(i, what) if len(node.inputs) > i and node.inputs[i] is not None else None
            for i, what in ((3, "axes"), (4, "steps"))
        )
    starts, ends = [int(v) for v in np.ravel(starts)], [int(v) for v in np.ravel(ends)]
    rank = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [int(a) % rank for a in np.ravel(axes)]
    steps = [1] * len(starts) if steps is None else [int(v) for v in np.ravel(steps)]
    index = [slice(None)] * len(x.shape)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        size = x.shape[axis]
        if step == 0:
            raise node.fail("a step of 0")
        # ONNX clamps out-of-range starts and ends as Python slices do, ends below -size
        # included (which a Python slice would read as from the end)
        end = None if step < 0 and end < -size else end
        index[axis] = slice(start, end, step)
    return linear(x, lambda t: t[(slice(None), *index)])


@converts("Gather")
def _gather(node: Node, builder: Builder) -> Value:
    x = node.data()
    indices = node.const(1, "indices").astype(np.int64)
    axis = int(node.attrs.get("axis", 0)) % len(x.shape)
    return linear(x, lambda t: np.take(t, indices, axis=axis + 1))


@converts("ReduceSum", "ReduceMean")
def _reduce(node: Node, builder: Builder) -> Value:
    x = node.data()
    axes = _axes(node, len(x.shape))
    if axes is None or not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(len(x.shape)))
    keep = bool(node.attrs.get("keepdims", 1))
    count = float(np.prod([x.shape[a] for a in axes]))
    total = lambda t: t.sum(axis=tuple(a + 1 for a in axes), keepdims=keep)  # noqa: E731
    p = builder.precision
    summed = product(x, total, total, int(count), p)
    return scale(summed, np.float64(1.0 / count), p, terms=2) if node.op == "ReduceMean" else summed


_FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}
_UNIT_ROUNDOFF = {1: 2.0**-24, 10: 2.0**-11, 11: 2.0**-53, 16: 2.0**-8}
_SMALLEST_NORMAL = {1: 2.0**-126, 10: 2.0**-14, 11: 2.0**-1022, 16: 2.0**-126}
_LARGEST = {1: float(np.finfo(np.float32).max), 10: 65504.0, 11: float(np.finfo(np.float64).max)}
_LARGEST[16] = 3.3895313892515355e38
_NUMPY_TYPES = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64}
_NUMPY_TYPES |= {9: np.bool_, 12: np.uint32, 13: np.uint64}


@converts("Cast")
def _cast(node: Node, builder: Builder) -> Value:
    """A cast to a floating type is the identity over the reals, and one rounding when a
    precision is tracked and the target type is coarser; a constant is cast as ONNX casts
    it (integers truncate)."""
    x, to = node.data(), int(node.attrs["to"])
    p = builder.precision
    if to in _FLOAT_TYPES:
        if p is None or _UNIT_ROUNDOFF[to] <= p.unit:
            return x
        coarser = Precision(_FLOAT_TYPES[to], _UNIT_ROUNDOFF[to], _SMALLEST_NORMAL[to], float)
        watch(x, p, float(np.finfo(p.dtype).max) / _LARGEST[to])
        if not isinstance(x, Affine):
            if to == 16:
                raise node.fail("a constant cast to bfloat16")
            return x.astype(np.dtype(_FLOAT_TYPES[to])).astype(np.float64)
        return scale(x, np.float64(1.0), coarser)
    if isinstance(x, Affine):
        raise node.fail("a cast of a tensor computed from the input to an integer type")
    if to not in _NUMPY_TYPES:
        raise node.fail(f"cast to ONNX type {to} is not supported")
    return x.astype(_NUMPY_TYPES[to]).astype(np.float64)


@converts("Split")
def _split(node: Node, builder: Builder) -> tuple[Value, ...]:
    x = node.data()
    axis = int(node.attrs.get("axis", 0)) % len(x.shape)
    if "split" in node.attrs:
        sizes = [int(v) for v in node.attrs["split"]]
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        sizes = [int(v) for v in np.ravel(node.const(1, "split"))]
    else:
        parts = int(node.attrs.get("num_outputs", node.outputs))
        size = -(-x.shape[axis] // parts)
        sizes = [min(size, x.shape[axis] - i * size) for i in range(parts)]
    if sum(sizes) != x.shape[axis]:
        raise node.fail(f"parts {sizes} do not add up to axis {axis} of size {x.shape[axis]}")
    cuts = np.cumsum([0, *sizes])
    return tuple(
        linear(x, lambda t, a=a, b=b: np.take(t, np.arange(a, b), axis=axis + 1))
        for a, b in itertools.pairwise(cuts)
    )


@converts("Shape", "Size")
def _shape_of(node: Node, builder: Builder) -> Value:
    """The shape (or size) of a tensor computed from the input: a constant."""
    shape = node.data().shape
    if node.op == "Size":
        return np.asarray(float(np.prod(shape)))
    rank = len(shape)
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    end = rank if end is None else int(end)
    return np.asarray(shape[slice(start, end)], dtype=np.float64)


@converts("Expand")
def _expand(node: Node, builder: Builder) -> Value:
    x = node.data()
    target = tuple(int(v) for v in np.ravel(node.const(1, "shape")))
    return broadcast(x, np.broadcast_shapes(x.shape, target))


@converts("Where")
def _where(node: Node, builder: Builder) -> Value:
    """A selection by a constant mask (one computed from the input is not piecewise linear
    in a form the chain holds)."""
    mask = node.const(0, "condition") != 0
    return select(mask, node.data(1), node.data(2))


# -- helpers ----------------------------------------------------------------------------------


def _pads(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> list[int]:
    auto = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto not in ("NOTSET", "VALID"):
        raise node.fail(f"auto_pad {auto} is not supported (give explicit pads)")
    return list(node.attrs.get("pads", [0] * (2 * len(spatial))))


def _conv2d(
    t: np.ndarray,
    weight: np.ndarray,
    pads: list[int],
    strides: list[int],
    dilations: list[int],
    group: int,
) -> np.ndarray:
    """Cross-correlation of ``t`` (L, N, C, H, W) with ``weight`` (M, C/group, kh, kw), as
    ONNX Conv computes it (no bias)."""
    lead, batch = t.shape[:2]
    x = t.reshape(lead * batch, *t.shape[2:])
    top, left, bottom, right = pads
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    kh, kw = weight.shape[2:]
    dh, dw = dilations
    windows = sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    windows = windows[:, :, :: strides[0], :: strides[1], ::dh, ::dw]
    per_in, per_out = weight.shape[1], weight.shape[0] // group
    out = np.concatenate(
        [
            np.einsum(
                "bchwij,mcij->bmhw",
                windows[:, g * per_in : (g + 1) * per_in],
                weight[g * per_out : (g + 1) * per_out],
                optimize=True,
            )
            for g in range(group)
        ],
        axis=1,
    )
    return out.reshape(lead, batch, *out.shape[1:])
