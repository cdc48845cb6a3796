"""MIPVerify-style HiGHS model of a ReLU chain, grown one layer at a time.

One model serves three purposes in turn: it tightens the next layer's bounds (by its LP
relaxation, where the big-M ReLU encoding with continuous indicators is the triangle
relaxation, or by the MILP itself), the same model with integral indicators is the exact
MILP, and the adversarial rows turn it into the robustness query (mini-batch
verification) or the output rows into a VNN-LIB unsafe region (the complete search's
finisher). Stable ReLUs get no indicator, inactive ones no column at all.

A layer may carry ``noise``: its computed pre-activations lie within ``noise`` of
``W a + b`` (a floating-point evaluation's rounding). Each row that holds a pre-activation
is then relaxed by the noise in the direction that admits more points, so the model
contains every computed behaviour; a point it finds is a candidate for the reference
evaluator to confirm, not a proof.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import highspy
import numpy as np

from vigil.rules.highs import quiet_highs

INF = highspy.kHighsInf
BOUND_SLACK = 1e-6
"""Relative and absolute widening of LP-derived bounds, so solver tolerances never cut a point."""
BOUNDS = ("lp", "milp")
DEFAULT_TIME_LIMIT = 600.0
"""Seconds one HiGHS run may take before the verifier gives up with an error (a safety net)."""
DEFAULT_BOUND_TIME = 1.0
"""Seconds one neuron's MILP bound may search; where it stops, its dual bound is used."""


@dataclass(frozen=True)
class Solver:
    """How unstable neurons are tightened, and how long HiGHS may run.

    ``bounds="lp"`` tightens by the LP relaxation; ``"milp"`` by the MILP over everything
    before the neuron (MIPVerify's strongest setting, the paper's Algorithms 2 and 3), each
    bound capped at ``bound_time`` seconds and read from HiGHS's dual bound, which is sound
    wherever the search stops. ``time_limit`` caps every other run; hitting it is an error.
    """

    time_limit: float = DEFAULT_TIME_LIMIT
    bounds: str = "lp"
    bound_time: float = DEFAULT_BOUND_TIME

    def __post_init__(self) -> None:
        if self.bounds not in BOUNDS:
            raise ValueError(f"bounds must be one of {BOUNDS}, got {self.bounds!r}")
        if not self.bound_time > 0.0:
            raise ValueError(f"bound_time must be positive, got {self.bound_time}")


DEFAULT_SOLVER = Solver()


class VerificationError(RuntimeError):
    """The solver gave no verdict (time limit, numerical failure): never read as robust."""


