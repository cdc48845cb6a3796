"""Which outputs make a counterfactual valid for its target class.

Every validity test here is written as ``min_r (C z)_r >= 0`` over the last-layer values z
(logits) with a small matrix C of *margin rows*: probabilities >= 0.5 are logits >= 0, and a
softmax target wins when its logit is at least every other one. Linear rows let the sampled,
interval and MILP checks share one definition.
"""

from __future__ import annotations

import numpy as np

from vigil.rules.reach.network import Network


class InvalidTarget(ValueError):
    """The target class does not exist for this network's output."""


def margin_rows(network: Network, target: int) -> np.ndarray:
    """Rows C (r, outputs) with: x is classified as ``target`` iff min(C @ logits(x)) >= 0.

    One output (a probability or a logit): target 1 means logit >= 0, target 0 logit <= 0.
    Several outputs with softmax or plain logits: the target logit minus each other logit.
    Several sigmoid outputs (independent probabilities): the target's own logit.
    """
    k = network.output_dim
    if k == 1:
        if network.output == "softmax":
            raise InvalidTarget("a single softmax output is constant 1 and decides nothing")
        if target not in (0, 1):
            raise InvalidTarget(f"target must be 0 or 1 for a single-output model, got {target}")
        return np.array([[1.0 if target == 1 else -1.0]])
    if not 0 <= target < k:
        raise InvalidTarget(f"target must be in [0, {k}) for a {k}-output model, got {target}")
    if network.output == "sigmoid":
        rows = np.zeros((1, k))
        rows[0, target] = 1.0
        return rows
    others = [j for j in range(k) if j != target]
    rows = np.zeros((k - 1, k))
    rows[:, target] = 1.0
    rows[np.arange(k - 1), others] = -1.0
    return rows


def margins(network: Network, x: np.ndarray, target: int) -> np.ndarray:
    """Per-row margin min(C z) of a batch; >= 0 means the target class is predicted."""
    rows = margin_rows(network, target)
    return (network.logits(np.atleast_2d(x)) @ rows.T).min(axis=1)
