"""Exact worst case of a small ReLU network over a polytope, by MILP (HiGHS): the test oracle."""

from __future__ import annotations

import highspy
import numpy as np

from vigil.rules.highs import quiet_highs
from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, OutputSpec


def interval_bounds(network: Network, lo: np.ndarray, hi: np.ndarray) -> list[tuple]:
    bounds = []
    for w, b in zip(network.weights, network.biases, strict=True):
        wp, wn = np.maximum(w, 0), np.minimum(w, 0)
        zl, zh = wp @ lo + wn @ hi + b, wp @ hi + wn @ lo + b
        bounds.append((zl, zh))
        lo, hi = np.maximum(zl, 0), np.maximum(zh, 0)
    return bounds


def max_violation(
    network: Network,
    inputs: InputSet,
    spec: OutputSpec,
    signs: list[np.ndarray] | None = None,
) -> tuple[float, np.ndarray]:
    """max over x in the set of max_j (c_j f(x) - d_j), and a maximiser; with ``signs`` (per
    hidden layer, +1 / -1 / 0 per neuron) only over the x whose pre-activations have the
    signs assumed (-inf where none has)."""
    bounds = interval_bounds(network, inputs.lower, inputs.upper)
    best, arg = -np.inf, None
    for c, d in zip(spec.C, spec.d, strict=True):
        h = quiet_highs()
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 1e-9)
        # rows may be broken by the feasibility tolerances, and the breaks add up through
        # the layers: at the defaults (1e-6, 1e-7) the optimum came out 1.1e-7 above the
        # network's own value at its point (test_reach_soundness, seed 3458297007)
        h.setOptionValue("mip_feasibility_tolerance", 1e-9)
        h.setOptionValue("primal_feasibility_tolerance", 1e-9)
        xs = [
            h.addVariable(lb=lo, ub=hi) for lo, hi in zip(inputs.lower, inputs.upper, strict=True)
        ]
        for row, rhs in zip(inputs.A, inputs.b, strict=True):
            h.addConstr(sum(float(a) * v for a, v in zip(row, xs, strict=True)) <= float(rhs))
        current = xs
        last = len(network.weights) - 1
        for i, (w, b) in enumerate(zip(network.weights, network.biases, strict=True)):
            z = [
                sum(float(wj) * v for wj, v in zip(row, current, strict=True)) + float(bj)
                for row, bj in zip(w, b, strict=True)
            ]
            if i == last:
                current = z
                break
            zl, zh = bounds[i]
            for expr, sign in zip(z, signs[i] if signs is not None else [0] * len(z), strict=True):
                if not sign:
                    continue
                if isinstance(expr, float):  # every neuron before is dead: a constant
                    if sign * expr < 0:
                        return -np.inf, np.full(inputs.dim, np.nan)
                    continue
                h.addConstr(float(sign) * expr >= 0)
            nxt = []
            for expr, lo, hi in zip(z, zl, zh, strict=True):
                if hi <= 0:
                    nxt.append(0.0)
                elif lo >= 0:
                    nxt.append(expr)
                else:
                    a = h.addVariable(lb=0.0, ub=float(hi))
                    s = h.addVariable(lb=0, ub=1, type=highspy.HighsVarType.kInteger)
                    h.addConstr(a - expr >= 0)
                    h.addConstr(a - expr + float(lo) * (1 - s) <= 0)
                    h.addConstr(a - float(hi) * s <= 0)
                    nxt.append(a)
            current = nxt
        h.maximize(sum(float(cj) * y for cj, y in zip(c, current, strict=True)) + 0.0 * xs[0])
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return -np.inf, np.full(inputs.dim, np.nan)
        assert status == highspy.HighsModelStatus.kOptimal, status
        value = h.getInfo().objective_function_value - d
        if value > best:
            best, arg = value, np.array([h.val(v) for v in xs])
    return float(best), arg
