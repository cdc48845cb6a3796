"""Abstract learning (Algorithms 3-5): the set of every K that cross-validation could choose
on some training set with at most n labels flipped.

Per sample and candidate k (its k cross-validation neighbours are fixed: flips change labels,
never distances), Algorithm 4 says whether the sample *may* be misclassified and Algorithm 5
whether it *must* be. Both are tie-aware so that they hold for any vote tie rule: "may err"
counts a tie as an error, "must err" requires that no flips reach even a tie.

Deliberate difference from the paper: a flipped label can be the held-out sample's own label,
which the paper's per-sample bounds ignore. At most n own labels change, moving the mean of the
fold error rates by at most n / (p * smallest fold), so UB_k and LB_k are widened by that much.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

from vigil.rules.certify.knn.knn import KnnModel, fold_error_rates, fold_ids, label_counts
from vigil.rules.highs import quiet_highs


def _own_and_rival(counts: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Count of the sample's own label y and the largest count of another label."""
    own = np.take_along_axis(counts, y[..., None], axis=-1)[..., 0]
    others = counts.copy()
    np.put_along_axis(others, y[..., None], -1, axis=-1)
    return own, others.max(axis=-1)


def may_err(counts: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """Algorithm 4: flip min(n, #y) y-labels to the strongest other label y'; may err iff y'
    then reaches #y (a tie may be lost)."""
    own, rival = _own_and_rival(counts, y)
    moved = np.minimum(n, own)
    return rival + moved >= own - moved


def _lp_feasible(counts: np.ndarray, y: int, n: int) -> bool:
    """Algorithm 5's LP: can flips f_l (label l -> y, 0 <= f_l <= #l, sum f <= n) bring y to at
    least every other label's count (#l - f_l <= #y + sum f)?"""
    others = [c for c in range(len(counts)) if c != y]
    m = len(others)
    h = quiet_highs()
    inf = highspy.kHighsInf
    h.addVars(m, np.zeros(m), counts[others].astype(np.float64))
    idx = np.arange(m, dtype=np.int32)
    h.addRows(1, np.array([-inf]), np.array([float(n)]), m, np.array([0]), idx, np.ones(m))
    for j, lab in enumerate(others):
        coef = -np.ones(m)
        coef[j] = -2.0
        upper = float(counts[y] - counts[lab])
        h.addRows(1, np.array([-inf]), np.array([upper]), m, np.array([0]), idx, coef)
    h.run()
    return h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def must_err(counts: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """Algorithm 5: must err iff no <= n flips let y reach every other label's count. The two
    necessary conditions (sum over labels, and the strongest rival within 2n) reject most
    samples; for two labels the second is exact, so HiGHS runs only for three or more labels,
    once per distinct (counts, y)."""
    q = counts.shape[-1]
    own, rival = _own_and_rival(counts, y)
    rest = counts.sum(axis=-1) - own
    cond_sum = rest - n <= (q - 1) * (own + n)
    cond_rival = rival - own <= 2 * n
    possible = cond_sum & cond_rival
    if q == 2 or not possible.any():
        return ~possible
    flat_counts = counts.reshape(-1, q)
    flat_y = y.reshape(-1)
    cand = np.flatnonzero(possible.reshape(-1))
    keys = np.column_stack([flat_counts[cand], flat_y[cand]])
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    feasible = np.array([_lp_feasible(u[:q], int(u[q]), n) for u in uniq])
    flat = ~possible.reshape(-1)
    flat[cand] = ~feasible[inverse.reshape(-1)]
    return flat.reshape(possible.shape)


@dataclass(frozen=True)
class AbstractLearning:
    """Error-rate bounds per candidate k and the resulting KSet."""

    ks: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    kset: np.ndarray


def abstract_learn(model: KnnModel, n: int) -> AbstractLearning:
    """Algorithm 3: KSet = {k : LB_k <= min_k' UB_k'} over all training sets with <= n flips."""
    counts = label_counts(model.y[model.cv_nbrs], model.ks, model.q)
    y = np.broadcast_to(model.y[:, None], counts.shape[:-1])
    fold = fold_ids(len(model.y), model.p)
    may = may_err(counts, y, n)
    must = must_err(counts, y, n)
    own_flips = n / (model.p * np.bincount(fold, minlength=model.p).min())
    upper = fold_error_rates(may, fold, model.p) + own_flips
    lower = fold_error_rates(must, fold, model.p) - own_flips
    kset = model.ks[lower <= upper.min() + 1e-12]
    return AbstractLearning(model.ks, lower, upper, kset)
