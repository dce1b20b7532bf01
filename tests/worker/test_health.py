"""``worker/health.py``'s judgement of a worker left without partitions: "more members than
partitions" only when the group's census says so; a worker waiting for partitions another member
still holds is a different condition, said later.  The census against Apache Kafka is
tests/supervisor/test_spread_kafka.py."""

from __future__ import annotations

import logging

from kdaemon.client.types import GroupState, TopicPartition
from kdaemon.worker.health import CONDITIONS, FIRST_WARNING_S, PENDING_S, HealthWatch, observe


class _Consumer:
    def __init__(self, partitions=(), stable: bool = True) -> None:
        self.partitions = set(partitions)
        self.stable = stable

    def reachability(self):
        return True, None

    def missing_topics(self):
        return set()

    def group_state(self):
        return GroupState("g", "consumer", "m", 3, None, self.stable, 1)

    def assignment(self):
        return set(self.partitions)


def test_no_partitions_is_more_members_than_partitions_only_when_the_census_says_so():
    asked = []

    def census(sizes):
        def ask():
            asked.append(sizes)
            return sizes
        return ask

    idle = _Consumer()
    assert observe(idle, ["t"], census=census(None)) == {}            # not counted yet: nothing said
    assert observe(idle, ["t"], census=census((3, 2))) == {
        "no_assignment": "group g: its 3 members share 2 partition(s) and this worker has none"}
    assert observe(idle, ["t"], census=census((4, 8))) == {
        "assignment_pending": "group g: this worker has no partitions yet, though the group's 4 members share 8"}
    assert observe(idle, ["t"], census=census((2, 2))).keys() == {"assignment_pending"}
    asked.clear()
    busy = _Consumer([TopicPartition("t", 0)])
    assert observe(busy, ["t"], census=census((3, 2))) == {}          # it has partitions
    assert observe(_Consumer(stable=False), ["t"], census=census((3, 2))) == {
        "join_incomplete": "group g: the join has not completed"}
    assert asked == []                                                # the census is asked only when needed


def test_a_worker_waiting_for_partitions_is_said_later_than_one_the_group_has_no_room_for(caplog):
    now = [0.0]
    watch = HealthWatch("worker", clock=lambda: now[0])
    pending = {"assignment_pending": "group g: this worker has no partitions yet, though the group's 4 members share 8"}
    assert CONDITIONS["assignment_pending"][0] == PENDING_S > FIRST_WARNING_S
    with caplog.at_level(logging.WARNING, logger="kdaemon.worker.health"):
        for t in (0.0, FIRST_WARNING_S, PENDING_S - 1):
            now[0] = t
            watch.update(pending)
        assert watch.problems == () and caplog.records == []
        now[0] = PENDING_S
        watch.update(pending)
    assert watch.problems == ("assignment_pending",)
    assert "more members than" not in caplog.text and "members share 8 for 15s" in caplog.text
