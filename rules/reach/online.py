"""The online verifier: re-establish ``f^t(X(t)) ⊆ Y`` at every time step, reusing what still holds.

Six accelerations of Wei & Liu, each switchable:

* BMI — on an input-set change keep the branches; a branch whose new set lies inside the set its
  result was computed for reuses that result; the others are recomputed.
* RSR — compute each branch over its set loosened by ``gamma`` so later drift stays inside it.
* LB — a holding branch also stays valid while the input drift since it was computed is within
  its output margin divided by the network's Lipschitz bound.
* BMW — on a weight change keep the branches and recompute their reach sets (no re-branching).
* INN — compute over an interval network ``W +- r`` (r a multiple of the largest one-step change
  seen per layer); while later weights stay inside the intervals, nothing is recomputed. Only an
  interval that still verifies is useful: when a rebuild over the interval network covers
  ``rebuild_drop`` less than the last rebuild over the exact one, the multiple is halved.
* IC — when only a suffix of the layers changed, restart propagation from the cached bounds of the
  first changed layer's input.

Without BMI (BMW) a changed input set (network) means reach + branch from scratch. All branches
are rebuilt when the coverage rate falls ``rebuild_drop`` below its value after the last rebuild.

A step the branches leave ``unknown`` may go on to the complete search (``complete.decide``,
within ``complete_seconds``): its ``unsat`` makes the step ``holds``, its ``sat`` ``violated``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vigil.rules.reach.basis import sample
from vigil.rules.reach.branch import (
    EMPTY,
    HOLDS,
    UNKNOWN,
    VIOLATED,
    Branches,
    assemble,
    evaluate,
    grow,
    reach_and_branch,
)
from vigil.rules.reach.complete import decide
from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.reach.symbolic import LAYER_FIELDS, LayerInput

_MIN_INN_SCALE = 1 / 16
_INN_BRANCH_FACTOR = 8
"""An interval network may be refined to at most this many times the branches the exact
network needed at its last rebuild: one that needs more costs more at every re-centring than
the steps inside it save, so its range is halved instead."""
ACCELERATIONS = ("bmi", "rsr", "lb", "bmw", "inn", "ic")


@dataclass(frozen=True)
class Accelerations:
    """Which accelerations run; ``rsr`` is the offset gamma and ``inn`` the interval range as a
    multiple of the largest one-step layer change (0 switches either off)."""

    bmi: bool = False
    rsr: float = 0.0
    lb: bool = False
    bmw: bool = False
    inn: float = 0.0
    ic: bool = False

    def __post_init__(self) -> None:
        if self.rsr < 0 or self.inn < 0:
            raise ValueError(f"rsr and inn must be >= 0, got {self.rsr} and {self.inn}")

    @classmethod
    def parse(cls, text: str, rsr: float = 1e-3, inn: float = 5.0) -> Accelerations:
        """From names joined by '+', e.g. ``"bmw+inn+ic"``; ``""`` or ``"none"`` for none."""
        names = {n.strip().lower() for n in text.split("+") if n.strip()} - {"none"}
        unknown = names - set(ACCELERATIONS)
        if unknown:
            raise ValueError(
                f"unknown accelerations {sorted(unknown)}; choose from {ACCELERATIONS}"
            )
        return cls(
            bmi="bmi" in names,
            rsr=rsr if "rsr" in names else 0.0,
            lb="lb" in names,
            bmw="bmw" in names,
            inn=inn if "inn" in names else 0.0,
            ic="ic" in names,
        )


@dataclass(frozen=True)
class StepResult:
    """One verification step's outcome."""

    status: str  # holds | violated | unknown
    coverage: float
    branches: int
    reused: int
    recomputed: int
    rebuilt: bool
    seconds: float
    counterexample: list[float] | None
    complete: str | None = None
    """The complete search's answer (``sat``, ``unsat``, ``timeout``, ``unknown``) when the
    branches left the step unknown; None when it did not run."""

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "coverage": self.coverage,
            "branches": self.branches,
            "reused": self.reused,
            "recomputed": self.recomputed,
            "rebuilt": self.rebuilt,
            "seconds": self.seconds,
            "counterexample": self.counterexample,
            "complete": self.complete,
        }