class Stop:
    """Ends, from another thread, the HiGHS runs of the models that share it: the runs
    under way at once, and any later one before it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: list[highspy.Highs] = []
        self.stopped = False

    def __call__(self) -> None:
        with self._lock:
            self.stopped = True
            for h in self._running:
                h.cancelSolve()

    def run(self, h: highspy.Highs) -> None:
        """``h.run()`` unless stopped; VerificationError when stopped before or during it."""
        with self._lock:
            if self.stopped:
                raise VerificationError("the search stopped the solver")
            h.HandleUserInterrupt = True
            self._running.append(h)
        try:
            h.run()
        finally:
            with self._lock:
                self._running.remove(h)
        if h.getModelStatus() == highspy.HighsModelStatus.kInterrupt:
            raise VerificationError("the search stopped the solver")


@dataclass(frozen=True)
class Layer:
    """Pre-activation bounds [lower, upper] of one hidden layer (or the union's box)."""

    lower: np.ndarray
    upper: np.ndarray

    @property
    def post(self) -> Layer:
        """Bounds after the ReLU."""
        return Layer(np.maximum(self.lower, 0.0), np.maximum(self.upper, 0.0))

    @property
    def unstable(self) -> np.ndarray:
        return (self.lower < 0.0) & (self.upper > 0.0)


def interval_layer(w: np.ndarray, b: np.ndarray, box: Layer) -> Layer:
    """Interval bounds of W a + b for a in the box."""
    centre = (box.lower + box.upper) / 2.0
    radius = (box.upper - box.lower) / 2.0
    mid = w @ centre + b
    spread = np.abs(w) @ radius
    return Layer(mid - spread, mid + spread)


def _widen(value: float, down: bool) -> float:
    slack = BOUND_SLACK * (1.0 + abs(value))
    return value - slack if down else value + slack


class ReluModel:
    """A HiGHS model whose last block of columns is the current layer's activations."""

    def __init__(
        self, solver: Solver, budget: float | None = None, stop: Stop | None = None
    ) -> None:
        """``budget`` (seconds) caps the model's whole life; ``stop`` ends it from another
        thread."""
        self.h = quiet_highs()
        self.solver = solver
        self.stop = stop
        self.deadline = None if budget is None else time.perf_counter() + budget
        self.ncols = 0
        self.integers: list[int] = []
        self.input_cols = np.zeros(0, dtype=np.int32)
        self.choice_cols = np.zeros(0, dtype=np.int32)
        self.current = np.zeros(0, dtype=np.int32)
        self.alive = np.zeros(0, dtype=bool)
        self.dead_value = np.zeros(0)
        self.box = Layer(np.zeros(0), np.zeros(0))
        self.margin = (np.zeros((0, 0)), np.zeros(0))  # y_j - y_label over the last block

    # -- construction ------------------------------------------------------------------------

    def _cols(self, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
        n = len(lower)
        self.h.addVars(n, np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64))
        idx = np.arange(self.ncols, self.ncols + n, dtype=np.int32)
        self.ncols += n
        return idx

    def _rows(self, lower: list[float], upper: list[float], rows: list[tuple]) -> None:
        """Rows given as (column indices, values) pairs."""
        if not rows:
            return
        starts = np.cumsum([0] + [len(c) for c, _ in rows[:-1]]).astype(np.int32)
        index = np.concatenate([np.asarray(c, dtype=np.int32) for c, _ in rows])
        value = np.concatenate([np.asarray(v, dtype=np.float64) for _, v in rows])
        self.h.addRows(
            len(rows),
            np.asarray(lower, dtype=np.float64),
            np.asarray(upper, dtype=np.float64),
            len(index),
            starts,
            index,
            value,
        )

    def _dense_rows(
        self,
        lower: np.ndarray,
        upper: np.ndarray,
        cols: np.ndarray,
        coef: np.ndarray,
        extra_cols: list[np.ndarray],
        extra_coef: list[np.ndarray | float],
    ) -> None:
        """One row per entry of ``lower``: coefficients ``coef`` (n, len(cols)) on the
        columns ``cols`` (none when ``coef`` has no columns), then per extra column of the
        row its index (n,) and coefficient (n,) or a coefficient shared by all rows."""
        n = len(lower)
        if not n:
            return
        width = coef.shape[1] + len(extra_cols)
        index = np.empty((n, width), dtype=np.int32)
        value = np.empty((n, width))
        index[:, : coef.shape[1]] = cols
        value[:, : coef.shape[1]] = coef
        for t, (c, v) in enumerate(zip(extra_cols, extra_coef, strict=True), coef.shape[1]):
            index[:, t] = c
            value[:, t] = v
        starts = np.arange(0, n * width, width, dtype=np.int32)
        self.h.addRows(
            n,
            np.asarray(lower, dtype=np.float64),
            np.asarray(upper, dtype=np.float64),
            n * width,
            starts,
            index.ravel(),
            value.ravel(),
        )

    def start_box(self, box: Layer) -> None:
        """The input ball (already clipped) as column bounds."""
        self.input_cols = self._cols(box.lower, box.upper)
        self.current = self.input_cols
        self.alive = np.ones(len(box.lower), dtype=bool)
        self.dead_value = np.zeros(len(box.lower))
        self.box = box

    def start_union(self, boxes: list[Layer], hull: bool = True) -> None:
        """Eq. 1: the layer's output v lies in one of the boxes, ball j chosen by binary q_j.

        ``hull=False`` is the paper's big-M form (M per coordinate: the union's own bounds).
        ``hull=True`` writes the same disjunction in Balas' form, v = sum_j v_j with
        lo_j q_j <= v_j <= hi_j q_j: the same integer points, but its LP relaxation is the
        convex hull of the union instead of its bounding box, so the bounds of later layers
        and the MILP's relaxation stay tight.
        """
        lo = np.stack([b.lower for b in boxes])
        hi = np.stack([b.upper for b in boxes])
        hull_lo, hull_hi = lo.min(axis=0), hi.max(axis=0)
        self.alive = hull_hi > hull_lo
        self.dead_value = np.where(self.alive, 0.0, hull_lo)
        self.box = Layer(hull_lo[self.alive], hull_hi[self.alive])
        self.current = self._cols(self.box.lower, self.box.upper)
        self.choice_cols = self._cols(np.zeros(len(boxes)), np.ones(len(boxes)))
        self.integers += self.choice_cols.tolist()
        self._rows([1.0], [1.0], [(self.choice_cols, np.ones(len(boxes)))])
        a_lo, a_hi = hull_lo[self.alive], hull_hi[self.alive]
        b_lo, b_hi = lo[:, self.alive], hi[:, self.alive]
        lower, upper, rows = [], [], []
        if hull:
            width = len(a_lo)
            parts = [
                self._cols(np.minimum(b_lo[j], 0.0), np.maximum(b_hi[j], 0.0))
                for j in range(len(boxes))
            ]
            for i in range(width):  # v_i = sum_j v_ji
                rows.append(
                    (
                        np.append([p[i] for p in parts], self.current[i]),
                        np.append(np.ones(len(parts)), -1.0),
                    )
                )
                lower.append(0.0)
                upper.append(0.0)
            for j, q in enumerate(self.choice_cols):
                for i in range(width):  # lo_j q_j <= v_ji <= hi_j q_j
                    rows.append(([parts[j][i], q], [1.0, -b_lo[j][i]]))
                    lower.append(0.0)
                    upper.append(INF)
                    rows.append(([parts[j][i], q], [1.0, -b_hi[j][i]]))
                    lower.append(-INF)
                    upper.append(0.0)
            self._rows(lower, upper, rows)
            return
        for j, q in enumerate(self.choice_cols):
            for i in np.flatnonzero(b_lo[j] > a_lo):  # v_i >= lo_j + (L - lo_j)(1 - q_j)
                rows.append(([self.current[i], q], [1.0, -(b_lo[j][i] - a_lo[i])]))
                lower.append(a_lo[i])
                upper.append(INF)
            for i in np.flatnonzero(b_hi[j] < a_hi):  # v_i <= hi_j + (U - hi_j)(1 - q_j)
                rows.append(([self.current[i], q], [1.0, a_hi[i] - b_hi[j][i]]))
                lower.append(-INF)
                upper.append(a_hi[i])
        self._rows(lower, upper, rows)

    def affine(self, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """W a + b restricted to the current columns: (weights on those columns, offset)."""
        dead = ~self.alive
        return w[:, self.alive], b + w[:, dead] @ self.dead_value[dead]

    def add_relu(
        self, w: np.ndarray, b: np.ndarray, pre: Layer, noise: np.ndarray | None = None
    ) -> None:
        """Layer a = ReLU(W a_prev + b + e) with pre-activation bounds ``pre``, |e| <= noise
        (0 without)."""
        wa, off = self.affine(w, b)
        e = np.zeros(len(b)) if noise is None else noise
        prev = self.current
        active = pre.lower >= 0.0
        unstable = pre.unstable
        alive = active | unstable
        cols = self._cols(np.where(active, pre.lower, 0.0)[alive], pre.upper[alive])
        col_of = np.full(len(b), -1)
        col_of[alive] = cols
        j = np.flatnonzero(active)  # a = z
        self._dense_rows(off[j] - e[j], off[j] + e[j], prev, -wa[j], [col_of[j]], [1.0])
        j = np.flatnonzero(unstable)
        if len(j):
            s = self._cols(np.zeros(len(j)), np.ones(len(j)))
            self.integers += s.tolist()
            a, lj, uj, n = col_of[j], pre.lower[j], pre.upper[j], len(j)
            low, high = off[j] - e[j], off[j] + e[j]
            self._dense_rows(low, np.full(n, INF), prev, -wa[j], [a], [1.0])  # a >= z
            # a <= z - l (1 - s)
            self._dense_rows(np.full(n, -INF), high - lj, prev, -wa[j], [a, s], [1.0, -lj])
            none = np.zeros(0, dtype=np.int32), np.zeros((n, 0))
            self._dense_rows(np.full(n, -INF), np.zeros(n), *none, [a, s], [1.0, -uj])  # a <= u s
        self.current = cols
        self.alive = alive
        self.dead_value = np.zeros(len(b))
        post = pre.post
        self.box = Layer(post.lower[alive], post.upper[alive])

    # -- solving -----------------------------------------------------------------------------

    def _set_cost(self, cols: np.ndarray, cost: np.ndarray) -> None:
        self.h.changeColsCost(len(cols), cols.astype(np.int32), cost.astype(np.float64))

    def _set_integral(self, integral: bool) -> None:
        if not self.integers:
            return
        idx = np.asarray(self.integers, dtype=np.int32)
        kind = highspy.HighsVarType.kInteger if integral else highspy.HighsVarType.kContinuous
        self.h.changeColsIntegrality(len(idx), idx, np.full(len(idx), kind.value, dtype=np.uint8))

    def _run(self, limit: float | None = None) -> None:
        limit = self.solver.time_limit if limit is None else limit
        if self.deadline is not None:
            left = self.deadline - time.perf_counter()
            if left <= 0.0:
                raise VerificationError("the batch's time budget is spent")
            limit = min(limit, left)
        self.h.setOptionValue("time_limit", limit)
        if self.stop is None:
            self.h.run()
        else:
            self.stop.run(self.h)

    def _minimise(self, cols: np.ndarray, cost: np.ndarray) -> float | None:
        """LP minimum of cost . x[cols]; None when the LP gives no optimum."""
        self._set_cost(cols, cost)
        self._run()
        status = self.h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            return None
        return float(self.h.getInfo().objective_function_value)

    def _floor(self, cols: np.ndarray, cost: np.ndarray) -> float | None:
        """A sound lower bound of min cost . x[cols] from a time-capped MILP; None if none."""
        self._set_cost(cols, cost)
        self._run(min(self.solver.time_limit, self.solver.bound_time))
        if self.h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return None
        bound = float(self.h.getInfo().mip_dual_bound)
        return bound if np.isfinite(bound) else None

    def tighten(
        self,
        w: np.ndarray,
        b: np.ndarray,
        pre: Layer,
        noise: np.ndarray | None = None,
        which: np.ndarray | list[int] | None = None,
    ) -> Layer:
        """Tighten the unstable neurons of the next layer (W a + b, within ``noise``) over
        the current model; with ``which``, only those of them."""
        wa, off = self.affine(w, b)
        e = np.zeros(len(b)) if noise is None else noise
        lower, upper = pre.lower.copy(), pre.upper.copy()
        exact = self.solver.bounds == "milp" and bool(self.integers)
        minimise = self._floor if exact else self._minimise
        if exact:
            self._set_integral(True)
        unstable = np.flatnonzero(pre.unstable)
        for j in unstable if which is None else np.intersect1d(unstable, which):
            lo = minimise(self.current, wa[j])
            if lo is not None:
                lower[j] = max(lower[j], _widen(lo + off[j] - e[j], down=True))
            if lower[j] >= 0.0:
                continue
            hi = minimise(self.current, -wa[j])
            if hi is not None:
                upper[j] = min(upper[j], _widen(-hi + off[j] + e[j], down=False))
        if exact:
            self._set_integral(False)
        self._set_cost(self.current, np.zeros(len(self.current)))
        return Layer(lower, upper)

    def margin_bounds(self, w: np.ndarray, b: np.ndarray, label: int) -> dict[int, float]:
        """Lower LP bounds of y_j - y_label for the classes j whose upper LP bound is >= 0."""
        wa, off = self.affine(w, b)
        diff_w = wa - wa[label]
        diff_b = off - off[label]
        interval = interval_layer(diff_w, diff_b, self.box)
        open_classes: dict[int, float] = {}
        for j in range(len(b)):
            if j == label or interval.upper[j] < 0.0:
                continue
            hi = self._minimise(self.current, -diff_w[j])
            if hi is not None and -hi + diff_b[j] + BOUND_SLACK * (1 + abs(hi)) < 0.0:
                continue
            lo = self._minimise(self.current, diff_w[j])
            floor = interval.lower[j] if lo is None else max(interval.lower[j], lo + diff_b[j])
            open_classes[j] = _widen(floor, down=True)
        self._set_cost(self.current, np.zeros(len(self.current)))
        self.margin = (diff_w, diff_b)
        return open_classes

    def add_attack(self, open_classes: dict[int, float]) -> None:
        """Some open class j scores at least as high as the label: one binary t_j per class."""
        diff_w, diff_b = self.margin
        classes = sorted(open_classes)
        if len(classes) == 1:
            j = classes[0]
            self._rows([-diff_b[j]], [INF], [(self.current, diff_w[j])])
            return
        t_cols = self._cols(np.zeros(len(classes)), np.ones(len(classes)))
        self.integers += t_cols.tolist()
        rows = [(t_cols, np.ones(len(classes)))]
        lower, upper = [1.0], [1.0]
        for j, t in zip(classes, t_cols, strict=True):
            floor = open_classes[j]  # margin_j >= floor (1 - t_j)
            rows.append((np.append(self.current, t), np.append(diff_w[j], floor)))
            lower.append(floor - diff_b[j])
            upper.append(INF)
        self._rows(lower, upper, rows)

    def add_output_disjunction(
        self,
        w: np.ndarray,
        b: np.ndarray,
        c: np.ndarray,
        d: np.ndarray,
        noise: np.ndarray | None = None,
    ) -> np.ndarray:
        """The outputs y = W a + b of the current layer (within ``noise``) constrained to
        satisfy at least one row of ``c y <= d``: a binary t_j per row that the LP
        relaxation leaves possible, row j relaxed by its LP maximum where t_j = 0. Returns
        the rows kept (none: no output of the model satisfies any row)."""
        coef, rhs = self._output_rows(w, b, c, d, noise)
        slack = []
        for j in range(len(d)):
            least = self._minimise(self.current, -coef[j])  # -max coef_j . a
            slack.append(np.inf if least is None else _widen(-least - rhs[j], down=False))
        self._set_cost(self.current, np.zeros(len(self.current)))
        kept = np.flatnonzero(np.asarray(slack) >= 0.0)
        if not len(kept):
            return kept
        t_cols = self._cols(np.zeros(len(kept)), np.ones(len(kept)))
        self.integers += t_cols.tolist()
        rows = [(t_cols, np.ones(len(kept)))]
        lower, upper = [1.0], [INF]
        for j, t in zip(kept, t_cols, strict=True):
            big = slack[j] if np.isfinite(slack[j]) else 1e6
            rows.append((np.append(self.current, t), np.append(coef[j], big)))
            lower.append(-INF)  # coef_j . a <= rhs_j + big (1 - t_j)
            upper.append(rhs[j] + big)
        self._rows(lower, upper, rows)
        return kept

    def add_output_rows(
        self,
        w: np.ndarray,
        b: np.ndarray,
        c: np.ndarray,
        d: np.ndarray,
        noise: np.ndarray | None = None,
    ) -> None:
        """The outputs y = W a + b of the current layer (within ``noise``) constrained to
        C y <= d."""
        coef, rhs = self._output_rows(w, b, c, d, noise)
        self._rows([-INF] * len(d), list(rhs), [(self.current, row) for row in coef])

    def _output_rows(
        self, w: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, noise: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``c y <= d`` over the current columns, ``coef_j . a <= rhs_j``, each
        relaxed by its worst case of the output ``noise``."""
        wa, off = self.affine(w, b)
        rhs = d - c @ off
        if noise is not None:
            rhs = rhs + np.abs(c) @ noise
        return c @ wa, rhs

    def solve_milp(self) -> np.ndarray | None:
        """A feasible point of the MILP (all columns), or None when it is infeasible."""
        self._set_integral(True)
        self._run()
        status = self.h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return None
        if status == highspy.HighsModelStatus.kOptimal:
            return np.asarray(self.h.getSolution().col_value)
        raise VerificationError(
            f"HiGHS stopped without a verdict: {self.h.modelStatusToString(status)}"
        )

    def exclude_choice(self, j: int) -> None:
        """Force q_j = 0: ball j leaves the batch, the rest of the model stays."""
        col = self.choice_cols[j : j + 1]
        self.h.changeColsBounds(1, col, np.zeros(1), np.zeros(1))

    def sharpen(self, point: np.ndarray, target: int) -> np.ndarray:
        """Within the linear region of a MILP point, the input that maximises y_target - y_label.

        A first feasible point often sits exactly on the decision boundary, where float32
        inference may still pick the label; the region's best point has a clear margin.
        """
        idx = np.asarray(self.integers, dtype=np.int32)
        fixed = np.round(point[idx])
        self.h.changeColsBounds(len(idx), idx, fixed, fixed)
        self._set_integral(False)
        diff_w, _ = self.margin
        best = self._minimise(self.current, -diff_w[target])
        if best is None:
            return point
        return np.asarray(self.h.getSolution().col_value)
