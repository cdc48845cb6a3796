"""``vigil check-config``: validate a configuration and load its rules' models, then exit."""

from __future__ import annotations

import argparse
from pathlib import Path

from vigil.daemon.config import load_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.service import build_rules

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check-config", help="validate a configuration file and exit")
    p.add_argument("config", type=Path)
    p.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    for rule in build_rules(config, Metrics()):  # loads and checks the rules' models
        rule.close()
    source = "kafka" if config.kafka else "files"
    print(f"{args.config}: ok ({len(config.rules)} rules, {source} source)")
    return 0
