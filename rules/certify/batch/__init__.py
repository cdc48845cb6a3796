"""Complete L-inf robustness verification of many inputs: BaVerLy mini-batches over HiGHS MILPs,
and the one-by-one MIPVerify-style baseline."""

from vigil.rules.certify.batch.runner import (
    METHODS,
    SIZERS,
    InvalidBatchInput,
    Report,
    verify_inputs,
)
from vigil.rules.relu_milp import BOUNDS, Solver, VerificationError

__all__ = [
    "BOUNDS",
    "METHODS",
    "SIZERS",
    "InvalidBatchInput",
    "Report",
    "Solver",
    "VerificationError",
    "verify_inputs",
]
