"""Certifications run in the offload pool.

``certify``: requests on a topic of their own; every request is one job, jobs run side by
side, and the consumer goes on while they run. A request's offset is committed only once its
result is delivered (``hold``), so a crash re-runs the job instead of losing its result. With
exactly-once delivery, results go out in request order, each in the transaction that
commits its request, so none is duplicated either.

``cfx``: decisions that carry a counterfactual explanation (``cfx``) get its robustness to
model shifts (APΔS delta_max); the batch's checks run in parallel in the pool.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import numpy as np
import orjson

from connectors.base import OutMessage, TopicPartition
from connectors.events import Decision, Record, dead_letter, encode
from daemon.alerts import now_iso
from daemon.config import CertifyRuleConfig, CfxRuleConfig
from daemon.offload import JobOutcome
from daemon.rules import Rule, RuleContext, RuleResult, read_model
from rules.certify.cfx.apas import parameter_count, sample_size
from rules.certify.cfx.certify import as_rows, certify_rows
from rules.certify.cfx.decision import margin_rows
from rules.reach.network import Network

JOBS = {
    "knn": "rules.certify.knn.job",
    "cfx": "rules.certify.cfx.job",
    "batch": "rules.certify.batch.job",
}
"""The module whose ``run_job(request) -> result`` serves each ``job`` a certify rule names."""


def run_certification(module: str, request: dict) -> dict:
    """A pool job: the certification's module is imported in the worker, not the daemon."""
    return importlib.import_module(module).run_job(request)


class _PoolRule(Rule):
    """A rule whose work runs in the shared offload pool."""

    def __init__(self, config: CertifyRuleConfig | CfxRuleConfig, context: RuleContext) -> None:
        super().__init__(config.name, {config.topic})
        if context.pool is None:
            raise ValueError(f"rule {config.name!r} needs the offload pool")
        self.context = context
        self.pool = context.pool

    def close(self) -> None:
        self.pool.shutdown()


class CertifyRule(_PoolRule):
    kind = "certify"

    def __init__(self, config: CertifyRuleConfig, context: RuleContext) -> None:
        super().__init__(config, context)
        self.config = config
        self.backend = config.job
        self._jobs: dict[TopicPartition, dict[int, asyncio.Future]] = {}
        self._records: dict[tuple[TopicPartition, int], tuple[Record, Any]] = {}

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
            kind = f"certify.{self.config.job}"
            future = self.pool.submit(kind, run_certification, JOBS[self.config.job], request)
            self._jobs.setdefault(tp, {})[record.offset] = future
            self._records[(tp, record.offset)] = (record, request.get("id"))
            result.checked += 1
        return result

    def hold(self, tp: TopicPartition) -> int | None:
        jobs = self._jobs.get(tp)
        return min(jobs) if jobs else None

    def completed(self) -> list[OutMessage]:
        out: list[OutMessage] = []
        for tp, jobs in self._jobs.items():
            done = [o for o in sorted(jobs) if jobs[o].done()]
            if self.context.exactly_once:  # a result goes out with its own offset's commit
                first_open = min((o for o in jobs if not jobs[o].done()), default=None)
                done = [o for o in done if first_open is None or o < first_open]
            for offset in done:
                outcome: JobOutcome = jobs.pop(offset).result()
                record, request_id = self._records.pop((tp, offset))
                out += self._messages(record, request_id, outcome)
        return out

    def _messages(self, record: Record, request_id: Any, outcome: JobOutcome) -> list[OutMessage]:
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
        return out

    def in_flight(self) -> bool:
        return any(self._jobs.values())

    def saturated(self) -> bool:
        return self.pool.saturated

    async def wait_for_space(self) -> None:
        await self.pool.wait_for_space()

    async def drain(self) -> None:
        futures = [f for jobs in self._jobs.values() for f in jobs.values()]
        if futures:
            await asyncio.wait(futures)

    def drop(self, tp: TopicPartition) -> None:
        """A revoked partition's jobs: their results are dropped (the new owner re-runs them
        from the committed offset)."""
        for offset in self._jobs.pop(tp, {}):
            self._records.pop((tp, offset), None)


def cfx_robustness(
    network: Network, rows: np.ndarray, target: int, gamma: float, R: float
) -> list[dict]:
    """APΔS delta_max of each counterfactual (a pool job)."""
    return list(certify_rows(network, rows, target, gamma, R))


class CfxRule(_PoolRule):
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

    def matches(self, decision: Decision) -> bool:
        return self.config.model is None or decision.model == self.config.model

    async def check(
        self, tp: TopicPartition, decisions: list[Decision], emit_from: int
    ) -> RuleResult:
        result = RuleResult()
        live = [d for d in decisions if d.record.offset >= emit_from]
        jobs, asked = [], []
        for d in live:
            if "cfx" not in d.event:
                continue
            try:
                rows = as_rows(d.event["cfx"], self.network, "cfx")
            except ValueError as e:
                result.dead.append((d.record, "schema", str(e)))
                continue
            c = self.config
            jobs.append(
                self.pool.submit(
                    "cfx.apas", cfx_robustness, self.network, rows, c.target, c.gamma, c.R
                )
            )
            asked.append(d)
        result.checked = len(asked)
        for d, outcome in zip(asked, await asyncio.gather(*jobs), strict=True):
            result.events.append(self._event(d, outcome))
        return result

    def _event(self, decision: Decision, outcome: JobOutcome) -> OutMessage:
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
        return OutMessage(self.context.certifications_topic, decision.model.encode(), encode(event))
