"""The exact finisher of the complete search: is there an input in a box whose outputs
satisfy ``C y <= d`` (every row, or with ``any_row`` one of them)? A MILP (HiGHS), big-M
ReLUs on the box's back-substituted pre-activation bounds, widened by the solver's slack.
On the boxes ACAS Xu property 2 leaves open near its ties these leave 3 to 50 neurons
unstable, where interval bounds left 80 to 200: HiGHS decides such a box in about 10 ms
instead of 2 to over 20 s. For the larger branches of the ReLU search, ``lp_bounds``
tightens the bounds further by the LP over the layers before each neuron; for a whole box
the search has not closed early, ``milp_bounds`` by the MILP over them."""

from __future__ import annotations

import time
from queue import Empty, SimpleQueue

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


def milp_bounds(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    bounds: list[tuple[np.ndarray, np.ndarray]],
    seconds: float,
    until: float,
    workers: int = 1,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """``bounds`` (each (1, width)) with the unstable neurons of every layer after the first
    tightened by the MILP over the layers before them (alpha-beta-CROWN's MIP refinement of
    intermediate bounds), layer by layer; and how many neurons it tightened. Each bound is
    HiGHS's dual bound after at most ``seconds``, sound wherever it stops; ``workers``
    MILPs run at once, each on a thread and model of its own (HiGHS releases the GIL);
    none begins after ``until`` (``time.monotonic``), and the neurons not reached by then
    keep their bounds. A network with a sigmoid or tanh keeps them all
    (the MILP does not model them)."""
    from concurrent.futures import ThreadPoolExecutor  # not for input bisection's start-up

    if not network.relu_only or time.monotonic() >= until:
        return bounds, 0
    solver = Solver(bounds="milp", bound_time=seconds)
    budget = until - time.monotonic()
    models = [ReluModel(solver, budget=budget) for _ in range(workers)]
    for model in models:
        _configure(model)
        model.start_box(Layer(lo, hi))
    out, count = [], 0
    with ThreadPoolExecutor(workers, "vigil-bounds") as pool:
        for k, (w, b, (low, high)) in enumerate(
            zip(network.weights[:-1], network.biases[:-1], bounds, strict=True)
        ):
            layer = _widened(low, high)
            noise = None if network.noise is None else network.noise[k]
            kept = low, high
            if k and layer.unstable.any() and time.monotonic() < until:
                neurons: SimpleQueue[int] = SimpleQueue()
                for j in np.flatnonzero(layer.unstable).tolist():
                    neurons.put(j)
                args = (w, b, layer, noise, neurons, until)
                parts = [
                    future.result()
                    for future in [pool.submit(_tighten, model, *args) for model in models]
                ]
                count += sum(n for _, n in parts)
                lower = np.max([part.lower for part, _ in parts], axis=0)
                upper = np.min([part.upper for part, _ in parts], axis=0)
                layer = Layer(np.maximum(lower, low[0]), np.minimum(upper, high[0]))
                kept = layer.lower[None], layer.upper[None]
            out.append(kept)
            for model in models:
                model.add_relu(w, b, layer, noise)
    return out, count


def _tighten(
    model: ReluModel,
    w: np.ndarray,
    b: np.ndarray,
    layer: Layer,
    noise: np.ndarray | None,
    neurons: SimpleQueue[int],
    until: float,
) -> tuple[Layer, int]:
    """The layer with the neurons this thread takes from ``neurons`` tightened over its
    model, until none is left or ``until``; and how many it took."""
    count = 0
    while time.monotonic() < until:
        try:
            j = neurons.get_nowait()
        except Empty:
            break
        try:
            layer = model.tighten(w, b, layer, noise, which=[j])
        except VerificationError:  # the budget is spent, or stopped
            break
        count += 1
    return layer, count


def _configure(model: ReluModel) -> None:
    model.h.setOptionValue("presolve", "off")  # a third faster on these small models
    # the feasibility-jump heuristic runs before every solve: half of the time of an ACAS
    # Xu box's MILP, which HiGHS decides at its root (bench/milp_heuristics.py)
    model.h.setOptionValue("mip_heuristic_run_feasibility_jump", False)


def _widened(low: np.ndarray, high: np.ndarray) -> Layer:
    """Bounds (each (1, width)) widened by the solver's slack, so that rounding in HiGHS
    cannot cut a point."""
    slack = BOUND_SLACK * (1.0 + np.maximum(np.abs(low[0]), np.abs(high[0])))
    return Layer(low[0] - slack, high[0] + slack)


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
    _configure(model)
    model.start_box(Layer(lo, hi))
    used = []
    for k, (w, b, (low, high)) in enumerate(
        zip(network.weights[:-1], network.biases[:-1], bounds, strict=True)
    ):
        layer = _widened(low, high)
        noise = None if network.noise is None else network.noise[k]
        if tighten and k:
            layer = model.tighten(w, b, layer, noise)
            layer = Layer(np.maximum(layer.lower, low[0]), np.minimum(layer.upper, high[0]))
        model.add_relu(w, b, layer, noise)
        used.append((layer.lower[None], layer.upper[None]))
    return used
