"""Input sets (a box with optional extra linear constraints) and linear output specifications."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_TIGHTEN_ROUNDS = 4
_EMPTY_TOLERANCE = 1e-12


class SpecError(ValueError):
    """An input set or output specification is malformed."""


@dataclass(frozen=True, eq=False)
class InputSet:
    """X = {x : lower <= x <= upper, A x <= b}; the box is mandatory so X is bounded."""

    lower: np.ndarray
    upper: np.ndarray
    A: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    b: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        lower = np.array(self.lower, dtype=np.float64).reshape(-1)
        upper = np.array(self.upper, dtype=np.float64).reshape(-1)
        if lower.shape != upper.shape or lower.size == 0:
            raise SpecError(f"lower {lower.shape} and upper {upper.shape} must be equal, non-empty")
        if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))):
            raise SpecError("the input box must be finite")
        if np.any(lower > upper):
            bad = int(np.argmax(lower > upper))
            raise SpecError(f"lower > upper in dimension {bad}: {lower[bad]} > {upper[bad]}")
        a = np.array(self.A, dtype=np.float64)
        a = a.reshape(0, lower.size) if a.size == 0 else a
        b = np.array(self.b, dtype=np.float64).reshape(-1)
        if a.ndim != 2 or a.shape[1] != lower.size or a.shape[0] != b.size:
            raise SpecError(f"A {a.shape} and b {b.shape} do not fit {lower.size} inputs")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise SpecError("A and b must be finite")
        for name, value in (("lower", lower), ("upper", upper), ("A", a), ("b", b)):
            value.flags.writeable = False
            object.__setattr__(self, name, value)
        object.__setattr__(
            self, "_key", (a.shape, lower.tobytes(), upper.tobytes(), a.tobytes(), b.tobytes())
        )

    def same_as(self, other: InputSet) -> bool:
        """Whether ``other`` is the same set, constraint for constraint."""
        return self is other or self._key == other._key

    @property
    def dim(self) -> int:
        return self.lower.size

    def relaxed(self, gamma: float) -> InputSet:
        """The set with every constraint loosened by ``gamma`` (RSR)."""
        return InputSet(self.lower - gamma, self.upper + gamma, self.A, self.b + gamma)

    def contains(self, x: np.ndarray, tol: float = 0.0) -> np.ndarray:
        """Which rows of ``x`` lie in the set."""
        x = np.atleast_2d(x)
        inside = np.all((x >= self.lower - tol) & (x <= self.upper + tol), axis=1)
        if self.A.shape[0]:
            inside &= np.all(x @ self.A.T <= self.b + tol, axis=1)
        return inside

    def tighten(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bounding boxes of each box [lo_i, hi_i] intersected with the set, for a batch (B, d).

        Bounds propagation over the linear constraints: sound (the result contains the exact
        intersection) and vectorised over the batch; returns (lo, hi, empty).
        """
        lo = np.maximum(lo, self.lower)
        hi = np.minimum(hi, self.upper)
        a = self.A
        if a.shape[0]:
            pos, neg = a > 0, a < 0
            safe = np.where(a == 0, 1.0, a)
            for _ in range(_TIGHTEN_ROUNDS):
                term = np.minimum(a * lo[:, None, :], a * hi[:, None, :])  # (B, m, d)
                rest = term.sum(axis=2, keepdims=True) - term
                bound = (self.b[None, :, None] - rest) / safe
                new_hi = np.minimum(hi, np.where(pos, bound, np.inf).min(axis=1))
                new_lo = np.maximum(lo, np.where(neg, bound, -np.inf).max(axis=1))
                if np.array_equal(new_hi, hi) and np.array_equal(new_lo, lo):
                    break
                lo, hi = new_lo, new_hi
        empty = np.any(lo > hi + _EMPTY_TOLERANCE, axis=1)
        hi = np.where(empty[:, None], lo, np.maximum(hi, lo))
        return lo, hi, empty


@dataclass(frozen=True, eq=False)
class OutputSpec:
    """Y = {y : C y <= d}: the specification holds on X iff every output of X lies in Y."""

    C: np.ndarray
    d: np.ndarray

    def __post_init__(self) -> None:
        c = np.atleast_2d(np.array(self.C, dtype=np.float64))
        d = np.array(self.d, dtype=np.float64).reshape(-1)
        if c.shape[0] != d.size or c.shape[0] == 0:
            raise SpecError(f"C {c.shape} and d {d.shape} must have the same, non-zero rows")
        if not (np.all(np.isfinite(c)) and np.all(np.isfinite(d))):
            raise SpecError("C and d must be finite")
        object.__setattr__(self, "C", c)
        object.__setattr__(self, "d", d)

    @property
    def output_dim(self) -> int:
        return self.C.shape[1]

    def violation(self, y: np.ndarray) -> np.ndarray:
        """max_j (c_j y - d_j) per row of ``y``: positive means the spec is violated."""
        return (np.atleast_2d(y) @ self.C.T - self.d).max(axis=1)
