"""Complete L-inf robustness verification of many inputs: BaVerLy mini-batches over HiGHS MILPs,
and the one-by-one MIPVerify-style baseline."""

from vigil.rules.certify.batch.encoding import BOUNDS, Solver, VerificationError
from vigil.rules.certify.batch.runner import (
    METHODS,
    SIZERS,
    InvalidBatchInput,
    Report,
    verify_inputs,
)

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
