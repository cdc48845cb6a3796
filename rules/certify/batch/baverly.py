"""BaVerLy: complete robustness verification of many balls of one class in mini-batches.

Per batch: bounds of each ball up to the split layer k, one disjunctive MILP (Eq. 1-2) from
layer k to the output, and refinement of the ball a counterexample names (verified alone,
reusing its prefix bounds) while the rest of the batch goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vigil.rules.certify.batch.bandit import RandomSizer, SplitChooser, ThompsonSizer
from vigil.rules.certify.batch.clustering import BatchTree, activation_patterns
from vigil.rules.certify.batch.mipverify import (
    Check,
    Outcome,
    attack,
    falsify,
    hidden_bounds,
    hidden_layers,
    prefix_bounds,
    verify_ball,
)
from vigil.rules.reach.network import Network
from vigil.rules.relu_milp import (
    Layer,
    ReluModel,
    Solver,
    VerificationError,
    interval_layer,
)

Progress = Callable[[int], None]
"""Told how many more balls got a verdict."""

DEFAULT_BATCH_BUDGET = 5.0
"""Seconds one batch MILP run may take at most; past it the batch's balls are verified alone."""
PROBE_SIZE = 4
"""Balls per batch while some split layer has not been tried yet."""
BUDGET_FACTOR = 0.5
"""A batch may also take at most this many times what its balls would cost one by one
(running mean of single-ball times), so a hopeless batch costs a bounded detour."""


@dataclass
class Stats:
    """Where the time went (seconds) and how often batches needed refinement."""

    falsify: float = 0.0
    cluster: float = 0.0
    bounds: float = 0.0
    batch: float = 0.0
    refine: float = 0.0
    batches: int = 0
    refinements: int = 0
    fallbacks: int = 0
    split_layers: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "time": {
                k: round(getattr(self, k), 4)
                for k in ("falsify", "cluster", "bounds", "batch", "refine")
            },
            "batches": self.batches,
            "refinements": self.refinements,
            "fallbacks": self.fallbacks,
            "split_layers": self.split_layers,
            "batch_sizes": self.batch_sizes,
        }


