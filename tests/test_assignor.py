"""The co-partitioning assignor against what it promises: every partition to exactly one
member, partition p of a group's topics to one member, and a load within one unit."""

from __future__ import annotations

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.connectors.assignor import CoPartitioned


class Cluster:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.counts[topic])) if topic in self.counts else None


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdefg"), st.integers(1, 6), min_size=1),
    st.integers(1, 4),
    st.data(),
)
def test_each_partition_once_and_a_groups_partition_numbers_together(counts, n, data):
    topics = sorted(counts)
    grouped = data.draw(st.lists(st.sampled_from(topics), unique=True, max_size=len(topics)))
    cut = data.draw(st.integers(0, len(grouped)))
    groups = [g for g in (grouped[:cut], grouped[cut:]) if g]
    members = {f"m{i}": ConsumerProtocolMemberMetadata(0, topics, b"") for i in range(n)}
    result = CoPartitioned(groups).assign(Cluster(counts), members)
    owner: dict[tuple[str, int], str] = {}
    for member, assignment in result.items():
        for topic, partitions in assignment.assignment:
            for p in partitions:
                assert (topic, p) not in owner, "assigned twice"
                owner[(topic, p)] = member
    assert set(owner) == {(t, p) for t, c in counts.items() for p in range(c)}
    for group in groups:
        for p in range(max(counts[t] for t in group)):
            assert len({owner[(t, p)] for t in group if p < counts[t]}) == 1
    loads = [sum(len(ps) for _, ps in a.assignment) for a in result.values()]
    assert max(loads) - min(loads) <= max([len(g) for g in groups] + [1])


def test_a_member_that_does_not_read_a_whole_group_still_gets_its_topics():
    members = {
        "old": ConsumerProtocolMemberMetadata(0, ["in"], b""),
        "new": ConsumerProtocolMemberMetadata(0, ["out"], b""),
    }
    result = CoPartitioned([["in", "out"]]).assign(Cluster({"in": 2, "out": 2}), members)
    got = {m: dict(a.assignment) for m, a in result.items()}
    assert got == {"old": {"in": [0, 1]}, "new": {"out": [0, 1]}}
