"""Branch and bound over ReLUs: the complete search for networks with more inputs than
bisection can cover (MNIST's 784).

A branch is the case's whole input box under assumptions on the signs of some neurons'
pre-activations. Its bounds are back-substituted (``backward.split_bounds``) with each
assumed neuron's bounds cut at 0, so every layer after it is bounded tighter, and within
the bounds of the whole box, which optimized slopes (alpha-CROWN) tighten once per case.
Its output rows' slopes and the multipliers of its assumptions (beta-CROWN: each assumption
enters the rows' bounds as a constraint, not only through the cut) are optimized, starting
from its parent's. A branch closes when one row of each unsafe polytope is shown
unreachable, or when its assumptions contradict its bounds. An open one is searched from
the input its weakest bound points to, and split in two on the unstable neuron whose
relaxation loosens its open bounds most (the intercept score of BaBSR). A split neuron is
stable in both children, so the tree is finite. Once its bounds leave few neurons
unstable, a branch also goes to the MILP, whose answer holds for every branch below it:
with two cores on a thread beside the bounds, with one on the search's own thread, which
waits for it. A search still open after a tenth of its time has the box's bounds tightened
by the MILP (``milp.milp_bounds``) and starts again within them.

Memory: branches are bounded in batches sized to three quarters of the memory budget, and
an open branch is one sign per hidden neuron and, while the last quarter holds it, the
relaxation it starts from; the branches kept for the MILP are at most ``CANDIDATES``;
nothing grows with branches times inputs times neurons.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from vigil.rules.reach.backward import (
    Relaxation,
    SplitBounds,
    pre_activation_bounds,
    split_bounds,
)
from vigil.rules.reach.milp import lp_bounds, milp_bounds
from vigil.rules.reach.network import Network
from vigil.rules.reach.query import Case, shut
from vigil.rules.relu_milp import Stop

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

BATCH_SECONDS = 0.5
"""A batch is grown while bounding it takes less than half this and shrunk when it takes
more, so the search looks at its deadline at least this often."""
MILP_UNSTABLE = 250
"""A branch whose bounds leave at most this many neurons unstable goes to the MILP: HiGHS
decides most of mnistfc 256x2's roots, with 100-150, in seconds."""
TIGHTEN_UNSTABLE = 40
"""A branch going to the MILP with more unstable neurons than this first gets their bounds
tightened by the LP over the layers before them (MIPVerify's LP bounds), once for all its
polytopes: fewer binaries for HiGHS to branch on."""
CANDIDATES = 64
"""Branches kept for the MILP while it is busy, the shallowest (a few MiB at most)."""
MILP_SHRINK = 0.8
"""After the MILP stopped at its time limit on a branch of n unstable neurons, its
descendants go to the MILP with at most this share of n."""
MILP_SECONDS, MILP_SHARE, ROOT_MILP_SHARE = 5.0, 0.25, 0.6
"""The time of one MILP on a branch (one per polytope, or one for a disjunction of single
rows): this share of the time left, at least these seconds, and for the whole box (whose
answer is the search's) the larger share; a branch the MILP does not decide in its time
is split. On mnistfc 256x4 ``prop_10_0.05`` the whole box's MILP on its tightened bounds
takes 45-55 s, and a quarter of the time left was not enough."""
ROOT_SLOPE_STEPS, SLOPE_STEPS = 20, 20
"""Steps of ``backward.optimized_slopes`` on a ReLU network: for every unstable neuron's
bounds over the case's box, once (every branch's bounds are intersected with them), and
for each branch's rows, slopes and the multipliers of its sign assumptions together.
None where the root's optimization would take more than half the memory
(``root_slope_bytes``). On mnistfc 256x4 ``prop_0_0.03`` the root's steps take its
unstable neurons from 218 to 164 and its rows' bounds from 1.2-1.8 above their thresholds
to 0.55-0.97. On 256x2 ``prop_3_0.03`` (published unsat) a branch's 20 steps decided it in
80 s, 10 in 100 s; it timed out at 120 s without the multipliers."""
REFINE_AFTER, REFINE_SHARE, BOUND_SECONDS = 0.1, 0.6, 0.5
"""A search still open after this share of its time stops for the MILP to tighten the
bounds of the whole box (``milp.milp_bounds``, on every core, for this share of the time
then left, each bound at most these seconds), then starts again from the whole box
within them (on 256x4 ``prop_4_0.05`` the branches open then did not close in the 150 s
left; starting again closed in 203). On mnistfc 256x4
``prop_4_0.05`` (published unsat, open after 300 s before) the last layer's unstable neurons
go from 121 to 85 and the search then closes in 179 branches."""
ATTACK_EVERY = 20
"""Batches between two rounds of fresh random restarts of the counterexample search."""
STEPS = 6
WHOLE_OUTPUT_SPACE = "an unsafe region is the whole output space, and no sample confirmed"


