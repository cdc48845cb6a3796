"""Robustness of counterfactual explanations under plausible model shifts (APΔS).

A plausible model shift of size delta moves every weight and bias of a ReLU network by at most
delta. `apas` estimates the largest delta a counterfactual survives with a probabilistic
guarantee, `milp` decides it exactly for an interval network, `enumeration` measures the
non-robust fraction of the shift box on tiny networks, and `generate` builds counterfactuals
that are robust by construction.
"""

from vigil.rules.certify.cfx.apas import ShiftSample, apas_delta_max, sample_size
from vigil.rules.certify.cfx.decision import InvalidTarget, margin_rows
from vigil.rules.certify.cfx.enumeration import Enumeration, enumerate_shifts
from vigil.rules.certify.cfx.generate import RobustCfx, nearest_cfx, robust_cfx
from vigil.rules.certify.cfx.milp import WorstCase, provable_delta_max, worst_case
from vigil.rules.certify.cfx.search import largest_delta

__all__ = [
    "Enumeration",
    "InvalidTarget",
    "RobustCfx",
    "ShiftSample",
    "WorstCase",
    "apas_delta_max",
    "enumerate_shifts",
    "largest_delta",
    "margin_rows",
    "nearest_cfx",
    "provable_delta_max",
    "robust_cfx",
    "sample_size",
    "worst_case",
]
