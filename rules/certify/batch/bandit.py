"""Choosing the next mini-batch size: Thompson sampling over bucketed sizes, or at random."""

from __future__ import annotations

import numpy as np


class ThompsonSizer:
    """Gaussian mean-variance Thompson sampling; one arm per bucket of batch sizes.

    An arm plays the largest size of its bucket and is credited with the batch it chose, even
    when fewer balls were left to take. Rewards are velocities (balls proven per second),
    scaled by the largest velocity seen so the risk weight ``rho`` is unit-free. Unplayed arms
    go first, largest first, as the paper starts from large batches.
    """

    def __init__(self, max_batch: int, bucket: int = 4, rho: float = 0.1, seed: int = 0) -> None:
        if max_batch < 1 or bucket < 1:
            raise ValueError(f"max_batch and bucket must be >= 1, got {max_batch}, {bucket}")
        self.arms = list(range(min(bucket, max_batch), max_batch + 1, bucket))
        if self.arms[-1] != max_batch:
            self.arms.append(max_batch)
        self.bucket = bucket
        self.rho = rho
        self.rewards: list[list[float]] = [[] for _ in self.arms]
        self.rng = np.random.default_rng(seed)

    def _arm_of(self, size: int) -> int:
        return next(i for i, top in enumerate(self.arms) if size <= top)

    def choose(self) -> int:
        fresh = [i for i, r in enumerate(self.rewards) if not r]
        if fresh:
            return self.arms[fresh[-1]]
        scale = max(max(r) for r in self.rewards) or 1.0
        pooled = np.var(np.concatenate([np.asarray(r) / scale for r in self.rewards]))
        best, best_score = 0, -np.inf
        for i, rewards in enumerate(self.rewards):
            obs = np.asarray(rewards) / scale
            n = len(obs)
            var = float(np.var(obs, ddof=1)) if n > 1 else float(pooled)
            var = max(var, 1e-6)
            sampled_var = var * max(n - 1, 1) / self.rng.chisquare(max(n - 1, 1))
            mean = self.rng.normal(obs.mean(), np.sqrt(sampled_var / n))
            score = mean - self.rho * sampled_var
            if score > best_score:
                best, best_score = i, score
        return self.arms[best]

    def update(self, chosen: int, velocity: float) -> None:
        """Reward the arm that ``choose`` returned ``chosen`` for."""
        self.rewards[self._arm_of(chosen)].append(float(velocity))


class RandomSizer:
    """The ablation: a uniformly random batch size in 1..max_batch, learning nothing."""

    def __init__(self, max_batch: int, seed: int = 0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.rng = np.random.default_rng(seed)

    def choose(self) -> int:
        return int(self.rng.integers(1, self.max_batch + 1))

    def update(self, chosen: int, velocity: float) -> None:
        """Random sizes ignore rewards."""


class SplitChooser:
    """The split layer of the next batch: each layer 1..``hidden`` once, the last first, then
    the layer with the fewest seconds per ball decided so far.

    Totals, not a mean of per-batch velocities: a few small batches of near-identical balls
    verify very fast at an early split while the large ones fail and refine, and a mean of
    velocities would keep favouring that layer although it costs the most time in all.
    """

    def __init__(self, hidden: int) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.balls = dict.fromkeys(range(hidden, 0, -1), 0)
        self.seconds = dict.fromkeys(range(hidden, 0, -1), 0.0)

    @property
    def exploring(self) -> bool:
        """Some layer has not been tried yet."""
        return not all(self.balls.values())

    def choose(self) -> int:
        untried = [k for k, n in self.balls.items() if not n]
        if untried:
            return untried[0]
        return min(self.balls, key=lambda k: self.seconds[k] / self.balls[k])

    def update(self, split: int, balls: int, seconds: float) -> None:
        """A batch of ``balls`` split at ``split`` took ``seconds``, refinements included."""
        self.balls[split] += balls
        self.seconds[split] += seconds
