"""Exact FRNN backends behind one interface; ``BACKENDS`` maps names to classes."""

from rules.ior.backends.auto import AutoBackend
from rules.ior.backends.base import Backend
from rules.ior.backends.bruteforce import BruteForceBackend
from rules.ior.backends.kdtree import KDTreeBackend
from rules.ior.backends.parallel import ParallelBackend
from rules.ior.backends.snn import SNNBackend

BACKENDS: dict[str, type[Backend]] = {
    b.name: b for b in (AutoBackend, BruteForceBackend, KDTreeBackend, ParallelBackend, SNNBackend)
}

__all__ = [
    "BACKENDS",
    "AutoBackend",
    "Backend",
    "BruteForceBackend",
    "KDTreeBackend",
    "ParallelBackend",
    "SNNBackend",
]
