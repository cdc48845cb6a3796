"""consume -> decode -> route -> check -> emit -> commit, with snapshots and recovery.

Guarantees (docs/architecture.md): every output is acknowledged before the offset of the
record it answers is committed (with exactly-once, sent in the Kafka transaction that commits
that record, and not before); a record whose offloaded job has not delivered its result
holds its partition's commit back, so a crash re-runs the job rather than losing its result.
After a restart each rule's state is restored from its newest snapshot the commit covers,
and the records between the snapshot and the committed offset are replayed into it without
emitting anything a second time.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from operator import attrgetter

import structlog

from vigil.connectors.base import Offsets, OutMessage, Sink, Source, TopicPartition
from vigil.connectors.events import (
    BadEvent,
    Decision,
    Record,
    dead_letter,
    encode,
    now_iso,
)
from vigil.connectors.kafka import broker_gone, fenced
from vigil.connectors.kafka_security import BrokerUnavailable
from vigil.daemon.adapters import Answer, Rule, RuleResult
from vigil.daemon.broker import BrokerWatch
from vigil.daemon.checkpoint import Checkpoint
from vigil.daemon.decoding import READ_AHEAD_BATCHES, Decoded, DecodeWorker
from vigil.daemon.metrics import Metrics
from vigil.daemon.state import Restored, StateStore, restore_partition

log = structlog.get_logger("vigil.pipeline")
_IDLE_POLL_SECONDS = 0.01
_LAG_TIMEOUT_SECONDS = 1.0
_RETRY_SECONDS = 1.0
_STABLE_TIMEOUT_SECONDS = 5.0
_STABLE_POLL_SECONDS = 0.02
_FENCED_AFTER_OUTAGE_SECONDS = 300.0
"""A fenced producer within this long of an outage was fenced by the broker's transaction
timeout (its transaction outlived the outage), not by another instance."""


Fetched = tuple[dict[TopicPartition, int], dict[TopicPartition, int]]
"""Each partition's seeks when a fetch began and when it ended (``Pipeline._seeks``)."""


class HistoryGap(ValueError):
    """A rule's history lacks records retention deleted, and the config says to stop."""


@dataclass(frozen=True)
class PipelineSettings:
    dead_letter_topic: str
    max_batch: int = 2000
    fetch_timeout_ms: int = 200
    snapshot_every_events: int = 100_000
    snapshot_every_seconds: float = 60.0
    fail_on_history_gap: bool = False
    startup_timeout_seconds: float = 60.0
    """How long recovering a partition waits for an unreachable broker."""


