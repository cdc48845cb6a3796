"""APΔS (Algorithm 1): the largest plausible shift a counterfactual survives, by sampling.

Lemma 4 (tolerance limits): if n realisations drawn uniformly from the shift box all keep the
counterfactual valid, then with confidence gamma at least a fraction R of the box does, for
n = ceil(log(1 - gamma) / log(R)).

One uniform draw u in [-1, 1]^k per realisation is made per counterfactual and scaled by each
probed delta (theta + delta * u is uniform on the delta box), so every probe still tests n
independent uniform realisations while costing one batched forward pass and no new random
numbers. With the noise fixed the first layer is affine in delta and is precomputed.
"""

from __future__ import annotations

import math

import numpy as np

from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.certify.cfx.search import DELTA_INIT, largest_delta
from vigil.rules.reach.network import Network

MAX_SAMPLED = 100_000_000
"""Cap on n x parameters, the uniform noise ShiftSample holds (800 MB of float64)."""


class InvalidConfidence(ValueError):
    """gamma or R is outside (0, 1), or needs more realisations than MAX_SAMPLED allows."""


def parameter_count(network: Network) -> int:
    """Weights and biases of ``network``: the values each realisation samples."""
    return sum(w.size + b.size for w, b in zip(network.weights, network.biases, strict=True))


def sample_size(gamma: float, R: float, parameters: int = 1) -> int:
    """Realisations needed for confidence ``gamma`` that a fraction ``R`` is robust (Lemma 4).

    Raises when n realisations of ``parameters`` values each exceed MAX_SAMPLED, so a
    near-1 (gamma, R) fails fast instead of exhausting memory.
    """
    for name, value in (("gamma", gamma), ("R", R)):
        if not 0.0 < value < 1.0:
            raise InvalidConfidence(f"{name} must be in (0, 1), got {value}")
    n = math.ceil(math.log(1.0 - gamma) / math.log(R))
    if n * parameters > MAX_SAMPLED:
        raise InvalidConfidence(
            f"gamma={gamma}, R={R} need n={n} realisations of {parameters} parameters, "
            f"over the cap of {MAX_SAMPLED:.0e} sampled values"
        )
    return n


class ShiftSample:
    """n realisations theta + delta * u of a network, evaluated at one fixed input.

    ``weight_noise[l]`` has shape (n, out, in) and ``bias_noise[l]`` (n, out), uniform on
    [-1, 1]; the realisation at delta has weights W_l + delta * weight_noise[l][i].
    """

    def __init__(
        self,
        network: Network,
        x: np.ndarray,
        target: int,
        n: int,
        rng: np.random.Generator,
    ) -> None:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape[0] != network.input_dim:
            raise ValueError(
                f"counterfactual has {x.shape[0]} features, the model expects {network.input_dim}"
            )
        if n < 1:
            raise ValueError(f"sample size must be >= 1, got {n}")
        self.network = network
        self.n = n
        self.weight_noise = [rng.uniform(-1.0, 1.0, size=(n, *w.shape)) for w in network.weights]
        self.bias_noise = [rng.uniform(-1.0, 1.0, size=(n, b.shape[0])) for b in network.biases]
        rows = margin_rows(network, target)
        w, b = network.weights, network.biases
        # First layer: z = (W + d U) x + b + d u = a + d g, with a, g independent of d.
        self._a = w[0] @ x + b[0]
        self._g = np.einsum("nij,j->ni", self.weight_noise[0], x) + self.bias_noise[0]
        # Later layers, the margin rows folded into the last one:
        # margin_r = (C W) h + C b + d (C U h + C u).
        self._layers: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        if len(w) == 1:
            self._a, self._g = rows @ self._a, self._g @ rows.T
        else:
            self._layers = [
                *zip(w[1:-1], b[1:-1], self.weight_noise[1:-1], self.bias_noise[1:-1], strict=True),
                (
                    rows @ w[-1],
                    rows @ b[-1],
                    np.einsum("rk,nki->nri", rows, self.weight_noise[-1]),
                    self.bias_noise[-1] @ rows.T,
                ),
            ]

    def margins(self, delta: float) -> np.ndarray:
        """Each realisation's margin at shift ``delta`` (>= 0: the counterfactual stays valid)."""
        z = self._a + delta * self._g
        for w, b, u, ub in self._layers:
            h = np.maximum(z, 0.0)
            z = h @ w.T + b + delta * (np.einsum("nij,nj->ni", u, h) + ub)
        return z.min(axis=1)

    def robust_at(self, delta: float) -> bool:
        """True when every realisation at ``delta`` keeps the counterfactual valid."""
        return bool(self.margins(delta).min() >= 0.0)

    def realisation(self, i: int, delta: float) -> Network:
        """Realisation ``i`` at ``delta`` as a plain network (for checks and witnesses)."""
        return Network(
            tuple(
                w + delta * u[i]
                for w, u in zip(self.network.weights, self.weight_noise, strict=True)
            ),
            tuple(
                b + delta * u[i] for b, u in zip(self.network.biases, self.bias_noise, strict=True)
            ),
            self.network.output,
        )


def apas_delta_max(
    network: Network,
    x: np.ndarray,
    target: int = 1,
    gamma: float = 0.999,
    R: float = 0.995,
    rng: np.random.Generator | None = None,
    delta_init: float = DELTA_INIT,
) -> float:
    """Largest delta at which all n = sample_size(gamma, R) realisations keep ``x`` valid."""
    n = sample_size(gamma, R, parameter_count(network))
    sample = ShiftSample(network, x, target, n, rng or np.random.default_rng())
    return largest_delta(sample.robust_at, delta_init)
