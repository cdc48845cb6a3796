"""Online input-output robustness monitoring as exact fixed-radius near-neighbour search."""

from rules.ior.backends import BACKENDS
from rules.ior.monitor import InvalidDecision, Monitor
from rules.ior.spec import InputMetric, MonitorSpec, OutputKind, OutputMetric
from rules.ior.witnesses import Witnesses

__all__ = [
    "BACKENDS",
    "InputMetric",
    "InvalidDecision",
    "Monitor",
    "MonitorSpec",
    "OutputKind",
    "OutputMetric",
    "Witnesses",
]
