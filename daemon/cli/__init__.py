"""The ``vigil`` command line: one module per command, each adding its parser in
``register(subparsers)`` under its ``GROUP`` (None for a top-level command, or "verify" or
"certify") and setting ``handler``, a function ``(args) -> exit code`` that prints its own
output. Bad input (a ``ValueError`` or a malformed stream) becomes one line
``vigil <command>: error: <message>`` and exit code 2, as does a broker that refuses the
connection's security settings; an unreachable broker exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import time
from typing import NoReturn

from vigil import __version__
from vigil.connectors.errors import BrokerRejected, BrokerUnavailable

GROUPS = {
    "verify": "verify a network (reachability, mini-batch MILP robustness)",
    "certify": "certify decisions (KNN fairness, counterfactual robustness)",
}
ONE_SHOT = {"verify_vnnlib"}
"""Commands that end their process as soon as their output is written (``exit_now``): one
run of a benchmark loop each, they hold nothing the interpreter's teardown would release."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, when ``argv`` names one, of that command alone: a
    command imports only what it runs (``vigil verify vnnlib`` starts without the daemon's
    Kafka, BDD and index libraries)."""
    parser = argparse.ArgumentParser(prog="vigil", description="Runtime assurance of AI models.")
    parser.add_argument("--version", action="version", version=f"vigil {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str | None, argparse._SubParsersAction] = {None: sub}
    for name, text in GROUPS.items():
        group = sub.add_parser(name, help=text)
        groups[name] = group.add_subparsers(dest="subcommand", required=True)
    commands = sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )
    named = _named(argv or [])
    for name in [named] if named in commands else commands:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(groups[module.GROUP])
    return parser


def _named(argv: list[str]) -> str:
    """The module of the command ``argv`` names (``verify vnnlib`` -> ``verify_vnnlib``)."""
    words = [w.replace("-", "_") for w in argv[:2]]
    if words and words[0] in GROUPS:
        return "_".join(words)
    return words[0] if words else ""


def _command(args: argparse.Namespace) -> str:
    """The command as typed: ``verify batch``, ``replay``, ..."""
    return " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; ``args.started`` is when, so that a time limit the
    command takes (``--timeout``) counts the imports of its libraries."""
    started = time.monotonic()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    args.started = started
    # a failed Kafka connection is our one error line, not also aiokafka's unconfigured log
    # lines (with `vigil run`'s logging configured they still reach the log)
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    try:
        return args.handler(args)
    except (ValueError, BrokerRejected) as e:  # StreamFormatError, InvalidDecision too
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 2
    except BrokerUnavailable as e:  # not the configuration's fault: a supervisor retries
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 1


def console() -> NoReturn:
    """The ``vigil`` executable: ``main`` on the process's arguments, then its exit code."""
    code = main()
    if _named(sys.argv[1:]) in ONE_SHOT:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once stdout and stderr are flushed, without the
    interpreter's teardown: finalizing numpy, onnx, onnxruntime and HiGHS takes about 50 ms,
    a tenth of a small VNN-COMP instance, and frees nothing a finished process needs. Under
    a tracer or a profiler (coverage, cProfile), which write their data at exit, it exits
    as usual."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: the output is lost, as Python reports it
        code = code or 120
    os._exit(code)
