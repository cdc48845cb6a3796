"""Robust counterfactuals on German credit (the APΔS paper's Table 1 and Fig. 4 setting).

A base network (20, 10 ReLU hidden units, as in the paper) is trained on a random half D1 of
the data. The shifted model is that network retrained on all the data: its training resumed
from the base weights on D1 and D2 until it converges again (or max_iter). A model trained from
scratch on all of it is reported too. 50 rejected applicants get a robust counterfactual from
Algorithm 2 with the exact MILP test (the MILP-R baseline) and with the APΔS test, each at
several target shifts delta (0.05 is the paper's Credit setting), so durability can be read
against cost. Reported per row: VM1 (valid on the base model), VM2 (valid after retraining) and
VM2s (valid on the from-scratch model) as shares of the applicants asked, a counterfactual not
found counting as not valid (as the paper's evaluation code does), VM2 over the counterfactuals
found, mean L1 cost, mean LOF plausibility (+1 inlier, -1 outlier), mean target margin on the
base model (how deep the counterfactuals sit) and seconds per counterfactual; at each delta both
methods ran, the two are compared applicant by applicant. Then the delta_max search time of
APΔS (batched) against a loop over sampled models, the provable delta of the MILP, and the
probabilistic guarantee checked by exact enumeration on tiny networks.

    .venv/bin/python bench/cfx_bench.py [--count 50] [--milp-deltas 0.02 0.05 0.1]
                                        [--apas-deltas 0.05 0.1 0.2 0.3]
                                        [--max-iterations 100] [--guarantee-runs 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from itertools import count, pairwise
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neighbors import LocalOutlierFactor
from sklearn.neural_network import MLPClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vigil.rules.certify.cfx import (
    ShiftSample,
    apas_delta_max,
    enumerate_shifts,
    provable_delta_max,
    robust_cfx,
    sample_size,
)
from vigil.rules.certify.cfx.decision import margins
from vigil.rules.certify.cfx.search import largest_delta
from vigil.rules.reach.network import Network

GERMAN = Path(__file__).resolve().parents[2] / "shared" / "data" / "german.data-numeric"


def load_german() -> tuple[np.ndarray, np.ndarray]:
    """24 numeric attributes scaled to [0, 1]; label 1 = good credit (the applicant's goal)."""
    if not GERMAN.exists():
        raise SystemExit(f"shared data absent: {GERMAN}")
    data = np.loadtxt(GERMAN)
    x = data[:, :24]
    return (x - x.min(axis=0)) / np.ptp(x, axis=0), (data[:, 24] == 1).astype(int)


def as_network(clf: MLPClassifier) -> Network:
    layers = [(c.T, b) for c, b in zip(clf.coefs_, clf.intercepts_, strict=True)]
    return Network.from_arrays(layers, "sigmoid")


def train_models(
    x: np.ndarray, y: np.ndarray, d1: np.ndarray, seed: int
) -> tuple[Network, Network, Network]:
    """Base (D1), retrained (the base's training resumed on all data), scratch (all data).

    Retraining keeps the base weights (warm start) and restarts the run: a fresh optimiser
    and a fresh convergence test (``best_loss_`` reset: the base's low loss on D1 and its
    spent patience would otherwise stop it after one epoch).
    """

    def classifier() -> MLPClassifier:
        return MLPClassifier(
            (20, 10), learning_rate_init=0.02, batch_size=32, max_iter=1000, random_state=seed
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = classifier().fit(x[d1], y[d1])
        base = as_network(clf)
        clf.set_params(warm_start=True)
        clf.best_loss_ = np.inf
        retrained = as_network(clf.fit(x, y))
        scratch = as_network(classifier().fit(x, y))
    return base, retrained, scratch


def accuracy(network: Network, x: np.ndarray, y: np.ndarray) -> float:
    return float(((margins(network, x, 1) >= 0).astype(int) == y).mean())


def max_shift(a: Network, b: Network) -> float:
    pairs = zip(a.weights + a.biases, b.weights + b.biases, strict=True)
    return max(float(np.abs(p - q).max()) for p, q in pairs)


def delta_max_loop(network: Network, x: np.ndarray, n: int, rng: np.random.Generator) -> float:
    """Baseline: Algorithm 1 as written, fresh realisations per probe, one model at a time."""

    def robust_at(delta: float) -> bool:
        for _ in range(n):
            shifted = Network(
                tuple(w + rng.uniform(-delta, delta, w.shape) for w in network.weights),
                tuple(b + rng.uniform(-delta, delta, b.shape) for b in network.biases),
                network.output,
            )
            if margins(shifted, x, 1)[0] < 0:
                return False
        return True

    return largest_delta(robust_at)


def generate(
    base: Network, xs: np.ndarray, method: str, delta: float, args: argparse.Namespace
) -> tuple[list[np.ndarray | None], list[float]]:
    """One robust counterfactual per row of ``xs`` (None where none was found), and seconds."""
    cfxs, seconds = [], []
    for k, x0 in enumerate(xs):
        start = time.perf_counter()
        result = robust_cfx(
            base,
            x0,
            delta,
            1,
            method,
            rng=np.random.default_rng([args.seed, k]),
            max_iterations=args.max_iterations,
        )
        seconds.append(time.perf_counter() - start)
        cfxs.append(result.x)
    return cfxs, seconds


def table1(args: argparse.Namespace) -> None:
    x, y = load_german()
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x))
    d1 = order[: len(x) // 2]
    base, retrained, scratch = train_models(x, y, d1, args.seed)
    xs = x[[i for i in order if margins(base, x[i], 1)[0] < 0][: args.count]]
    shifted = {"retrained": retrained, "scratch": scratch}
    print(
        f"German credit: base trained on D1 = {len(d1)} rows (accuracy on all "
        f"{accuracy(base, x, y):.3f}); "
        + "; ".join(
            f"{name} on all {len(x)} ({accuracy(m, x, y):.3f}, delta_e = "
            f"{max_shift(base, m):.2f}, accepts {(margins(m, xs, 1) >= 0).sum()} of the "
            f"{len(xs)} applicants unchanged)"
            for name, m in shifted.items()
        )
    )
    lof = LocalOutlierFactor(novelty=True).fit(x)
    runs = [("milp", d) for d in args.milp_deltas] + [("apas", d) for d in args.apas_deltas]
    print(f"\nTable 1 (gamma = 0.999, R = 0.995, n = {sample_size(0.999, 0.995)})")
    print(
        f"{'method':8} {'delta':>6} {'VM1':>6} {'VM2':>6} {'VM2s':>6} {'VM2|f':>7} {'L1':>8} "
        f"{'lof':>6} {'margin':>7} {'s/CFX':>8} found"
    )
    found: list[np.ndarray] = []
    generated: dict[tuple[str, float], list[np.ndarray | None]] = {}
    for method, delta in runs:
        cfxs, seconds = generate(base, xs, method, delta, args)
        generated[method, delta] = cfxs
        ok = [k for k, c in enumerate(cfxs) if c is not None]
        c = np.array([cfxs[k] for k in ok]).reshape(len(ok), x.shape[1])
        valid = [(margins(m, c, 1) >= 0).sum() for m in (base, retrained, scratch)]
        shares = " ".join(f"{v / len(xs):6.0%}" for v in valid)
        nan = float("nan")
        kept = valid[1] / len(ok) if ok else nan
        cost = np.abs(c - xs[ok]).sum(axis=1).mean() if ok else nan
        plausible = lof.predict(c).mean() if ok else nan
        depth = margins(base, c, 1).mean() if ok else nan
        name = "MILP-R" if method == "milp" else "APΔS"
        print(
            f"{name:8} {delta:6.3g} {shares} {kept:7.0%} {cost:8.3f}"
            f" {plausible:6.2f} {depth:7.3f} {np.mean(seconds):8.2f} {len(ok):3d}/{len(xs)}"
        )
        if method == "apas" and delta == args.apas_deltas[0]:
            found = list(c)
    print(
        "VM1, VM2, VM2s: valid on the base, retrained and from-scratch models, of all applicants "
        "(not found = not valid);\nVM2|f: VM2 of the counterfactuals found; L1, lof: means over "
        "those found; margin: mean target logit of those found on the base model (their depth in "
        "the accepted region);\ns/CFX: mean over all applicants"
    )
    paired(base, retrained, generated)
    if found:
        search_times(base, found, args)


def paired(
    base: Network, retrained: Network, generated: dict[tuple[str, float], list[np.ndarray | None]]
) -> None:
    """Applicant by applicant at each delta both methods ran: whose CFX is deeper, who survives.

    The two methods share the generator and differ only in the test that stops the relaxation;
    the exact worst case is never above the sampled minimum, so MILP-R's CFX should be at least
    as deep as APΔS's for nearly every applicant, and survive retraining whenever APΔS's does.
    """
    shared = sorted(d for (m, d) in generated if m == "milp" and ("apas", d) in generated)
    for delta in shared:
        pairs = [
            (a, m)
            for a, m in zip(generated["apas", delta], generated["milp", delta], strict=True)
            if a is not None and m is not None
        ]
        if not pairs:
            continue
        a, m = (np.array(side) for side in zip(*pairs, strict=True))
        deeper = int((margins(base, m, 1) >= margins(base, a, 1) - 1e-6).sum())
        ka, km = margins(retrained, a, 1) >= 0, margins(retrained, m, 1) >= 0
        print(
            f"paired at delta = {delta:g}, {len(pairs)} applicants with both CFXs: MILP-R's is at "
            f"least as deep for {deeper}; after retraining both valid {int((ka & km).sum())}, "
            f"only MILP-R's {int((km & ~ka).sum())}, only APΔS's {int((ka & ~km).sum())}, "
            f"neither {int((~ka & ~km).sum())}"
        )


def search_times(base: Network, cfxs: list[np.ndarray], args: argparse.Namespace) -> None:
    n = sample_size(0.999, 0.995)
    batched, provable_t, deltas, provable = [], [], [], []
    for k, c in enumerate(cfxs):
        repeats = []
        for r in range(args.repeats):
            start = time.perf_counter()
            d = apas_delta_max(base, c, 1, rng=np.random.default_rng([args.seed, k, r]))
            repeats.append(time.perf_counter() - start)
        batched.append(statistics.median(repeats))
        deltas.append(d)
        start = time.perf_counter()
        provable.append(provable_delta_max(base, c, 1))
        provable_t.append(time.perf_counter() - start)
    looped = []
    for k, c in enumerate(cfxs[: args.loop_count]):
        start = time.perf_counter()
        delta_max_loop(base, c, n, np.random.default_rng([args.seed, k]))
        looped.append(time.perf_counter() - start)
    b_med, l_med = statistics.median(batched), statistics.median(looped)
    print(f"\ndelta_max search per CFX, n = {n}, network 24-20-10-1 (721 parameters)")
    print(f"{'search':30} {'median ms':>10} {'CFXs':>5} {'mean delta':>11}")
    mean_delta = f"{np.mean(deltas):11.4f}"
    print(f"{'APΔS batched (einsum)':30} {1e3 * b_med:10.1f} {len(batched):5d} {mean_delta}")
    print(f"{'APΔS loop over models':30} {1e3 * l_med:10.1f} {len(looped):5d}")
    print(
        f"{'provable (MILP, HiGHS)':30} {1e3 * statistics.median(provable_t):10.1f} "
        f"{len(provable_t):5d} {np.mean(provable):11.4f}"
    )
    print(
        f"speed-up of batching: {l_med / b_med:.0f}x; "
        f"provable <= sampled for {sum(p <= d for p, d in zip(provable, deltas, strict=True))}"
        f"/{len(deltas)} CFXs"
    )


def guarantee(args: argparse.Namespace) -> None:
    """Share of runs whose returned delta_max leaves more than 1 - R of the box non-robust."""
    print(f"\nGuarantee at delta_max on tiny networks ({args.guarantee_runs} runs each)")
    print(
        f"{'network':8} {'gamma':>6} {'R':>6} {'n':>4} {'failed':>7} {'undecided':>10} "
        f"{'rate (bounds)':>14} {'rate (MC)':>10} {'1-gamma':>8}"
    )
    for sizes, budget in (([1, 1, 1], 50_000), ([1, 2, 1], 400_000)):
        for gamma, R in ((0.9, 0.9), (0.99, 0.9)):
            runs = failed = undecided = sampled_failed = 0
            for seed in count(1):
                if runs == args.guarantee_runs:
                    break
                rng = np.random.default_rng(seed)
                network = Network.from_arrays(
                    [
                        (rng.normal(size=(o, i)), rng.normal(scale=0.3, size=o))
                        for i, o in pairwise(sizes)
                    ],
                    "sigmoid",
                )
                xs = np.random.default_rng(seed + 1).uniform(-1, 1, size=(64, 1))
                x0 = xs[np.argmax(margins(network, xs, 1))]
                d = apas_delta_max(network, x0, 1, gamma, R, np.random.default_rng(seed))
                if d == 0.0:
                    continue
                runs += 1
                lo, hi = enumerate_shifts(network, x0, 1, d, max_boxes=budget).non_robust_bounds
                failed += lo > 1 - R
                undecided += lo <= 1 - R < hi
                if lo <= 1 - R < hi:  # settle by a large fresh sample (not a proof)
                    fresh = ShiftSample(network, x0, 1, 200_000, np.random.default_rng([seed, 1]))
                    sampled_failed += (fresh.margins(d) < 0).mean() > 1 - R
                else:
                    sampled_failed += lo > 1 - R
            name = "-".join(map(str, sizes))
            rate = f"{failed / runs:.3f}..{(failed + undecided) / runs:.3f}"
            print(
                f"{name:8} {gamma:6} {R:6} {sample_size(gamma, R):4d} {failed:7d} "
                f"{undecided:10d} {rate:>14} {sampled_failed / runs:10.3f} {1 - gamma:8.3f}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=50, help="counterfactuals per method (0: skip)")
    p.add_argument(
        "--milp-deltas",
        type=float,
        nargs="*",
        default=[0.02, 0.05, 0.1],
        help="shifts MILP-R generates for (0.05 is the paper's Credit setting)",
    )
    p.add_argument(
        "--apas-deltas",
        type=float,
        nargs="+",
        default=[0.05, 0.1, 0.2, 0.3],
        help="shifts APΔS generates for; the first is also timed below",
    )
    p.add_argument(
        "--max-iterations",
        type=int,
        default=100,
        help="relaxations per counterfactual (the paper's MILP-R code allows about 100)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="timing repeats per CFX (median)")
    p.add_argument("--loop-count", type=int, default=5, help="CFXs timed with the loop baseline")
    p.add_argument("--guarantee-runs", type=int, default=200)
    args = p.parse_args()
    if args.repeats < 1 or args.loop_count < 1:
        p.error("--repeats and --loop-count must be >= 1")
    if args.count:
        table1(args)
    if args.guarantee_runs:
        guarantee(args)


if __name__ == "__main__":
    main()