class Searcher(Protocol):
    """The counterexample search the complete search shares (``complete._Search``)."""

    def descend(
        self, case: Case, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, steps: int, step: float
    ) -> tuple[tuple | None, np.ndarray]: ...

    def restarts(self, case: Case, rng: np.random.Generator, deadline: float) -> tuple | None: ...

    def confirmed(self, case: Case, x: np.ndarray) -> tuple | None: ...

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
    ) -> tuple | str: ...


def bytes_per_branch(network: Network, rows: int) -> int:
    """Peak working memory of bounding one branch: back-substituting the unstable neurons of
    a layer (at most two rows each) through the widest layer and the input, a few arrays at
    once; the output rows' coefficients and intercepts; and their relaxation's optimization:
    for the slopes and for the sign assumptions' multipliers each, the variables, the best
    ones, Adam's two moments, the gradient and a few more of their size."""
    widths = network.hidden_sizes
    widest = max([network.input_dim, *widths])
    inner = 2 * max(widths, default=0) * widest
    outer = rows * (widest + sum(widths))
    slopes = 16 * rows * sum(widths)
    return 8 * (4 * inner + 2 * outer + slopes + 4 * sum(widths))


def root_slope_bytes(network: Network) -> int:
    """Peak memory of optimizing the slopes of one layer's unstable neurons' bounds over the
    case's box (no sign assumptions there): eight arrays of a slope per row and neuron, for
    two rows per neuron of the widest layer."""
    widths = network.hidden_sizes
    return 8 * 8 * 2 * max(widths, default=0) * sum(widths)


