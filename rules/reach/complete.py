"""Complete verification of a query (``query.Query``) on a ReLU network: a counterexample
search, then branch and bound over the input box.

Sampling comes first (points of the box and of its faces, then projected sign-gradient
steps). Then each box is bounded by back-substitution (``backward.py``): an unsafe polytope
is empty on a box once one of its rows ``c y <= d`` (or an average of some of them) has
``c y > d`` everywhere on it. A box where some polytope stays open is searched from its
centre and otherwise bisected: along the input whose halves bound best for the first
splits (strong branching), then along the input with the largest split score. A box too
small to split further, or one bisected often whose bounds leave few neurons unstable, is
decided by the MILP (``milp.py``). So the answers are: ``sat``
with an input the reference evaluator (``confirm``) puts in the unsafe region, ``unsat``
when every box was closed by sound bounds or an infeasible MILP, ``timeout`` when the time
ran out first, and ``unknown`` when a box could be decided by neither (the MILP solver gave
up on it, or the evaluator rejected its point).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from vigil.rules.reach.backward import output_bounds, pre_activation_bounds
from vigil.rules.reach.milp import box_counterexample
from vigil.rules.reach.network import POWER, Network
from vigil.rules.reach.query import Case, Query, joint_network, reach_query, shut
from vigil.rules.reach.relu_split import WHOLE_OUTPUT_SPACE, ReluSplit, bytes_per_branch
from vigil.rules.reach.rounding import rounding_noise
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.relu_milp import Stop

BATCH = 256
"""Boxes bounded together (one matrix product per layer for all of them)."""
SEARCH_SAMPLES = 10_000
SEARCH_STARTS = 64
FACE_SHARE = 0.3
"""In half of the samples, the share of inputs put on a bound of the box (ACAS Xu 1_9,
property 7: its counterexamples lie at the lower bound of X_0)."""
SEARCH_STEPS = 24
PROGRESS_SECONDS = 5.0
STRONG_SPLITS = 512
"""Splits chosen by bounding every input's halves (ten bounds per split on ACAS Xu), after
which the split score chooses. The first splits decide how many boxes follow: ACAS Xu
property 1 on 2_8, 3_8, 3_9, 4_7 and 4_9 is decided in 3-10 s with 512 and not in 116 s
with 64; properties 5, 6 and 9, decided by the split score, take a few seconds longer."""
MAX_AVERAGED = 5
"""Polytopes of up to this many rows also get the averages of their rows' subsets."""
BOX_STEPS = 6
MILP_WIDTH = 1e-4
"""A box whose widest side (relative to the query's box) is below this goes to the MILP."""
MILP_TIERS = ((14, 25), (20, 30))
"""A box of a ReLU network bisected at least as often as a tier says whose bounds leave at
most that tier's unstable neurons goes to the MILP too: bisection had not closed it. On
ACAS Xu property 2 (near-ties of 0.001) the boxes along the tie keep 20-30 unstable
neurons. Two at a time on this machine, 4_2 took 85 s with these tiers and 125 s with
(20, 30) alone, 3_3 39-42 s and 71 s; (16, 20) gave no verdict in 250 s. Property 5 on
1_1 pays: 12 s instead of 8 (docs/benchmarks.md)."""
MILP_TRY_SECONDS = 0.1
"""The MILP's time on a box sent by ``MILP_TIERS`` (per polytope); a box it does not decide
in that time is bisected. HiGHS decides most such boxes in 5-25 ms, a few of them (the
wider) in up to 1.8 s, which their halves take a fraction of."""
MILP_MARGINS = (1e-6, 1e-4)
"""How far inside the unsafe region (relative to each row's bound, plus as much absolute)
a MILP point is sought again, in turn, when the evaluator rejects one on the region's
boundary. HiGHS may violate each row by its feasibility tolerance (1e-6), and a violation
carries through the layers after it: a point on an input half-plane, carried through two
hidden layers, came out 2e-6 outside it."""

