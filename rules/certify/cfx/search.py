"""The delta search shared by APΔS (Algorithm 1) and its provable variant (Algorithm 4)."""

from __future__ import annotations

from collections.abc import Callable

DELTA_INIT = 1e-4
"""Smallest shift probed, and the width at which the binary search stops."""

DELTA_CAP = 1e6
"""Doubling stops here: a counterfactual robust at the cap is reported at exactly the cap."""


def largest_delta(
    robust_at: Callable[[float], bool],
    delta_init: float = DELTA_INIT,
    delta_cap: float = DELTA_CAP,
) -> float:
    """Largest delta ``robust_at`` accepts, to within ``delta_init``; 0 if it rejects delta_init.

    Doubles delta (the last probe clipped to ``delta_cap``, returned if accepted) until the
    first rejection, then bisects between the last accepted and the first rejected value until
    they are ``delta_init`` apart, and returns the accepted end, so the returned value is always
    one that ``robust_at`` accepted (or 0).
    """
    if not delta_init > 0:
        raise ValueError(f"delta_init must be positive, got {delta_init}")
    if not robust_at(delta_init):
        return 0.0
    low = delta_init
    high = min(2.0 * delta_init, delta_cap)
    while robust_at(high):
        if high >= delta_cap:
            return high
        low, high = high, min(2.0 * high, delta_cap)
    while high - low > delta_init:
        mid = 0.5 * (low + high)
        if robust_at(mid):
            low = mid
        else:
            high = mid
    return low
