"""BaVerLy mini-batch verification against one-by-one MIPVerify-style verification.

    python bench/batch_verify.py [--n 100] [--classes 0 3 8] [--nets 3x100 5x100]
                                 [--eps 0.02 0.03] [--max-batch 16] [--no-ablation]
                                 [--train standard|ibp] [--train-eps 0.05] [--repeats 1]
                                 [--bounds lp|milp] [--bound-time 1.0]

Networks are trained here on scikit-learn's 8x8 handwritten digits (pixels scaled to [0, 1]):
fully connected ReLU MLPs, by scikit-learn (``--train standard``) or by certified interval
training in numpy (``--train ibp``; the paper's networks were robustly trained too).
No convolutional network: the ONNX loader in rules/reach/network.py reads Gemm/MatMul
chains only. Each set holds the first ``--n`` inputs of one class; both
verifiers run in this process on the same set, and the script fails unless every verdict is
identical. The ablation replaces the Thompson-sampling batch sizes by random ones.
``--bounds`` applies to both verifiers alike: LP tightening, or MILP tightening as in the
paper's MIPVerify baseline and its Algorithms 2-3.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

from vigil.rules.certify.batch import BOUNDS, Solver, verify_inputs
from vigil.rules.reach.network import Network


def train(hidden: tuple[int, ...], seed: int = 0) -> bytes:
    """Standard training: scikit-learn's MLPClassifier."""
    digits = load_digits()
    clf = MLPClassifier(hidden, activation="relu", max_iter=300, random_state=seed)
    clf.fit(digits.data / 16.0, digits.target)
    layers = [(w.T, b) for w, b in zip(clf.coefs_, clf.intercepts_, strict=True)]
    return Network.from_arrays(layers).to_onnx()


def _adam(params, grads, state, step, lr):
    for p, g, (m, v) in zip(params, grads, state, strict=True):
        m *= 0.9
        m += 0.1 * g
        v *= 0.999
        v += 0.001 * g * g
        p -= lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)