INPUT_SPLIT_DIMS = 16
"""Networks with at most this many inputs are searched by bisecting the input box, others
by splitting ReLUs (``splits_inputs``)."""
MEMORY = 2 << 30
"""Bytes the search's arrays may take at once, by default."""
ATTACK_ROUNDS = 8
"""Rounds of random restarts before a ReLU search (``SEARCH_STARTS`` points each)."""
ATTACK_STEPS = 40

Confirm = Callable[[np.ndarray], np.ndarray]
"""The reference evaluator: outputs (n, m) for inputs (n, d) (onnxruntime)."""


@dataclass
class Verdict:
    """A query's answer; for ``sat`` the counterexample as the reference evaluator computes
    it; for ``timeout`` and ``unknown`` the reason."""

    result: str
    seconds: float
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    stats: dict[str, int] = field(default_factory=dict)
    reason: str = ""


def splits_inputs(network: Network) -> bool:
    """Whether the search bisects the input box (few inputs, as ACAS Xu's 5) rather than
    branching on the signs of unstable neurons (``relu_split``): halving one of 784 inputs
    hardly tightens a bound, fixing a neuron does."""
    return network.input_dim <= INPUT_SPLIT_DIMS


def verify(
    network: Network,
    query: Query,
    confirm: Confirm,
    *,
    timeout: float = 60.0,
    memory: int = MEMORY,
    progress: Callable[[dict[str, int]], None] | None = None,
    cores: int | None = None,
) -> Verdict:
    """The query's answer within ``timeout`` seconds, using at most about ``memory`` bytes
    for the search's arrays and ``cores`` cores (default: those the process may run on)."""
    if query.inputs != network.input_dim or query.outputs != network.output_dim:
        raise ValueError(
            f"the property is over {query.inputs} inputs and {query.outputs} outputs, the "
            f"network has {network.input_dim} and {network.output_dim}"
        )
    if network.output != "none" and not splits_inputs(network):
        raise ValueError(
            f"the network ends in {network.output}; its outputs are bounded by input "
            f"bisection only, for at most {INPUT_SPLIT_DIMS} inputs (it has "
            f"{network.input_dim}): state the property over the logits (the model without "
            f"its {network.output})"
        )
    started = time.monotonic()
    deadline = started + timeout
    if network.rounding is not None and network.noise is None:
        # bounds of the floating-point evaluation: its rounding over every case's box
        lows = np.stack([case.lower for case in query.cases])
        highs = np.stack([case.upper for case in query.cases])
        network = rounding_noise(network, lows, highs)
    stats = {"boxes": 0, "branches": 0, "splits": 0, "milp": 0, "refined": 0, "candidates": 0}
    search = _Search(network, confirm, stats, memory)
    rng = np.random.default_rng(0)
    for case in query.cases:  # counterexamples first: a sample is cheap, a proof is not
        found = search.sample(case, rng, deadline)
        if found is None and not splits_inputs(network):
            found = search.restarts(case, rng, deadline, rounds=ATTACK_ROUNDS)
        if found is not None:
            return Verdict("sat", time.monotonic() - started, *found, stats)
    searches: list[_BranchAndBound | ReluSplit]
    if splits_inputs(network):
        searches = [
            _BranchAndBound(network, case, search, stats, progress, memory) for case in query.cases
        ]
    else:
        cores = len(os.sched_getaffinity(0)) if cores is None else cores
        args = (search, stats, memory, progress, PROGRESS_SECONDS, cores)
        searches = [ReluSplit(network, case, _rows(case), *args) for case in query.cases]
    for bab in searches:
        found = bab.run(deadline)
        if found is not None:
            return Verdict("sat", time.monotonic() - started, *found, stats)
    seconds = time.monotonic() - started
    if not all(bab.done for bab in searches):
        left = sum(bab.waiting for bab in searches)
        return Verdict("timeout", seconds, stats=stats, reason=f"{left} branches still open")
    undecided = [bab.undecided for bab in searches if bab.undecided]
    undecided += [reason for case in query.cases if (reason := _power_domain(network, case))]
    if undecided:
        return Verdict("unknown", seconds, stats=stats, reason=undecided[0])
    return Verdict("unsat", seconds, stats=stats)


