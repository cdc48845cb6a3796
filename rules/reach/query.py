"""A verification query as VNN-LIB states it: is there an input in one of the boxes whose
output lies in the unsafe region?

The region of each box is a disjunction of polytopes ``C y <= d`` (every row of one of
them; a strict row ``c y < d`` where the query says so). ``sat`` means such an input exists
(a counterexample), ``unsat`` that none does.

A constraint that is not a bound on one input (a sum of inputs, or inputs and outputs
together) makes the query ``joint``: its rows then range over the outputs followed by the
inputs, ``C (y, x) <= d``, and the verifiers see the network with its inputs appended to its
outputs (``joint_network``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, OutputSpec, SpecError


@dataclass(frozen=True, eq=False)
class Case:
    """One input box and the unsafe polytopes checked over it."""

    lower: np.ndarray
    upper: np.ndarray
    unsafe: tuple[tuple[np.ndarray, np.ndarray], ...]  # (C (k, m), d (k,)) per polytope
    strict: tuple[np.ndarray, ...] = ()
    """Per polytope, which rows are strict (``c y < d``); none when empty."""
    lower_open: np.ndarray | None = None
    """Which inputs' lower bounds are strict (``x > lower``); none when unset."""
    upper_open: np.ndarray | None = None
    tolerance: float = 0.0
    """How far outside a non-strict row a counterexample's output may be (VNN-LIB 1.0:
    VNN-COMP's 1e-4; 2.0: none)."""

    def violation(self, y: np.ndarray) -> np.ndarray:
        """For outputs ``y`` (n, m): how far each is from the unsafe region, min over the
        polytopes of max over their rows of ``c y - d`` (<= 0: unsafe, up to strictness)."""
        out = np.full(len(y), np.inf)
        for c, d in self.unsafe:
            rows = y @ c.T - d if len(d) else np.full((len(y), 1), -np.inf)
            out = np.minimum(out, rows.max(axis=1))
        return out

    def strict_rows(self, polytope: int) -> np.ndarray:
        """Which rows of one polytope are strict."""
        if self.strict:
            return self.strict[polytope]
        return np.zeros(len(self.unsafe[polytope][1]), dtype=bool)

    def holds(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Which inputs ``x`` (n, d) with outputs ``y`` (n, m) are counterexamples: in the
        box (strict bounds strictly) with the output in an unsafe polytope (strict rows
        strictly, the others within ``tolerance``). NaN satisfies nothing."""
        inside = np.all((x >= self.lower) & (x <= self.upper), axis=1)
        if self.lower_open is not None:
            inside &= np.all(~self.lower_open | (x > self.lower), axis=1)
        if self.upper_open is not None:
            inside &= np.all(~self.upper_open | (x < self.upper), axis=1)
        unsafe = np.zeros(len(y), dtype=bool)
        for p, (c, d) in enumerate(self.unsafe):
            values = y @ c.T - d
            met = np.where(self.strict_rows(p), values < 0, values <= self.tolerance)
            unsafe |= met.all(axis=1)
        return inside & unsafe


@dataclass(frozen=True)
class Variable:
    """A declared input, output or hidden node: its name, element type (``real``,
    ``float32``, ...), shape (``()`` for a VNN-LIB 1.0 scalar) and role."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str = "input"
    offset: int = 0
    """Where its values start in X (an input) or Y (an output or hidden node)."""


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
    joint: bool = False
    """The rows range over (y, x): ``outputs`` then counts the network's outputs plus its
    inputs."""
    hidden: tuple[str, ...] = ()
    """The graph tensors of the hidden nodes the query constrains: Y holds the network's
    outputs, then these."""
    networks: tuple[tuple[str, str], ...] = ()
    """Each declared network's name and the network it is ``equal-to`` ("" if none)."""
    aliases: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = ()
    """Inputs equated element by element: (network, input position) of the earlier
    input, then of the later one, which reads the earlier's values."""

    @property
    def element_type(self) -> str:
        """The one element type of the declared variables (``real`` for VNN-LIB 1.0): the
        arithmetic the query is about. Inputs and outputs of different types are refused."""
        types = {v.dtype for v in self.variables} or {"real"}
        if len(types) > 1:
            named = ", ".join(f"{v.name} {v.dtype}" for v in self.variables)
            raise ValueError(f"the variables are declared with different element types ({named})")
        return types.pop()

    def counterexample(self, x: np.ndarray, y: np.ndarray) -> bool:
        """Whether input ``x`` with output ``y`` satisfies a case (``Case.holds``)."""
        x, y = np.asarray(x).reshape(1, -1), np.asarray(y).reshape(1, -1)
        if self.joint and y.shape[1] + x.shape[1] == self.outputs:
            y = np.hstack([y, x])
        return any(bool(case.holds(x, y)[0]) for case in self.cases)


def shut(upper: np.ndarray, d: np.ndarray, strict: np.ndarray) -> np.ndarray:
    """Which rows no point meets, from upper bounds of ``-c y`` (B, R): ``c y > d``
    everywhere, or for a strict row ``c y >= d``."""
    return (upper < -d) | (strict & (upper <= -d))


Row = tuple[np.ndarray, np.ndarray, float, bool]
"""An atomic constraint ``a_x . x + a_y . y <= rhs``, or ``< rhs`` when strict."""


def query_from_clauses(
    clauses: list[list[Row]],
    inputs: int,
    outputs: int,
    network: str | None = None,
    variables: tuple[Variable, ...] = (),
    boxed: bool = True,
    tolerance: float = 0.0,
) -> Query:
    """The query of a formula in disjunctive normal form: each clause's input rows must be
    bounds on one input (they give its box), its output rows one unsafe polytope; clauses
    with the same box share a case. ``boxed``: every input must be bounded. ``tolerance``:
    the cases' (``Case.tolerance``)."""
    cases: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]] = {}
    # a row that is not a bound on one input: every row then ranges over (y, x)
    joint = any(
        np.count_nonzero(a_x) > 1 or (np.any(a_x) and np.any(a_y))
        for clause in clauses
        for a_x, a_y, _, _ in clause
    )
    columns = outputs + inputs if joint else outputs
    for clause in clauses:
        lower, upper = np.full(inputs, -np.inf), np.full(inputs, np.inf)
        lower_open, upper_open = np.zeros(inputs, dtype=bool), np.zeros(inputs, dtype=bool)
        c_rows, d_rows, strict_rows, feasible = [], [], [], True
        for a_x, a_y, rhs, strict in clause:
            on_x, on_y = np.flatnonzero(a_x), np.flatnonzero(a_y)
            if on_x.size > 1 or (on_x.size and on_y.size):
                c_rows.append(np.concatenate([a_y, a_x]))
                d_rows.append(rhs)
                strict_rows.append(strict)
            elif on_x.size:
                i, a = int(on_x[0]), float(a_x[on_x[0]])
                bound = rhs / a
                if a > 0 and bound < upper[i]:
                    upper[i], upper_open[i] = bound, strict
                elif a > 0 and bound == upper[i]:
                    upper_open[i] |= strict
                elif a < 0 and bound > lower[i]:
                    lower[i], lower_open[i] = bound, strict
                elif a < 0 and bound == lower[i]:
                    lower_open[i] |= strict
            elif on_y.size:
                c_rows.append(np.concatenate([a_y, np.zeros(inputs)]) if joint else a_y)
                d_rows.append(rhs)
                strict_rows.append(strict)
            elif rhs < 0 or (strict and rhs == 0):  # 0 <= rhs is false: holds for nothing
                feasible = False
        empty = (lower > upper) | ((lower == upper) & (lower_open | upper_open))
        if not feasible or np.any(empty):
            continue
        key = b"".join(a.tobytes() for a in (lower, upper, lower_open, upper_open))
        polytope = (np.array(c_rows).reshape(-1, columns), np.array(d_rows, dtype=np.float64))
        strictness = np.array(strict_rows, dtype=bool)
        case = cases.setdefault(key, (lower, upper, lower_open, upper_open, []))
        case[4].append((polytope, strictness))
    for lower, upper, *_ in cases.values() if boxed else ():
        unbounded = np.flatnonzero(~np.isfinite(lower) | ~np.isfinite(upper))
        if unbounded.size:
            raise SpecError(f"input {int(unbounded[0])} has no lower or no upper bound")
    return Query(
        inputs,
        columns,
        tuple(
            Case(
                lo,
                hi,
                tuple(p for p, _ in polys),
                tuple(s for _, s in polys) if any(s.any() for _, s in polys) else (),
                lo_open if lo_open.any() else None,
                hi_open if hi_open.any() else None,
                tolerance,
            )
            for lo, hi, lo_open, hi_open, polys in cases.values()
        ),
        network,
        variables,
        joint,
    )


