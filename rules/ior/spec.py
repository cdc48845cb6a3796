"""What a monitor checks: the input metric, eps, the output semantics and the feature view."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


class InputMetric(StrEnum):
    LINF = "linf"
    L2 = "l2"
    L1 = "l1"


class OutputMetric(StrEnum):
    """Distance between probability vectors; labels use 0/1 (same or different)."""

    L1 = "l1"
    LINF = "linf"
    TV = "tv"


class OutputKind(StrEnum):
    LABEL = "label"
    PROBABILITIES = "probabilities"


@dataclass(frozen=True)
class MonitorSpec:
    """The i.o.r. property: decision j is a witness for n iff
    ``d_in(x_j, x_n) <= eps`` and the outputs differ (labels) or ``d_out > delta`` (vectors).

    ``scale`` multiplies each raw feature before distances are taken; ``ignore`` lists raw
    feature indices left out of ``d_in`` (protected attributes, for individual fairness).
    ``quantitative`` also reports, per decision, the largest ``d_out / d_in`` over earlier
    decisions within eps (a local, data-driven Lipschitz estimate) and where it is attained.
    """

    dim: int
    eps: float
    metric: InputMetric = InputMetric.LINF
    output: OutputKind = OutputKind.LABEL
    delta: float = 0.0
    output_metric: OutputMetric = OutputMetric.LINF
    output_dim: int = 1
    scale: tuple[float, ...] | None = None
    ignore: tuple[int, ...] = field(default_factory=tuple)
    quantitative: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "metric", InputMetric(self.metric))
        object.__setattr__(self, "output", OutputKind(self.output))
        object.__setattr__(self, "output_metric", OutputMetric(self.output_metric))
        object.__setattr__(self, "ignore", tuple(sorted(set(int(i) for i in self.ignore))))
        if self.scale is not None:
            object.__setattr__(self, "scale", tuple(float(s) for s in self.scale))
        if not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be a positive integer, got {self.dim!r}")
        if not (isinstance(self.eps, int | float) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        if not (math.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"delta must be a finite number >= 0, got {self.delta!r}")
        if self.output is OutputKind.LABEL and self.delta != 0:
            raise ValueError("delta applies to probability outputs only; labels differ or not")
        if self.output is OutputKind.PROBABILITIES and self.output_dim < 2:
            raise ValueError(f"probability outputs need output_dim >= 2, got {self.output_dim}")
        bad = [i for i in self.ignore if not 0 <= i < self.dim]
        if bad:
            raise ValueError(f"ignore lists feature indices outside 0..{self.dim - 1}: {bad}")
        if len(self.ignore) == self.dim:
            raise ValueError("ignore leaves no feature to compare")
        if self.scale is not None:
            if len(self.scale) != self.dim:
                raise ValueError(f"scale has {len(self.scale)} entries, expected dim={self.dim}")
            if not all(math.isfinite(s) and s > 0 for s in self.scale):
                raise ValueError("scale entries must be finite and > 0")

    @property
    def kept(self) -> np.ndarray:
        """Raw feature indices that enter ``d_in``."""
        return np.setdiff1d(np.arange(self.dim), np.asarray(self.ignore, dtype=np.int64))

    @property
    def view_dim(self) -> int:
        return self.dim - len(self.ignore)

    def view(self, x: np.ndarray) -> np.ndarray:
        """Map raw inputs (n, dim) to the float64 space where ``d_in`` is measured."""
        v = np.asarray(x, dtype=np.float64)
        if self.ignore:
            v = v[:, self.kept]
        if self.scale is not None:
            v = v * np.asarray(self.scale, dtype=np.float64)[self.kept]
        return np.ascontiguousarray(v)

    def to_dict(self) -> dict:
        return {
            "dim": self.dim,
            "eps": self.eps,
            "metric": self.metric.value,
            "output": self.output.value,
            "delta": self.delta,
            "output_metric": self.output_metric.value,
            "output_dim": self.output_dim,
            "scale": list(self.scale) if self.scale is not None else None,
            "ignore": list(self.ignore),
            "quantitative": self.quantitative,
        }

    @classmethod
    def from_dict(cls, d: dict) -> MonitorSpec:
        d = dict(d)
        if d.get("scale") is not None:
            d["scale"] = tuple(d["scale"])
        d["ignore"] = tuple(d.get("ignore", ()))
        return cls(**d)
