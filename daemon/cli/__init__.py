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
import pkgutil
import sys

from vigil import __version__
from vigil.connectors.csv_source import StreamFormatError
from vigil.connectors.kafka_security import BrokerRejected, BrokerUnavailable
from vigil.rules.ior import InvalidDecision

GROUPS = {
    "verify": "verify a network (reachability, mini-batch MILP robustness)",
    "certify": "certify decisions (KNN fairness, counterfactual robustness)",
}


def build_parser() -> argparse.ArgumentParser:
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
    for name in commands:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(groups[module.GROUP])
    return parser


def _command(args: argparse.Namespace) -> str:
    """The command as typed: ``verify batch``, ``replay``, ..."""
    return " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # a failed Kafka connection is our one error line, not also aiokafka's unconfigured log
    # lines (with `vigil run`'s logging configured they still reach the log)
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    try:
        return args.handler(args)
    except (StreamFormatError, InvalidDecision, ValueError, BrokerRejected) as e:
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 2
    except BrokerUnavailable as e:  # not the configuration's fault: a supervisor retries
        print(f"vigil {_command(args)}: error: {e}", file=sys.stderr)
        return 1
