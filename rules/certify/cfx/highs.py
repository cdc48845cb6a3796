"""A thin builder over HiGHS for the small MILPs here (rows added one at a time, CSR at solve)."""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

from vigil.rules.highs import quiet_highs


class SolverFailure(RuntimeError):
    """HiGHS ended without an optimal solution for a model that should always have one."""


@dataclass(frozen=True)
class Solution:
    """Optimal value, a proven bound on it (the MIP dual bound), and the column values."""

    objective: float
    bound: float
    values: np.ndarray


class Milp:
    """Columns with bounds (optionally binary) and two-sided linear rows; minimised by HiGHS."""

    def __init__(self) -> None:
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._binary: list[int] = []
        self._rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []
        self.num_cols = 0

    def add_vars(self, lo: np.ndarray | float, hi: np.ndarray | float, n: int) -> np.ndarray:
        """n continuous columns with bounds [lo, hi]; returns their indices."""
        self._lo.append(np.broadcast_to(np.asarray(lo, dtype=np.float64), (n,)).copy())
        self._hi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (n,)).copy())
        idx = np.arange(self.num_cols, self.num_cols + n)
        self.num_cols += n
        return idx

    def add_binary(self) -> int:
        """One 0/1 column; returns its index."""
        (idx,) = self.add_vars(0.0, 1.0, 1)
        self._binary.append(int(idx))
        return int(idx)

    def add_row(self, idx: np.ndarray, vals: np.ndarray, lo: float, hi: float) -> None:
        """lo <= sum vals * x[idx] <= hi."""
        self._rows.append((np.asarray(idx, dtype=np.int32), np.asarray(vals, float), lo, hi))

    def solve(self, cost: np.ndarray, offset: float = 0.0) -> Solution | None:
        """Minimise cost @ x + offset; None when the rows and bounds admit no point."""
        h = quiet_highs()
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 1e-9)
        lo = np.concatenate(self._lo) if self._lo else np.zeros(0)
        hi = np.concatenate(self._hi) if self._hi else np.zeros(0)
        h.addVars(self.num_cols, lo, hi)
        h.changeColsCost(self.num_cols, np.arange(self.num_cols, dtype=np.int32), cost)
        if self._rows:
            starts = np.cumsum([0] + [len(r[0]) for r in self._rows[:-1]]).astype(np.int32)
            h.addRows(
                len(self._rows),
                np.array([r[2] for r in self._rows]),
                np.array([r[3] for r in self._rows]),
                int(sum(len(r[0]) for r in self._rows)),
                starts,
                np.concatenate([r[0] for r in self._rows]),
                np.concatenate([r[1] for r in self._rows]),
            )
        if self._binary:
            idx = np.array(self._binary, dtype=np.int32)
            kinds = np.array([highspy.HighsVarType.kInteger] * len(idx))
            h.changeColsIntegrality(len(idx), idx, kinds)
        h.changeObjectiveOffset(offset)
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return None
        if status != highspy.HighsModelStatus.kOptimal:
            raise SolverFailure(f"HiGHS ended with {h.modelStatusToString(status)}")
        info = h.getInfo()
        objective = float(info.objective_function_value)
        bound = float(info.mip_dual_bound) if self._binary else objective
        values = np.asarray(h.getSolution().col_value, dtype=np.float64)
        return Solution(objective, min(bound, objective), values)