def _power_domain(network: Network, case: Case) -> str:
    """Why bounds cannot prove the case empty: a power neuron (``POWER``) whose base is not
    shown non-negative over the case's box. The bounds are those of ``max(z, 0)^p``, which
    onnxruntime computes only where ``z >= 0`` (below, NaN, which a later operator such as
    a ReLU may turn into a number)."""
    if network.activations is None or not any((a == POWER).any() for a in network.activations):
        return ""
    pre = pre_activation_bounds(network, case.lower[None], case.upper[None])
    for k, ((low, _), codes) in enumerate(zip(pre, network.activations, strict=False)):
        if (low[0, codes == POWER] < 0).any():
            return (
                f"the base of a non-integer power in layer {k + 1} may be negative on the "
                f"box, where onnxruntime computes NaN: no bound covers that"
            )
    return ""


def decide(
    network: Network,
    inputs: InputSet,
    spec: OutputSpec,
    timeout: float,
    confirm: Confirm | None = None,
    memory: int = MEMORY,
) -> Verdict:
    """Whether every input of ``inputs`` gives last-layer values (the logits, behind a
    sigmoid or softmax head) in ``spec``, by the same search as ``verify``: ``unsat`` when
    it holds, ``sat`` with an input that breaks it as ``confirm`` computes those values
    (by default the network's own layers)."""
    logits = replace(network, output="none")
    query = reach_query(inputs, spec)
    own: Confirm = confirm or logits.forward
    check = own
    if query.joint:  # input constraints A x <= b: rows over (y, x)
        logits = joint_network(logits)
        check = lambda x: np.hstack([own(x), x])  # noqa: E731
    return verify(logits, query, check, timeout=timeout, memory=memory)


Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""The rows searches bound: C (R, m), d (R,), which polytope each belongs to (P, R), and
which are strict (R,)."""


def _rows(case: Case) -> Rows:
    """The unsafe polytopes' rows with the averages of their subsets (``_averages``)."""
    rows = [_averages(c, d, case.strict_rows(p)) for p, (c, d) in enumerate(case.unsafe)]
    owner = np.repeat(np.arange(len(rows)), [len(d) for _, d, _ in rows])
    return (
        np.vstack([c for c, _, _ in rows]),
        np.concatenate([d for _, d, _ in rows]),
        owner[None, :] == np.arange(len(case.unsafe))[:, None],
        np.concatenate([s for _, _, s in rows]),
    )


