"""One-ball complete verification (MIPVerify style) and the per-ball bounds BaVerLy reuses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vigil.rules.certify.batch.attack import pgd_attack
from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import (
    DEFAULT_SOLVER,
    Layer,
    ReluModel,
    Solver,
    interval_layer,
)

Check = Callable[[np.ndarray], bool]
"""Does the reference model (onnxruntime) misclassify this input?"""


@dataclass(frozen=True)
class Outcome:
    """A complete verdict for one ball: robust, or an adversarial input inside the ball."""

    robust: bool
    adversarial: np.ndarray | None = None


def ball_box(centre: np.ndarray, eps: float, clip: tuple[float, float] | None) -> Layer:
    """The L-inf ball around ``centre`` intersected with the valid input range."""
    lower, upper = centre - eps, centre + eps
    if clip is not None:
        lower, upper = np.maximum(lower, clip[0]), np.minimum(upper, clip[1])
    return Layer(lower, upper)


def hidden_layers(network: Network) -> int:
    return len(network.weights) - 1


def hidden_bounds(
    network: Network,
    model: ReluModel,
    start: Layer,
    first: int,
    last: int,
    known: list[Layer] | None = None,
) -> list[Layer]:
    """Add hidden layers ``first``..``last - 1`` to ``model`` (current block spans ``start``).

    Each layer gets interval bounds, then tightening of its unstable neurons; the first
    layer over an input box is exact by intervals alone. ``known`` bounds are used as given.
    """
    known = known or []
    bounds: list[Layer] = []
    box = start
    for i in range(first, last):
        w, b = network.weights[i], network.biases[i]
        if i - first < len(known):
            pre = known[i - first]
        else:
            pre = interval_layer(w, b, box)
            if i > 0:
                pre = model.tighten(w, b, pre)
        model.add_relu(w, b, pre)
        bounds.append(pre)
        box = pre.post
    return bounds


def prefix_bounds(network: Network, box: Layer, upto: int, solver: Solver) -> list[Layer]:
    """Pre-activation bounds of hidden layers 1..``upto`` for one ball."""
    model = ReluModel(solver)
    model.start_box(box)
    return hidden_bounds(network, model, box, 0, upto)


def attack(model: ReluModel, network: Network, label: int) -> np.ndarray | None:
    """Add the output layer's adversarial query and solve it: a MILP point, or None (robust)."""
    open_classes = model.margin_bounds(network.weights[-1], network.biases[-1], label)
    if not open_classes:
        return None
    model.add_attack(open_classes)
    return model.solve_milp()


def falsify(network: Network, box: Layer, label: int, check: Check | None) -> Outcome | None:
    """A not-robust verdict from a gradient attack the reference model confirms, else None."""
    if check is None:
        return None
    found = pgd_attack(network, box, (box.lower + box.upper) / 2.0, label)
    return Outcome(False, found) if found is not None and check(found) else None


def verify_ball(
    network: Network,
    box: Layer,
    label: int,
    known: list[Layer] | None = None,
    solver: Solver = DEFAULT_SOLVER,
    check: Check | None = None,
) -> Outcome:
    """Is every input of ``box`` classified ``label``? ``known`` are reused prefix bounds.

    With ``check``, a confirmed gradient attack answers "not robust" before any MILP.
    """
    quick = falsify(network, box, label, check)
    if quick is not None:
        return quick
    model = ReluModel(solver)
    model.start_box(box)
    hidden_bounds(network, model, box, 0, hidden_layers(network), known)
    point = attack(model, network, label)
    if point is None:
        return Outcome(True)
    x = point[model.input_cols]
    scores = network.logits(x[None, :])[0]
    scores[label] = -np.inf
    target = int(np.argmax(scores))
    sharp = model.sharpen(point, target)[model.input_cols]
    return Outcome(False, np.clip(sharp, box.lower, box.upper))
