"""``vigil check-config``: validate a configuration and load its rules' models, then exit;
with ``--connect``, also connect to Kafka as the daemon would and list its topics."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from vigil.connectors.kafka import topic_partitions
from vigil.daemon.config import Config, load_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.service import build_rules

GROUP = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check-config", help="validate a configuration file and exit")
    p.add_argument("config", type=Path)
    p.add_argument(
        "--connect",
        action="store_true",
        help="also connect to the Kafka brokers with the configured TLS/SASL settings and "
        "report the topics the rules read and write",
    )
    p.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    rules = build_rules(config, Metrics())  # loads and checks the rules' models
    topics = sorted({t for r in rules for t in r.topics})
    for rule in rules:
        rule.close()
    source = "kafka" if config.kafka else "files"
    print(f"{args.config}: ok ({len(config.rules)} rules, {source} source)")
    if args.connect:
        _connect(config, topics)
    return 0


def _connect(config: Config, inputs: list[str]) -> None:
    if config.kafka is None:
        print("--connect: the [files] source has no broker to connect to")
        return
    k = config.kafka
    security = k.security()
    out, kinds = config.outputs, {r.kind for r in config.rules}
    outputs = [out.alerts_topic, out.dead_letter_topic]
    if "reach" in kinds:
        outputs.append(out.verifications_topic)
    if kinds & {"certify", "cfx"}:
        outputs.append(out.certifications_topic)
    found = asyncio.run(topic_partitions(k.bootstrap_servers, inputs + outputs, security))
    print(f"connected to {k.bootstrap_servers} ({security.describe()})")
    for role, names in (("reads", inputs), ("writes", outputs)):
        for topic in names:
            count = found[topic]
            state = "missing" if count is None else f"{count} partitions"
            print(f"  {role} {topic}: {state}")
