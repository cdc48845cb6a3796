"""Certifications run in the offload pool.

Every record with work is one job; jobs run side by side, and the consumer goes on while
they run. A record's offset is committed only once its answer is delivered (``hold``), so a
crash re-runs the job instead of losing its result; with exactly-once delivery the pipeline
sends each answer in the transaction that commits its record, so none is duplicated either.

``certify``: requests on a topic of their own.
``cfx``: decisions that carry a counterfactual explanation (``cfx``) get its robustness to
model shifts (APΔS delta_max).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import numpy as np
import orjson
from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, Record, dead_letter, encode
from vigil.daemon.alerts import now_iso
from vigil.daemon.config import CertifyRuleConfig, CfxRuleConfig
from vigil.daemon.offload import JobOutcome
from vigil.daemon.rules import Answer, Rule, RuleContext, RuleResult, read_model
from vigil.rules.certify.cfx.apas import parameter_count, sample_size
from vigil.rules.certify.cfx.certify import as_rows, certify_rows
from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.reach.network import Network

JOBS = {
    "knn": "vigil.rules.certify.knn.job",
    "cfx": "vigil.rules.certify.cfx.job",
    "batch": "vigil.rules.certify.batch.job",
}
"""The module whose ``run_job(request) -> result`` serves each ``job`` a certify rule names."""


def run_certification(module: str, request: dict) -> dict:
    """A pool job: the certification's module is imported in the worker, not the daemon."""
    return importlib.import_module(module).run_job(request)


class _PoolRule(Rule):
    """A rule whose work runs in the shared offload pool, one job per record. The consumer
    goes on while jobs run; a partition's commit is held at its oldest record whose answer
    is not delivered yet."""

    def __init__(self, config: CertifyRuleConfig | CfxRuleConfig, context: RuleContext) -> None:
        super().__init__(config.name, {config.topic})
        if context.pool is None:
            raise ValueError(f"rule {config.name!r} needs the offload pool")
        self.context = context
        self.pool = context.pool
        self._jobs: dict[TopicPartition, dict[int, tuple[asyncio.Future, Any]]] = {}

    def _start(self, record: Record, context: Any, kind: str, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the pool for ``record``; ``context`` goes to ``_answers``."""
        tp = (record.topic, record.partition)
        self._jobs.setdefault(tp, {})[record.offset] = (self.pool.submit(kind, fn, *args), context)

    def _answers(self, context: Any, outcome: JobOutcome) -> list[Answer]:
        raise NotImplementedError

    def hold(self, tp: TopicPartition) -> int | None:
        jobs = self._jobs.get(tp)
        return min(jobs) if jobs else None

    def completed(self) -> list[Answer]:
        out: list[Answer] = []
        for jobs in self._jobs.values():
            for offset in sorted(o for o, (job, _) in jobs.items() if job.done()):
                job, context = jobs.pop(offset)
                out += self._answers(context, job.result())
        return out

    def in_flight(self) -> bool:
        return any(self._jobs.values())

    def saturated(self) -> bool:
        return self.pool.saturated

    async def wait_for_space(self) -> None:
        await self.pool.wait_for_space()

    async def drain(self) -> None:
        futures = [job for jobs in self._jobs.values() for job, _ in jobs.values()]
        if futures:
            await asyncio.wait(futures)

    def drop(self, tp: TopicPartition) -> None:
        """A revoked partition's jobs: their results are dropped (the new owner re-runs them
        from the committed offset)."""
        self._jobs.pop(tp, None)

    def close(self) -> None:
        self.pool.shutdown()


class CertifyRule(_PoolRule):
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
            kind, module = f"certify.{self.config.job}", JOBS[self.config.job]
            context = (record, request.get("id"))
            self._start(record, context, kind, run_certification, module, request)
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
            self._start(d.record, d, "cfx.apas", cfx_robustness, *args)
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
