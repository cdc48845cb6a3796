"""What a tensor of an imported ONNX graph is: a constant, or an affine function of the
neurons of the layer being built.

An ``Affine`` value ``v`` with coefficients ``coef`` (n, *shape) and ``offset`` (*shape) is
``v = sum_j h_j coef[j] + offset`` for the n neurons ``h`` of the current layer (the network
input before the first ReLU). Linear operators act on ``coef`` as on a batch of n tensors and
on ``offset`` as on one, which is why every converter is written for arrays with a leading
batch axis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class UnsupportedModel(ValueError):
    """The ONNX graph holds something the importer cannot turn into a ReLU network."""


@dataclass(frozen=True)
class Affine:
    """A tensor as an affine function of the current layer's neurons."""

    coef: np.ndarray  # (n, *shape)
    offset: np.ndarray  # shape

    @property
    def shape(self) -> tuple[int, ...]:
        return self.offset.shape

    @property
    def neurons(self) -> int:
        return self.coef.shape[0]


Value = Affine | np.ndarray
"""A graph tensor during import: an ``Affine`` data tensor, or a constant array."""


def linear(value: Value, fn: Callable[[np.ndarray], np.ndarray]) -> Value:
    """``fn`` (linear, acting on arrays with a leading batch axis) applied to a value."""
    if isinstance(value, Affine):
        return Affine(fn(value.coef), fn(value.offset[None])[0])
    return fn(value[None])[0]


def lift(value: Value, neurons: int) -> Affine:
    """A value as an ``Affine`` of ``neurons`` neurons (a constant has no coefficients)."""
    if isinstance(value, Affine):
        return value
    return Affine(np.zeros((neurons, *value.shape)), np.asarray(value, dtype=np.float64))


def add(a: Value, b: Value) -> Value:
    """a + b with ONNX (numpy) broadcasting."""
    if not isinstance(a, Affine) and not isinstance(b, Affine):
        return a + b
    neurons = a.neurons if isinstance(a, Affine) else b.neurons  # type: ignore[union-attr]
    a, b = lift(a, neurons), lift(b, neurons)
    offset = a.offset + b.offset
    return Affine(_coef(a, offset.shape) + _coef(b, offset.shape), offset)


def scale(a: Value, factor: np.ndarray) -> Value:
    """a * factor (a constant), broadcast."""
    if not isinstance(a, Affine):
        return a * factor
    offset = a.offset * factor
    return Affine(_coef(a, offset.shape) * factor, offset)


def _coef(a: Affine, shape: tuple[int, ...]) -> np.ndarray:
    """``a``'s coefficients broadcast to a tensor ``shape`` (the neuron axis stays first)."""
    lead = (1,) * (len(shape) - len(a.shape))
    return np.broadcast_to(a.coef.reshape(a.neurons, *lead, *a.shape), (a.neurons, *shape))
