"""The ``cfx`` rule: decisions that carry a counterfactual explanation (``cfx``) get its
robustness to model shifts (APΔS delta_max), computed in the offload pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, encode, now_iso
from vigil.daemon.adapters.base import Answer, RuleContext, RuleResult, read_model
from vigil.daemon.adapters.pooled import PooledRule
from vigil.daemon.config import CfxRuleConfig
from vigil.daemon.offload import JobOutcome
from vigil.rules.certify.cfx.apas import parameter_count, sample_size
from vigil.rules.certify.cfx.certify import as_rows, certify_rows
from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.reach.network import Network


def cfx_robustness(
    network: Network, rows: np.ndarray, target: int, gamma: float, R: float
) -> list[dict]:
    """APΔS delta_max of each counterfactual (a pool job)."""
    return list(certify_rows(network, rows, target, gamma, R))


class CfxRule(PooledRule):
    kind = "cfx"
    backend = "apas"

    def __init__(self, config: CfxRuleConfig, context: RuleContext) -> None:
        super().__init__(config, context)
        self.config = config
        _, self.network = read_model(config.onnx, config.name)
        try:  # a bad target or (gamma, R) fails at startup, not in every job
            margin_rows(self.network, config.target)
            sample_size(config.gamma, config.R, parameter_count(self.network))
        except ValueError as e:
            raise ValueError(f"rule {config.name!r}: {e}") from None

    def serves(self, model: str) -> bool:
        return self.config.model is None or model == self.config.model

    async def check(
        self, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> RuleResult:
        result = RuleResult()
        c = self.config
        for d in decisions:
            if d.record.offset < emit_from or "cfx" not in d.event:
                continue  # answered before the restart, or nothing to check
            try:
                rows = as_rows(d.event["cfx"], self.network, "cfx")
            except ValueError as e:
                result.dead.append((d.record, "schema", str(e)))
                continue
            args = (self.network, rows, c.target, c.gamma, c.R)
            self._start(d.record, d, cfx_robustness, *args)
            result.checked += 1
        return result

    def _answers(self, decision: Decision, outcome: JobOutcome) -> list[Answer]:
        event: dict[str, Any] = {
            "kind": "certification",
            "rule": self.name,
            "job": "cfx",
            "model": decision.model,
            "decision": {"id": decision.id},
            "status": outcome.status,
            "seconds": outcome.seconds,
            "source": decision.record.source,
            "completed_at": now_iso(),
        }
        if outcome.status == "ok":
            event["result"] = {"results": outcome.value}
            event["robust"] = all(r["delta_max"] >= self.config.min_delta for r in outcome.value)
        else:
            event["error"] = outcome.error
        key = decision.model.encode()
        message = OutMessage(self.context.certifications_topic, key, encode(event))
        return [Answer.to(decision.record, message)]
