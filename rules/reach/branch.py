"""Reach + branch (Algorithm 1 of Wei & Liu): verify an input set by bisecting it into branches.

A branch is a split box (half-spaces from bisections; infinite where no split bounds it)
intersected with the input set. Its reach set is computed over the bounding box of that
intersection. Statuses: holds (every output in spec), violated (a concrete input in the
branch breaks the spec), unknown (neither shown within the limits), empty (no input).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vigil.rules.reach.basis import Basis
from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.reach.symbolic import LAYER_FIELDS, LayerInput, reach

UNKNOWN, HOLDS, VIOLATED, EMPTY = 0, 1, 2, 3
STATUS_NAMES = ("unknown", "holds", "violated", "empty")
_ATTACK_STEPS = 8


@dataclass
class Branches:
    """The branch set X_S with each branch's last result, in the basis' u coordinates."""

    basis: Basis
    split_lo: np.ndarray  # (B, d), -inf where no bisection bounds the branch
    split_hi: np.ndarray
    box_lo: np.ndarray  # the box the result was computed over
    box_hi: np.ndarray
    status: np.ndarray  # (B,) int8
    upper: np.ndarray  # (B, k) upper bounds of C y over the box (nan when not computed)
    point: np.ndarray  # (B, d) counterexample (u coordinates) of violated branches, else nan
    gradient: np.ndarray  # (B, d) split scores of the last result (see ``Reach.gradient``)
    inputs: list[LayerInput] = field(default_factory=list)  # per layer, for incremental reuse

    def __len__(self) -> int:
        return self.status.size

    def part(self, index: np.ndarray) -> Part:
        """Some branches as a part, to reassemble with others."""
        ev = Evaluation(
            self.status[index],
            self.upper[index],
            self.point[index],
            self.gradient[index],
            [s.take(index) for s in self.inputs],
        )
        return Part(
            self.split_lo[index], self.split_hi[index], self.box_lo[index], self.box_hi[index], ev
        )

    @property
    def verified(self) -> np.ndarray:
        return (self.status == HOLDS) | (self.status == EMPTY)

    def locate(self, x: np.ndarray) -> np.ndarray:
        """Index of the branch whose split box holds each input point (-1 if none)."""
        x = self.basis.coordinates(x)
        inside = np.all(
            (x[:, None, :] >= self.split_lo[None]) & (x[:, None, :] <= self.split_hi[None]), axis=2
        )
        return np.where(inside.any(axis=1), inside.argmax(axis=1), -1)

    def coverage(self, samples: np.ndarray) -> float:
        """Fraction of the sample points that lie in verified branches."""
        if samples.shape[0] == 0:
            return 0.0
        index = self.locate(samples)
        return float(np.mean((index >= 0) & self.verified[np.maximum(index, 0)]))


@dataclass(frozen=True)
class Evaluation:
    """What computing a batch of branches found."""

    status: np.ndarray
    upper: np.ndarray
    point: np.ndarray
    gradient: np.ndarray
    inputs: list[LayerInput]

    def take(self, index: np.ndarray) -> Evaluation:
        return Evaluation(
            self.status[index],
            self.upper[index],
            self.point[index],
            self.gradient[index],
            [s.take(index) for s in self.inputs],
        )


def evaluate(
    network: Network,
    inputs: InputSet,
    spec: OutputSpec,
    lo: np.ndarray,
    hi: np.ndarray,
    empty: np.ndarray,
    *,
    method: str = "symbolic",
    radius: list[tuple[np.ndarray, np.ndarray]] | None = None,
    start: int = 0,
    cached: list[LayerInput] | None = None,
    attack: bool = True,
    target: Network | None = None,
) -> Evaluation:
    """Reach sets of boxes [lo, hi] (already tightened to ``inputs``), then their statuses.

    ``target``: the network counterexamples must break, when ``network`` (with ``radius``) is
    an interval network around it rather than the network itself."""
    result = reach(
        network, lo, hi, spec.C, radius=radius, start=start, cached=cached, method=method, d=spec.d
    )
    holds = np.all(result.upper <= spec.d, axis=1)
    status = np.where(empty, EMPTY, np.where(holds, HOLDS, UNKNOWN)).astype(np.int8)
    point = np.full(lo.shape, np.nan)
    # no input of a box breaks the spec for the centre weights where their bound holds
    open_ = np.flatnonzero((status == UNKNOWN) & ~np.all(result.centre_upper <= spec.d, axis=1))
    if attack and open_.size:
        found, where = counterexamples(
            network if target is None else target, inputs, spec, lo[open_], hi[open_]
        )
        status[open_[found]] = VIOLATED
        point[open_[found]] = where[found]
    return Evaluation(status, result.upper, point, result.gradient, result.inputs)


def counterexamples(
    network: Network, inputs: InputSet, spec: OutputSpec, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Search each box for an input of the set that violates the spec: the centre, then a few
    projected sign-gradient ascent steps on the largest violation. Returns (found, points)."""
    x = (lo + hi) / 2
    step = (hi - lo) / 4
    best = x.copy()
    found = _violates(network, inputs, spec, x)
    for _ in range(_ATTACK_STEPS):
        if found.all():
            break
        x = np.clip(x + step * np.sign(_violation_gradient(network, spec, x)), lo, hi)
        hit = _violates(network, inputs, spec, x) & ~found
        best[hit] = x[hit]
        found |= hit
        step = step * 0.7
    return found, best


