"""``vigil verify reach``: does an ONNX ReLU network keep every input of a box (or polytope) in
the output set ``C y <= d`` (or a VNN-LIB property's safe outputs)?"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import orjson

from vigil.daemon.cli._args import load_npy, seed
from vigil.rules.reach.basis import sample
from vigil.rules.reach.branch import reach_and_branch
from vigil.rules.reach.complete import decide
from vigil.rules.reach.network import OnnxRunner, load_checked
from vigil.rules.reach.online import overall
from vigil.rules.reach.query import safe_set
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.reach.symbolic import METHODS
from vigil.rules.reach.vnnlib import read_query

GROUP = "verify"
_COVERAGE_SAMPLES = 2000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reach",
        help="reachability: check a box of inputs against C y <= d",
        description="Verify that every input x with L <= x <= U (and A x <= b) gives an output "
        "y of the network's last layer with C y <= d. Prints one JSON line.",
    )
    p.add_argument("--model", type=Path, required=True, help="ONNX feed-forward ReLU network")
    p.add_argument("--lower", type=Path, required=True, metavar="L.npy")
    p.add_argument("--upper", type=Path, required=True, metavar="U.npy")
    p.add_argument("--C", type=Path, metavar="C.npy", help="(k, outputs) matrix")
    p.add_argument("--d", type=Path, metavar="D.npy", help="(k,) bounds")
    p.add_argument(
        "--spec",
        type=Path,
        metavar="SPEC.vnnlib",
        help="instead of --C and --d: a VNN-LIB property over the outputs, its unsafe region "
        "a disjunction of single output constraints",
    )
    p.add_argument("--A", type=Path, metavar="A.npy", help="extra input constraints A x <= b")
    p.add_argument("--b", type=Path, metavar="B.npy")
    p.add_argument("--max-branches", type=int, default=250)
    p.add_argument("--method", choices=METHODS, default="symbolic")
    p.add_argument("--seed", type=seed, default=0, help="for the coverage estimate's samples")
    p.add_argument(
        "--complete-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="when the branches leave the answer unknown, decide it by the complete search "
        "(vigil verify vnnlib's) within S seconds; 0: do not (default: 60)",
    )
    p.set_defaults(handler=run)


def _array(path: Path | None, name: str) -> np.ndarray | None:
    return None if path is None else load_npy(path, f"--{name}")


def _output_spec(args: argparse.Namespace) -> OutputSpec:
    if args.spec is not None:
        if args.C is not None or args.d is not None:
            raise ValueError("give --spec or --C and --d, not both")
        return OutputSpec(*safe_set(read_query(args.spec, boxed=False)))
    if args.C is None or args.d is None:
        raise ValueError("give the output spec: --C and --d, or --spec")
    return OutputSpec(_array(args.C, "C"), _array(args.d, "d"))


def run(args: argparse.Namespace) -> int:
    if args.max_branches < 1:
        raise ValueError(f"--max-branches must be >= 1, got {args.max_branches}")
    if not args.complete_seconds >= 0:
        raise ValueError(f"--complete-seconds must be >= 0, got {args.complete_seconds}")
    if (args.A is None) != (args.b is None):
        raise ValueError("--A and --b go together")
    if not args.model.is_file():
        raise ValueError(f"--model {args.model}: no such file")
    start = time.perf_counter()
    network, runner = load_checked(args.model)
    a, b = _array(args.A, "A"), _array(args.b, "b")
    inputs = InputSet(
        _array(args.lower, "lower"),
        _array(args.upper, "upper"),
        *(() if a is None else (a, b)),
    )
    spec = _output_spec(args)
    if inputs.dim != network.input_dim:
        raise ValueError(f"the box has {inputs.dim} dimensions, the model {network.input_dim}")
    if spec.output_dim != network.output_dim:
        raise ValueError(f"C has {spec.output_dim} columns, the model {network.output_dim} outputs")
    branches = reach_and_branch(network, inputs, spec, args.max_branches, method=args.method)
    status, point = overall(branches)
    if point is not None and not _confirmed(runner, network.output, spec, inputs, point):
        status, point = "unknown", None
    coverage = branches.coverage(
        sample(inputs, _COVERAGE_SAMPLES, np.random.default_rng(args.seed))
    )
    complete = None
    if status == "unknown" and args.complete_seconds > 0:
        confirm = runner if network.output == "none" else None
        verdict = decide(network, inputs, spec, args.complete_seconds, confirm)
        complete = verdict.result
        if verdict.result == "unsat":
            status = "holds"
        elif verdict.result == "sat":
            assert verdict.x is not None
            status, point = "violated", verdict.x.tolist()
    result = {
        "status": status,
        "coverage": coverage,
        "branches": len(branches),
        "seconds": time.perf_counter() - start,
        "counterexample": point,
        "complete": complete,
    }
    print(orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY).decode(), flush=True)
    return 0


def _confirmed(
    runner: OnnxRunner, output: str, spec: OutputSpec, inputs: InputSet, point: list[float]
) -> bool:
    """A counterexample counts only if onnxruntime agrees (on logits-only models; with a
    sigmoid or softmax head the spec is on the logits, checked by the loaded layers)."""
    x = np.array([point])
    if not inputs.contains(x)[0]:
        return False
    if output != "none":
        return True
    return bool(spec.violation(runner(x))[0] > 0)