class ReluSplit:
    """The open branches of one case, bounded, searched and split in batches; ``run``
    goes on where the last one stopped."""

    def __init__(
        self,
        network: Network,
        case: Case,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        search: Searcher,
        stats: dict[str, int],
        memory: int,
        progress: Callable[[dict[str, int]], None] | None = None,
        progress_seconds: float = 5.0,
        cores: int = 1,
    ) -> None:
        """``rows``: the unsafe polytopes' rows C (R, m), bounds d (R,), which polytope
        each row belongs to (P, R) and which rows are strict (R,); ``memory``: bytes the
        search may use at once; ``cores``: with two or more, the MILP runs on a thread of
        its own beside the bounds."""
        self.network, self.case, self.search, self.stats = network, case, search, stats
        self.C, self.d, self.member, self.strict = rows
        widths = network.hidden_sizes
        self.cuts = np.cumsum([0, *widths])
        neurons = int(self.cuts[-1])
        self.limit = memory * 3 // 4 // bytes_per_branch(network, len(self.d))
        if self.limit < 1:
            raise MemoryError(
                f"bounding one branch takes {bytes_per_branch(network, len(self.d)) >> 20} MiB, "
                f"more than the {memory * 3 // 4 >> 20} MiB left to the search's batches"
            )
        self.open_memory = memory // 4
        self.open_limit = max(self.open_memory // (neurons + len(case.unsafe)), 1)
        self.batch = 1
        # the open branches, depth first
        self.stack: list[Branches] = [self._root()]
        self.undecided = ""
        if any(not len(d) for _, d in case.unsafe):
            self.undecided = WHOLE_OUTPUT_SPACE
            self.stack = []
        self.progress, self.progress_seconds = progress, progress_seconds
        self.last_report = time.monotonic()
        self.rng = np.random.default_rng(1)
        self.batches = 0
        self.root: list[tuple[np.ndarray, np.ndarray]] | None = None
        self.slope_steps = (
            SLOPE_STEPS if network.relu_only and root_slope_bytes(network) <= memory // 2 else 0
        )
        self.cores = cores
        self.finisher: ThreadPoolExecutor | _Inline | None = None
        self.pending: _Pending | None = None
        self.candidates: list[_Candidate] = []
        self.refine_at: float | None = None  # when the MILP tightens the root's bounds

    def _root(self) -> Branches:
        """The branch of the whole box: no sign assumed, every polytope open."""
        neurons = int(self.cuts[-1])
        return Branches(
            np.zeros((1, neurons), dtype=np.int8),
            np.ones((1, len(self.case.unsafe)), dtype=bool),
            np.full(1, MILP_UNSTABLE),
            None,
        )

    @property
    def done(self) -> bool:
        return not self.stack

    @property
    def waiting(self) -> int:
        return sum(len(part.signs) for part in self.stack)

    def run(self, deadline: float) -> tuple | None:
        """Work until every branch is closed or ``deadline``; a counterexample if found.
        With two cores the MILP decides one branch at a time on a thread of its own (HiGHS
        releases the GIL) while the bounds go on: on mnistfc 256x2 ``prop_3_0.03`` the
        bounds alone close the tree in 16 s, where waiting for each MILP took 76 s. A MILP
        still running when this returns is stopped, and its thread ends with it."""
        if self.root is None and self.stack:
            steps = ROOT_SLOPE_STEPS if self.slope_steps else 0
            box = self.case.lower[None], self.case.upper[None]
            self.root = pre_activation_bounds(self.network, *box, slope_steps=steps, until=deadline)
            if self.network.relu_only and len(self.network.hidden_sizes) > 1:
                now = time.monotonic()
                self.refine_at = now + REFINE_AFTER * (deadline - now)
        with _finisher(self.cores) as self.finisher:
            try:
                if self.refine_at is not None:
                    found = self._run(min(deadline, self.refine_at))
                    if found is not None or not self.stack or time.monotonic() >= deadline:
                        return found
                    self._refine(deadline)
                return self._run(deadline)
            finally:
                self._stop_pending()
                self.finisher = None

    def _stop_pending(self) -> None:
        """Stop the MILP on its thread, if one runs, and wait for the thread to end."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.stop()
            pending.future.exception()  # waits for its thread to end
            self.stats["milp"] += pending.counts["milp"]

    def _refine(self, deadline: float) -> None:
        """Tighten the root's bounds by the MILP on every core, the MILP of a branch (if
        one runs) stopped first: its branch was split, so nothing is lost with it."""
        self.refine_at = None
        self._stop_pending()
        assert self.root is not None
        now = time.monotonic()
        until = now + REFINE_SHARE * (deadline - now)
        box = self.case.lower, self.case.upper
        self.root, count = milp_bounds(
            self.network, *box, self.root, BOUND_SECONDS, until, self.cores
        )
        self.stats["refined"] += count
        self.stack, self.candidates = [self._root()], []

    def _run(self, deadline: float) -> tuple | None:
        while self.stack and time.monotonic() < deadline:
            started = time.monotonic()
            found = self._collect()
            if found is None and self.stack:
                self._offer(deadline)
                found = self._collect()  # on one core the MILP has run
            if found is not None or not self.stack:
                return found
            found = self._step(_pop(self.stack, self.batch), deadline)
            if found is not None:
                return found
            took = time.monotonic() - started
            if took < BATCH_SECONDS / 2:
                self.batch = min(2 * self.batch, self.limit)
            elif took > BATCH_SECONDS:
                self.batch = max(self.batch // 2, 1)
            if self.waiting > self.open_limit:
                self.undecided = (
                    f"{self.waiting} open branches outgrew the memory limit (at most "
                    f"{self.open_limit} fit)"
                )
                self.stack = []
                return None
            self.batches += 1
            if self.batches % ATTACK_EVERY == 0:
                found = self.search.restarts(self.case, self.rng, deadline)
                if found is not None:
                    return found
            if self.progress and time.monotonic() - self.last_report > self.progress_seconds:
                self.last_report = time.monotonic()
                self.progress({**self.stats, "open": self.waiting})
        return None

    def _step(self, branches: Branches, deadline: float) -> tuple | None:
        """Bound a batch of branches, search the open ones, decide or split them."""
        signs, open_, limit = branches.signs, branches.open, branches.limit
        n = len(signs)
        self.stats["branches"] += n
        case = self.case
        lo = np.broadcast_to(case.lower, (n, case.lower.size))
        hi = np.broadcast_to(case.upper, (n, case.upper.size))
        layers = [signs[:, a:b] for a, b in zip(self.cuts[:-1], self.cuts[1:], strict=True)]
        start = None if branches.start is None else self._unpacked(branches.start)
        bound = split_bounds(
            self.network, lo, hi, layers, -self.C, self.root, self.slope_steps, start
        )
        closed = shut(bound.upper, self.d, self.strict)  # row r: no point of the branch
        open_ = open_ & ~(closed[:, None, :] & self.member[None]).any(axis=2)
        open_ &= ~bound.empty[:, None]
        live = np.flatnonzero(open_.any(axis=1))
        if not live.size:
            return None
        # the rows still open, and of them each branch's weakest: search where it points
        rows_open = (open_[live][:, :, None] & self.member[None]).any(axis=1) & ~closed[live]
        slack = np.where(rows_open, bound.upper[live] + self.d, -np.inf)
        weakest = slack.argmax(axis=1)
        coefficients = bound.coefficients[live, weakest]
        centre, radius = (case.lower + case.upper) / 2, (case.upper - case.lower) / 2
        x = centre + radius * np.sign(coefficients)
        found, _ = self.search.descend(case, x, lo[live], hi[live], STEPS, 0.1)
        if found is not None:
            return found
        unstable = np.zeros(len(live), dtype=int)  # ReLUs: what splits and the MILP take
        for k, (low, high) in enumerate(bound.pre):
            relus = self.network.relus(k)
            unstable += ((low[live] < 0) & (high[live] > 0) & relus).sum(axis=1)
        exact = unstable <= limit[live]
        split = ~exact
        for i in np.flatnonzero(exact):
            b = live[i]
            # the polytopes whose bounds are weakest first: the likeliest to hold a point
            polytope_slack = np.where(self.member, slack[i], -np.inf).max(axis=1)
            weakest_first = np.argsort(-polytope_slack, kind="stable")
            bounds = [(low[b : b + 1].copy(), high[b : b + 1].copy()) for low, high in bound.pre]
            if unstable[i]:
                # the shallowest such branch goes to the MILP once it is free; split either
                # way, so the bounds go on beneath it meanwhile
                depth = int((signs[b] != 0).sum())
                self.candidates.append(
                    _Candidate(
                        depth, signs[b].copy(), int(unstable[i]), bounds, open_[b].copy(),
                        weakest_first,
                    )
                )  # fmt: skip
                split[i] = True
                continue
            outcome = self._milp(bounds, open_[b], weakest_first, deadline)
            if isinstance(outcome, tuple):
                return outcome
            if outcome == "timeout":
                self.stack.append(Branches(signs, open_, limit, branches.start).take([b]))
            elif outcome == "unknown" and not self.network.relu_only:
                self.undecided = (
                    "the bounds of the network's sigmoid or tanh neurons leave a branch "
                    "open with every ReLU fixed, and the MILP does not model them"
                )
            elif outcome == "unknown":
                self.undecided = (
                    "the MILP's point of a branch with every neuron stable is not a "
                    "counterexample for the reference evaluator"
                )
        if split.any():
            index = live[split]
            packed = self._packed(bound.relaxation, index)
            parents = Branches(signs[index], open_[index], limit[index], packed)
            self._split(parents, bound, index, rows_open[split])
        return None

    def _split(
        self, parents: Branches, bound: SplitBounds, index: np.ndarray, rows_open: np.ndarray
    ) -> None:
        """Split each branch on the unstable neuron with the largest intercept on its open
        rows (ties: the widest bounds), assumed active in one child and inactive in the
        other; both start from their parent's relaxation while the open branches' memory
        holds it."""
        scores, widths = [], []
        for k, ((low, high), added) in enumerate(zip(bound.pre, bound.intercepts, strict=True)):
            low, high = low[index], high[index]
            unstable = (low < 0) & (high > 0) & self.network.relus(k)
            score = (added[index] * rows_open[:, :, None]).sum(axis=1)
            scores.append(np.where(unstable, score, -np.inf))
            widths.append(np.where(unstable, high - low, 0.0))
        score = np.hstack(scores)
        width = np.hstack(widths)
        neuron = np.argmax(score + 1e-9 * width / (1.0 + width.max(axis=1, keepdims=True)), axis=1)
        signs = parents.signs
        rows = np.arange(len(signs))
        active, inactive = signs.copy(), signs.copy()
        active[rows, neuron] = 1
        inactive[rows, neuron] = -1
        self.stats["splits"] += len(signs)
        children = np.stack([inactive, active], axis=1).reshape(-1, signs.shape[1])
        start = None if parents.start is None else np.repeat(parents.start, 2, axis=0)
        twice = np.repeat(parents.open, 2, axis=0), np.repeat(parents.limit, 2)
        self.stack.append(Branches(children, *twice, start))
        self._forget_starts()

    def _packed(self, relaxation: Relaxation | None, index: np.ndarray) -> np.ndarray | None:
        """The relaxation of the batch's branches ``index`` as one array (n, 2, k, neurons)
        of float32: what the open branches keep (any slope in [0, 1] and multiplier >= 0 is
        sound, rounded or not)."""
        if relaxation is None:
            return None
        packed = np.zeros((len(index), 2, len(self.d), int(self.cuts[-1])), dtype=np.float32)
        for plane, arrays in enumerate(relaxation):
            if arrays is None:  # no assumptions: the multipliers stay 0
                continue
            for a, b, array in zip(self.cuts[:-1], self.cuts[1:], arrays, strict=True):
                packed[:, plane, :, a:b] = array[index]
        return packed

    def _unpacked(self, start: np.ndarray) -> Relaxation:
        """``_packed``'s inverse, per hidden layer."""
        bounds = self.cuts[1:-1]
        return Relaxation(
            np.split(start[:, 0], bounds, axis=2), np.split(start[:, 1], bounds, axis=2)
        )

    def _forget_starts(self) -> None:
        """Keep the open branches' relaxations within their share of memory beside their
        signs: the longest-waiting (the bottom of the stack) start from CROWN's again."""
        held = sum(part.nbytes for part in self.stack)
        for i, part in enumerate(self.stack):
            if held <= self.open_memory:
                break
            if part.start is not None:
                held -= part.start.nbytes
                self.stack[i] = part._replace(start=None)

    def _offer(self, deadline: float) -> None:
        """Give the MILP, when it is free, the shallowest branch that went to it (the most
        of the tree one MILP can close) among the ``CANDIDATES`` shallowest kept, while
        branches below it are still open."""
        self.candidates.sort(key=lambda c: c.depth)
        del self.candidates[CANDIDATES:]
        if self.pending is not None or self.finisher is None:
            return
        while self.candidates:
            candidate = self.candidates.pop(0)
            if any(_below(part.signs, candidate.signs).any() for part in self.stack):
                break
        else:
            return
        stop, open_, counts = Stop(), candidate.open.copy(), {"milp": 0}

        def decide() -> tuple[str | tuple, np.ndarray]:
            order, bounds = candidate.order, candidate.bounds
            share = MILP_SHARE if candidate.depth else ROOT_MILP_SHARE
            return self._milp(bounds, open_, order, deadline, stop, counts, share), open_

        future = self.finisher.submit(decide)
        self.pending = _Pending(candidate.signs, candidate.unstable, future, stop, counts)

    def _collect(self) -> tuple | None:
        """A finished MILP's answer, given to every open branch below the one it decided:
        its counterexample; or the polytopes it showed empty closed in them, and after a
        solver that stopped at its time limit, the MILP only for the ones markedly smaller
        than that branch."""
        pending = self.pending
        if pending is None or not pending.future.done():
            return None
        self.pending = None
        outcome, still_open = pending.future.result()
        self.stats["milp"] += pending.counts["milp"]
        if isinstance(outcome, tuple):
            return outcome
        shrunk = int(MILP_SHRINK * pending.unstable)
        if outcome == "unknown":  # the ones below go to the MILP only once markedly smaller
            self.candidates = [
                c
                for c in self.candidates
                if c.unstable <= shrunk or not _below(c.signs[None], pending.signs)[0]
            ]
        parts = []
        for part in self.stack:
            below = _below(part.signs, pending.signs)
            if below.any():
                open_, limit = part.open.copy(), part.limit.copy()
                open_[below] &= still_open
                if outcome == "unknown":
                    limit[below] = np.minimum(limit[below], shrunk)
                part = Branches(part.signs, open_, limit, part.start).take(open_.any(axis=1))
            if len(part.signs):
                parts.append(part)
        self.stack = parts
        return None

    def _milp(
        self,
        bounds: list[tuple[np.ndarray, np.ndarray]],
        open_: np.ndarray,
        order: np.ndarray,
        deadline: float,
        stop: Stop | None = None,
        counts: dict[str, int] | None = None,
        share: float = MILP_SHARE,
    ) -> str | tuple:
        """Decide the open polytopes of a branch exactly on its bounds (each (1, width)), in
        ``order``, each MILP with ``share`` of the time left: a confirmed counterexample,
        "unsat", "unknown" (the solver stopped at its limit, or its point is not confirmed;
        ``open_`` then keeps only the polytopes not shown empty) or "timeout" (the deadline
        came first, or ``stop``)."""
        counts = self.stats if counts is None else counts
        if sum(int(((low < 0) & (high > 0)).sum()) for low, high in bounds) > TIGHTEN_UNSTABLE:
            seconds = min(deadline - time.monotonic(), MILP_SECONDS)
            box = self.case.lower, self.case.upper
            bounds = lp_bounds(self.network, *box, bounds, seconds, stop)
            if bounds is None:
                return "timeout" if time.monotonic() >= deadline else "unknown"
        polytopes = order[open_[order]]
        # single rows (as "some other class wins"): one MILP picks the row
        single = all(len(self.case.unsafe[p][1]) == 1 for p in polytopes)
        for p in polytopes[:1] if single else polytopes:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            seconds = min(left, max(MILP_SECONDS, share * left))
            counts["milp"] += 1
            if single:
                c = np.vstack([self.case.unsafe[q][0] for q in polytopes])
                d = np.concatenate([self.case.unsafe[q][1] for q in polytopes])
            else:
                c, d = self.case.unsafe[p]
            lo, hi = self.case.lower, self.case.upper
            outcome = self.search.milp(self.case, lo, hi, c, d, seconds, bounds, single, stop)
            if isinstance(outcome, tuple):
                return outcome
            if outcome != "infeasible":
                return "timeout" if time.monotonic() >= deadline else "unknown"
            open_[polytopes if single else p] = False
        return "unsat"


