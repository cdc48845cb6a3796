"""Activation patterns and the size-annotated cluster tree that hands out mini-batches."""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import linkage
from scipy.spatial.distance import pdist

from vigil.rules.reach.network import Network


def activation_patterns(network: Network, x: np.ndarray) -> np.ndarray:
    """One bit per hidden ReLU (1 = active, pre-activation > 0) for each row of x."""
    return np.hstack([z > 0.0 for z in network.pre_activations(x)])


class BatchTree:
    """Binary tree of complete-linkage Hamming clustering, each node annotated with the number
    of leaves still in its subtree; batches are removed from it as they are verified."""

    def __init__(self, patterns: np.ndarray, ids: list[int]) -> None:
        n = len(ids)
        if n == 0:
            raise ValueError("a batch tree needs at least one input")
        self.ids = list(ids)
        self.left = np.full(2 * n - 1, -1)
        self.right = np.full(2 * n - 1, -1)
        self.parent = np.full(2 * n - 1, -1)
        self.size = np.zeros(2 * n - 1, dtype=np.int64)
        self.size[:n] = 1
        if n > 1:
            merges = linkage(pdist(patterns, metric="hamming"), method="complete")
            for k, (a, b) in enumerate(merges[:, :2].astype(int)):
                node = n + k
                self.left[node], self.right[node] = a, b
                self.parent[a] = self.parent[b] = node
                self.size[node] = self.size[a] + self.size[b]
        self.n = n
        self.root = 2 * n - 2

    def remaining(self) -> int:
        return int(self.size[self.root])

    def take(self, limit: int) -> list[int]:
        """Remove and return the first subtree in pre-order holding 1..``limit`` inputs."""
        if limit < 1:
            raise ValueError(f"batch size must be >= 1, got {limit}")
        if not self.remaining():
            return []
        node = self.root
        while self.size[node] > limit:
            node = self.left[node] if self.size[self.left[node]] else self.right[node]
        taken = self._leaves(node)
        removed = self.size[node]
        up = node
        while up != -1:
            self.size[up] -= removed
            up = self.parent[up]
        return [self.ids[i] for i in taken]

    def _leaves(self, node: int) -> list[int]:
        out, stack = [], [node]
        while stack:
            v = stack.pop()
            if not self.size[v]:
                continue
            if v < self.n:
                out.append(int(v))
            else:
                stack.extend((self.right[v], self.left[v]))
        return out
