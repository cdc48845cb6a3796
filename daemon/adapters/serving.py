"""A rule on a serving stack's traffic (Seldon Core 2, KServe) as two stages, each a
consume-transform-produce step with the pipeline's commit order (exactly-once with
transactions):

1. ``ServingForward`` sends every request and response of the rule's model, as it came, to
   the rule's join topic keyed by the model, merged from the serving stack's partitions in
   record time and packed many to a join-topic record (daemon/forwarded.py): the model's
   traffic gets one order in one partition;
2. ``ServingJoin`` pairs requests with responses there and hands each pair's rows, as
   decisions, to the rule's checker (i.o.r. or reach) in the same step. The requests
   waiting for their responses and the checker's history are one state, snapshotted,
   restored and replayed together.

A single log per model makes a replay after a restart see the records in the order the
first pass did, so the join pairs and expires them the same way and the checker sees the
same decisions in the same order.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

import msgspec
import numpy as np

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import BadEvent, Decision, Record, dead_letter, encode, now_iso
from vigil.connectors.serving import kserve, seldon
from vigil.connectors.serving.layouts import Layouts
from vigil.connectors.serving.message import Inference, Role
from vigil.connectors.serving.rows import Row, TensorSelection, decision_rows
from vigil.daemon.adapters.base import Answer, Rule, RuleContext, RuleResult, StatePart
from vigil.daemon.adapters.ior import IorRule
from vigil.daemon.adapters.reach import ReachRule
from vigil.daemon.config import IorRuleConfig, ReachRuleConfig, SeldonConfig, ServingKeys
from vigil.daemon.forwarded import PACK_BYTES, PACK_HEADER, Fields, frame, unpack
from vigil.daemon.join import Expired, Join, Waiting
from vigil.daemon.merge import TimeMerge

SOURCE_HEADERS = ("vigil-topic", "vigil-partition", "vigil-offset")
"""Where a forwarded record came from, in the join-topic copies of older builds."""
KEY_HEADER = "vigil-key"
"""A forwarded record's own key, in the join-topic copies of older builds."""
_PACKED = ((PACK_HEADER, b"1"),)
_OURS = frozenset((*SOURCE_HEADERS, KEY_HEADER))
UNREADABLE = (ValueError, TypeError, AttributeError, LookupError, ArithmeticError)
"""What reading a record the decoders did not foresee may raise: a dead letter, since
nothing a record holds may stop the daemon."""


