"""The commit order: every answer is delivered before the offset of the record it answers is
committed.

With a sink that commits offsets itself (Kafka transactions, exactly-once), an answer goes
out in the transaction whose commit passes its record, and not before: answers to records a
running job holds back wait in the outbox, since a crash before that commit replays the
record and answers it again. A delivery that fails leaves the checkpoint ``failed``: the
read positions have already moved past answers that were not delivered, so nothing more may
be committed or snapshotted; the restart replays from the last commit instead.

``send`` starts a delivery without waiting for it (snapshots taken meanwhile wait for it
instead). Deliveries send their answers one at a time and in order, and each commits its
offsets once its answers are acknowledged and the commit before it is done, so every commit
follows the acknowledgement of its answers and commits never overtake each other. With a
sink that commits offsets itself, a delivery is one transaction and the next waits for it
whole; otherwise (at-least-once: the consumer commits, in the loop) the next delivery's
answers go out while the commit before is under way, since that commit's round trip is
answered only when the loop yields (a commit waited for at every batch took a tenth of a
backlog's drain, docs/benchmarks.md). The daemon's loop settles each delivery before its next
fetch: a batch fetched while the previous one is delivered would wait for that delivery and
then for its own (bench/pipeline_bench.py: p50 at 10,000 decisions/s 30 -> 45 ms
at-least-once, 49 -> 69 ms exactly-once, when the loop went on fetching). With a backlog's
batches held while the decode worker reads them (daemon/decoding.py), the loop goes on to
its next fetch and to the oldest held batch's check without waiting: that batch is there
already, and the delivery's round trips go on meanwhile in the sink's own thread
(connectors/kafka.py); the next ``send`` waits for whatever is left of it. The time the
loop waits is counted in ``vigil_delivery_wait_seconds``.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable

from vigil.connectors.base import Offsets, Sink, Source, TopicPartition
from vigil.daemon.adapters import Answer
from vigil.daemon.metrics import Metrics


class Checkpoint:
    """Committed offsets per partition and the exactly-once outbox."""

    def __init__(self, source: Source, sink: Sink, metrics: Metrics) -> None:
        self.source = source
        self.sink = sink
        self.metrics = metrics
        self.committed: dict[TopicPartition, int] = {}
        self.error: BaseException | None = None  # of the delivery that failed
        self._outbox: dict[TopicPartition, list[Answer]] = defaultdict(list)
        self._sending: Offsets = {}  # offsets the deliveries under way commit
        self._delivery: asyncio.Task | None = None  # the last one started
        self._answered: asyncio.Future | None = None  # when its answers are acknowledged

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def delivery(self) -> asyncio.Task | None:
        """The last delivery started, if under way (it ends after every delivery before it;
        it succeeds only if they did)."""
        return self._delivery

    def target(self, tp: TopicPartition) -> int:
        """The partition's committed offset once the deliveries under way are done."""
        return self._sending.get(tp, self.committed.get(tp, 0))

    def assign(self, tp: TopicPartition, committed: int | None) -> None:
        self.committed[tp] = committed or 0

    def revoke(self, tp: TopicPartition) -> None:
        """Forget a partition; its waiting answers are the new owner's to give again."""
        self.committed.pop(tp, None)
        self._outbox.pop(tp, None)
        self._count_outbox()

    def due(self, positions: dict[TopicPartition, int]) -> Offsets:
        """The positions (each already behind the partition's holds) that move a commit
        beyond what is committed or being committed."""
        return {tp: p for tp, p in positions.items() if p > self.target(tp)}

    async def send(self, answers: list[Answer], offsets: Offsets) -> None:
        """Start delivering ``answers`` and committing ``offsets`` once the previous
        delivery's answers are acknowledged (with a sink that commits offsets: once it is
        done), without waiting for this one; a failure of a delivery before is raised here."""
        if not answers and not offsets:
            return
        if self._answered is not None:
            await self._wait_for(self._answered)
        if self.error is not None:
            raise self.error
        if self.sink.commits_offsets:
            answers = self._release(answers, offsets)
        if not answers and not offsets:
            return
        self._sending.update(offsets)
        self._answered = asyncio.get_running_loop().create_future()
        self._delivery = asyncio.create_task(
            self._deliver(answers, offsets, self._delivery, self._answered)
        )

    async def settle(self) -> None:
        """Wait for the deliveries under way, if any; raise the failure of any delivery."""
        await self.wait()
        if self.error is not None:
            raise self.error

    async def wait(self) -> None:
        """Wait for the deliveries under way, if any (a failure is kept in ``error``)."""
        if self._delivery is not None:
            delivery, self._delivery = self._delivery, None
            await self._wait_for(delivery)

    async def _wait_for(self, future: asyncio.Future) -> None:
        """Wait for ``future`` (a delivery, or its acknowledgement), counting the time."""
        if not future.done():
            started = time.perf_counter()
            await asyncio.wait([future])
            self.metrics.delivery_wait.inc(time.perf_counter() - started)

    async def _deliver(
        self,
        answers: list[Answer],
        offsets: Offsets,
        before: asyncio.Task | None,
        answered: asyncio.Future,
    ) -> bool:
        """Whether the answers went out and the offsets were committed, after every delivery
        ``before`` this one had done so; ``answered`` is set once the answers are
        acknowledged (or the delivery has failed)."""
        try:
            sent = await self._recorded(self.sink.deliver([a.message for a in answers], offsets))
            if sent and not self.sink.commits_offsets:
                answered.set_result(None)  # the next delivery's answers go out meanwhile
            if before is not None:  # its commit comes first; it ends before this one does
                await asyncio.wait([before])
            if self.error is not None:  # this delivery or one before it failed
                return False
            committing = bool(offsets) and not self.sink.commits_offsets
            if committing and not await self._recorded(self.source.commit(offsets)):
                return False
        finally:
            if not answered.done():
                answered.set_result(None)
        self.committed.update(offsets)
        for tp, offset in offsets.items():  # a later delivery's may be under way
            if self._sending.get(tp) == offset:
                del self._sending[tp]
        return True

    async def _recorded(self, step: Awaitable[None]) -> bool:
        """Whether ``step`` succeeded; its failure is kept in ``error``."""
        try:
            await step
        except Exception as e:
            self.error = e
            return False
        except BaseException as e:
            self.error = e
            raise
        return True

    def recovered(self) -> None:
        """Forget a failed delivery, its offsets and the waiting answers once every partition
        has been resumed from its commit (assigned again: their answers are given again)."""
        self.error = None
        self._delivery = self._answered = None
        self._sending.clear()
        self._outbox.clear()
        self._count_outbox()

    def _release(self, answers: list[Answer], offsets: Offsets) -> list[Answer]:
        """The answers (new or waiting) to records that ``offsets`` commit, in record order
        within each partition; the others wait in the outbox."""
        pending = [a for tp in list(self._outbox) for a in self._outbox.pop(tp)] + answers
        out = []
        for a in pending:
            if a.offset < offsets.get(a.tp, self.committed.get(a.tp, 0)):
                out.append(a)
            else:
                self._outbox[a.tp].append(a)
        self._count_outbox()
        return _in_record_order(out)

    def _count_outbox(self) -> None:
        self.metrics.outbox.set(sum(map(len, self._outbox.values())))


def _in_record_order(answers: list[Answer]) -> list[Answer]:
    """``answers`` with each partition's in record order, in the places its answers hold:
    the order across partitions is the rules' own (a merging rule's is time)."""
    last: dict[TopicPartition, int] = {}
    for a in answers:
        if a.offset < last.get(a.tp, -1):
            break
        last[a.tp] = a.offset
    else:
        return answers
    slots: dict[TopicPartition, list[int]] = defaultdict(list)
    for i, a in enumerate(answers):
        slots[a.tp].append(i)
    out = list(answers)
    for places in slots.values():
        ordered = sorted((answers[i] for i in places), key=lambda a: a.offset)
        for i, a in zip(places, ordered, strict=True):
            out[i] = a
    return out