def joint_network(network: Network) -> Network:
    """``network`` with its input appended to its output, y' = (f(x), x), for a ``joint``
    query: the input passes each ReLU as relu(x) and relu(-x), exactly, with no rounding
    of its own."""
    if network.output != "none":
        raise SpecError(
            f"constraints that combine inputs (with each other or with outputs) on a network "
            f"ending in {network.output} are not supported"
        )
    d = network.input_dim
    eye = np.eye(d)
    weights, biases = [], []
    rounding = None if network.rounding is None else []
    peaks = None if network.peaks is None else []
    last = len(network.weights) - 1
    for k, (w, b) in enumerate(zip(network.weights, network.biases, strict=True)):
        carried = d if k == 0 else 2 * d  # the input's columns into this layer
        wide = np.zeros((w.shape[0], w.shape[1] + (0 if k == 0 else 2 * d)))
        wide[:, : w.shape[1]] = w
        if k == last:
            through = eye if k == 0 else np.hstack([eye, -eye])
        else:
            through = np.vstack([eye, -eye]) if k == 0 else np.eye(2 * d)
        block = np.zeros((through.shape[0], wide.shape[1]))
        block[:, wide.shape[1] - carried :] = through
        weights.append(np.vstack([wide, block]))
        biases.append(np.concatenate([b, np.zeros(len(block))]))
        if rounding is not None and network.rounding is not None:
            r_w, r_b = network.rounding[k]
            grown = np.zeros((len(weights[-1]), wide.shape[1]))
            grown[: r_w.shape[0], : r_w.shape[1]] = r_w
            rounding.append((grown, np.concatenate([r_b, np.zeros(len(block))])))
        if peaks is not None and network.peaks is not None:
            p, q = network.peaks[k]
            peaks.append((np.concatenate([p, np.zeros(wide.shape[1] - len(p))]), q))
    activations = exponents = None
    if network.activations is not None:  # the carried input's neurons are ReLUs
        activations = tuple(
            np.concatenate([a, np.zeros(len(w) - len(a), dtype=a.dtype)])
            for a, w in zip(network.activations, weights[:-1], strict=True)
        )
    if network.exponents is not None:
        exponents = tuple(
            np.concatenate([e, np.full(len(w) - len(e), np.nan)])
            for e, w in zip(network.exponents, weights[:-1], strict=True)
        )
    return replace(
        Network.from_arrays(list(zip(weights, biases, strict=True))),
        precision=network.precision,
        rounding=None if rounding is None else tuple(rounding),
        peaks=None if peaks is None else tuple(peaks),
        activations=activations,
        exponents=exponents,
    )