class ServingForward(Rule):
    """Stage 1: the rule's requests and responses to its join topic, keyed by model, merged
    from the serving stack's partitions in record-timestamp order (daemon/merge.py)."""

    kind = "serving-forward"
    merges = True

    def __init__(
        self,
        name: str,
        config: ServingKeys,
        topics: set[str],
        join_topic: str,
        context: RuleContext,
    ) -> None:
        super().__init__(name, topics)
        self.config, self.join_topic, self.context = config, join_topic, context
        self.backend = config.format
        assert config.model is not None
        self.key = config.model.encode()
        idle_ms = int(config.merge_idle_seconds * 1000)
        self.merge = TimeMerge(idle_ms, config.join_pending_limit)
        self._topics: dict[str, bytes] = {}

    def wants_decisions(self, topic: str) -> bool:
        return False

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        """Take the records into the merge; those before ``emit_from`` were forwarded before
        the restart (a commit stays behind every record not yet forwarded)."""
        if records and records[0].offset < emit_from:
            records = [r for r in records if r.offset >= emit_from]
        self.merge.add(tp, records)
        return RuleResult()

    def release(self, behind: Callable[[TopicPartition], bool]) -> RuleResult:
        """Forward the records whose turn has come, in time order, packed into join-topic
        records of up to ``PACK_BYTES`` (each answers the last record it holds: one commit
        passes them all)."""
        result = RuleResult()
        started = time.perf_counter()
        frames: list[bytes] = []
        size, last = 0, None
        for record in self.merge.release(behind):
            try:
                mine = self._pairable(record)
            except BadEvent as e:
                result.dead.append((record, e.reason, str(e)))
                continue
            except UNREADABLE as e:
                result.dead.append((record, "undecodable", f"cannot read it: {e!r}"))
                continue
            if not mine:
                continue  # another InferenceService's traffic on a shared topic
            result.checked += 1
            topic = self._topics.get(record.topic)
            if topic is None:
                topic = self._topics[record.topic] = record.topic.encode()
            packed = frame(record, topic)
            if frames and size + len(packed) > PACK_BYTES:
                result.events.append(self._message(frames, last))
                frames, size = [], 0
            frames.append(packed)
            size += len(packed)
            last = record
        if frames:
            result.events.append(self._message(frames, last))
        read_ahead = self.context.metrics.serving_read_ahead
        for (topic_name, partition), held in self.merge.held().items():
            read_ahead.labels(self.name, topic_name, str(partition)).set(held)
        result.seconds = time.perf_counter() - started
        return result

    def _message(self, frames: list[bytes], last: Record | None) -> Answer:
        assert last is not None
        value = b"".join(frames)
        message = OutMessage(self.join_topic, self.key, value, _PACKED, last.timestamp_ms)
        return Answer.to(last, message)

    def hold(self, tp: TopicPartition) -> int | None:
        return self.merge.hold(tp)

    def full(self) -> set[TopicPartition]:
        return self.merge.full()

    def in_flight(self) -> bool:
        return len(self.merge) > 0

    def assign(self, tp: TopicPartition) -> None:
        self.merge.assign(tp)

    def drop(self, tp: TopicPartition) -> None:
        self.merge.drop(tp)

    def _pairable(self, record: Record) -> bool:
        """Whether the record is of this rule's model; raises ``BadEvent`` for a record
        without what pairs it with its other side."""
        if self.config.format == "seldon":
            seldon.join_key(record)
            return True
        _, service = kserve.identify(record)
        return service == self.config.model


