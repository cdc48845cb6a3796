"""Counterfactuals that are robust by construction (Algorithm 2).

`nearest_cfx` solves for the L1-nearest input whose target margin is at least kappa (a MILP
with big-M constants from interval arithmetic over the input box; immutable features are fixed
to their values). `robust_cfx` then tests the candidate against plausible shifts of size delta,
with APΔS sampling or with the exact worst case (the MILP-R baseline), and raises kappa by the
observed shortfall until the test passes or the iterations run out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from vigil.rules.certify.cfx.apas import ShiftSample, parameter_count, sample_size
from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.certify.cfx.highs import Milp
from vigil.rules.certify.cfx.milp import worst_case
from vigil.rules.reach.network import Network

KAPPA_INIT = 1e-4
"""Margin (in logits) the first candidate must clear, so float noise cannot undo validity."""

GROWTH = 1.05
"""kappa grows by this multiple of the shortfall the robustness test observed."""


class InvalidBounds(ValueError):
    """Feature bounds or immutable indices do not fit the input."""


@dataclass(frozen=True)
class RobustCfx:
    """Result of Algorithm 2: the counterfactual (None if none was found) and how it was found."""

    x: np.ndarray | None
    iterations: int
    kappa: float
    l1: float


def _input_box(
    x: np.ndarray, lower: np.ndarray | float, upper: np.ndarray | float, immutable: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    d = x.size
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (d,)).copy()
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (d,)).copy()
    if np.any(lo > hi):
        raise InvalidBounds(
            f"lower bound exceeds upper bound at features {np.flatnonzero(lo > hi)}"
        )
    bad = [i for i in immutable if not 0 <= i < d]
    if bad:
        raise InvalidBounds(f"immutable feature indices {bad} outside [0, {d})")
    idx = list(immutable)
    lo[idx] = x[idx]
    hi[idx] = x[idx]
    return lo, hi


def nearest_cfx(
    network: Network,
    x: np.ndarray,
    target: int = 1,
    kappa: float = KAPPA_INIT,
    lower: np.ndarray | float = 0.0,
    upper: np.ndarray | float = 1.0,
    immutable: list[int] | tuple[int, ...] = (),
) -> np.ndarray | None:
    """The L1-nearest x' in [lower, upper] with target margin >= kappa; None if there is none."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size != network.input_dim:
        raise ValueError(f"input has {x.size} features, the model expects {network.input_dim}")
    lo, hi = _input_box(x, lower, upper, list(immutable))
    rows = margin_rows(network, target)
    m = Milp()
    xv = m.add_vars(lo, hi, x.size)
    tv = m.add_vars(0.0, np.inf, x.size)
    for j in range(x.size):
        m.add_row([tv[j], xv[j]], [1.0, -1.0], -x[j], np.inf)  # t >= x' - x
        m.add_row([tv[j], xv[j]], [1.0, 1.0], x[j], np.inf)  # t >= x - x'
    prev, p_lo, p_hi = xv, lo, hi
    for w, b in zip(network.weights[:-1], network.biases[:-1], strict=True):
        wp, wn = np.maximum(w, 0.0), np.minimum(w, 0.0)
        z_lo, z_hi = wp @ p_lo + wn @ p_hi + b, wp @ p_hi + wn @ p_lo + b
        h = m.add_vars(np.maximum(z_lo, 0.0), np.maximum(z_hi, 0.0), len(b))
        for k in range(len(b)):
            if z_hi[k] <= 0.0:
                continue
            idx = np.concatenate([[h[k]], prev])
            if z_lo[k] >= 0.0:
                m.add_row(idx, np.concatenate([[1.0], -w[k]]), b[k], b[k])  # h = W x + b
                continue
            a = m.add_binary()
            m.add_row(idx, np.concatenate([[1.0], -w[k]]), b[k], np.inf)  # h >= z
            # h <= z - L (1 - a)
            m.add_row(
                np.concatenate([idx, [a]]),
                np.concatenate([[1.0], -w[k], [-z_lo[k]]]),
                -np.inf,
                b[k] - z_lo[k],
            )
            m.add_row([h[k], a], [1.0, -z_hi[k]], -np.inf, 0.0)  # h <= U a
        prev, p_lo, p_hi = h, np.maximum(z_lo, 0.0), np.maximum(z_hi, 0.0)
    w, b = rows @ network.weights[-1], rows @ network.biases[-1]
    for r in range(len(rows)):
        m.add_row(prev, w[r], kappa - b[r], np.inf)
    cost = np.zeros(m.num_cols)
    cost[tv] = 1.0
    solution = m.solve(cost)
    if solution is None:
        return None
    return np.clip(solution.values[xv], lo, hi)


def robust_cfx(
    network: Network,
    x: np.ndarray,
    delta: float,
    target: int = 1,
    test: Literal["apas", "milp"] = "apas",
    gamma: float = 0.999,
    R: float = 0.995,
    rng: np.random.Generator | None = None,
    max_iterations: int = 20,
    lower: np.ndarray | float = 0.0,
    upper: np.ndarray | float = 1.0,
    immutable: list[int] | tuple[int, ...] = (),
) -> RobustCfx:
    """Nearest counterfactual that passes the delta-robustness ``test`` (Algorithm 2)."""
    if not (delta >= 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be finite and >= 0, got {delta}")
    if test not in ("apas", "milp"):
        raise ValueError(f"test must be 'apas' or 'milp', got {test!r}")
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
    rng = rng or np.random.default_rng()
    n = sample_size(gamma, R, parameter_count(network))
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    kappa = KAPPA_INIT
    for iteration in range(1, max_iterations + 1):
        candidate = nearest_cfx(network, x, target, kappa, lower, upper, immutable)
        if candidate is None:
            return RobustCfx(None, iteration, kappa, float("nan"))
        if test == "apas":
            worst = float(ShiftSample(network, candidate, target, n, rng).margins(delta).min())
        else:
            worst = worst_case(network, candidate, target, delta).bound
        if worst >= 0.0:
            return RobustCfx(candidate, iteration, kappa, float(np.abs(candidate - x).sum()))
        kappa += GROWTH * -worst
    return RobustCfx(None, max_iterations, kappa, float("nan"))