class Pipeline:
    def __init__(
        self,
        rules: list[Rule],
        source: Source,
        sink: Sink,
        store: StateStore,
        metrics: Metrics,
        settings: PipelineSettings,
        broker: BrokerWatch | None = None,
        reader: DecodeWorker | None = None,
    ) -> None:
        """``reader``: reads large batches' decision events in a worker process, each batch
        checked after the next fetch (daemon/decoding.py); without it the loop reads them."""
        self.rules = rules
        self._merging = [r for r in rules if r.merges]
        self.broker = broker
        self.source = source
        self.sink = sink
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self._lock = asyncio.Lock()
        self._emit_from: dict[TopicPartition, int] = {}
        self._apply_from: dict[tuple[str, TopicPartition], int] = {}
        self._next: dict[TopicPartition, int] = {}
        self._unsnapshotted: dict[TopicPartition, int] = defaultdict(int)
        self._snapshot_at: dict[TopicPartition, float] = {}
        self._writes: dict[tuple[str, TopicPartition], asyncio.Task] = {}  # newest per key
        self.checkpoint = Checkpoint(source, sink, metrics)
        self.reader = reader
        self._held: deque[tuple[list[Record], Fetched, asyncio.Future[Decoded]]] = deque()
        """Fetched batches, oldest first, whose decision events the reader reads while the
        batches before are checked: (records, seeks when fetched, the reading)."""
        self._seeks: dict[TopicPartition, int] = defaultdict(int)
        """Seeks so far per partition (assignments' and re-reads'): a batch fetched before
        one of its partition's is stale there."""
        self.fatal: Exception | None = None  # raised by the loop (found in a callback)

    def _rules_for(self, topic: str) -> list[Rule]:
        return [r for r in self.rules if topic in r.topics]

    # -- assignment -------------------------------------------------------------------

    async def on_assign(self, tps: list[TopicPartition]) -> None:
        """Recover the assigned partitions. A failure stops the loop (``fatal``): the client
        would only log it and leave the partitions unread."""
        async with self._lock:
            await self.checkpoint.wait()
            try:
                for tp in tps:
                    await self._recover(tp)
            except Exception as e:
                if self.fatal is None:
                    self.fatal = e
                return
            self.metrics.assigned_partitions.set(len(self.source.assignment()))

    async def _recover(self, tp: TopicPartition) -> None:
        rules = self._rules_for(tp[0])
        restored = await self._restore(tp, rules)
        self._report_gaps(tp, restored)
        for rule in rules:
            rule.assign(tp)
            self._apply_from[(rule.name, tp)] = restored.apply_from[rule.name]
            if rule.stateful:
                complete = rule.name not in restored.incomplete
                rule.mark_history(tp, complete)
                self.metrics.history_complete.labels(rule.name, tp[0], str(tp[1])).set(complete)
        self._emit_from[tp] = restored.emit_from
        self.checkpoint.assign(tp, restored.committed)
        self._next[tp] = restored.replay_from
        self._snapshot_at[tp] = time.monotonic()
        self._seeks[tp] += 1
        await self.source.seek(tp, restored.replay_from)
        log.info(
            "partition_assigned",
            topic=tp[0],
            partition=tp[1],
            committed=restored.committed,
            replay_from=restored.replay_from,
        )

    async def _restore(self, tp: TopicPartition, rules: list[Rule]) -> Restored:
        """``restore_partition``, tried again while the broker does not answer; raises
        ``BrokerUnavailable`` once it has been away ``startup_timeout_seconds``."""
        waited = False
        while True:
            attempt = asyncio.ensure_future(
                restore_partition(tp, rules, self.source, self.store, self.metrics)
            )
            try:
                return await self._unless_broker_away(attempt)
            except Exception as e:
                if self.broker is None or not broker_gone(e):
                    raise
                self.store.close(tp)
                for rule in rules:
                    rule.drop(tp)
                if not waited:
                    log.warning("recovery_waiting_for_broker", topic=tp[0], partition=tp[1])
                    waited = True
                await asyncio.sleep(_RETRY_SECONDS)

    async def _unless_broker_away(self, task: asyncio.Future) -> Restored:
        """``task``'s result, or ``BrokerUnavailable`` (``task`` cancelled) once the broker
        has not answered for ``startup_timeout_seconds``."""
        limit = self.settings.startup_timeout_seconds
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=_RETRY_SECONDS)
                if done:
                    return task.result()
                if self.broker is not None and self.broker.unreachable_for() > limit:
                    raise BrokerUnavailable(
                        f"the broker did not answer for {limit:.0f} s while partitions were "
                        "recovered ([kafka] startup_timeout_seconds)"
                    )
        finally:
            task.cancel()

    def _report_gaps(self, tp: TopicPartition, restored: Restored) -> None:
        """Records retention deleted before they were covered: never silent. Each is logged
        as an error and counted; with ``fail_on_history_gap`` the loop stops on it."""
        found = [(rule, *missing) for rule, missing in restored.gaps.items()]
        if restored.unanswered:
            found.append(("", *restored.unanswered))
        for rule, start, end in found:
            log.error(
                "history_gap",
                rule=rule or None,
                topic=tp[0],
                partition=tp[1],
                missing_from=start,
                missing_to=end,
                unanswered=not rule,
            )
            self.metrics.history_gaps.labels(rule).inc()
        if found and self.settings.fail_on_history_gap and self.fatal is None:
            self.fatal = HistoryGap(
                f"{tp[0]}[{tp[1]}]: offsets {found[0][1]}..{found[0][2] - 1} were deleted by "
                'retention before a snapshot covered them ([state] on_history_gap = "fail")'
            )

    async def on_revoke(self, tps: list[TopicPartition]) -> None:
        async with self._lock:
            await self.checkpoint.wait()  # commit what was answered before letting go
            await self._until_committed([tp for tp in tps if tp in self._emit_from])
            for tp in tps:
                if tp not in self._emit_from:
                    continue
                self._snapshot_if_changed(tp)
                for rule in self._rules_for(tp[0]):
                    rule.drop(tp)
                    self._apply_from.pop((rule.name, tp), None)
                del self._emit_from[tp]
                self._next.pop(tp, None)
                self.checkpoint.revoke(tp)
                self.metrics.forget_partition(*tp, [r.name for r in self._rules_for(tp[0])])
                log.info("partition_revoked", topic=tp[0], partition=tp[1])
            await self._flush_snapshots()
            for tp in tps:
                self.store.close(tp)
            self.metrics.assigned_partitions.set(len(self.source.assignment()))

    async def _until_committed(self, tps: list[TopicPartition]) -> None:
        """Wait until the broker answers the offsets this instance committed for ``tps``,
        so that their next owner starts where this one stopped. A transaction's offsets
        count only once its markers are written, a moment after its commit returned; an
        owner that asks before then gets the offsets before, and answers those records
        again (the client cannot ask for stable offsets only). Bounded: when the broker does
        not confirm them in time, that is logged and the partitions are let go."""
        committed = self.checkpoint.committed
        wanted = {tp: committed[tp] for tp in tps if tp in committed}
        if not wanted or self.failed or (self.broker is not None and not self.broker.up):
            return
        try:
            async with asyncio.timeout(_STABLE_TIMEOUT_SECONDS):
                while wanted:
                    for tp in list(wanted):
                        if ((await self.source.committed(tp)) or 0) >= wanted[tp]:
                            del wanted[tp]
                    if wanted:
                        await asyncio.sleep(_STABLE_POLL_SECONDS)
        except Exception as e:  # a timeout, or the broker's error
            log.warning("commit_not_confirmed", partitions=sorted(wanted), error=repr(e))

    def ready(self) -> bool:
        """Partitions assigned and every one replayed up to its committed offset."""
        return bool(self._emit_from) and all(
            self._next.get(tp, 0) >= emit for tp, emit in self._emit_from.items()
        )

    # -- the loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, until_idle: bool = False) -> None:
        """Process batches until ``stop`` is set (or, with ``until_idle``, the source has
        nothing more to give)."""
        if self.reader is not None:
            self.reader.start()
        while not stop.is_set():
            try:
                if await self._step(stop, until_idle):
                    break
            except Exception as e:
                if not self._outage_caused(e):
                    raise
                await self._resume(e, stop)
        for _, _, reading in self._held:  # fetched, not checked: read again after a restart
            reading.cancel()
        self._held.clear()
        if not self.failed:
            await self._settle()

    async def _step(self, stop: asyncio.Event, until_idle: bool) -> bool:
        """One fetch and what follows it; true when ``until_idle`` and the source is idle.
        The fetch gives way to ``stop`` (the client waits without a bound for partitions
        while its group cannot reach the broker)."""
        if self.fatal is not None:
            raise self.fatal
        if self._saturated():  # backpressure: let offloaded jobs finish before fetching
            await self._wait_for_space()
            await self.deliver_completed()
            return False
        began = dict(self._seeks)
        held = self._held
        # with a batch held, take only what is buffered: one is checked right after
        timeout = 0 if held else self.settings.fetch_timeout_ms
        records = await _unless_stopped(self.source.fetch(self.settings.max_batch, timeout), stop)
        if stop.is_set():
            return False  # run() lets the held batches go
        if self.fatal is not None:  # found by an assignment during the fetch
            raise self.fatal
        fetched = (began, dict(self._seeks))
        # a batch sought during its fetch is dropped unread: not worth a worker's reading
        ahead = records and self.reader is not None and began == fetched[1]
        reading = self.reader.read(records) if ahead else None
        if reading is not None:  # checked after the next fetches; the worker reads it meanwhile
            held.append((records, fetched, reading))
            if len(held) > READ_AHEAD_BATCHES:
                await self._process_held()
        elif records:  # the batches held before these go first
            while held:
                await self._process_held()
            await self._process(records, fetched)
        elif held:
            await self._process_held()
        else:
            if not any(r.in_flight() for r in self.rules):
                await self._settle()
                if until_idle:
                    return True
                async with self._lock:
                    for tp in list(self._emit_from):
                        self._maybe_snapshot(tp)
            else:  # nothing to read, jobs running: do not spin on a source that never waits
                await asyncio.sleep(_IDLE_POLL_SECONDS)
        # a held batch is checked next, while this delivery is acknowledged
        await self.deliver_completed(settle=not held)
        await self._update_lag()
        return False

    async def _process_held(self) -> None:
        """Check the oldest held batch, once the worker has read it."""
        records, fetched, reading = self._held.popleft()
        started = time.perf_counter()
        decoded = await reading
        self.metrics.decode_wait.inc(time.perf_counter() - started)
        await self._process(records, fetched, decoded)

    def _outage_caused(self, error: Exception) -> bool:
        """Whether a failed delivery is the broker's absence, to be waited out: it did not
        answer, or its transaction timeout fenced a transaction that outlived an outage."""
        if self.broker is None or self.checkpoint.error is not error:
            return False
        if broker_gone(error):
            return True
        back = self.broker.last_back
        recent = back is not None and time.monotonic() - back < _FENCED_AFTER_OUTAGE_SECONDS
        return fenced(error) and (recent or not self.broker.up)

    async def _resume(self, error: Exception, stop: asyncio.Event) -> None:
        """After a delivery the broker did not take: wait for it, make a new producer (its
        start aborts the transaction left open), and resume every partition from its
        commit, as a new assignment would; nothing was committed past the answers that went
        out, so the records after the commit are answered again (their jobs run again). The
        checkpoint stays failed (nothing committed or snapshotted) until every partition is
        resumed; a partition not yet resumed has no read position, so nothing of it is
        checked or committed meanwhile."""
        assert self.broker is not None
        log.warning("delivery_failed_waiting_for_broker", error=repr(error))
        self.metrics.delivery_recoveries.inc()
        async with self._lock:
            await self._flush_snapshots()  # those of deliveries that went out
            stale = list(self._emit_from)
            for tp in stale:
                self._forget_position(tp)
        producer_ready = False
        while True:
            waiting = asyncio.ensure_future(self.broker.wait_until_up())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            stopping.cancel()
            if stop.is_set():
                return  # failed stays set: nothing more is committed or snapshotted
            try:
                async with self._lock:
                    if not producer_ready:
                        await self.sink.restart(self.settings.startup_timeout_seconds)
                        producer_ready = True
                    assigned = set(self.source.assignment())
                    for tp in [tp for tp in stale if tp in assigned]:
                        await self._recover(tp)
                        stale.remove(tp)
                    self.checkpoint.recovered()
            except BrokerUnavailable as e:
                if producer_ready:  # recovery waited its limit: not a retry
                    raise
                log.info("resume_waiting_for_broker", error=str(e))
            except Exception as e:
                if not broker_gone(e):
                    raise
                log.info("resume_waiting_for_broker", error=repr(e))
            else:
                log.info("resumed", partitions=len(self._emit_from))
                return
            await asyncio.sleep(_RETRY_SECONDS)

    def _forget_position(self, tp: TopicPartition) -> None:
        """Drop a partition's state and read position, to be recovered from its commit."""
        for rule in self._rules_for(tp[0]):
            rule.drop(tp)
            self._apply_from.pop((rule.name, tp), None)
        self._emit_from.pop(tp, None)
        self._next.pop(tp, None)
        self._unsnapshotted.pop(tp, None)
        self.store.close(tp)

    def _saturated(self) -> bool:
        return any(r.saturated() for r in self.rules)

    async def _wait_for_space(self) -> None:
        waits = [asyncio.ensure_future(r.wait_for_space()) for r in self.rules if r.saturated()]
        timeout = max(self.settings.fetch_timeout_ms, 10) / 1000
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for w in pending:
            w.cancel()

    async def deliver_completed(self, settle: bool = True) -> None:
        """Deliver the results of finished offloaded jobs, and what the merging rules release
        with no new records (an idle wait ended), and commit what they released; with
        ``settle``, wait until that and any delivery before it are acknowledged."""
        async with self._lock:
            if self.failed:
                return
            answers = [a for r in self.rules for a in r.completed()]
            if self._merging:
                answers += self._merged()
            await self.checkpoint.send(answers, self._commit_positions(list(self._emit_from)))
            if settle:
                await self.checkpoint.settle()

    @property
    def failed(self) -> bool:
        """A delivery failed: nothing more is committed or snapshotted."""
        return self.checkpoint.failed

    def _commit_positions(self, tps: list[TopicPartition]) -> Offsets:
        """For each partition, the position up to which every record is fully answered
        (behind the oldest record whose job is still running), if it moved."""
        positions = {}
        for tp in tps:
            position = self._next.get(tp)
            if position is None:
                continue
            holds = [h for r in self._rules_for(tp[0]) if (h := r.hold(tp)) is not None]
            positions[tp] = min([position, *holds])
        return self.checkpoint.due(positions)

    async def process(
        self, records: list[Record], fetched_at: dict[TopicPartition, int] | None = None
    ) -> None:
        """Check, emit and commit one fetched batch, and wait for the delivery.
        ``fetched_at``: the seeks when the fetch began (see ``_process``)."""
        fetched = None if fetched_at is None else (fetched_at, dict(self._seeks))
        await self._process(records, fetched)
        await self._settle()

    async def _settle(self) -> None:
        async with self._lock:
            await self.checkpoint.settle()

    async def _process(
        self,
        records: list[Record],
        fetched: Fetched | None = None,
        decoded: Decoded | None = None,
    ) -> None:
        """Check one fetched batch and start its delivery and commit (the loop settles it
        before the next fetch, see daemon/checkpoint.py). ``fetched`` (each partition's
        seeks when the fetch began and when it ended) marks partitions sought since: their
        records may predate the seek (an assignment's, or a re-read's), so they are dropped.
        If the seek came during the fetch, the fetch may also have moved the position past
        records the seek meant to read: the partition is sought back to where processing
        stands, to be read again in order. ``decoded``: the batch's decisions read ahead."""
        decoded = decoded or Decoded()
        started = time.perf_counter()
        async with self._lock:
            answers: list[Answer] = []
            positions: Offsets = {}
            by_tp: dict[TopicPartition, list[Record]] = defaultdict(list)
            for tp, run in groupby(records, _partition_of):  # a source's runs, in order
                by_tp[tp] += run
            for tp, recs in by_tp.items():
                if tp not in self._emit_from:
                    continue  # revoked while the batch was in flight
                if fetched is not None and fetched[0].get(tp) != self._seeks[tp]:
                    log.info("stale_batch_dropped", topic=tp[0], partition=tp[1], records=len(recs))
                    if fetched[1].get(tp) == self._seeks[tp]:
                        await self.source.seek(tp, self._next[tp])
                        self._seeks[tp] += 1
                    continue
                # fetched before the assignment's seek and fetched again after it
                recs = [r for r in recs if r.offset >= self._next[tp]]
                if not recs:
                    continue
                positions[tp] = recs[-1].offset + 1
                answers += await self._process_partition(tp, recs, decoded)
            for tp, offset in positions.items():
                self._unsnapshotted[tp] += offset - self._next.get(tp, 0)
                self._next[tp] = offset
            moved = list(positions)
            if self._merging:
                answers += self._merged()
                moved = list(self._emit_from)  # a release moves any partition's hold
            offsets = self._commit_positions(moved)
            await self.checkpoint.send(answers, offsets)
            for tp in positions:
                self._maybe_snapshot(tp)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _merged(self) -> list[Answer]:
        """The merging rules' answers to the records whose turn has come; the partitions
        they hold enough of are paused, the others read."""
        out: list[Answer] = []
        full: set[TopicPartition] = set()
        for rule in self._merging:
            result = rule.release(self._behind)
            self.metrics.events.labels(rule.name, "checked").inc(result.checked)
            out += self._outputs(rule, result, 0)
            full |= rule.full()
        self.source.pause_only(full)
        return out

    def _behind(self, tp: TopicPartition) -> bool:
        """Whether records of ``tp`` exist past those read (unknown counts as behind)."""
        end = self.source.end_offset(tp)
        return end is None or self._next.get(tp, 0) < end

    async def _process_partition(
        self, tp: TopicPartition, records: list[Record], decoded: Decoded
    ) -> list[Answer]:
        emit_from = self._emit_from[tp]
        out: list[Answer] = []
        rules = self._rules_for(tp[0])
        for rule in rules:
            if rule.wants_decisions(tp[0]):
                continue
            apply_from = self._apply_from[(rule.name, tp)]
            mine = [r for r in records if r.offset >= apply_from]
            if mine:
                result = await rule.handle(tp, mine, emit_from)
                self.metrics.events.labels(rule.name, "checked").inc(result.checked)
                out += self._outputs(rule, result, emit_from)
                out += await self._check_all(rule, tp, result.decisions, emit_from)
        rules = [r for r in rules if r.wants_decisions(tp[0])]
        if not rules:
            return out
        decisions: Sequence[Decision]
        by_model: dict[str, Sequence[Decision]]
        run = decoded.run(records)
        if run is not None and len(models := set(run.models)) == 1:  # a backlog's usual batch
            decisions, by_model = run, {models.pop(): run}
        else:
            decisions, by_model = self._decisions(records, decoded, emit_from, out)
        routed: set[str] = set()
        for rule in rules:
            served = [model for model in by_model if rule.serves(model)]
            routed.update(served)
            mine = _of_models(decisions, by_model, served)
            mine = mine[_first_at(mine, self._apply_from[(rule.name, tp)]) :]
            out += await self._check_all(rule, tp, mine, emit_from)
        unrouted = sum(len(ds) for model, ds in by_model.items() if model not in routed)
        if unrouted:
            self.metrics.events.labels("", "unrouted").inc(unrouted)
        return out

    def _decisions(
        self, records: list[Record], decoded: Decoded, emit_from: int, out: list[Answer]
    ) -> tuple[list[Decision], dict[str, list[Decision]]]:
        """The records' decisions, and grouped by model; the dead letters of the others
        (live ones) go to ``out``."""
        decisions: list[Decision] = []
        by_model: dict[str, list[Decision]] = defaultdict(list)
        for r in records:
            try:
                d = decoded.decision(r)
            except BadEvent as e:
                if r.offset >= emit_from:
                    out.append(self._dead(r, e.reason, str(e)))
                continue
            decisions.append(d)
            by_model[d.model].append(d)
        return decisions, by_model

    async def _check_all(
        self, rule: Rule, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> list[Answer]:
        """Check ``decisions`` in order, ``max_batch`` at a time: a rule that makes decisions
        of the records it reads (a serving stack's requests of many rows) can have many more
        than a fetch has records, and the monitor's cost grows faster than a batch's size."""
        out: list[Answer] = []
        step = self.settings.max_batch
        for start in range(0, len(decisions), step):
            out += await self._check(rule, tp, decisions[start : start + step], emit_from)
        return out

    async def _check(
        self, rule: Rule, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> list[Answer]:
        """One check of at most ``max_batch`` decisions, counted in the metrics."""
        result = await rule.check(tp, decisions, emit_from)
        # decisions applied again after a restart; dead letters are not applied
        replayed = _first_at(decisions, emit_from) - sum(
            1 for record, _, _ in result.dead if record.offset < emit_from
        )
        m = self.metrics
        m.events.labels(rule.name, "checked").inc(result.checked - replayed)
        m.events.labels(rule.name, "replayed").inc(replayed)
        m.events.labels(rule.name, "flagged").inc(result.alerts)
        m.witnesses.labels(rule.name).inc(result.alert_witnesses)
        m.alerts.labels(rule.name).inc(result.alerts)
        m.check_seconds.labels(rule.name, rule.backend).observe(result.seconds)
        m.history_size.labels(rule.name, tp[0], str(tp[1])).set(rule.history_size(tp))
        return self._outputs(rule, result, emit_from)

    def _outputs(self, rule: Rule, result: RuleResult, emit_from: int) -> list[Answer]:
        """A rule's events and dead letters of a batch."""
        out = list(result.events)
        for record, reason, error in result.dead:
            if record.offset >= emit_from:
                out.append(self._dead(record, reason, error, rule.name))
        return out

    def _dead(self, record: Record, reason: str, error: str, rule: str | None = None) -> Answer:
        self.metrics.dead_letters.labels(reason).inc()
        self.metrics.events.labels(rule or "", "dead_letter").inc()
        event = dead_letter(record, reason, error, now_iso())
        if rule:
            event["rule"] = rule
        log.info("dead_letter", reason=reason, error=error, **record.source)
        return Answer.to(
            record, OutMessage(self.settings.dead_letter_topic, record.key, encode(event))
        )

    # -- snapshots --------------------------------------------------------------------

    def _maybe_snapshot(self, tp: TopicPartition) -> None:
        due_events = self._unsnapshotted[tp] >= self.settings.snapshot_every_events
        due_time = (
            time.monotonic() - self._snapshot_at.get(tp, 0) >= self.settings.snapshot_every_seconds
        )
        if self._unsnapshotted[tp] and (due_events or due_time):
            self._snapshot(tp)

    def _snapshot_if_changed(self, tp: TopicPartition) -> None:
        """Snapshot unless the newest snapshot already holds every committed record (so a
        shutdown's final snapshot is not written again when the source revokes)."""
        if self._unsnapshotted[tp]:
            self._snapshot(tp)

    def _snapshot(self, tp: TopicPartition) -> None:
        """Snapshot every stateful rule's state of ``tp`` as applied so far (the bytes are
        taken now, so later batches do not leak in; written in the background). A rule with
        no state there yet (no decision of its model so far) records that its state begins
        here, so a restart does not re-read the partition for it. While a job holds the
        commit behind it, the store keeps the newest snapshot the commit covers as well."""
        offset = self._next.get(tp)
        if offset is None or self.failed:
            return
        for rule in self._rules_for(tp[0]):
            if not rule.stateful:
                continue
            # a rule restored from a newer snapshot skips records up to its own offset
            at = max(offset, self._apply_from.get((rule.name, tp), 0))
            part = self.store.take(rule.name, tp, partial(rule.snapshot, tp))
            if part is None:
                save = partial(self.store.mark_origin, rule.name, tp, at)
            else:
                committed = self.checkpoint.target(tp)
                save = partial(self.store.save, rule.name, tp, at, part, committed)
            key = (rule.name, tp)
            after = self._writes.get(key)
            delivery = self.checkpoint.delivery
            task = asyncio.create_task(self._write(key, save, at, after, delivery))
            self._writes[key] = task
            task.add_done_callback(partial(self._written, key))
        self._unsnapshotted[tp] = 0
        self._snapshot_at[tp] = time.monotonic()

    async def _write(
        self,
        key: tuple[str, TopicPartition],
        save: Callable[[], Awaitable[None]],
        offset: int,
        after: asyncio.Task | None,
        delivery: asyncio.Task | None,
    ) -> None:
        """Write one snapshot once the previous write of the same rule and partition is done
        (they would race on the same files) and the delivery under way when it was taken has
        succeeded (else it would cover answers that never went out). A failure is logged and
        counted: the state is still in memory and the next snapshot (a base, as segments
        would continue what was not written), or a longer replay, covers it."""
        if after is not None:
            await after
        if delivery is not None:
            await asyncio.wait([delivery])
        rule, tp = key
        if self.failed or (delivery is not None and not _delivered(delivery)):
            self.store.forget(rule, tp)
            return
        started = time.perf_counter()
        try:
            await save()
        except Exception as e:
            self.store.forget(rule, tp)
            log.error("snapshot_write_failed", rule=rule, tp=tp, offset=offset, error=repr(e))
            self.metrics.snapshots.labels("failed").inc()
            return
        self.metrics.snapshot_seconds.observe(time.perf_counter() - started)
        self.metrics.snapshots.labels("written").inc()

    def _written(self, key: tuple[str, TopicPartition], task: asyncio.Task) -> None:
        if self._writes.get(key) is task:
            del self._writes[key]

    async def _flush_snapshots(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes.values())

    async def snapshot_all(self) -> None:
        """Snapshot every assigned partition now and wait for the files."""
        async with self._lock:
            await self.checkpoint.wait()
            for tp in list(self._emit_from):
                self._snapshot_if_changed(tp)
            await self._flush_snapshots()

    async def _update_lag(self) -> None:
        """Refresh the consumer-lag gauges; a metric never stops or holds up the daemon (the
        client refuses positions of partitions a rebalance took away meanwhile, and waits
        for a broker that does not answer)."""
        if self.broker is not None and not self.broker.up:
            return
        try:
            async with asyncio.timeout(_LAG_TIMEOUT_SECONDS):
                lags = await self.source.lag()
        except TimeoutError:
            return
        except Exception as e:
            log.warning("lag_unavailable", error=repr(e))
            return
        async with self._lock:  # a partition revoked meanwhile must not get its series back
            for (topic, partition), lag in lags.items():
                if (topic, partition) in self._emit_from:
                    self.metrics.consumer_lag.labels(topic, str(partition)).set(lag)


async def _unless_stopped(work: Awaitable[list[Record]], stop: asyncio.Event) -> list[Record]:
    """``work``'s records, or none if ``stop`` is set first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return []


def _delivered(delivery: asyncio.Task) -> bool:
    """Whether a finished delivery task went out and committed (``Checkpoint._deliver``)."""
    return not delivery.cancelled() and delivery.exception() is None and delivery.result()


def _of_models(
    decisions: Sequence[Decision], by_model: dict[str, Sequence[Decision]], models: list[str]
) -> Sequence[Decision]:
    """The decisions of ``models``, in stream order (``by_model``: ``decisions`` grouped)."""
    if not models:
        return []
    if len(models) == len(by_model):
        return decisions
    if len(models) == 1:
        return by_model[models[0]]
    wanted = set(models)
    return [d for d in decisions if d.model in wanted]


_partition_of = attrgetter("topic", "partition")


def _first_at(decisions: Sequence[Decision], offset: int) -> int:
    """The index of the first decision at ``offset`` or later (offsets increase)."""
    if not decisions or decisions[0].record.offset >= offset:
        return 0
    return bisect_left(decisions, offset, key=lambda d: d.record.offset)