class ServingJoin(Rule):
    """Stage 2: each request paired with its response, the pair's rows checked by
    ``checker`` as decisions named ``<request id>/<row>``."""

    stateful = True

    def __init__(
        self, config: ServingKeys, join_topic: str, checker: Rule, context: RuleContext
    ) -> None:
        super().__init__(config.name, {join_topic})
        self.config, self.checker, self.context = config, checker, context
        self.kind, self.backend = checker.kind, checker.backend
        self.selection = TensorSelection(
            config.input_tensor,
            config.output_tensor,
            tuple(features) if (features := getattr(config, "features", None)) else None,
            config.categories,
        )
        self.timeout_ms = int(config.join_timeout_seconds * 1000)
        self.joins: dict[TopicPartition, Join] = {}
        self.layouts = Layouts(self.selection)  # of the model's protobuf messages
        self._continued: set[TopicPartition] = set()  # the last snapshot held checker state
        self._roles: dict[str, Role] = {}  # of the Seldon topics seen

    def wants_decisions(self, topic: str) -> bool:
        return False

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        """Pair the records in order; the pairs' decisions go to ``check`` (through the
        pipeline), what a record expires is emitted with it. Records before ``emit_from`` are
        replayed into the state: their pairs are checked again without alerts, and their
        dead letters went out before."""
        result = RuleResult()
        started = time.perf_counter()
        join = self.joins.setdefault(tp, self._new_join())
        by_layout = self.config.format == "seldon"
        for record in records:
            live = record.offset >= emit_from
            try:
                carried = _carried(record)
            except BadEvent as e:
                if live:
                    result.events.append(self._dead(record, record, e.reason, str(e)))
                continue
            rows = self._layout_rows(carried) if by_layout else repeat(None)
            for fields, row in zip(carried, rows, strict=False):  # ``repeat`` for KServe
                if row is not None:
                    self._take_row(join, record, fields, row, live, result)
                    continue
                source = Record(*fields)
                try:
                    inference = self._decode(source)
                except BadEvent as e:
                    if live:
                        result.events.append(self._dead(record, source, e.reason, str(e)))
                    continue
                except UNREADABLE as e:
                    if live:
                        error = f"cannot read it: {e!r}"
                        result.events.append(self._dead(record, source, "undecodable", error))
                    continue
                pair, expired = join.add(inference, source, source.timestamp_ms)
                if live and expired:
                    result.events += [self._unmatched(record, e) for e in expired]
                if pair is not None:
                    self._decisions(record, *pair, result, live)
        self.context.metrics.serving_waiting.labels(self.name, tp[0], str(tp[1])).set(len(join))
        result.seconds = time.perf_counter() - started
        return result

    def _layout_rows(self, carried: list[Fields]) -> list[Row | None]:
        """The decision row of each carried Seldon record that reads by a known layout
        (``seldon.decode``'s common case, read the same way), the records of each topic read
        together; None for any other record (``decode`` reads it)."""
        rows: list[Row | None] = [None] * len(carried)
        if not carried:
            return rows
        topics, _, _, values, keys, headers, _ = zip(*carried, strict=True)
        keyed = None  # a key and a value to read: all have, usually
        if not (all(keys) and all(values)):
            keyed = list(map(all, zip(keys, values, strict=True)))
        for topic in set(topics):
            role = self._role(topic)
            if role is None:
                continue
            mine = list(map(operator.eq, topics, repeat(topic)))
            if keyed is not None:
                mine = list(map(operator.and_, mine, keyed))
            read = seldon.layout_rows(
                role, list(compress(values, mine)), list(compress(headers, mine)), self.layouts
            )
            for i, row in zip(compress(range(len(carried)), mine), read, strict=True):
                rows[i] = row
        return rows

    def _role(self, topic: str) -> Role | None:
        """A Seldon topic's side, or None for another topic (``decode`` says why)."""
        role = self._roles.get(topic)
        if role is None:
            try:
                role = self._roles[topic] = seldon.role_of(topic)
            except ValueError:
                return None
        return role

    def _take_row(
        self, join: Join, record: Record, fields: Fields, row: Row, live: bool, result: RuleResult
    ) -> None:
        """Take a keyed Seldon record whose ``row`` was read by layout. A side that pairs at
        once with one read so too becomes a decision without a record, an inference or a
        ``Waiting`` built for it."""
        topic, _, _, _, key, _, timestamp = fields
        role = self._roles[topic]
        assert key is not None
        join_key = key.decode(errors="replace")
        partner, expired = join.take(join_key, role, timestamp)
        if live and expired:
            result.events += [self._unmatched(record, e) for e in expired]
        if partner is not None and partner.inference.row is not None:
            if role == "response":
                ident, x_row, y_row = partner.inference.request_id, partner.inference.row, row
            else:
                ident, x_row, y_row = seldon.request_id(join_key), row, partner.inference.row
            result.decisions.append(self._decision(record, ident, x_row, y_row))
            return
        model = self.config.model
        assert model is not None
        inference = Inference(join_key, seldon.request_id(join_key), role, model, [], None, row)
        arrived = Waiting(inference, Record(*fields), timestamp)
        if partner is not None:
            pair = (partner, arrived) if role == "response" else (arrived, partner)
            self._decisions(record, *pair, result, live)
        else:
            superseded = join.put(arrived)
            if live and superseded is not None:
                result.events.append(self._unmatched(record, superseded))

    async def check(
        self, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> RuleResult:
        return await self.checker.check(tp, decisions, emit_from)

    def _new_join(self) -> Join:
        return Join(self.timeout_ms)

    def _decode(self, source: Record) -> Inference:
        """The request or response in one of the serving stack's records."""
        if self.config.format == "seldon":
            assert self.config.model is not None
            return seldon.decode(source, self.config.model, self.layouts)
        return kserve.decode(source)

    def _decisions(
        self, record: Record, request: Waiting, response: Waiting, result: RuleResult, live: bool
    ) -> None:
        """The pair's rows as decisions answered by ``record``, or (live) a dead letter."""
        asked, answered = request.inference, response.inference
        ident = asked.request_id
        if asked.row is not None and answered.row is not None:  # one row each, by layout
            result.decisions.append(self._decision(record, ident, asked.row, answered.row))
            return
        try:
            x, y = self._rows(asked, answered)
        except BadEvent as e:
            if live:
                result.events.append(self._dead(record, request.record, e.reason, str(e)))
            return
        if len(x) == 1:
            result.decisions.append(self._decision(record, ident, x[0], y[0].tolist()))
            return
        model = self.config.model
        names = [f"{ident}/{row}" for row in range(len(x))]
        event = {"id": ident, "model": model}
        result.decisions += map(
            Decision, repeat(record), names, repeat(model), x, y.tolist(), repeat(event)
        )

    def _decision(self, record: Record, ident: str, x_row: Any, y_row: Any) -> Decision:
        """A pair's one row as the decision ``<ident>/0``, answered by ``record``."""
        model = self.config.model
        assert model is not None
        return Decision(record, f"{ident}/0", model, x_row, y_row, {"id": ident, "model": model})

    def _rows(self, request: Inference, response: Inference) -> tuple[np.ndarray, np.ndarray]:
        """The pair's rows; raises ``BadEvent`` for a failed inference or rows that do not
        pair."""
        if response.error is not None:
            error = f"the serving stack answered with an error: {response.error}"
            raise BadEvent("failed", error)
        try:
            return decision_rows(request, response, self.selection)
        except BadEvent:
            raise
        except UNREADABLE as e:
            raise BadEvent("schema", f"cannot pair the rows: {e!r}") from e

    def _unmatched(self, record: Record, expired: Expired) -> Answer:
        side = expired.waiting.inference.role
        why = {
            "timeout": f"no {'response' if side == 'request' else 'request'} within "
            f"{self.config.join_timeout_seconds:g} s of stream time",
            "superseded": "a later record of the same side and key replaced it",
        }[expired.why]
        self.context.metrics.serving_unmatched.labels(self.name, side, expired.why).inc()
        error = f"unmatched {side} {expired.waiting.inference.request_id!r}: {why}"
        return self._dead(record, expired.waiting.record, "unmatched", error)

    def _dead(self, answers: Record, about: Record, reason: str, error: str) -> Answer:
        """A dead letter naming ``about`` as it was on the serving stack's topic (where, and
        its key), sent with ``answers``."""
        source = _original(about)
        event = dead_letter(source, reason, error, now_iso())
        event["rule"] = self.config.name
        self.context.metrics.dead_letters.labels(reason).inc()
        self.context.metrics.events.labels(self.name, "dead_letter").inc()
        message = OutMessage(self.context.dead_letter_topic, source.key, encode(event))
        return Answer.to(answers, message)

    # -- state: the waiting side and the checker's, as one ---------------------------

    def snapshot(self, tp: TopicPartition, since: int | None = None) -> StatePart | None:
        """The waiting side whole, and the checker's state as the checker gives it (a
        segment continues only a part that held checker state too)."""
        join = self.joins.get(tp)
        inner = self.checker.snapshot(tp, since if tp in self._continued else None)
        if join is None and inner is None:
            return None
        waiting = join.snapshot() if join is not None else b""
        if inner is None:
            self._continued.discard(tp)
            return StatePart(_pack(waiting, b""))
        self._continued.add(tp)
        return StatePart(
            _pack(waiting, inner.blob), inner.base, inner.start, inner.stop, inner.live_from
        )

    def restore(self, tp: TopicPartition, parts: list[bytes]) -> None:
        """The newest part's waiting side, and the checker's state from every part."""
        unpacked = [_unpack(part) for part in parts]
        waiting = unpacked[-1][0]
        checker = [blob for _, blob in unpacked if blob]
        if checker:
            self.checker.restore(tp, checker)
            self._continued.add(tp)
        if waiting:
            # a snapshot of an older build holds join-topic copies: their sources are read
            decode = lambda record: self._decode(_original(record))  # noqa: E731
            self.joins[tp] = Join.restore(waiting, decode, self.timeout_ms)

    def drop(self, tp: TopicPartition) -> None:
        self.joins.pop(tp, None)
        self._continued.discard(tp)
        self.checker.drop(tp)

    # -- the rest is the checker's ----------------------------------------------------

    def history_size(self, tp: TopicPartition) -> int:
        return self.checker.history_size(tp)

    def mark_history(self, tp: TopicPartition, complete: bool) -> None:
        self.checker.mark_history(tp, complete)

    def hold(self, tp: TopicPartition) -> int | None:
        return self.checker.hold(tp)

    def completed(self) -> list[Answer]:
        return self.checker.completed()

    def in_flight(self) -> bool:
        return self.checker.in_flight()

    def saturated(self) -> bool:
        return self.checker.saturated()

    async def wait_for_space(self) -> None:
        await self.checker.wait_for_space()

    async def drain(self) -> None:
        await self.checker.drain()

    def offload_jobs(self) -> dict[str, set[str]]:
        return self.checker.offload_jobs()

    def close(self) -> None:
        self.checker.close()


def _pack(waiting: bytes, checker: bytes) -> bytes:
    return len(waiting).to_bytes(8, "little") + waiting + checker


def _unpack(part: bytes) -> tuple[bytes, bytes]:
    size = int.from_bytes(part[:8], "little")
    return part[8 : 8 + size], part[8 + size :]


def _carried(record: Record) -> list[Fields]:
    """The fields of the serving stack's records a join-topic record carries: many (packed
    by this build's forward stage), or one (a copy with its source headers, as older builds
    forwarded them)."""
    headers = record.headers
    if len(headers) == 1 and tuple(headers[0]) == _PACKED[0]:
        try:
            return unpack(record.value or b"")
        except ValueError as e:
            raise BadEvent("undecodable", f"a join-topic record of packed records: {e}") from e
    source = _original(record)
    if source is record:
        raise BadEvent("schema", "a join-topic record without its source topic header")
    return [msgspec.structs.astuple(source)]


def _original(record: Record) -> Record:
    """A join-topic record as it was on the serving stack's topic (its coordinates, its
    key and headers), or the record itself when it lacks those."""
    ours = {name: value for name, value in record.headers if name in _OURS}  # the last wins
    topic, partition, offset = (ours.get(h) for h in SOURCE_HEADERS)
    if topic is None or partition is None or offset is None:
        return record
    key = ours.get(KEY_HEADER)
    return Record(topic.decode(), int(partition), int(offset), record.value, key, record.headers)


def serving_topics(config: ServingKeys, seldon_config: SeldonConfig, group_id: str) -> Stages:
    """The topics of a serving-stack rule's stages."""
    if config.format == "seldon":
        sources = set(seldon_config.topics(config))
    else:
        assert config.topic is not None
        sources = {config.topic}
    return Stages(frozenset(sources), f"{group_id}.{config.name}.join")


def serving_rules(
    config: IorRuleConfig | ReachRuleConfig,
    seldon_config: SeldonConfig,
    group_id: str,
    context: RuleContext,
) -> list[Rule]:
    """The two stages of a rule on a serving stack's traffic: forward, and join with the
    rule itself (i.o.r. or reach) checking the joined rows, already one row of columns."""
    stages = serving_topics(config, seldon_config, group_id)
    update = {"topic": stages.join, "format": "vigil", "features": None}
    checker: Rule
    if isinstance(config, IorRuleConfig):
        checker = IorRule(config.model_copy(update={**update, "dim": config.input_dim}), context)
    else:
        checker = ReachRule(config.model_copy(update=update), context)
    return [
        ServingForward(f"{config.name}.forward", config, set(stages.sources), stages.join, context),
        ServingJoin(config, stages.join, checker, context),
    ]


@dataclass(frozen=True)
class Stages:
    """A serving-stack rule's topics: the serving stack's, and its join topic (one
    partition: every record in it is of the rule's model)."""

    sources: frozenset[str]
    join: str
