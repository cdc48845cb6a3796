"""Online input-output robustness monitoring as exact fixed-radius near-neighbour search."""

from vigil.rules.ior.backends import BACKENDS
from vigil.rules.ior.monitor import InvalidDecision, Monitor
from vigil.rules.ior.spec import InputMetric, MonitorSpec, OutputKind, OutputMetric
from vigil.rules.ior.witnesses import Witnesses

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