class BatchVerifier:
    """BaVerLy over the balls of one class (Algorithm 1 of the paper)."""

    def __init__(
        self,
        network: Network,
        boxes: list[Layer],
        label: int,
        check: Check,
        solver: Solver,
        stats: Stats,
        progress: Progress | None = None,
        batch_budget: float = DEFAULT_BATCH_BUDGET,
    ) -> None:
        self.network = network
        self.boxes = boxes
        self.label = label
        self.check = check
        self.solver = solver
        self.batch_budget = batch_budget
        self.single_times: list[float] = []
        self.stats = stats
        self.progress = progress or (lambda n: None)
        self.outcomes: dict[int, Outcome] = {}

    def _decide(self, i: int, outcome: Outcome) -> None:
        self.outcomes[i] = outcome
        self.progress(1)

    def run_batch(self, ids: list[int], split: int) -> tuple[int, float]:
        """Verify the balls ``ids`` jointly from ``split``; (balls proven in batch, batch time)."""
        start = time.perf_counter()
        prefix = {i: prefix_bounds(self.network, self.boxes[i], split, self.solver) for i in ids}
        bounded = time.perf_counter()
        self.stats.bounds += bounded - start
        posts = [prefix[i][-1].post for i in ids]
        members = list(range(len(ids)))
        refine_time = 0.0

        def refine(pos: int) -> None:
            nonlocal refine_time
            r0 = time.perf_counter()
            i = ids[pos]
            outcome = verify_ball(
                self.network,
                self.boxes[i],
                self.label,
                known=prefix[i],
                solver=self.solver,
            )  # no attack: verify() already ran it on every ball
            refine_time += time.perf_counter() - r0
            self.single_times.append(time.perf_counter() - r0)
            self.stats.refinements += 1
            self._decide(i, outcome)
            members.remove(pos)

        budget = self.batch_budget
        if self.single_times:
            budget = min(budget, BUDGET_FACTOR * len(ids) * float(np.mean(self.single_times)))
        model = ReluModel(self.solver, budget)
        over_budget = False
        try:
            model.start_union(posts)
            hull = Layer(
                np.min([p.lower for p in posts], axis=0), np.max([p.upper for p in posts], axis=0)
            )
            # over a union of boxes the next layer's exact bounds are the per-box intervals
            known = []
            if split < hidden_layers(self.network):
                w, b = self.network.weights[split], self.network.biases[split]
                parts = [interval_layer(w, b, p) for p in posts]
                known = [
                    Layer(
                        np.min([q.lower for q in parts], axis=0),
                        np.max([q.upper for q in parts], axis=0),
                    )
                ]
            hidden_bounds(self.network, model, hull, split, hidden_layers(self.network), known)
            point = attack(model, self.network, self.label)
        except VerificationError:
            point, over_budget = None, True
        while point is not None:
            choice = point[model.choice_cols]
            pos = max(members, key=lambda m: choice[m])
            refine(pos)
            if not members:
                break
            model.exclude_choice(pos)
            try:
                point = model.solve_milp()
            except VerificationError:
                point, over_budget = None, True
        if over_budget:  # the batch gave no verdict: each remaining ball is verified alone
            self.stats.fallbacks += 1
            for pos in list(members):
                refine(pos)
        for m in members:
            self._decide(ids[m], Outcome(True))
        elapsed = time.perf_counter() - bounded - refine_time
        self.stats.batch += elapsed
        self.stats.refine += refine_time
        self.stats.batches += 1
        self.stats.batch_sizes.append(len(ids))
        return len(members), (bounded - start) + elapsed

    def verify(self, max_batch: int, sizer: str, seed: int) -> dict[int, Outcome]:
        """Verdicts for every ball, index into ``boxes``."""
        t0 = time.perf_counter()
        pending = []
        for i, box in enumerate(self.boxes):
            found = falsify(self.network, box, self.label, self.check)
            if found is None:
                pending.append(i)
            else:
                self._decide(i, found)
        t1 = time.perf_counter()
        self.stats.falsify += t1 - t0
        hidden = hidden_layers(self.network)
        if not hidden:  # a linear classifier: nothing to batch
            for i in pending:
                outcome = verify_ball(self.network, self.boxes[i], self.label, solver=self.solver)
                self._decide(i, outcome)
            return self.outcomes
        if not pending:
            return self.outcomes
        centres = np.stack([(self.boxes[i].lower + self.boxes[i].upper) / 2.0 for i in pending])
        tree = BatchTree(activation_patterns(self.network, centres), pending)
        t2 = time.perf_counter()
        self.stats.cluster += t2 - t1
        sizes = (
            ThompsonSizer(max_batch, seed=seed)
            if sizer == "thompson"
            else RandomSizer(max_batch, seed=seed)
        )
        splits = SplitChooser(hidden)
        while tree.remaining():
            split = splits.choose()
            size = min(PROBE_SIZE, max_batch) if splits.exploring else sizes.choose()
            ids = tree.take(size)
            began, refined = time.perf_counter(), self.stats.refinements
            proven, seconds = self.run_batch(ids, split)
            total = time.perf_counter() - began
            sizes.update(size, proven / max(seconds, 1e-9))
            splits.update(split, len(ids), total)
            self.stats.split_layers.append(split)
            if split == hidden and self.stats.refinements == refined:
                self.single_times.append(total / len(ids))
        return self.outcomes


def verify_one_by_one(
    network: Network,
    boxes: list[Layer],
    label: int,
    check: Check,
    solver: Solver,
    progress: Progress | None = None,
) -> dict[int, Outcome]:
    """The baseline: every ball verified alone over the whole network."""
    out = {}
    for i, box in enumerate(boxes):
        out[i] = verify_ball(network, box, label, solver=solver, check=check)
        if progress:
            progress(1)
    return out
