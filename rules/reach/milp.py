"""The exact finisher of the complete search: is there an input in a box whose outputs
satisfy ``C y <= d`` (every row, or with ``any_row`` one of them)? A MILP (HiGHS), big-M
ReLUs on the box's back-substituted pre-activation bounds, widened by the solver's slack.
On the boxes ACAS Xu property 2 leaves open near its ties these leave 3 to 50 neurons
unstable, where interval bounds left 80 to 200: HiGHS decides such a box in about 10 ms
instead of 2 to over 20 s. For the larger branches of the ReLU search, ``lp_bounds``
tightens the bounds further by the LP over the layers before each neuron."""

from __future__ import annotations

import numpy as np

from vigil.rules.reach.backward import pre_activation_bounds
from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import BOUND_SLACK, Layer, ReluModel, Solver, Stop, VerificationError


def box_counterexample(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    c: np.ndarray,
    d: np.ndarray,
    seconds: float,
    bounds: list[tuple[np.ndarray, np.ndarray]] | None = None,
    any_row: bool = False,
    stop: Stop | None = None,
) -> tuple[str, np.ndarray | None]:
    """Is there an input in the box whose output meets every row of ``c y <= d`` (with
    ``any_row``, at least one: one MILP that picks the row, MIPVerify's encoding of "some
    other class wins", instead of a MILP per row)? ("found", x), ("infeasible", None), or
    ("unknown", None) when HiGHS stops without a verdict within ``seconds``.

    ``bounds``: the box's pre-activation bounds (each (1, width)) when known, as a branch's
    sign assumptions tighten them; every ReLU is exact in the model, so a point found is one
    of the network's (with rounding ``noise``, a candidate the reference evaluator confirms
    or not). ``stop`` ends HiGHS from another thread ("unknown")."""
    if not network.relu_only:
        return "unknown", None  # a sigmoid or tanh has no MILP encoding here
    if bounds is None:
        bounds = pre_activation_bounds(network, lo[None], hi[None])
    model = ReluModel(Solver(time_limit=seconds), budget=seconds, stop=stop)
    w, b = network.weights[-1], network.biases[-1]
    noise = None if network.noise is None else network.noise[-1]
    try:
        _add_hidden(model, network, lo, hi, bounds)
        if not any_row:
            model.add_output_rows(w, b, c, d, noise)
        elif not len(model.add_output_disjunction(w, b, c, d, noise)):
            return "infeasible", None
        point = model.solve_milp()
    except VerificationError:
        return "unknown", None
    if point is None:
        return "infeasible", None
    # HiGHS may leave a column outside its bounds by its feasibility tolerance
    return "found", np.clip(point[model.input_cols], lo, hi)


def lp_bounds(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    bounds: list[tuple[np.ndarray, np.ndarray]],
    seconds: float,
    stop: Stop | None = None,
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """``bounds`` (each (1, width)) with every unstable neuron after the first layer
    tightened by the LP over the layers before it, or None when ``seconds`` run out first,
    ``stop`` ends it (or the network has a sigmoid or tanh, which the LP does not model)."""
    if not network.relu_only:
        return None
    model = ReluModel(Solver(time_limit=seconds), budget=seconds, stop=stop)
    try:
        return _add_hidden(model, network, lo, hi, bounds, tighten=True)
    except VerificationError:
        return None


def _add_hidden(
    model: ReluModel,
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    bounds: list[tuple[np.ndarray, np.ndarray]],
    tighten: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The box and the hidden layers into ``model``, on ``bounds`` widened by the solver's
    slack (so that rounding in HiGHS cannot cut a point); with ``tighten``, each layer
    after the first also LP-tightened. The bounds used, each (1, width)."""
    model.h.setOptionValue("presolve", "off")  # a third faster on these small models
    # the feasibility-jump heuristic runs before every solve: half of the time of an ACAS
    # Xu box's MILP, which HiGHS decides at its root (bench/milp_heuristics.py)
    model.h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    model.start_box(Layer(lo, hi))
    used = []
    for k, (w, b, (low, high)) in enumerate(
        zip(network.weights[:-1], network.biases[:-1], bounds, strict=True)
    ):
        slack = BOUND_SLACK * (1.0 + np.maximum(np.abs(low[0]), np.abs(high[0])))
        layer = Layer(low[0] - slack, high[0] + slack)
        noise = None if network.noise is None else network.noise[k]
        if tighten and k:
            layer = model.tighten(w, b, layer, noise)
            layer = Layer(np.maximum(layer.lower, low[0]), np.minimum(layer.upper, high[0]))
        model.add_relu(w, b, layer, noise)
        used.append((layer.lower[None], layer.upper[None]))
    return used
