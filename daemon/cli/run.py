"""``vigil run``: the daemon, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from vigil.daemon.config import load_config
from vigil.daemon.logs import configure_logging
from vigil.daemon.service import run_daemon

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the daemon")
    p.add_argument("--config", type=Path, required=True, help="TOML configuration file")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging(config.logging.level, config.logging.format)
    asyncio.run(run_daemon(config))
    return 0
