"""A consumer-group assignor that keeps co-partitioned topics together: partition ``p`` of
every topic in one group goes to the same member, as Kafka Streams puts a task's input
partitions in one task. A serving stack writes a request and its response to the same
partition number of its two topics, so the instance that merges them in time holds both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)


class CoPartitioned(AbstractPartitionAssignor):
    """Units of work (one partition number of a group of topics, or one partition of any
    other topic) to the least loaded member, largest units first; deterministic, so every
    leader assigns alike."""

    name = "vigil-copartitioned"
    version = 0

    def __init__(self, groups: Iterable[Iterable[str]]) -> None:
        self.group_of = {topic: i for i, group in enumerate(groups) for topic in group}

    def assign(  # type: ignore[override]  # an instance: it holds the groups
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        topics = sorted({t for m in members.values() for t in m.subscription})
        units: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
        for topic in topics:
            for p in sorted(cluster.partitions_for_topic(topic) or ()):
                group = self.group_of.get(topic)
                unit = ("topic", topic, p) if group is None else ("group", str(group), p)
                units[unit].append((topic, p))
        load = dict.fromkeys(members, 0)
        assigned: dict[str, dict[str, list[int]]] = {m: defaultdict(list) for m in members}
        subscribed = {m: set(meta.subscription) for m, meta in members.items()}

        def give(partitions: list[tuple[str, int]]) -> bool:
            wanted = {topic for topic, _ in partitions}
            able = [m for m in members if wanted <= subscribed[m]]
            if not able:
                return False
            member = min(able, key=lambda m: (load[m], m))
            for topic, p in partitions:
                assigned[member][topic].append(p)
            load[member] += len(partitions)
            return True

        for unit in sorted(units, key=lambda u: (-len(units[u]), u)):
            if not give(units[unit]):  # no member reads the whole group: one by one
                for partition in units[unit]:
                    give([partition])
        return {
            m: ConsumerProtocolMemberAssignment(self.version, sorted(assigned[m].items()), b"")
            for m in members
        }

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        return ConsumerProtocolMemberMetadata(self.version, list(topics), b"")

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        return None
