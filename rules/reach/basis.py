"""Coordinates aligned with the input polytope, so that boxes fit it.

Reachability bounds every neuron over a box. When the input set is a thin polytope (say
consecutive velocities that may differ by at most 0.1), its bounding box is mostly outside the
set, and the bounds hold over inputs that never occur. Branches therefore live in coordinates
u = M x whose axes are the set's tightest constraint directions: there the set is close to a
box. The network is composed with x = M^-1 u; verdicts and counterexamples are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, SpecError

_RANK_TOLERANCE = 1e-9
_SAMPLE_ROUNDS = 200


@dataclass(frozen=True, eq=False)
class Basis:
    """u = M x (``to_u`` = M, ``to_x`` = M^-1)."""

    to_u: np.ndarray
    to_x: np.ndarray

    @classmethod
    def identity(cls, dim: int) -> Basis:
        return cls(np.eye(dim), np.eye(dim))

    @classmethod
    def fit(cls, inputs: InputSet) -> Basis:
        """Greedily take the constraint directions along which the set is narrowest."""
        dim = inputs.dim
        candidates = [np.eye(dim)[k] for k in range(dim)]
        widths = list(inputs.upper - inputs.lower)
        if inputs.A.shape[0]:
            norms = np.linalg.norm(inputs.A, axis=1)
            for i, row in enumerate(inputs.A):
                if norms[i] == 0:
                    continue
                unit = row / norms[i]
                box_width = float(np.abs(unit) @ (inputs.upper - inputs.lower))
                opposite = [
                    inputs.b[j] / norms[j] + inputs.b[i] / norms[i]
                    for j in range(inputs.A.shape[0])
                    if norms[j] > 0 and np.allclose(inputs.A[j] / norms[j], -unit)
                ]
                candidates.append(unit)
                widths.append(min([box_width, *opposite]))
        chosen: list[np.ndarray] = []
        for k in np.argsort(widths, kind="stable"):
            trial = np.array([*chosen, candidates[k]])
            if np.linalg.matrix_rank(trial, tol=_RANK_TOLERANCE) == len(trial):
                chosen.append(candidates[k])
            if len(chosen) == dim:
                break
        m = np.array(chosen)
        if np.allclose(m, np.eye(dim)):
            return cls.identity(dim)
        return cls(m, np.linalg.inv(m))

    @property
    def is_identity(self) -> bool:
        return bool(np.array_equal(self.to_u, np.eye(self.to_u.shape[0])))

    def inputs(self, inputs: InputSet) -> InputSet:
        """The set in u coordinates: the x box becomes linear rows, u gets the box's image."""
        if self.is_identity:
            return inputs
        t = self.to_u
        lower = np.minimum(t * inputs.lower, t * inputs.upper).sum(axis=1)
        upper = np.maximum(t * inputs.lower, t * inputs.upper).sum(axis=1)
        a = np.vstack([inputs.A @ self.to_x, self.to_x, -self.to_x])
        b = np.concatenate([inputs.b, inputs.upper, -inputs.lower])
        return InputSet(lower, upper, a, b)

    def network(self, network: Network) -> Network:
        """f(M^-1 u): the first layer absorbs the change of coordinates."""
        if self.is_identity:
            return network
        weights = (network.weights[0] @ self.to_x, *network.weights[1:])
        return Network(weights, network.biases, network.output)

    def radius(
        self, radius: list[tuple[np.ndarray, np.ndarray]] | None
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Interval weights W +- R of the first layer become W M^-1 +- R |M^-1|."""
        if radius is None or self.is_identity:
            return radius
        r_w, r_b = radius[0]
        return [(r_w @ np.abs(self.to_x), r_b), *radius[1:]]

    def points(self, u: np.ndarray) -> np.ndarray:
        return u @ self.to_x.T

    def coordinates(self, x: np.ndarray) -> np.ndarray:
        return x @ self.to_u.T


def sample(
    inputs: InputSet, n: int, rng: np.random.Generator, basis: Basis | None = None
) -> np.ndarray:
    """``n`` uniform points of the set: rejection from its bounding box in the fitted basis,
    where the box is tight (a linear map keeps uniform densities uniform)."""
    basis = basis or Basis.fit(inputs)
    region = basis.inputs(inputs)
    dim = inputs.dim
    lo, hi, empty = region.tighten(np.full((1, dim), -np.inf), np.full((1, dim), np.inf))
    if empty[0]:
        raise SpecError("the input set is empty")
    kept: list[np.ndarray] = []
    count = 0
    for _ in range(_SAMPLE_ROUNDS):
        u = rng.uniform(lo[0], hi[0], size=(max(n, 256), dim))
        u = u[region.contains(u)]
        kept.append(u)
        count += u.shape[0]
        if count >= n:
            return basis.points(np.concatenate(kept)[:n])
    raise SpecError(
        f"could not sample the input set: {count} of {_SAMPLE_ROUNDS * max(n, 256)} box points "
        "fell inside it (is it nearly empty?)"
    )
