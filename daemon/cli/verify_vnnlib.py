"""``vigil verify vnnlib``: a VNN-LIB property on an ONNX network, decided as VNN-COMP asks
(``sat`` with a counterexample, ``unsat``, ``unknown`` or ``timeout``)."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import orjson

from vigil.daemon.cli._args import byte_size, out_path, positive_int
from vigil.rules.graph.importer import data_inputs
from vigil.rules.reach.complete import Verdict, verify
from vigil.rules.reach.query import Query, joint_network
from vigil.rules.reach.rounding import load_for
from vigil.rules.reach.vnnlib import read_query

GROUP = "verify"
DEFAULT_MEMORY = 2 << 30
MIN_SEARCH_MEMORY = 32 << 20


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "vnnlib",
        help="decide a VNN-LIB property (1.0 or 2.0) on an ONNX network",
        description="Is there an input in the property's box whose output lies in its unsafe "
        "region? Prints one JSON line (result: sat, unsat, unknown or timeout) and, with "
        "--out, writes the VNN-COMP result file.",
    )
    p.add_argument("model", type=Path, metavar="MODEL.onnx")
    p.add_argument("spec", type=Path, metavar="SPEC.vnnlib", help=".vnnlib or .vnnlib.gz")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the whole run (default 300)"
    )
    p.add_argument(
        "--memory-limit",
        type=byte_size,
        default=DEFAULT_MEMORY,
        metavar="SIZE",
        help="the process's resident memory at most, e.g. 256MB or 4GiB (default 2GiB): the "
        "search gets what loading the model left of it",
    )
    p.add_argument(
        "--cores",
        type=positive_int,
        metavar="N",
        help="cores the search may use: with 2 or more, the MILP runs beside the bounds "
        "(default: the CPUs the process may run on; set it to a container's CPU limit)",
    )
    p.add_argument("--out", type=out_path, metavar="RESULT", help="VNN-COMP result file")
    p.set_defaults(handler=run)


def solve(
    model: Path | bytes,
    query: Query,
    timeout: float,
    started: float,
    progress: Callable[[dict[str, int]], None] | None = None,
    memory_limit: int = DEFAULT_MEMORY,
    cores: int | None = None,
) -> Verdict:
    """Load and check the model (a file, or a merged model's bytes), then decide the
    query; the time already spent since
    ``started`` counts against ``timeout``, the memory the process holds then against
    ``memory_limit``."""
    if not timeout > 0:
        raise ValueError(f"--timeout must be positive, got {timeout}")
    _check_declarations(model, query)
    network, runner = load_for(model, query.element_type, query.hidden)
    outputs = query.outputs - (query.inputs if query.joint else 0)
    if query.inputs != network.input_dim or outputs != network.output_dim:
        raise ValueError(
            f"the property is over {query.inputs} inputs and {outputs} outputs, "
            f"{'the networks have' if isinstance(model, bytes) else model.name + ' has'} "
            f"{network.input_dim} and {network.output_dim}"
        )
    confirm: Callable[[np.ndarray], np.ndarray] = runner
    if query.joint:  # rows over (y, x): the network and its evaluator give both
        network = joint_network(network)
        confirm = lambda x: np.hstack([runner(x), x])  # noqa: E731
    held = peak_rss()
    if memory_limit - held < MIN_SEARCH_MEMORY:
        raise ValueError(
            f"--memory-limit {memory_limit >> 20} MiB leaves the search less than "
            f"{MIN_SEARCH_MEMORY >> 20} MiB: the process holds {held >> 20} MiB once the "
            "model is loaded"
        )
    left = timeout - (time.monotonic() - started)
    try:
        verdict = verify(
            network,
            query,
            confirm,
            timeout=max(left, 0.0),
            memory=memory_limit - held,
            progress=progress,
            cores=cores,
        )
    except MemoryError as e:
        raise ValueError(f"--memory-limit {memory_limit >> 20} MiB: {e}") from None
    verdict.seconds = time.monotonic() - started
    if verdict.y is not None:
        verdict.y = verdict.y[:outputs]
    return verdict


def _check_declarations(model: Path | bytes, query: Query) -> None:
    """A 2.0 query declares the model's inputs and outputs in the model's order: each
    declared tensor must have as many values as the model's tensor in its place."""
    if not any(v.shape for v in query.variables):  # VNN-LIB 1.0: scalars, counted as a whole
        return
    graph = (
        onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    ).graph
    for role, tensors in (
        ("input", data_inputs(graph)),
        ("output", list(graph.output)),
    ):
        seen: set[int] = set()
        declared = []
        for v in query.variables:
            if v.role == role and v.offset not in seen:  # an input read from another: once
                seen.add(v.offset)
                declared.append(v)
        sizes = [
            int(np.prod([d.dim_value or 1 for d in t.type.tensor_type.shape.dim])) for t in tensors
        ]
        if len(declared) != len(tensors) or any(
            int(np.prod(v.shape)) != size for v, size in zip(declared, sizes, strict=False)
        ):
            named = ", ".join(f"{v.name} {list(v.shape)}" for v in declared)
            have = ", ".join(
                f"{t.name} ({size} values)" for t, size in zip(tensors, sizes, strict=True)
            )
            raise ValueError(
                f"the query declares the {role}s {named}; the model's {role}s, in order, are {have}"
            )


def peak_rss() -> int:
    """The most resident memory this program has held so far, in bytes: Linux's VmHWM
    (``ru_maxrss`` would count the parent's memory a spawned process had before its exec)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak << 10
    kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))
    return int(kilobytes) << 10


def _progress(stats: dict[str, int]) -> None:
    print(f"vigil verify vnnlib: {orjson.dumps(stats).decode()}", file=sys.stderr)


def result_file(verdict: Verdict) -> str:
    """The VNN-COMP result: the verdict, then for ``sat`` the assignment of every X_i and
    Y_j (X in the flattened row-major order of the ONNX input)."""
    lines = [verdict.result]
    if verdict.result == "sat":
        assert verdict.x is not None and verdict.y is not None
        values = [("X", v) for v in verdict.x] + [("Y", v) for v in verdict.y]
        counts = {"X": 0, "Y": 0}
        pairs = []
        for kind, value in values:
            pairs.append(f"({kind}_{counts[kind]} {float(value)!r})")
            counts[kind] += 1
        lines.append("(" + "\n ".join(pairs) + ")")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    started = args.started
    if not args.model.is_file():
        raise ValueError(f"{args.model}: no such file")
    query = read_query(args.spec)
    if len(query.networks) > 1:
        raise ValueError(
            f"the property declares {len(query.networks)} networks: give each its model with "
            "vigil-vnnlib verify QUERY --network NAME=MODEL.onnx ..."
        )
    verdict = solve(
        args.model, query, args.timeout, started, _progress, args.memory_limit, args.cores
    )
    if verdict.result in ("timeout", "unknown"):
        print(
            f"vigil verify vnnlib: {verdict.result} after {verdict.seconds:.1f} s "
            f"(--timeout {args.timeout:g}): {verdict.reason}",
            file=sys.stderr,
        )
    out: dict[str, object] = {
        "result": verdict.result,
        "seconds": round(verdict.seconds, 4),
        **verdict.stats,
    }
    if verdict.result == "sat":
        assert verdict.x is not None and verdict.y is not None
        out["counterexample"] = {"x": verdict.x.tolist(), "y": verdict.y.tolist()}
    print(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    if args.out is not None:
        args.out.write_text(result_file(verdict))
    return 0
