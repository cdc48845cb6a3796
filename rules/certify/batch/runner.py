"""Verify a set of labelled inputs of an ONNX classifier: BaVerLy or one-by-one, per class.

Shared by the CLI, the daemon job and the benchmark. Every "not robust" verdict carries an
adversarial input that onnxruntime misclassifies; anything else is an error, never a verdict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vigil.rules.certify.batch.baverly import BatchVerifier, Progress, Stats, verify_one_by_one
from vigil.rules.certify.batch.mipverify import ball_box
from vigil.rules.reach.network import Network, OnnxRunner, load_checked
from vigil.rules.relu_milp import DEFAULT_SOLVER, Solver, VerificationError

METHODS = ("baverly", "one-by-one")
SIZERS = ("thompson", "random")
CONTAINMENT_TOL = 1e-9


class InvalidBatchInput(ValueError):
    """The inputs, labels or options of a batch verification are malformed."""


class InvalidModel(InvalidBatchInput):
    """The model cannot be verified here (unreadable, unsupported, or not a classifier)."""


@dataclass(frozen=True)
class Report:
    """One verdict dict per input (in input order) and the run's summary."""

    verdicts: list[dict]
    summary: dict


def _validate(
    inputs: np.ndarray,
    labels: np.ndarray,
    eps: float,
    clip: tuple[float, float] | None,
    max_batch: int,
    method: str,
    sizer: str,
) -> None:
    if inputs.ndim != 2 or not len(inputs):
        raise InvalidBatchInput(
            f"inputs must be a non-empty (n, d) array, got shape {inputs.shape}"
        )
    if not np.isfinite(inputs).all():
        raise InvalidBatchInput("inputs hold NaN or infinite values")
    if labels.shape != (len(inputs),):
        raise InvalidBatchInput(f"labels must have shape ({len(inputs)},), got {labels.shape}")
    if not (math.isfinite(eps) and eps > 0):
        raise InvalidBatchInput(f"eps must be a positive finite number, got {eps}")
    if clip is not None:
        lo, hi = clip
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise InvalidBatchInput(f"clip must be finite lo < hi, got {clip}")
        outside = np.flatnonzero(((inputs < lo) | (inputs > hi)).any(axis=1))
        if outside.size:
            raise InvalidBatchInput(
                f"{outside.size} inputs lie outside the clip range [{lo}, {hi}] "
                f"(first: index {int(outside[0])})"
            )
    if max_batch < 1:
        raise InvalidBatchInput(f"max_batch must be >= 1, got {max_batch}")
    if method not in METHODS:
        raise InvalidBatchInput(f"method must be one of {METHODS}, got {method!r}")
    if sizer not in SIZERS:
        raise InvalidBatchInput(f"sizer must be one of {SIZERS}, got {sizer!r}")