def safe_set(query: Query) -> tuple[np.ndarray, np.ndarray]:
    """The outputs a property allows, as ``C y <= d``, for a property over outputs alone
    whose unsafe region is a disjunction of single constraints ``c y <= d`` (the safe set
    is then their negations' conjunction, closed: ``-c y <= -d``)."""
    if len(query.cases) != 1:
        raise SpecError(f"the property has {len(query.cases)} input boxes; one is needed")
    if query.joint:
        raise SpecError("constraints that combine inputs cannot be an output spec")
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


def reach_query(inputs: InputSet, spec: OutputSpec) -> Query:
    """The query whose counterexamples are the inputs of ``inputs`` with an output outside
    ``spec`` (a ``reach`` rule's question asked of the complete search): one polytope per
    spec row, ``c y > d`` (strict), with the rows of ``A x <= b`` (then ``joint``)."""
    n, m = inputs.dim, spec.output_dim
    eye, none_x, none_y = np.eye(n), np.zeros(n), np.zeros(m)
    box: list[Row] = [(eye[i], none_y, float(inputs.upper[i]), False) for i in range(n)]
    box += [(-eye[i], none_y, -float(inputs.lower[i]), False) for i in range(n)]
    box += [(a, none_y, float(b), False) for a, b in zip(inputs.A, inputs.b, strict=True)]
    clauses = [[*box, (none_x, -c, -float(d), True)] for c, d in zip(spec.C, spec.d, strict=True)]
    return query_from_clauses(clauses, n, m)
