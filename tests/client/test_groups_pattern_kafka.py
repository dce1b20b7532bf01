"""Pattern subscriptions on Apache Kafka, kdaemon beside the Java consumer.

Java subscribes to the topics a pattern matches *whole* (``Pattern.matcher(topic).matches()``),
leaving out internal topics (``exclude.internal.topics``), and picks up topics created later on
its next metadata refresh.  kdaemon must agree topic for topic: in a mixed group the leader
assigns what the members' subscriptions name, so a member that reads a pattern differently
fetches partitions nobody else would, or misses some.

Each pattern runs in two groups at once, one kdaemon member and one Java member, and the test
compares kdaemon's ``subscription()`` and assignment with the Java member's assignment.  The
topic names carry a run id, so other tests' topics on the session broker never match.
"""

from __future__ import annotations

import uuid

import pytest

from testkit.group_members import JavaMember, KdMember, wait_until
from testkit.produce import create_topic

pytestmark = pytest.mark.kafka

WAIT = 90.0
PARTITIONS = 2


def _partitions(topics) -> frozenset[tuple[str, int]]:
    return frozenset((t, p) for t in topics for p in range(PARTITIONS))


def test_patterns_match_whole_topic_names_and_new_topics_as_java_does(kafka):
    bootstrap = kafka.bootstrap
    base = f"{uuid.uuid4().hex[:8]}-pat"
    for t in (f"{base}-a", f"{base}-ab", f"{base}-abc", f"x{base}-abc", f"{base}-c"):
        create_topic(bootstrap, t, PARTITIONS)
    # (pattern, what it matches now, what it matches once the later topics exist)
    cases = {
        # A prefix: "x...-pat-abc" contains a match but is not one; re.search would take it.
        "prefix": (f"{base}-a.*", {f"{base}-a", f"{base}-ab", f"{base}-abc"}, {f"{base}-a2"}),
        # A character class: "-pat-ab" starts with a match; the internal topic is left out.
        "class": (f"{base}-[ab]|__consumer_offsets", {f"{base}-a"}, {f"{base}-b"}),
    }
    members = []
    try:
        pairs = {}
        for key, (pattern, _, _) in cases.items():
            kd = KdMember(bootstrap, f"g-kd-{key}-{base}", pattern=pattern, name=f"kd-{key}", metadata_max_age_ms=1000)
            java = JavaMember(bootstrap, f"g-java-{key}-{base}", pattern=pattern, name=f"java-{key}",
                              settings={"metadata.max.age.ms": "1000"})
            pairs[key] = (kd, java)
            members += [kd, java]

        def agree(stage: int) -> bool:
            for key, (kd, java) in pairs.items():
                topics = cases[key][1] | (cases[key][2] if stage else set())
                if kd.assignment() != _partitions(topics) or java.assignment() != _partitions(topics):
                    return False
            return True

        wait_until(lambda: agree(0), WAIT, "both clients to subscribe to the matching topics", members)
        for key, (kd, java) in pairs.items():
            assert kd.call(lambda c: c.subscription()) == cases[key][1]

        # New topics: one more match per pattern, and one that only looks like a match.
        for t in (f"{base}-b", f"{base}-a2", f"x{base}-a3"):
            create_topic(bootstrap, t, PARTITIONS)
        wait_until(lambda: agree(1), WAIT, "both clients to pick up the new matching topics", members)
        for key, (kd, java) in pairs.items():
            assert kd.call(lambda c: c.subscription()) == cases[key][1] | cases[key][2]
    finally:
        for m in members:
            m.stop()
