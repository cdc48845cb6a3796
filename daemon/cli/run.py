"""``vigil run``: the daemon, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from vigil.daemon.config import load_config
from vigil.daemon.logs import configure_logging
from vigil.daemon.service import EXIT_SHUTDOWN_INCOMPLETE, ShutdownIncomplete, run_daemon

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the daemon")
    p.add_argument("--config", type=Path, required=True, help="TOML configuration file")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    """Exit status: 0 stopped cleanly, 1 no broker answered (or the loop failed), 2 a
    configuration or security settings the daemon cannot use, 3 stopped on request before
    everything was committed and closed (docs/operations.md, "Exit status")."""
    config = load_config(args.config)
    configure_logging(config.logging.level, config.logging.format)
    with asyncio.Runner() as runner:
        try:
            runner.run(run_daemon(config))
        except ShutdownIncomplete:
            # what it left is logged; clients that did not close would hold up the loop's
            # clean-up, and nothing they hold is needed (uncommitted records are read again)
            sys.stderr.flush()
            os._exit(EXIT_SHUTDOWN_INCOMPLETE)
    return 0
