"""Per-counterfactual certificates as the CLI and the daemon job report them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from vigil.rules.certify.cfx.apas import ShiftSample, parameter_count, sample_size
from vigil.rules.certify.cfx.decision import margins
from vigil.rules.certify.cfx.milp import provable_delta_max
from vigil.rules.certify.cfx.search import largest_delta
from vigil.rules.reach.network import Network


def as_rows(cfx: object, network: Network, name: str = "cfx") -> np.ndarray:
    """Counterfactuals as a finite (m, input_dim) float array; ValueError naming what is wrong."""
    try:
        rows = np.asarray(cfx, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: not a numeric array ({e})") from None
    if rows.ndim == 1:
        rows = rows[None, :]
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"{name}: expected one counterfactual per row, got shape {rows.shape}")
    if rows.shape[1] != network.input_dim:
        raise ValueError(
            f"{name}: rows have {rows.shape[1]} features, the model expects {network.input_dim}"
        )
    if not np.all(np.isfinite(rows)):
        raise ValueError(f"{name}: holds NaN or infinite values")
    return rows


def certify_rows(
    network: Network,
    cfx: np.ndarray,
    target: int = 1,
    gamma: float = 0.999,
    R: float = 0.995,
    provable: bool = False,
    seed: int | None = 0,
) -> Iterator[dict]:
    """One certificate per row: whether the model gives it the target class now (``valid``;
    an invalid row has delta_max 0 like a fragile one), APΔS delta_max, samples used, optional
    provable delta, seconds.

    Each row draws from its own child of ``seed``, so a row's result does not depend on which
    other rows are certified with it.
    """
    n = sample_size(gamma, R, parameter_count(network))
    streams = np.random.SeedSequence(seed).spawn(len(cfx))
    for i, (x, stream) in enumerate(zip(cfx, streams, strict=True)):
        start = time.perf_counter()
        sample = ShiftSample(network, x, target, n, np.random.default_rng(stream))
        entry: dict = {
            "row": i,
            "valid": bool(margins(network, x, target)[0] >= 0),
            "delta_max": largest_delta(sample.robust_at),
            "samples": n,
        }
        if provable:
            entry["provable_delta"] = provable_delta_max(network, x, target)
        entry["seconds"] = time.perf_counter() - start
        yield entry