class _Search:
    """Counterexample search: points in a box moved towards the unsafe region, each
    candidate confirmed by the reference evaluator."""

    def __init__(
        self, network: Network, confirm: Confirm, stats: dict[str, int], memory: int
    ) -> None:
        self.network, self.confirm, self.stats = network, confirm, stats
        # the evaluator's input type: float16 models take float16, others float32 values
        half = network.precision is not None and network.precision.name == "float16"
        self.input_type = np.float16 if half else np.float32
        # a point's input, activations and gradient, a few copies of each at once
        point = 8 * 4 * (network.input_dim + sum(network.hidden_sizes) + network.output_dim)
        self.samples = int(min(SEARCH_SAMPLES, max(memory // point, SEARCH_STARTS)))

    def sample(self, case: Case, rng: np.random.Generator, deadline: float) -> tuple | None:
        """Random points of the case's box, then gradient steps from the closest ones: a
        confirmed counterexample, if any."""
        lo, hi = case.lower, case.upper
        n = self.samples
        x = lo + (hi - lo) * rng.random((n, lo.size))
        # half of them on faces of the box: worst cases often sit on a bound of some input
        face = (rng.random(x.shape) < FACE_SHARE) & (np.arange(n) % 2 == 1)[:, None]
        x = np.vstack(
            [(lo + hi) / 2, np.where(face, np.where(rng.random(x.shape) < 0.5, lo, hi), x)]
        )
        score = case.violation(self.network.forward(x))
        order = np.argsort(score)
        best = x[order[:SEARCH_STARTS]]
        if self.network.precision is not None:
            # the computed network may reach the region where the real one does not
            found = self.confirmed(case, best)
            if found is not None:
                return found
        n = len(best)
        found, _ = self.descend(
            case, best, np.tile(lo, (n, 1)), np.tile(hi, (n, 1)), SEARCH_STEPS, 0.25, deadline
        )
        return found

    def restarts(
        self, case: Case, rng: np.random.Generator, deadline: float, rounds: int = 1
    ) -> tuple | None:
        """Projected gradient descent from ``rounds`` times ``SEARCH_STARTS`` random points
        of the box (some of their inputs on its faces): a confirmed counterexample, if
        any."""
        lo, hi = case.lower, case.upper
        n = SEARCH_STARTS
        los, his = np.tile(lo, (n, 1)), np.tile(hi, (n, 1))
        for _ in range(rounds):
            if time.monotonic() >= deadline:
                return None
            x = lo + (hi - lo) * rng.random((n, lo.size))
            face = rng.random(x.shape) < FACE_SHARE
            x = np.where(face, np.where(rng.random(x.shape) < 0.5, lo, hi), x)
            found, _ = self.descend(case, x, los, his, ATTACK_STEPS, 0.25, deadline)
            if found is not None:
                return found
        return None

    def descend(
        self,
        case: Case,
        x: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        steps: int,
        step: float = 0.25,
        deadline: float = np.inf,
    ) -> tuple[tuple | None, np.ndarray]:
        """Projected sign-gradient descent of the distance to the unsafe region from each
        point within its box (lo, hi per point): the first confirmed point, if any, and the
        smallest distance reached from each (steps stop at ``deadline``)."""
        size = (hi - lo) * step
        closest = np.full(len(x), np.inf)
        for _ in range(steps + 1):
            if time.monotonic() >= deadline:
                break
            score, grad = self._objective(case, x)
            closest = np.minimum(closest, score)
            hit = np.flatnonzero(score <= 0)
            if hit.size:
                found = self.confirmed(case, x[hit])
                if found is not None:
                    return found, closest
            x = np.clip(x - size * np.sign(grad), lo, hi)
            size = size * 0.75
        return None, closest

    def milp(
        self,
        case: Case,
        lo: np.ndarray,
        hi: np.ndarray,
        c: np.ndarray,
        d: np.ndarray,
        seconds: float,
        bounds: list[tuple[np.ndarray, np.ndarray]] | None = None,
        any_row: bool = False,
        stop: Stop | None = None,
    ) -> tuple | str:
        """``milp.box_counterexample`` with its point confirmed: a counterexample,
        "infeasible", "unknown" (the solver stopped, or the time ran out before its point
        was sought inside every margin) or "unconfirmed" (the evaluator rejects its points
        at every margin).
        The solver's region is closed and its point may lie on the boundary, or past it by
        the solver's tolerance, where a strict row or a row without tolerance rejects it:
        the region with every row moved inside by each of ``MILP_MARGINS`` is then tried in
        turn (infeasible there proves nothing, so it is not reported)."""
        deadline = time.monotonic() + seconds
        net = self.network
        outcome, x = box_counterexample(net, lo, hi, c, d, seconds, bounds, any_row, stop)
        if outcome != "found":
            return outcome
        assert x is not None
        found = self.confirmed(case, x[None])
        for margin in MILP_MARGINS:
            if found is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return "unknown"
            inside = d - margin * (1.0 + np.abs(d))
            outcome, x = box_counterexample(net, lo, hi, c, inside, left, bounds, any_row, stop)
            if outcome == "unknown":
                return outcome
            found = self.confirmed(case, x[None]) if x is not None else None
        return found if found is not None else "unconfirmed"

    def _objective(self, case: Case, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """min over polytopes of max over rows of (c y - d), and its gradient in x (through
        the logits: an output activation's own slope is left out)."""
        net = self.network
        pre = net.pre_activations(x)
        h = net.hidden(len(pre) - 1, pre[-1]) if pre else x
        y = net.activate(h @ net.weights[-1].T + net.biases[-1])
        best = np.full(len(x), np.inf)
        rows = np.zeros((len(x), y.shape[1]))
        for c, d in case.unsafe:
            if not len(d):
                return np.full(len(x), -np.inf), np.zeros_like(x)
            values = y @ c.T - d
            arg = values.argmax(axis=1)
            top = values[np.arange(len(x)), arg]
            better = top < best
            best[better] = top[better]
            rows[better] = c[arg[better]]
        grad = rows @ net.weights[-1]
        for k in range(len(pre) - 1, -1, -1):
            grad = (grad * net.slope(k, pre[k])) @ net.weights[k]
        return best, grad

    def confirmed(self, case: Case, x: np.ndarray) -> tuple | None:
        """Of the points whose reference output satisfies the case (``Case.holds``), the
        one deepest in the unsafe region, with that output."""
        self.stats["candidates"] += len(x)
        x = _inside(x, case, self.input_type)
        y = self.confirm(x)
        holds = np.flatnonzero(case.holds(x, y))
        if not holds.size:
            return None
        best = holds[int(np.argmin(case.violation(y[holds])))]
        return x[best], y[best]


def _inside(x: np.ndarray, case: Case, kind: type = np.float32) -> np.ndarray:
    """``x`` moved into the case's box so that it stays there once rounded to ``kind``
    (the evaluator's input type): a rounded bound outside the box, or on a strict bound,
    is replaced by its next value of that type towards the inside."""
    lo, hi = case.lower, case.upper
    lo_open = np.zeros(lo.shape, bool) if case.lower_open is None else case.lower_open
    hi_open = np.zeros(hi.shape, bool) if case.upper_open is None else case.upper_open
    lo_k, hi_k = lo.astype(kind), hi.astype(kind)
    up, down = np.nextafter(lo_k, kind(np.inf)), np.nextafter(hi_k, kind(-np.inf))
    lo_k = np.where((lo_k < lo) | (lo_open & (lo_k <= lo)), up, lo_k)
    hi_k = np.where((hi_k > hi) | (hi_open & (hi_k >= hi)), down, hi_k)
    x = np.clip(x, lo, hi).astype(kind)
    return np.clip(x, lo_k, np.maximum(hi_k, lo_k)).astype(np.float64)


class _BranchAndBound:
    """The boxes of one case still open, bounded, searched and split in batches; ``run``
    goes on where the last one stopped."""

    def __init__(
        self,
        network: Network,
        case: Case,
        search: _Search,
        stats: dict[str, int],
        progress: Callable[[dict[str, int]], None] | None,
        memory: int,
    ) -> None:
        self.network, self.case, self.search = network, case, search
        self.stats, self.progress = stats, progress
        self.C, self.d, self.member, self.strict = _rows(case)
        # strong branching bounds both halves of every input of each box at once
        per_box = 2 * network.input_dim * bytes_per_branch(network, len(self.d))
        self.batch = int(min(BATCH, max(memory // per_box, 1)))
        self.width = np.maximum(case.upper - case.lower, 1e-300)
        self.fixed = case.upper <= case.lower  # inputs with one value: never bisected
        self.stack_lo, self.stack_hi = [case.lower[None]], [case.upper[None]]
        self.stack_open = [np.ones((1, len(case.unsafe)), dtype=bool)]
        self.undecided = ""
        if any(not len(d) for _, d in case.unsafe):
            self.undecided = WHOLE_OUTPUT_SPACE
            self.stack_lo, self.stack_hi, self.stack_open = [], [], []
        self.last_report = time.monotonic()
        self.splits = 0

    @property
    def done(self) -> bool:
        return not self.stack_lo

    @property
    def waiting(self) -> int:
        return sum(map(len, self.stack_lo))

    def run(self, deadline: float) -> tuple | None:
        """Work until every box is closed or ``deadline``; a counterexample if one is found."""
        while self.stack_lo and time.monotonic() < deadline:
            lo, hi, open_ = _pop(self.stack_lo, self.stack_hi, self.stack_open, self.batch)
            self.stats["boxes"] += len(lo)
            bound = output_bounds(self.network, lo, hi, -self.C, -self.d)
            closed = shut(bound.upper, self.d, self.strict)  # row r: no point of the box
            open_ &= ~((closed[:, None, :] & self.member[None]).any(axis=2))
            live = np.flatnonzero(open_.any(axis=1))
            if not live.size:
                continue
            lo, hi, open_ = lo[live], hi[live], open_[live]
            grad, unstable = bound.gradient[live], bound.unstable[live]
            found, closest = self.search.descend(
                self.case, (lo + hi) / 2, lo, hi, BOX_STEPS, step=0.25
            )
            if found is not None:
                return found
            # the halves of the boxes whose search came closest are taken first, depth first
            order = np.argsort(closest, kind="stable")
            lo, hi, open_, grad = lo[order], hi[order], open_[order], grad[order]
            batch_row = live[order]  # each box's row in ``bound``
            share = (hi - lo) / self.width
            bisections = -np.log2(np.where(self.fixed, 1.0, share)).sum(axis=1)
            tiny = share.max(axis=1) < MILP_WIDTH
            exact = tiny.copy()
            if self.network.output == "none":
                if self.network.relu_only:  # deep and nearly stable: the MILP decides
                    for depth, most in MILP_TIERS:
                        exact |= (bisections >= depth) & (unstable[order] <= most)
                for i in np.flatnonzero(exact):
                    j = batch_row[i]
                    box = [(low[j : j + 1], high[j : j + 1]) for low, high in bound.pre]
                    cap = None if tiny[i] else MILP_TRY_SECONDS
                    outcome = self._milp(lo[i], hi[i], open_[i], box, deadline, cap)
                    if isinstance(outcome, tuple):
                        return outcome
                    if outcome == "split":  # not decided within the cap: bisected
                        exact[i] = False
                    elif outcome == "timeout":  # still open: the verdict is a timeout
                        self.stack_lo.append(lo[i : i + 1])
                        self.stack_hi.append(hi[i : i + 1])
                        self.stack_open.append(open_[i : i + 1])
                    elif outcome == "unknown":
                        self.undecided = (
                            "the MILP solver did not decide a box, or its point is not a "
                            "counterexample for the reference evaluator"
                        )
            elif exact.any():  # no MILP through the output activation: left undecided
                self.undecided = (
                    f"boxes too small to split are still open: bounds through the "
                    f"{self.network.output} did not close them"
                )
            split = ~exact
            lo, hi, open_, grad = lo[split], hi[split], open_[split], grad[split]
            if len(lo):
                self._split(lo, hi, open_, grad)
            if self.progress and time.monotonic() - self.last_report > PROGRESS_SECONDS:
                self.last_report = time.monotonic()
                self.progress({**self.stats, "open": self.waiting})
        return None

    def _split(self, lo: np.ndarray, hi: np.ndarray, open_: np.ndarray, grad: np.ndarray) -> None:
        """Bisect each box: along the input whose halves have the best bounds while the
        tree is young (strong branching: every input's halves are bounded), then along the
        input with the largest split score."""
        if self.splits < STRONG_SPLITS:
            dim = self._strongest(lo, hi, open_, grad)
        else:
            dim = np.argmax(grad + 1e-12 * (hi - lo) / self.width, axis=1)
        self.splits += len(lo)
        self.stats["splits"] += len(lo)
        rows = np.arange(len(lo))
        middle = (lo[rows, dim] + hi[rows, dim]) / 2
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[rows, dim] = middle
        right_lo[rows, dim] = middle
        pairs = (len(lo) * 2, lo.shape[1])  # each box's halves side by side, in its order
        self.stack_lo.append(np.stack([lo, right_lo], axis=1).reshape(pairs))
        self.stack_hi.append(np.stack([left_hi, hi], axis=1).reshape(pairs))
        self.stack_open.append(np.repeat(open_, 2, axis=0))

    def _strongest(
        self, lo: np.ndarray, hi: np.ndarray, open_: np.ndarray, grad: np.ndarray
    ) -> np.ndarray:
        """Per box, the input whose two halves leave the least of the open polytopes'
        bounds above the unsafe region, summed over the polytopes (ties: the larger split
        score)."""
        n, dims = lo.shape
        child_lo = np.repeat(lo[None], 2 * dims, axis=0)
        child_hi = np.repeat(hi[None], 2 * dims, axis=0)
        middle = (lo + hi) / 2
        for k in range(dims):
            child_hi[2 * k, :, k] = middle[:, k]
            child_lo[2 * k + 1, :, k] = middle[:, k]
        bound = output_bounds(
            self.network, child_lo.reshape(-1, dims), child_hi.reshape(-1, dims), -self.C, -self.d
        )
        # how far each row is from being shut (< 0: shut); a polytope's, its best row's
        slack = (bound.upper + self.d).reshape(2 * dims, n, 1, -1)
        polytope = np.where(self.member[None, None], slack, np.inf).min(axis=3)
        left = np.where(open_[None], np.maximum(polytope, 0.0), 0.0).sum(axis=2)  # (2 dims, n)
        score = left[0::2] + left[1::2]  # (dims, n)
        score[1e-9 * self.width[:, None] >= (hi - lo).T] = np.inf  # nothing left to halve
        best = score.min(axis=0)
        near = score <= best + 0.01 * np.abs(best)
        return np.argmax(np.where(near.T, grad, -1.0), axis=1)

    def _milp(
        self,
        lo: np.ndarray,
        hi: np.ndarray,
        open_: np.ndarray,
        bounds: list[tuple[np.ndarray, np.ndarray]],
        deadline: float,
        cap: float | None = None,
    ) -> str | tuple:
        """Decide the open polytopes of a small box exactly on its pre-activation
        ``bounds`` (each (1, width)), each in at most ``cap`` seconds when given: a
        counterexample, "unsat", "unknown" (the evaluator rejects the solver's points, or
        the solver stopped without a cap), "split" when the time ran out at the cap (the
        solver stopped, or its point was rejected and no time was left to look further
        inside: a loaded machine reaches the cap sooner), or "timeout" when the deadline
        came first (the box stays open). A polytope shown empty is closed in ``open_``."""
        for p in np.flatnonzero(open_):
            seconds = deadline - time.monotonic()
            if seconds <= 0:
                return "timeout"
            self.stats["milp"] += 1
            c, d = self.case.unsafe[p]
            limit = seconds if cap is None else min(cap, seconds)
            outcome = self.search.milp(self.case, lo, hi, c, d, limit, bounds)
            if isinstance(outcome, tuple):
                return outcome
            if outcome == "infeasible":
                open_[p] = False
                continue
            if time.monotonic() >= deadline:
                return "timeout"
            return "split" if outcome == "unknown" and cap is not None else "unknown"
        return "unsat"


def _averages(
    c: np.ndarray, d: np.ndarray, strict: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A polytope's rows and the averages of every subset of them: where an average of rows
    exceeds its bound, one of them does, so the polytope is empty on any box where some
    average is shown above its bound; near the ties of a conjunction (``Y_0`` is the
    largest) the averages are shown where no single row is (ACAS Xu 3_3, property 2). An
    average is strict when one of its rows is."""
    k = len(d)
    if not 1 < k <= MAX_AVERAGED:
        return c, d, strict
    subsets = [s for size in range(2, k + 1) for s in itertools.combinations(range(k), size)]
    return (
        np.vstack([c, *(c[list(s)].mean(axis=0) for s in subsets)]),
        np.concatenate([d, [d[list(s)].mean() for s in subsets]]),
        np.concatenate([strict, [strict[list(s)].any() for s in subsets]]),
    )


def _pop(stack_lo, stack_hi, stack_open, n: int):
    """Up to ``n`` boxes from the top of the stack (depth first keeps it small)."""
    lo, hi, op = [], [], []
    taken = 0
    while stack_lo and taken < n:
        a, b, c = stack_lo.pop(), stack_hi.pop(), stack_open.pop()
        room = n - taken
        if len(a) > room:
            stack_lo.append(a[room:])
            stack_hi.append(b[room:])
            stack_open.append(c[room:])
            a, b, c = a[:room], b[:room], c[:room]
        lo.append(a)
        hi.append(b)
        op.append(c)
        taken += len(a)
    return np.vstack(lo), np.vstack(hi), np.vstack(op)