def _finisher(cores: int) -> ThreadPoolExecutor | _Inline:
    """Where the MILP runs: a thread of its own with two cores or more, else the search's
    own thread, which then waits for it (on one core the two threads would halve the
    bounds' time: mnistfc 256x4 ``prop_5_0.03`` took 107 s waiting, and timed out at 300 s
    sharing)."""
    from concurrent.futures import ThreadPoolExecutor  # not for input bisection's start-up

    return ThreadPoolExecutor(1, "vigil-milp") if cores > 1 else _Inline()


class _Inline:
    """An executor that runs each call at once on the caller's thread."""

    def submit(self, call: Callable[[], tuple]) -> Future:
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(call())
        return future

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _below(signs: np.ndarray, branch: np.ndarray) -> np.ndarray:
    """Which of the branches ``signs`` (n, neurons) lie below ``branch`` (neurons,): they
    make every sign assumption it makes."""
    assumed = branch != 0
    return (signs[:, assumed] == branch[assumed]).all(axis=1)


class _Candidate(NamedTuple):
    """A branch for the MILP: its depth (sign assumptions), signs, unstable neurons,
    bounds (each (1, width)), open polytopes, and the order to decide them in."""

    depth: int
    signs: np.ndarray
    unstable: int
    bounds: list[tuple[np.ndarray, np.ndarray]]
    open: np.ndarray
    order: np.ndarray


