"""Rules whose work runs in the offload pool, one job per record.

Jobs run side by side, and the consumer goes on while they run. A record's offset is
committed only once its answer is delivered (``hold``), so a crash re-runs the job instead of
losing its result; with exactly-once delivery the pipeline sends each answer in the
transaction that commits its record, so none is duplicated either.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vigil.connectors.base import TopicPartition
from vigil.connectors.events import Record
from vigil.daemon.adapters.base import Answer, Rule, RuleContext
from vigil.daemon.config import CertifyRuleConfig, CfxRuleConfig
from vigil.daemon.offload import JobOutcome


class PooledRule(Rule):
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

    @property
    def job_kind(self) -> str:
        """The offload job kind of this rule's work (a metric label)."""
        return f"{self.kind}.{self.backend}"

    def offload_jobs(self) -> dict[str, set[str]]:
        return {self.pool.name: {self.job_kind}}

    def _start(self, record: Record, context: Any, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the pool for ``record``; ``context`` goes to ``_answers``."""
        tp = (record.topic, record.partition)
        job = self.pool.submit(self.job_kind, fn, *args)
        self._jobs.setdefault(tp, {})[record.offset] = (job, context)

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
