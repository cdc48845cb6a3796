"""The ``certify`` rule: certification requests on a topic of their own, each one a pool job
(KNN fairness, counterfactual robustness, batch verification), answered on the
certifications topic."""

from __future__ import annotations

import importlib
from typing import Any

import orjson

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Record, dead_letter, encode, now_iso
from vigil.daemon.adapters.base import Answer, RuleContext, RuleResult
from vigil.daemon.adapters.pooled import PooledRule
from vigil.daemon.config import CertifyRuleConfig
from vigil.daemon.offload import JobOutcome

JOBS = {
    "knn": "vigil.rules.certify.knn.job",
    "cfx": "vigil.rules.certify.cfx.job",
    "batch": "vigil.rules.certify.batch.job",
}
"""The module whose ``run_job(request) -> result`` serves each ``job`` a certify rule names."""


def run_certification(module: str, request: dict) -> dict:
    """A pool job: the certification's module is imported in the worker, not the daemon."""
    return importlib.import_module(module).run_job(request)


class CertifyRule(PooledRule):
    kind = "certify"

    def __init__(self, config: CertifyRuleConfig, context: RuleContext) -> None:
        super().__init__(config, context)
        self.config = config
        self.backend = config.job

    def wants_decisions(self, topic: str) -> bool:
        return False

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        result = RuleResult()
        for record in records:
            if record.offset < emit_from:
                continue  # answered before the restart
            try:
                request = orjson.loads(record.value or b"")
            except orjson.JSONDecodeError as e:
                result.dead.append((record, "undecodable", f"not valid JSON: {e}"))
                continue
            if not isinstance(request, dict):
                result.dead.append((record, "schema", "a request must be a JSON object"))
                continue
            context = (record, request.get("id"))
            self._start(record, context, run_certification, JOBS[self.config.job], request)
            result.checked += 1
        return result

    def _answers(self, context: tuple[Record, Any], outcome: JobOutcome) -> list[Answer]:
        record, request_id = context
        event: dict[str, Any] = {
            "kind": "certification",
            "rule": self.name,
            "job": self.config.job,
            "request_id": request_id,
            "status": outcome.status,
            "seconds": outcome.seconds,
            "source": record.source,
            "completed_at": now_iso(),
        }
        if outcome.status == "ok":
            event["result"] = outcome.value
        else:
            event["error"] = outcome.error
        key = record.key
        out = [OutMessage(self.context.certifications_topic, key, encode(event))]
        if outcome.status == "invalid":
            letter = dead_letter(record, "invalid_request", outcome.error or "", now_iso())
            letter["rule"] = self.name
            self.context.metrics.dead_letters.labels("invalid_request").inc()
            out.append(OutMessage(self.context.dead_letter_topic, key, encode(letter)))
        return [Answer.to(record, m) for m in out]
