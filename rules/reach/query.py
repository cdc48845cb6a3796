"""A verification query as VNN-LIB states it: is there an input in one of the boxes whose
output lies in the unsafe region?

The region of each box is a disjunction of polytopes ``C y <= d`` (every row of one of
them). ``sat`` means such an input exists (a counterexample), ``unsat`` that none does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.reach.sets import SpecError


@dataclass(frozen=True, eq=False)
class Case:
    """One input box and the unsafe polytopes checked over it."""

    lower: np.ndarray
    upper: np.ndarray
    unsafe: tuple[tuple[np.ndarray, np.ndarray], ...]  # (C (k, m), d (k,)) per polytope

    def violation(self, y: np.ndarray) -> np.ndarray:
        """For outputs ``y`` (n, m): how far each is from the unsafe region, min over the
        polytopes of max over their rows of ``c y - d`` (<= 0: unsafe)."""
        out = np.full(len(y), np.inf)
        for c, d in self.unsafe:
            rows = y @ c.T - d if len(d) else np.full((len(y), 1), -np.inf)
            out = np.minimum(out, rows.max(axis=1))
        return out


@dataclass(frozen=True)
class Variable:
    """A declared input or output: its name, element type (``real``, ``float32``, ...) and
    shape (``()`` for a VNN-LIB 1.0 scalar)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Query:
    """Input and output sizes (flattened, row-major) and the cases, any of which is a
    counterexample when satisfied; the declared network's name and variables, inputs
    first."""

    inputs: int
    outputs: int
    cases: tuple[Case, ...]
    network: str | None = None
    variables: tuple[Variable, ...] = ()

    def counterexample(self, x: np.ndarray, y: np.ndarray, tolerance: float = 0.0) -> bool:
        """Whether ``x`` lies in a case's box and ``y`` in its unsafe region (``tolerance``
        on y, as VNN-COMP checks a reported counterexample)."""
        x, y = np.asarray(x).reshape(1, -1), np.asarray(y).reshape(1, -1)
        return any(
            np.all(x >= case.lower)
            and np.all(x <= case.upper)
            and case.violation(y)[0] <= tolerance
            for case in self.cases
        )


Row = tuple[np.ndarray, np.ndarray, float]
"""An atomic constraint ``a_x . x + a_y . y <= rhs``."""


def query_from_clauses(
    clauses: list[list[Row]],
    inputs: int,
    outputs: int,
    network: str | None = None,
    variables: tuple[Variable, ...] = (),
    boxed: bool = True,
) -> Query:
    """The query of a formula in disjunctive normal form: each clause's input rows must be
    bounds on one input (they give its box), its output rows one unsafe polytope; clauses
    with the same box share a case. ``boxed``: every input must be bounded."""
    cases: dict[bytes, tuple[np.ndarray, np.ndarray, list]] = {}
    for clause in clauses:
        lower, upper = np.full(inputs, -np.inf), np.full(inputs, np.inf)
        c_rows, d_rows, feasible = [], [], True
        for a_x, a_y, rhs in clause:
            on_x, on_y = np.flatnonzero(a_x), np.flatnonzero(a_y)
            if on_x.size and on_y.size:
                raise SpecError("a constraint mixing inputs and outputs is not supported")
            if on_x.size > 1:
                raise SpecError("input constraints must be bounds on one input each")
            if on_x.size:
                i, a = int(on_x[0]), float(a_x[on_x[0]])
                if a > 0:
                    upper[i] = min(upper[i], rhs / a)
                else:
                    lower[i] = max(lower[i], rhs / a)
            elif on_y.size:
                c_rows.append(a_y)
                d_rows.append(rhs)
            elif rhs < 0:  # 0 <= rhs is false: the clause holds for nothing
                feasible = False
        if not feasible or np.any(lower > upper):
            continue
        key = lower.tobytes() + upper.tobytes()
        polytope = (np.array(c_rows).reshape(-1, outputs), np.array(d_rows, dtype=np.float64))
        cases.setdefault(key, (lower, upper, []))[2].append(polytope)
    for lower, upper, _ in cases.values() if boxed else ():
        unbounded = np.flatnonzero(~np.isfinite(lower) | ~np.isfinite(upper))
        if unbounded.size:
            raise SpecError(f"input {int(unbounded[0])} has no lower or no upper bound")
    return Query(
        inputs,
        outputs,
        tuple(Case(lo, hi, tuple(polys)) for lo, hi, polys in cases.values()),
        network,
        variables,
    )


def safe_set(query: Query) -> tuple[np.ndarray, np.ndarray]:
    """The outputs a property allows, as ``C y <= d``, for a property over outputs alone
    whose unsafe region is a disjunction of single constraints ``c y <= d`` (the safe set
    is then their negations' conjunction, closed: ``-c y <= -d``)."""
    if len(query.cases) != 1:
        raise SpecError(f"the property has {len(query.cases)} input boxes; one is needed")
    (case,) = query.cases
    if np.isfinite(case.lower).any() or np.isfinite(case.upper).any():
        raise SpecError(
            "the property constrains the inputs; here the input set is given separately, "
            "so state only output constraints"
        )
    rows = [len(d) for _, d in case.unsafe]
    if any(n != 1 for n in rows):
        raise SpecError(
            "the unsafe region must be a disjunction of single output constraints (its "
            f"complement is then one conjunction C y <= d); it has polytopes of {rows} rows"
        )
    c = np.vstack([c for c, _ in case.unsafe])
    d = np.concatenate([d for _, d in case.unsafe])
    return -c, -d
