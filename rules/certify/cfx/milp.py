"""Exact worst case of a counterfactual over an interval network, as a MILP (Appendix C).

With the input fixed and every weight and bias of neuron k free in [theta - delta,
theta + delta], neuron k can reach exactly the values W_k h + b_k +- delta (sum(h) + 1) for
hidden activations h >= 0 (first layer: +- delta (|x|_1 + 1)), independently of other neurons.
That makes each layer a pair of linear inequalities; only the ReLUs need binaries, with big-M
constants taken from interval arithmetic. The first layer's activations are an exact box, so a
one-hidden-layer network is a plain LP. Minimising the margin gives the exact worst case, and
the solution converts back into a concrete realisation (the witness).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.certify.cfx.highs import Milp, SolverFailure
from vigil.rules.certify.cfx.interval import ParameterBox, interval_bounds
from vigil.rules.certify.cfx.search import DELTA_INIT, largest_delta
from vigil.rules.reach.network import Network


@dataclass(frozen=True)
class WorstCase:
    """Smallest margin over the delta box, a proven lower bound on it, and a realisation."""

    margin: float
    bound: float
    witness: Network

    @property
    def robust(self) -> bool:
        """Every realisation keeps the counterfactual valid (the proven bound is >= 0)."""
        return self.bound >= 0.0


class _Encoding:
    """The interval network's hidden layers as MILP rows; activation columns per layer in ``h``."""

    def __init__(self, network: Network, x: np.ndarray, delta: float, rows: np.ndarray) -> None:
        bounds = interval_bounds(ParameterBox.around(network, delta), x, rows)
        self.pre_lo = [b[0] for b in bounds.pre_lo]
        self.pre_hi = [b[0] for b in bounds.pre_hi]
        self.milp = Milp()
        # First layer: an exact box of activations.
        self.h = [
            self.milp.add_vars(
                np.maximum(self.pre_lo[0], 0), np.maximum(self.pre_hi[0], 0), len(self.pre_lo[0])
            )
        ]
        self.z: list[np.ndarray | None] = [None]
        for i in range(1, len(network.weights) - 1):
            self._hidden(network.weights[i], network.biases[i], delta, i)

    def _hidden(self, w: np.ndarray, b: np.ndarray, delta: float, i: int) -> None:
        m, lo, hi = self.milp, self.pre_lo[i], self.pre_hi[i]
        prev = self.h[-1]
        z = m.add_vars(lo, hi, len(lo))
        h = m.add_vars(np.maximum(lo, 0.0), np.maximum(hi, 0.0), len(lo))
        for k in range(len(lo)):
            idx = np.concatenate([[z[k]], prev])
            # W h + b - delta (sum h + 1) <= z_k <= W h + b + delta (sum h + 1)
            m.add_row(idx, np.concatenate([[1.0], -(w[k] - delta)]), b[k] - delta, np.inf)
            m.add_row(idx, np.concatenate([[1.0], -(w[k] + delta)]), -np.inf, b[k] + delta)
            if hi[k] <= 0.0:
                continue  # h_k fixed at 0 by its bounds
            if lo[k] >= 0.0:
                m.add_row([h[k], z[k]], [1.0, -1.0], 0.0, 0.0)
                continue
            a = m.add_binary()
            m.add_row([h[k], z[k]], [1.0, -1.0], 0.0, np.inf)  # h >= z
            m.add_row([h[k], z[k], a], [1.0, -1.0, -lo[k]], -np.inf, -lo[k])  # h <= z - L (1 - a)
            m.add_row([h[k], a], [1.0, -hi[k]], -np.inf, 0.0)  # h <= U a
        self.z.append(z)
        self.h.append(h)


