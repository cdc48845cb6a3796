"""Abstract prediction (Section 4): bounds on the distance from every admissible input x' to
each training point, the over-approximated neighbour set overNN, and Algorithm 2
(abs_same_label) under n label flips."""

from __future__ import annotations

import numpy as np


def distance_bounds(
    x: np.ndarray,
    train: np.ndarray,
    eps: np.ndarray,
    extra_lo: np.ndarray | float,
    extra_hi: np.ndarray | float,
    power: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of sum_i |x'_i - t_i|^power over the box |x'_i - x_i| <= eps_i,
    per training row t (the paper's closed form, squared for Euclidean); ``extra_*`` add the
    protected attributes' share, bounded separately over their value domains."""
    d = np.abs(train - x)
    lo = np.maximum(d - eps, 0.0)
    hi = d + eps
    if power == 2:
        lo *= lo
        hi *= hi
    return lo.sum(1) + extra_lo, hi.sum(1) + extra_hi


def same_label(
    lb: np.ndarray,
    ub: np.ndarray,
    labels: np.ndarray,
    q: int,
    kset: np.ndarray,
    y: int,
    n: int,
    tol: float,
) -> tuple[bool, int | None]:
    """Algorithm 2 for every K in KSet: overNN_K = {t : LB(t) <= K-th smallest UB (+ tol)};
    S = its points not labelled y; certified iff #y' < K - |S| - 2n for y' the most frequent
    label of S. Returns (certified, the first K that failed)."""
    kmax = int(kset[-1])
    ub_k = np.partition(ub, kmax - 1)[:kmax]
    ub_k.sort()
    thr = ub_k[kset - 1] + tol
    near = lb <= thr[-1]
    lb_near = lb[near]
    order = np.argsort(lb_near, kind="stable")
    cum = np.zeros((len(order) + 1, q), dtype=np.int64)
    np.cumsum(labels[near][order][:, None] == np.arange(q), axis=0, out=cum[1:])
    counts = cum[np.searchsorted(lb_near[order], thr, side="right")]  # (|KSet|, q)
    others = counts.copy()
    others[:, y] = 0
    s_size = others.sum(1)
    rival = others.max(1)
    ok = rival < kset - s_size - 2 * n
    if ok.all():
        return True, None
    return False, int(kset[int(np.argmin(ok))])