def _ce_grad(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p / len(y)


def train_ibp(hidden: tuple[int, ...], eps: float, epochs: int = 60, seed: int = 0) -> bytes:
    """Certified (interval bound propagation) training in numpy, like the robustly trained
    networks of the paper: cross-entropy on clean logits mixed with the interval worst case
    over the eps-ball, eps and the mix ramped up over the first half of training."""
    digits = load_digits()
    x, y = digits.data / 16.0, digits.target
    rng = np.random.default_rng(seed)
    sizes = [x.shape[1], *hidden, 10]
    ws = [rng.normal(0, np.sqrt(2 / a), (b, a)) for a, b in itertools.pairwise(sizes)]
    bs = [np.zeros(b) for b in sizes[1:]]
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in ws + bs]
    depth, step = len(ws), 0
    for epoch in range(epochs):
        ramp = min(1.0, epoch / (epochs * 0.5))
        e, kappa = eps * ramp, 1.0 - 0.5 * ramp
        for _ in range(len(x) // 64):
            idx = rng.integers(0, len(x), 64)
            xb, yb = x[idx], y[idx]
            acts = [xb]
            for i in range(depth):
                z = acts[-1] @ ws[i].T + bs[i]
                acts.append(np.maximum(z, 0) if i < depth - 1 else z)
            lo, hi = np.clip(xb - e, 0, 1), np.clip(xb + e, 0, 1)
            mids, rads, pres = [], [], []
            for i in range(depth):
                mid, rad = (hi + lo) / 2, (hi - lo) / 2
                mids.append(mid)
                rads.append(rad)
                zm, zr = mid @ ws[i].T + bs[i], rad @ np.abs(ws[i]).T
                pres.append((zm - zr, zm + zr))
                lo, hi = np.maximum(zm - zr, 0), np.maximum(zm + zr, 0)
            own = np.eye(10, dtype=bool)[yb]
            worst = np.where(own, pres[-1][0], pres[-1][1])
            gw = [np.zeros_like(w) for w in ws]
            gb = [np.zeros_like(b) for b in bs]
            g = _ce_grad(acts[-1], yb) * kappa
            for i in range(depth - 1, -1, -1):
                gw[i] += g.T @ acts[i]
                gb[i] += g.sum(axis=0)
                g = (g @ ws[i]) * (acts[i] > 0) if i else g
            gworst = _ce_grad(worst, yb) * (1 - kappa)
            g_lo, g_hi = np.where(own, gworst, 0), np.where(own, 0, gworst)
            for i in range(depth - 1, -1, -1):
                if i < depth - 1:
                    g_lo, g_hi = g_lo * (pres[i][0] > 0), g_hi * (pres[i][1] > 0)
                g_mid, g_rad = g_lo + g_hi, g_hi - g_lo
                gw[i] += g_mid.T @ mids[i] + np.sign(ws[i]) * (g_rad.T @ rads[i])
                gb[i] += g_mid.sum(axis=0)
                g_m, g_r = g_mid @ ws[i], g_rad @ np.abs(ws[i])
                g_lo, g_hi = (g_m - g_r) / 2, (g_m + g_r) / 2
            step += 1
            _adam(ws + bs, gw + gb, state, step, 2e-3)
    return Network.from_arrays(list(zip(ws, bs, strict=True))).to_onnx()


def run(model: bytes, x, y, eps: float, method: str, sizer: str, mb: int, repeats: int, solver):
    """Median wall time over ``repeats`` runs and the first run's report; every run must
    give the same verdicts."""
    times, first = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        report = verify_inputs(
            model,
            x,
            y,
            eps,
            clip=(0.0, 1.0),
            max_batch=mb,
            method=method,
            sizer=sizer,
            solver=solver,
        )
        times.append(time.perf_counter() - start)
        if first is None:
            first = report
        elif [v["verdict"] for v in report.verdicts] != [v["verdict"] for v in first.verdicts]:
            raise SystemExit(f"{method}/{sizer}: verdicts changed between repeats")
    return statistics.median(times), first


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100, help="inputs per set (one class)")
    p.add_argument("--classes", type=int, nargs="+", default=[0, 3, 8])
    p.add_argument("--nets", nargs="+", default=["3x100", "5x100"], help="DEPTHxWIDTH")
    p.add_argument("--eps", type=float, nargs="+", default=[0.02, 0.03])
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1, help="runs per method; median time")
    p.add_argument("--no-ablation", action="store_true", help="skip the random-batch-size run")
    p.add_argument(
        "--train",
        choices=["standard", "ibp"],
        default="standard",
        help="scikit-learn MLP, or certified interval training at --train-eps",
    )
    p.add_argument("--train-eps", type=float, default=0.05)
    p.add_argument("--bounds", choices=BOUNDS, default="lp", help="neuron tightening, both methods")
    p.add_argument("--bound-time", type=float, default=1.0, help="seconds per MILP bound")
    args = p.parse_args()
    solver = Solver(bounds=args.bounds, bound_time=args.bound_time)

    digits = load_digits()
    x_all, y_all = digits.data / 16.0, digits.target
    header = (
        f"{'net':>6} {'eps':>5} {'class':>5} {'n':>4} {'robust':>6} {'!robust':>7} "
        f"{'1-by-1 s':>9} {'BaVerLy s':>9} {'speed-up':>8} {'random s':>9} {'MAB gain':>8}"
    )
    print(
        f"bounds: {args.bounds}" + (f" ({args.bound_time} s each)" if args.bounds == "milp" else "")
    )
    print(header)
    speedups, gains = [], []
    for spec in args.nets:
        depth, width = (int(v) for v in spec.split("x"))
        hidden = (width,) * depth
        model = train(hidden) if args.train == "standard" else train_ibp(hidden, args.train_eps)
        for eps in args.eps:
            for c in args.classes:
                pick = np.flatnonzero(y_all == c)[: args.n]
                x, y = x_all[pick], y_all[pick]
                t_one, one = run(
                    model, x, y, eps, "one-by-one", "thompson", args.max_batch, args.repeats, solver
                )
                t_bat, bat = run(
                    model, x, y, eps, "baverly", "thompson", args.max_batch, args.repeats, solver
                )
                verdicts = [v["verdict"] for v in one.verdicts]
                if verdicts != [v["verdict"] for v in bat.verdicts]:
                    print(f"verdicts differ: {spec} eps={eps} class={c}", file=sys.stderr)
                    return 1
                t_rnd = float("nan")
                if not args.no_ablation:
                    t_rnd, rnd = run(
                        model, x, y, eps, "baverly", "random", args.max_batch, args.repeats, solver
                    )
                    if verdicts != [v["verdict"] for v in rnd.verdicts]:
                        print(f"random-size verdicts differ: {spec} {eps} {c}", file=sys.stderr)
                        return 1
                    gains.append(t_rnd / t_bat)
                speedups.append(t_one / t_bat)
                s = one.summary
                print(
                    f"{spec:>6} {eps:>5} {c:>5} {len(x):>4} {s['robust']:>6} {s['not_robust']:>7} "
                    f"{t_one:>9.2f} {t_bat:>9.2f} {t_one / t_bat:>7.2f}x {t_rnd:>9.2f} "
                    f"{t_rnd / t_bat:>7.2f}x",
                    flush=True,
                )
                print(
                    f"        BaVerLy: split {bat.summary['split_layers']} batches "
                    f"{bat.summary['batches']} refinements {bat.summary['refinements']} "
                    f"fallbacks {bat.summary['fallbacks']} time {bat.summary['time']}",
                    flush=True,
                )
    print(f"average speed-up (BaVerLy vs one-by-one): {statistics.mean(speedups):.2f}x")
    if gains:
        print(f"average MAB gain (random sizes / Thompson): {statistics.mean(gains):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
