"""The commit order: every answer is delivered before the offset of the record it answers is
committed.

With a sink that commits offsets itself (Kafka transactions, exactly-once), an answer goes
out in the transaction whose commit passes its record, and not before: answers to records a
running job holds back wait in the outbox, since a crash before that commit replays the
record and answers it again. A delivery that fails leaves the checkpoint ``failed``: the
read positions have already moved past answers that were not delivered, so nothing more may
be committed or snapshotted; the restart replays from the last commit instead.
"""

from __future__ import annotations

from collections import defaultdict

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
        self.failed = False
        self._outbox: dict[TopicPartition, list[Answer]] = defaultdict(list)

    def assign(self, tp: TopicPartition, committed: int | None) -> None:
        self.committed[tp] = committed or 0

    def revoke(self, tp: TopicPartition) -> None:
        """Forget a partition; its waiting answers are the new owner's to give again."""
        self.committed.pop(tp, None)
        self._outbox.pop(tp, None)
        self._count_outbox()

    def due(self, positions: dict[TopicPartition, int]) -> Offsets:
        """The positions (each already behind the partition's holds) that move a commit."""
        return {tp: p for tp, p in positions.items() if p > self.committed.get(tp, 0)}

    async def deliver(self, answers: list[Answer], offsets: Offsets) -> None:
        """Deliver ``answers``, then commit ``offsets`` (in one transaction where the sink
        commits offsets itself)."""
        if self.sink.commits_offsets:
            answers = self._release(answers, offsets)
        if not answers and not offsets:
            return
        try:
            await self.sink.deliver([a.message for a in answers], offsets)
            if not self.sink.commits_offsets and offsets:
                await self.source.commit(offsets)
        except BaseException:
            self.failed = True
            raise
        self.committed.update(offsets)

    def _release(self, answers: list[Answer], offsets: Offsets) -> list[Answer]:
        """The answers (new or waiting) to records that ``offsets`` commit, in record order;
        the others wait in the outbox."""
        pending = [a for tp in list(self._outbox) for a in self._outbox.pop(tp)] + answers
        out = []
        for a in pending:
            if a.offset < offsets.get(a.tp, self.committed.get(a.tp, 0)):
                out.append(a)
            else:
                self._outbox[a.tp].append(a)
        self._count_outbox()
        return sorted(out, key=lambda a: (a.tp, a.offset))

    def _count_outbox(self) -> None:
        self.metrics.outbox.set(sum(map(len, self._outbox.values())))