def _labels(raw: np.ndarray, classes: int) -> np.ndarray:
    labels = np.asarray(raw)
    if labels.ndim != 1:
        raise InvalidBatchInput(f"labels must be one-dimensional, got shape {labels.shape}")
    if labels.size and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise InvalidBatchInput("labels must be integers")
    labels = labels.astype(np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        raise InvalidBatchInput(
            f"labels must lie in 0..{classes - 1}; index {int(bad[0])} has {int(labels[bad[0]])}"
        )
    return labels


def _checker(runner: OnnxRunner, label: int) -> Callable[[np.ndarray], bool]:
    return lambda x: int(np.argmax(runner(x[None, :])[0])) != label


def _prepare(
    model: bytes,
    inputs: np.ndarray,
    labels: np.ndarray,
    eps: float,
    clip: tuple[float, float] | None,
    max_batch: int,
    method: str,
    sizer: str,
) -> tuple[Network, OnnxRunner, np.ndarray, np.ndarray]:
    """The loaded model and the validated inputs and labels; InvalidBatchInput (InvalidModel)
    names what is wrong."""
    try:
        x = np.asarray(inputs, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidBatchInput(f"inputs are not numeric: {e}") from None
    try:
        network, runner = load_checked(model)
    except Exception as e:  # unparsable bytes, unsupported operators, numpy/onnx disagreement
        raise InvalidModel(f"cannot use the model: {e}") from None
    if network.output_dim < 2:
        raise InvalidModel(
            f"the model has {network.output_dim} output; robustness is checked as 'the "
            "label's score stays the largest', which needs one score per class (two or more "
            "outputs)"
        )
    try:
        y = _labels(labels, network.output_dim)
    except InvalidBatchInput:
        raise
    except (TypeError, ValueError) as e:
        raise InvalidBatchInput(f"labels are not numeric: {e}") from None
    _validate(x, y, eps, clip, max_batch, method, sizer)
    if x.shape[1] != network.input_dim:
        raise InvalidBatchInput(
            f"inputs have {x.shape[1]} features, the model expects {network.input_dim}"
        )
    return network, runner, x, y


def check_inputs(
    model: bytes,
    inputs: np.ndarray,
    labels: np.ndarray,
    eps: float,
    clip: tuple[float, float] | None = None,
    max_batch: int = 16,
    method: str = "baverly",
    sizer: str = "thompson",
) -> None:
    """Raise what ``verify_inputs`` would raise for bad input, without verifying anything
    (before the inputs are split into chunks that run elsewhere)."""
    _prepare(model, inputs, labels, eps, clip, max_batch, method, sizer)


def label_chunks(labels: np.ndarray, size: int) -> list[np.ndarray]:
    """The fan-out unit: the indices of each label's inputs, in input order, in chunks of at
    most ``size``; labels ascending, as ``verify_inputs`` takes them. A label's inputs are
    one chunk when there are at most ``size`` of them, so its mini-batches are formed from
    the same balls, in the same order, as in one ``verify_inputs`` call."""
    if size < 1:
        raise InvalidBatchInput(f"chunk size must be >= 1, got {size}")
    y = np.asarray(labels)
    chunks = []
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        chunks += [members[s : s + size] for s in range(0, len(members), size)]
    return chunks


def merge_reports(parts: Sequence[tuple[np.ndarray, Report]], seconds: float) -> Report:
    """One report from reports on disjoint subsets of the inputs (``parts``: each subset's
    indices into the whole, and its report), verdicts re-indexed into input order. Counts and
    times add up; ``split_layers`` and ``batch_sizes`` follow the parts' order; ``seconds``
    is the wall time of the whole run."""
    inputs = sum(len(indices) for indices, _ in parts)
    verdicts: list[dict | None] = [None] * inputs
    for indices, report in parts:
        for verdict in report.verdicts:
            i = int(indices[verdict["index"]])
            verdicts[i] = {**verdict, "index": i}
    if any(v is None for v in verdicts):
        raise ValueError("the parts do not cover every input exactly once")
    first = parts[0][1].summary
    summary = {
        "inputs": inputs,
        **{k: sum(r.summary[k] for _, r in parts) for k in ("robust", "not_robust")},
        "misclassified": sum(r.summary["misclassified"] for _, r in parts),
        "seconds": round(seconds, 4),
        "method": first["method"],
        "bounds": first["bounds"],
    }
    if "time" in first:  # BaVerLy
        summary["time"] = {
            k: round(sum(r.summary["time"][k] for _, r in parts), 4) for k in first["time"]
        }
        for key in ("batches", "refinements", "fallbacks"):
            summary[key] = sum(r.summary[key] for _, r in parts)
        for key in ("split_layers", "batch_sizes"):
            summary[key] = [v for _, r in parts for v in r.summary[key]]
        summary["sizer"] = first["sizer"]
    return Report(verdicts, summary)  # type: ignore[arg-type]


def verify_inputs(
    model: bytes,
    inputs: np.ndarray,
    labels: np.ndarray,
    eps: float,
    clip: tuple[float, float] | None = None,
    max_batch: int = 16,
    method: str = "baverly",
    sizer: str = "thompson",
    seed: int = 0,
    solver: Solver = DEFAULT_SOLVER,
    progress: Progress | None = None,
) -> Report:
    """Robust / not_robust / misclassified for every input's eps-ball (L-inf, clipped).

    ``solver`` says how bounds are tightened (LP or MILP, in both methods alike).
    """
    network, runner, x, y = _prepare(model, inputs, labels, eps, clip, max_batch, method, sizer)
    start = time.perf_counter()
    predicted = np.argmax(runner(x), axis=1)
    verdicts: list[dict] = [{"index": i, "verdict": "misclassified"} for i in range(len(x))]
    stats = Stats()
    if progress:
        progress(int(np.sum(predicted != y)))
    for label in np.unique(y[predicted == y]):
        members = np.flatnonzero((y == label) & (predicted == y))
        boxes = [ball_box(x[i], eps, clip) for i in members]
        check = _checker(runner, int(label))
        if method == "one-by-one":
            outcomes = verify_one_by_one(network, boxes, int(label), check, solver, progress)
        else:
            outcomes = BatchVerifier(
                network, boxes, int(label), check, solver, stats, progress
            ).verify(min(max_batch, len(boxes)), sizer, seed)
        for local, outcome in outcomes.items():
            i = int(members[local])
            if outcome.robust:
                verdicts[i] = {"index": i, "verdict": "robust"}
                continue
            adv = outcome.adversarial
            box = boxes[local]
            inside = np.all(adv >= box.lower - CONTAINMENT_TOL) and np.all(
                adv <= box.upper + CONTAINMENT_TOL
            )
            if not inside or not check(adv):
                raise VerificationError(
                    f"input {i}: the MILP counterexample is not confirmed by onnxruntime "
                    "(a tie within solver tolerance)"
                )
            verdicts[i] = {"index": i, "verdict": "not_robust", "adversarial_example": adv.tolist()}
    counts = {v: sum(d["verdict"] == v for d in verdicts) for v in ("robust", "not_robust")}
    summary = {
        "inputs": len(x),
        "robust": counts["robust"],
        "not_robust": counts["not_robust"],
        "misclassified": int(np.sum(predicted != y)),
        "seconds": round(time.perf_counter() - start, 4),
        "method": method,
        "bounds": solver.bounds,
    }
    if method == "baverly":
        summary.update(stats.as_dict())
        summary["sizer"] = sizer
    return Report(verdicts, summary)
