"""The exact finisher of the complete search: is there an input in a box whose outputs
satisfy ``C y <= d``? A MILP (HiGHS), big-M ReLUs on interval bounds of the box."""

from __future__ import annotations

import numpy as np

from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import (
    Layer,
    ReluModel,
    Solver,
    VerificationError,
    interval_layer,
)


def box_counterexample(
    network: Network, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, d: np.ndarray, seconds: float
) -> tuple[str, np.ndarray | None]:
    """("found", x), ("infeasible", None), or ("unknown", None) when HiGHS stops without a
    verdict within ``seconds``."""
    model = ReluModel(Solver(time_limit=seconds))
    model.start_box(Layer(lo, hi))
    for w, b in zip(network.weights[:-1], network.biases[:-1], strict=True):
        pre = interval_layer(w, b, Layer(*_full(model, len(model.alive))))
        model.add_relu(w, b, pre)
    model.add_output_rows(network.weights[-1], network.biases[-1], c, d)
    try:
        point = model.solve_milp()
    except VerificationError:
        return "unknown", None
    if point is None:
        return "infeasible", None
    return "found", point[model.input_cols]


def _full(model: ReluModel, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The current layer's bounds over all its neurons (dead ones are 0)."""
    lower, upper = np.zeros(width), np.zeros(width)
    lower[model.alive], upper[model.alive] = model.box.lower, model.box.upper
    return lower, upper
