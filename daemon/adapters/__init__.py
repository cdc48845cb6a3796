"""Rule adapters: one module per ``kind`` of ``[[rules]]`` entry, each turning the pipeline's
batches into finished answers (alerts, verification and certification events, dead letters)
by calling the algorithms in ``vigil.rules``."""

from __future__ import annotations

from vigil.daemon.adapters.base import (
    Answer,
    Rule,
    RuleContext,
    RuleResult,
    StaleSnapshot,
    StatePart,
)
from vigil.daemon.adapters.certify import CertifyRule
from vigil.daemon.adapters.cfx import CfxRule
from vigil.daemon.adapters.ior import IorRule
from vigil.daemon.adapters.reach import ReachRule
from vigil.daemon.adapters.serving import serving_rules
from vigil.daemon.config import RuleConfig, SeldonConfig

KINDS: dict[str, type[Rule]] = {
    rule.kind: rule for rule in (IorRule, ReachRule, CertifyRule, CfxRule)
}
"""Rule classes by the ``kind`` a ``[[rules]]`` entry names."""


def build_rules(
    config: RuleConfig, context: RuleContext, seldon: SeldonConfig, group_id: str
) -> list[Rule]:
    """The adapters of one configured rule (its models loaded and checked): one, or the
    three stages of a rule on a serving stack's traffic (daemon/adapters/serving.py)."""
    if getattr(config, "format", "vigil") != "vigil":
        return serving_rules(config, seldon, group_id, context)
    return [KINDS[config.kind](config, context)]


__all__ = [
    "KINDS",
    "Answer",
    "CertifyRule",
    "CfxRule",
    "IorRule",
    "ReachRule",
    "Rule",
    "RuleContext",
    "RuleResult",
    "StaleSnapshot",
    "StatePart",
    "build_rules",
]