def lipschitz_bound(weights: list[np.ndarray]) -> float:
    """An L2 Lipschitz bound of a ReLU network: the product of the layers' spectral norms."""
    return float(np.prod([np.linalg.norm(w, 2) for w in weights]))


def overall(branches: Branches) -> tuple[str, list[float] | None]:
    """The verdict over all branches, with a counterexample when one was found."""
    violated = np.flatnonzero(branches.status == VIOLATED)
    if violated.size:
        return "violated", branches.basis.points(branches.point[violated[:1]])[0].tolist()
    return ("holds" if branches.verified.all() else "unknown"), None


class OnlineVerifier:
    """Keeps the branch set and its results between steps; see the module docstring."""

    def __init__(
        self,
        spec: OutputSpec,
        *,
        max_branches: int = 250,
        accelerations: Accelerations | None = None,
        method: str = "symbolic",
        coverage_samples: int = 1000,
        rebuild_drop: float = 0.05,
        seed: int = 0,
        complete_seconds: float = 0.0,
    ) -> None:
        if max_branches < 1 or coverage_samples < 1:
            raise ValueError("max_branches and coverage_samples must be >= 1")
        if not complete_seconds >= 0:
            raise ValueError(f"complete_seconds must be >= 0, got {complete_seconds}")
        self.spec = spec
        self.complete_seconds = complete_seconds
        self.max_branches = max_branches
        self.acc = accelerations or Accelerations()
        self.method = method
        self.coverage_samples = coverage_samples
        self.rebuild_drop = rebuild_drop
        self._rng = np.random.default_rng(seed)
        self.branches: Branches | None = None
        self._inputs: InputSet | None = None
        self._network: Network | None = None
        self._centre: Network | None = None  # the weights the results were computed around
        self._radius: list[tuple[np.ndarray, np.ndarray]] | None = None
        self._ranges = np.zeros(0)  # interval half-width per layer (0 without INN)
        self._change: np.ndarray | None = None  # largest one-step change seen, per layer
        self._coverage_now = 0.0
        self._verdict: tuple[str, list[float] | None] = ("unknown", None)
        self._complete: str | None = None
        self._lipschitz: float | None = None
        self._samples: np.ndarray | None = None
        self._sample_branch = np.zeros(0, dtype=np.int64)
        self._inside = np.zeros(0, dtype=bool)  # which samples lie in the set _inside_of
        self._inside_of: InputSet | None = None
        self._boxes: tuple | None = None  # the input set in u and the branches' boxes in it
        self._baseline_coverage = 0.0
        self._exact_coverage = 0.0  # coverage of the last rebuild without interval weights
        self._exact_branches = 1  # and its number of branches
        self._inn_scale = 1.0  # halved while the interval network loses coverage
        self._rebuild_next = False

    def step(
        self,
        inputs: InputSet,
        network: Network,
        confirm: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> StepResult:
        """Verify ``network`` on ``inputs`` now, reusing earlier results where still valid;
        ``confirm`` computes the network's last-layer values for the complete search's
        counterexamples (onnxruntime; by default the network's own layers)."""
        if inputs.dim != network.input_dim or network.output_dim != self.spec.output_dim:
            raise ValueError(
                f"network maps {network.input_dim} -> {network.output_dim}, but the input set has "
                f"{inputs.dim} dimensions and the spec {self.spec.output_dim} outputs"
            )
        start = time.perf_counter()
        first_changed = self._observe(network)
        input_changed = self._inputs is None or not inputs.same_as(self._inputs)
        rebuild = (
            self.branches is None
            or self._rebuild_next
            or first_changed == -1
            or (input_changed and not self.acc.bmi)
            or (first_changed is not None and not self.acc.bmw)
        )
        if rebuild:
            reused, recomputed = 0, self._rebuild(inputs, network)
        else:
            reused, recomputed = self._update(inputs, network, first_changed, input_changed)
        self._inputs, self._network = inputs, network
        # a complete search's answer is for these weights only (branches may hold for an
        # interval of them)
        stale = self._complete is not None and first_changed is not None
        if rebuild or recomputed or input_changed or stale:  # else nothing changed
            self._coverage_now = self._coverage(inputs, fresh=rebuild)
            self._verdict, self._complete = overall(self.branches), None
            if self._verdict[0] == "unknown" and self.complete_seconds > 0:
                self._decide(inputs, network, confirm)
        coverage = self._coverage_now
        shrink = False
        if rebuild:
            self._baseline_coverage = coverage
            if not self._ranges.any():
                self._exact_coverage, self._exact_branches = coverage, len(self.branches)
            elif coverage < self._exact_coverage - self.rebuild_drop:
                shrink = True  # the interval is too wide to verify what the network satisfies
                self._inn_scale = self._inn_scale / 2 if self._inn_scale > _MIN_INN_SCALE else 0.0
        self._rebuild_next = shrink or coverage < self._baseline_coverage - self.rebuild_drop
        status, point = self._verdict
        return StepResult(
            status,
            coverage,
            len(self.branches),
            reused,
            recomputed,
            rebuild,
            time.perf_counter() - start,
            point,
            self._complete,
        )

    def _decide(
        self,
        inputs: InputSet,
        network: Network,
        confirm: Callable[[np.ndarray], np.ndarray] | None,
    ) -> None:
        """The complete search on the whole set, for a step the branches left unknown."""
        verdict = decide(network, inputs, self.spec, self.complete_seconds, confirm)
        self._complete = verdict.result
        if verdict.result == "unsat":
            self._verdict = ("holds", None)
        elif verdict.result == "sat":
            assert verdict.x is not None
            self._verdict = ("violated", verdict.x.tolist())

    def _observe(self, network: Network) -> int | None:
        """First layer whose weights changed since the last step (None: none, -1: new shape).

        Non-finite weights are rejected before any state changes: a NaN range would let every
        later network pass as inside the interval."""
        old = self._network
        if old is None or [w.shape for w in old.weights] != [w.shape for w in network.weights]:
            layers = zip(network.weights, network.biases, strict=True)
            _reject_non_finite([np.isfinite(w).all() and np.isfinite(b).all() for w, b in layers])
            if old is None:
                return None
            self._change = None  # one-step changes of the old layers say nothing of the new
            return -1
        change = np.array(
            [
                max(_distance(w, old_w), _distance(b, old_b))
                for w, b, old_w, old_b in zip(
                    network.weights, network.biases, old.weights, old.biases, strict=True
                )
            ]
        )
        _reject_non_finite(np.isfinite(change))  # the old layers are finite
        self._change = change if self._change is None else np.maximum(self._change, change)
        changed = np.flatnonzero(change)
        return int(changed[0]) if changed.size else None

    def _interval(self, network: Network) -> None:
        """Centre the interval network on the current weights."""
        self._centre = network
        self._lipschitz = None
        change = self._change if self._change is not None else np.zeros(len(network.weights))
        self._ranges = self.acc.inn * self._inn_scale * change
        self._radius = (
            [
                (np.full(w.shape, r), np.full(b.shape, r))
                for w, b, r in zip(network.weights, network.biases, self._ranges, strict=True)
            ]
            if self.acc.inn
            else None
        )

    def _weights_valid(self, network: Network) -> bool:
        """Whether the weights of ``network`` lie inside the interval network."""
        if self._centre is None:
            return False
        centre = self._centre
        for w, b, c_w, c_b, r in zip(
            network.weights,
            network.biases,
            centre.weights,
            centre.biases,
            self._ranges,
            strict=True,
        ):
            if _distance(w, c_w) > r or _distance(b, c_b) > r:
                return False
        return True

    def _rebuild(self, inputs: InputSet, network: Network) -> int:
        self._interval(network)
        self.branches = reach_and_branch(
            network,
            inputs,
            self.spec,
            self._branch_limit(),
            method=self.method,
            radius=self._radius,
            relax=self.acc.rsr,
        )
        self._samples = self._boxes = None
        return len(self.branches)

    def _update(
        self, inputs: InputSet, network: Network, first_changed: int | None, input_changed: bool
    ) -> tuple[int, int]:
        br = self.branches
        weights_ok = first_changed is None or self._weights_valid(network)
        if not input_changed and weights_ok and not (br.status == VIOLATED).any():
            return len(br), 0  # every result still stands for the same set and weights
        basis = br.basis
        if input_changed or self._boxes is None:
            region = basis.inputs(inputs)
            work_region = basis.inputs(inputs.relaxed(self.acc.rsr)) if self.acc.rsr else region
            lo, hi, empty = region.tighten(br.split_lo, br.split_hi)
            work = (
                work_region.tighten(br.split_lo, br.split_hi) if self.acc.rsr else (lo, hi, empty)
            )
            self._boxes = (region, work_region, lo, hi, empty, *work)
        region, work_region, lo, hi, empty, work_lo, work_hi, work_empty = self._boxes
        same_box = np.all((work_lo == br.box_lo) & (work_hi == br.box_hi), axis=1)
        inside = np.all((lo >= br.box_lo) & (hi <= br.box_hi), axis=1)
        holding = br.status == HOLDS
        valid = same_box | (holding & inside) if self.acc.bmi else same_box.copy()
        if self.acc.lb:
            valid |= holding & self._lipschitz_tolerates(lo, hi)
        valid &= weights_ok
        valid &= ~((br.status == VIOLATED) & ~self._still_violated(inputs, network))
        # "empty" says nothing about the box's reach set: it stands while the box stays empty
        valid &= (br.status != EMPTY) | empty
        now_empty = empty & ~valid
        br.status[now_empty] = EMPTY  # box, bounds and cache stay those last computed
        valid |= now_empty
        todo = np.flatnonzero(~valid)
        if todo.size == 0:
            return len(br), 0
        recentre = not weights_ok
        while True:
            start = self._recentre(network) if recentre else 0
            # over the interval network: its centre +- the range, whatever the weights now;
            # counterexamples must break the weights now
            u_network, u_radius = basis.network(self._centre), basis.radius(self._radius)
            target = None if network is self._centre else basis.network(network)
            # an empty branch skipped the last recentres: its cache may be older than the centre
            incremental = (
                same_box[todo] & (br.status[todo] != EMPTY)
                if start
                else np.zeros(todo.size, dtype=bool)
            )
            for part, layer in ((incremental, start), (~incremental, 0)):
                if not part.any():
                    continue
                index = todo[part]
                ev = evaluate(
                    u_network,
                    region,
                    self.spec,
                    work_lo[index],
                    work_hi[index],
                    work_empty[index],
                    method=self.method,
                    radius=u_radius,
                    start=layer,
                    cached=[s.take(index) for s in br.inputs[: layer + 1]] if layer else None,
                    target=target,
                )
                br.box_lo[index], br.box_hi[index] = work_lo[index], work_hi[index]
                br.status[index], br.upper[index], br.point[index] = ev.status, ev.upper, ev.point
                br.gradient[index] = ev.gradient
                for offset, state in enumerate(ev.inputs):
                    _put(br.inputs, layer + offset, index, state)
            refined = self._refine(region, work_region, u_network, u_radius, target)
            br = self.branches
            if not (recentre and self._inn_scale) or self._interval_verifies(inputs):
                return len(br) - todo.size, int(todo.size) + refined
            self._inn_scale = self._inn_scale / 2 if self._inn_scale > _MIN_INN_SCALE else 0.0
            todo = np.arange(len(br))
            work_lo, work_hi, work_empty = br.box_lo, br.box_hi, br.status == EMPTY
            same_box = np.ones(len(br), dtype=bool)

    def _recentre(self, network: Network) -> int:
        """Centre the interval on ``network``; returns the layer recomputation may start from
        (IC: the first layer whose centre weights or range moved, so the cached bounds of the
        layers before it were computed over the same interval layers)."""
        old, kept = self._centre, self._ranges
        self._interval(network)
        if not self.acc.ic or old is None:
            return 0
        layers = zip(network.weights, network.biases, old.weights, old.biases, strict=True)
        for i, (w, b, old_w, old_b) in enumerate(layers):
            if _distance(w, old_w) or _distance(b, old_b) or kept[i] != self._ranges[i]:
                return i
        return 0

    def _interval_verifies(self, inputs: InputSet) -> bool:
        """Whether the interval network, refined within the budget, keeps the coverage of the
        last rebuild over the exact network."""
        return self._coverage(inputs, fresh=False) >= self._exact_coverage - self.rebuild_drop

    def _refine(
        self,
        region: InputSet,
        work_region: InputSet,
        network: Network,
        radius: list[tuple[np.ndarray, np.ndarray]] | None,
        target: Network | None,
    ) -> int:
        """Bisect branches left unknown, within the branch budget (smaller for an interval
        network, see ``_INN_BRANCH_FACTOR``); returns the branches computed."""
        br = self.branches
        parents = np.flatnonzero(br.status == UNKNOWN)
        budget = self._branch_limit() - (len(br) - parents.size)
        if parents.size == 0 or budget <= parents.size:
            return 0
        parts = grow(
            network,
            region,
            work_region,
            self.spec,
            br.part(parents),  # their results are for this network and these boxes
            budget,
            method=self.method,
            radius=radius,
            target=target,
        )
        keep = np.setdiff1d(np.arange(len(br)), parents)
        self.branches = assemble(br.basis, [br.part(keep), *parts])
        self._boxes = None
        if self._samples is not None:
            self._sample_branch = self.branches.locate(self._samples)
        return 2 * (len(self.branches) - len(br))  # two new branches per bisection

    def _branch_limit(self) -> int:
        if self._ranges.any():
            return min(self.max_branches, _INN_BRANCH_FACTOR * self._exact_branches)
        return self.max_branches

    def _lipschitz_tolerates(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Which branches' input drift (in u coordinates) their output margins absorb."""
        br = self.branches
        if self._lipschitz is None:
            weights = list(self._centre.weights)
            if self.acc.inn:
                weights = [np.abs(w) + r for w, r in zip(weights, self._ranges, strict=True)]
                weights[0] = weights[0] @ np.abs(br.basis.to_x)
            else:
                weights[0] = weights[0] @ br.basis.to_x
            self._lipschitz = lipschitz_bound(weights)
        drift = np.linalg.norm(np.maximum(0.0, np.maximum(br.box_lo - lo, hi - br.box_hi)), axis=1)
        margin = self.spec.d - br.upper  # (B, k)
        scale = np.linalg.norm(self.spec.C, axis=1) * self._lipschitz
        with np.errstate(invalid="ignore"):
            return np.all(drift[:, None] * scale <= margin, axis=1)

    def _still_violated(self, inputs: InputSet, network: Network) -> np.ndarray:
        br = self.branches
        result = np.zeros(len(br), dtype=bool)
        rows = np.flatnonzero(br.status == VIOLATED)
        if rows.size:
            x = br.basis.points(br.point[rows])
            result[rows] = (self.spec.violation(network.logits(x)) > 0) & inputs.contains(x)
        return result

    def _coverage(self, inputs: InputSet, fresh: bool) -> float:
        """Share of the input set in verified branches, on samples drawn at the last rebuild
        (each located once in its branch) that still lie in the set."""
        br = self.branches
        inside = None
        if not fresh and self._samples is not None:
            known = self._inside_of is not None and inputs.same_as(self._inside_of)
            inside = self._inside if known else inputs.contains(self._samples)
        if inside is None or inside.sum() < self.coverage_samples // 2:
            self._samples = sample(inputs, self.coverage_samples, self._rng, br.basis)
            self._sample_branch = br.locate(self._samples)
            inside = np.ones(self.coverage_samples, dtype=bool)
        self._inside, self._inside_of = inside, inputs
        index = self._sample_branch[inside]
        return float(np.mean((index >= 0) & br.verified[np.maximum(index, 0)]))


def _reject_non_finite(finite: list[bool] | np.ndarray) -> None:
    bad = np.flatnonzero(~np.asarray(finite, dtype=bool))
    if bad.size:
        raise ValueError(f"layer {bad[0]} of the network has non-finite weights or biases")


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference between two parameter arrays; 0 without a look when they are the
    same (read-only) array."""
    return 0.0 if a is b else float(np.abs(a - b).max(initial=0.0))


def _put(layers: list[LayerInput], i: int, index: np.ndarray, state: LayerInput) -> None:
    for name in LAYER_FIELDS:
        getattr(layers[i], name)[index] = getattr(state, name)