def worst_case(network: Network, x: np.ndarray, target: int, delta: float) -> WorstCase:
    """The exact smallest margin of ``x`` over all realisations in the delta box."""
    if not (delta >= 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be finite and >= 0, got {delta}")
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    rows = margin_rows(network, target)
    if len(network.weights) == 1:
        return _single_layer(network, x, rows, delta)
    enc = _Encoding(network, x, delta, rows)
    w, b = network.weights[-1], network.biases[-1]
    last = enc.h[-1]
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    bound = np.inf
    for c in rows:
        # min c (W h + b) - delta |c|_1 (sum h + 1): the last layer's worst case in closed form.
        spread = delta * np.abs(c).sum()
        cost = np.zeros(enc.milp.num_cols)
        cost[last] = c @ w - spread
        solution = enc.milp.solve(cost, float(c @ b) - spread)
        if solution is None:
            raise SolverFailure("the interval network encoding is infeasible")
        bound = min(bound, solution.bound)
        if best is None or solution.objective < best[0]:
            best = (solution.objective, c, solution.values)
    objective, c, values = best
    witness = _witness(network, x, delta, enc, values, c)
    return WorstCase(objective, float(bound), witness)


def _single_layer(network: Network, x: np.ndarray, rows: np.ndarray, delta: float) -> WorstCase:
    w, b = network.weights[0], network.biases[0]
    spread = delta * (np.abs(x).sum() + 1.0)
    values = rows @ (w @ x + b) - np.abs(rows).sum(axis=1) * spread
    r = int(np.argmin(values))
    sign = -np.sign(rows[r])[:, None]
    witness = Network(
        (w + delta * sign * np.sign(x)[None, :],),
        (b + delta * sign[:, 0],),
        network.output,
    )
    return WorstCase(float(values[r]), float(values[r]), witness)


def _realise(
    w: np.ndarray, b: np.ndarray, h: np.ndarray, z: np.ndarray, delta: float, sign: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Weights in the box with w h + b = z for each neuron (z within the reachable interval)."""
    spread = delta * (np.abs(h).sum() + 1.0)
    t = np.clip((z - (w @ h + b)) / spread, -1.0, 1.0) if spread > 0 else np.zeros_like(z)
    return w + delta * t[:, None] * sign[None, :], b + delta * t


def _witness(
    network: Network, x: np.ndarray, delta: float, enc: _Encoding, values: np.ndarray, c: np.ndarray
) -> Network:
    """A concrete realisation that reaches the MILP's optimum."""
    ws, bs = [], []
    h_prev = x
    for i in range(len(network.weights) - 1):
        h = np.maximum(values[enc.h[i]], 0.0)
        # First layer: z = h where active, otherwise its lowest reachable value (<= 0).
        z = np.where(h > 0, h, np.minimum(enc.pre_lo[0], 0.0)) if i == 0 else values[enc.z[i]]
        w, b = _realise(network.weights[i], network.biases[i], h_prev, z, delta, np.sign(h_prev))
        ws.append(w)
        bs.append(b)
        h_prev = np.maximum(w @ h_prev + b, 0.0)
    sign = -np.sign(c)[:, None]
    ws.append(network.weights[-1] + delta * sign)
    bs.append(network.biases[-1] + delta * sign[:, 0])
    return Network(tuple(ws), tuple(bs), network.output)


def provably_robust(network: Network, x: np.ndarray, target: int, delta: float) -> bool:
    """True iff every realisation in the delta box keeps ``x`` valid (interval bounds first)."""
    rows = margin_rows(network, target)
    bounds = interval_bounds(ParameterBox.around(network, delta), x, rows)
    if bounds.margin_lo[0] >= 0.0:
        return True
    if bounds.margin_hi[0] < 0.0:
        return False
    return worst_case(network, x, target, delta).robust


def provable_delta_max(
    network: Network, x: np.ndarray, target: int = 1, delta_init: float = DELTA_INIT
) -> float:
    """Largest delta (to within delta_init) at which ``x`` is provably robust (Algorithm 4)."""
    return largest_delta(lambda d: provably_robust(network, x, target, d), delta_init)