class _Pending(NamedTuple):
    """The branch on the MILP's thread: its signs, its unstable neurons, the MILP's
    answer to come, what stops it, and the MILPs it has begun."""

    signs: np.ndarray
    unstable: int
    future: Future
    stop: Stop
    counts: dict[str, int]


class Branches(NamedTuple):
    """Open branches: their signs (n, neurons), open polytopes (n, P), the most unstable
    neurons each goes to the MILP with (n,), and the relaxation each starts from
    (``ReluSplit._packed``; None: CROWN's)."""

    signs: np.ndarray
    open: np.ndarray
    limit: np.ndarray
    start: np.ndarray | None

    def take(self, index: np.ndarray | list[int] | slice) -> Branches:
        return Branches(*(None if a is None else a[index] for a in self))

    @property
    def nbytes(self) -> int:
        return sum(0 if a is None else a.nbytes for a in self)


def _pop(stack: list[Branches], n: int) -> Branches:
    """Up to ``n`` branches from the top of the stack (depth first keeps it small), all
    with a relaxation to start from or all without."""
    taken: list[Branches] = []
    count = 0
    while stack and count < n:
        if taken and (stack[-1].start is None) != (taken[0].start is None):
            break
        part = stack.pop()
        room = n - count
        if len(part.signs) > room:
            stack.append(part.take(slice(None, -room)))
            part = part.take(slice(-room, None))
        taken.append(part)
        count += len(part.signs)
    if len(taken) == 1:
        return taken[0]
    return Branches(
        *(None if a[0] is None else np.concatenate(a) for a in zip(*taken, strict=True))
    )
