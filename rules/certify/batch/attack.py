"""Projected gradient attack: a cheap search for a concrete adversarial input before any MILP.

Only ever used to *find* counterexamples (each one is checked by the caller); a failed attack
proves nothing, and the complete MILP decides.
"""

from __future__ import annotations

import numpy as np

from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import Layer


def _margin_gradient(network: Network, x: np.ndarray, label: int) -> tuple[np.ndarray, np.ndarray]:
    """For a batch x (n, d): best other-class margin y_j - y_label and its input gradient."""
    acts, masks = [x], []
    h = x
    for w, b in zip(network.weights[:-1], network.biases[:-1], strict=True):
        z = h @ w.T + b
        masks.append(z > 0.0)
        h = np.maximum(z, 0.0)
        acts.append(h)
    logits = h @ network.weights[-1].T + network.biases[-1]
    others = logits.copy()
    others[:, label] = -np.inf
    target = np.argmax(others, axis=1)
    margin = others[np.arange(len(x)), target] - logits[:, label]
    grad = network.weights[-1][target] - network.weights[-1][label]
    for w, mask in zip(reversed(network.weights[:-1]), reversed(masks), strict=True):
        grad = (grad * mask) @ w
    return margin, grad


def pgd_attack(
    network: Network,
    box: Layer,
    centre: np.ndarray,
    label: int,
    steps: int = 30,
    restarts: int = 4,
    seed: int = 0,
) -> np.ndarray | None:
    """Sign-gradient ascent on the best other-class margin from the centre and random starts.

    Returns an input of ``box`` whose float64 margin is > 0, or None.
    """
    rng = np.random.default_rng(seed)
    starts = [centre] + [rng.uniform(box.lower, box.upper) for _ in range(restarts - 1)]
    x = np.clip(np.stack(starts), box.lower, box.upper)
    step = np.maximum(box.upper - box.lower, 1e-12) / 4.0
    for i in range(steps):
        margin, grad = _margin_gradient(network, x, label)
        hit = np.flatnonzero(margin > 0.0)
        if hit.size:
            return x[hit[np.argmax(margin[hit])]]
        decay = 1.0 - i / steps
        x = np.clip(x + step * decay * np.sign(grad), box.lower, box.upper)
    margin, _ = _margin_gradient(network, x, label)
    best = int(np.argmax(margin))
    return x[best] if margin[best] > 0.0 else None