def _violates(network: Network, inputs: InputSet, spec: OutputSpec, x: np.ndarray) -> np.ndarray:
    return (spec.violation(network.logits(x)) > 0) & inputs.contains(x)


def _violation_gradient(network: Network, spec: OutputSpec, x: np.ndarray) -> np.ndarray:
    """Gradient of max_j (c_j f(x) - d_j) for a batch of points (ReLU masks from a forward pass)."""
    pre = network.pre_activations(x)
    y = network.logits(x)
    row = np.argmax(y @ spec.C.T - spec.d, axis=1)
    grad = spec.C[row] @ network.weights[-1]  # (n, width of the last hidden layer)
    for w, z in zip(reversed(network.weights[:-1]), reversed(pre), strict=True):
        grad = (grad * (z > 0)) @ w
    return grad


def reach_and_branch(
    network: Network,
    inputs: InputSet,
    spec: OutputSpec,
    max_branches: int = 250,
    *,
    method: str = "symbolic",
    radius: list[tuple[np.ndarray, np.ndarray]] | None = None,
    relax: float = 0.0,
    basis: Basis | None = None,
) -> Branches:
    """Algorithm 1: compute, bisect the open branches with the most influential dimension,
    repeat until every branch is decided or ``max_branches`` is reached. ``relax`` computes
    every branch over the input set loosened by that offset (RSR); branches are boxes in
    ``basis`` (by default fitted to the input set)."""
    if max_branches < 1:
        raise ValueError(f"max_branches must be >= 1, got {max_branches}")
    basis = basis or Basis.fit(inputs)
    region = basis.inputs(inputs.relaxed(relax) if relax else inputs)
    inputs, network, radius = basis.inputs(inputs), basis.network(network), basis.radius(radius)
    root = np.full((1, inputs.dim), np.inf)
    parts = grow(
        network, inputs, region, spec, (-root, root), max_branches, method=method, radius=radius
    )
    return assemble(basis, parts)


def grow(
    network: Network,
    inputs: InputSet,
    region: InputSet,
    spec: OutputSpec,
    start: tuple[np.ndarray, np.ndarray] | Part,
    budget: int,
    *,
    method: str = "symbolic",
    radius: list[tuple[np.ndarray, np.ndarray]] | None = None,
    target: Network | None = None,
) -> list[Part]:
    """The branching loop of Algorithm 1, all in u coordinates: boxes are tightened to
    ``region``, counterexamples must lie in ``inputs`` and break ``target`` (as in
    `evaluate`), and the boxes may grow to ``budget`` branches in all. ``start``: the split
    boxes (lo, hi), or branches already computed with this network (their first evaluation
    is then not repeated)."""
    parts: list[Part] = []
    evaluated = start if isinstance(start, Part) else None
    split_lo, split_hi = (start.split_lo, start.split_hi) if evaluated is not None else start
    total = split_lo.shape[0]
    while split_lo.shape[0]:
        if evaluated is None:
            lo, hi, empty = region.tighten(split_lo, split_hi)
            ev = evaluate(
                network, inputs, spec, lo, hi, empty, method=method, radius=radius, target=target
            )
        else:
            lo, hi, ev, evaluated = evaluated.box_lo, evaluated.box_hi, evaluated.ev, None
        open_ = ev.status == UNKNOWN
        room = budget - total
        if not open_.any() or room <= 0 or (ev.status == VIOLATED).any():
            parts.append(Part(split_lo, split_hi, lo, hi, ev))
            break
        candidates = np.flatnonzero(open_)
        excess = (ev.upper - spec.d).max(axis=1)
        split = candidates[np.argsort(-excess[candidates], kind="stable")[:room]]
        keep = np.setdiff1d(np.arange(split_lo.shape[0]), split)
        parts.append(Part(split_lo[keep], split_hi[keep], lo[keep], hi[keep], ev.take(keep)))
        total += split.size
        dimension = np.argmax(ev.gradient[split] + 1e-300 * (hi[split] - lo[split]), axis=1)
        middle = (lo[split, dimension] + hi[split, dimension]) / 2
        left_hi, right_lo = split_hi[split].copy(), split_lo[split].copy()
        rows = np.arange(split.size)
        left_hi[rows, dimension] = middle
        right_lo[rows, dimension] = middle
        split_lo = np.vstack([split_lo[split], right_lo])
        split_hi = np.vstack([left_hi, split_hi[split]])
    return parts


@dataclass(frozen=True)
class Part:
    """Branches computed together: split boxes, computed boxes and their evaluation."""

    split_lo: np.ndarray
    split_hi: np.ndarray
    box_lo: np.ndarray
    box_hi: np.ndarray
    ev: Evaluation


def assemble(basis: Basis, parts: list[Part]) -> Branches:
    """One branch set from parts (in order)."""
    cat = np.concatenate
    evs = [p.ev for p in parts]
    inputs = [
        LayerInput(*(cat([getattr(e.inputs[i], name) for e in evs]) for name in LAYER_FIELDS))
        for i in range(len(evs[0].inputs))
    ]
    return Branches(
        basis,
        cat([p.split_lo for p in parts]),
        cat([p.split_hi for p in parts]),
        cat([p.box_lo for p in parts]),
        cat([p.box_hi for p in parts]),
        cat([e.status for e in evs]),
        cat([e.upper for e in evs]),
        cat([e.point for e in evs]),
        cat([e.gradient for e in evs]),
        inputs,
    )
