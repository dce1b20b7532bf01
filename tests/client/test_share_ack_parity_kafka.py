"""RELEASE, REJECT and RENEW: what the next fetch returns, delivery counts included, is what Java's
``KafkaShareConsumer`` gets (testkit/java_peer.JavaShareConsumerProcess, ``verdicts``).

One topic, two share groups (one per client, each reading from the earliest offset), the same
script in both: the first delivery of each record gets the verdict the script names (ACCEPT when
it names none), every later delivery is accepted, and each poll's verdicts are committed
(commitSync) before the next poll.  Per record delivered: the poll that returned it (counting
polls that returned records), its offset, delivery count and verdict must be the same for both
clients; afterwards both groups have settled everything (lag 0).
"""

from __future__ import annotations

import time
import uuid

import pytest

from kdaemon.client import AcknowledgeType, ShareConsumer
from testkit.group_configs import set_group_configs
from testkit.java_peer import JavaShareConsumerProcess
from testkit.produce import create_topic, produce
from testkit.share_groups import share_lag

pytestmark = pytest.mark.kafka

WAIT = 60.0
RECORDS = 8
# The first delivery's verdict per (partition, offset); every other delivery is accepted.
SCRIPT = {(0, 1): "release", (0, 2): "reject", (0, 3): "renew", (0, 4): "release", (0, 6): "renew"}
# Every record once, then the released and the renewed ones once more.
DELIVERIES = RECORDS + sum(kind in ("release", "renew") for kind in SCRIPT.values())


def new_group(kafka) -> str:
    group = f"ackpar-{uuid.uuid4().hex[:8]}"
    set_group_configs(kafka.bootstrap, group, {"share.auto.offset.reset": "earliest"})
    return group


def ours(kafka, topic: str) -> tuple[str, list[tuple[int, int, int, str]]]:
    """The script run by kdaemon's ShareConsumer: (poll, offset, delivery count, verdict) per delivery."""
    group = new_group(kafka)
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int, int, str]] = []
    c = ShareConsumer(kafka.bootstrap, group_id=group, client_id="ack-parity-kd", share_acknowledgement_mode="explicit")
    try:
        c.subscribe([topic])
        polls = 0
        deadline = time.monotonic() + WAIT
        while len(out) < DELIVERIES:
            assert time.monotonic() < deadline, out
            records = [r for rs in c.poll(200).values() for r in rs]
            if not records:
                continue
            polls += 1
            for r in records:
                key = (r.partition, r.offset)
                kind = SCRIPT.get(key, "accept") if key not in seen else "accept"
                seen.add(key)
                c.acknowledge(r, AcknowledgeType[kind.upper()])
                out.append((polls, r.offset, r.delivery_count, kind))
            assert all(e is None for e in c.commit_sync().values())
    finally:
        c.close()
    return group, out


def java(kafka, topic: str) -> tuple[str, list[tuple[int, int, int, str]]]:
    group = new_group(kafka)
    peer = JavaShareConsumerProcess(kafka.bootstrap, group, [topic], mode="explicit", max_records=DELIVERIES,
                                    verdicts=SCRIPT)
    try:
        peer.proc.wait(WAIT * 2)          # it ends by itself after DELIVERIES records
    finally:
        end = peer.stop()
    assert end.get("count") == DELIVERIES, (end, peer.stderr[-3000:])
    return group, [(r.poll, r.offset, r.delivery_count, r.verdict) for r in peer.records]


def settled(kafka, group: str, topic: str) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        found = share_lag(kafka.host, kafka.port, group).get((topic, 0))
        if found is not None and found[1] == 0:
            return
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def test_release_reject_and_renew_come_back_as_they_do_for_java(kafka):
    topic = f"ackpar-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)
    produce(kafka.bootstrap, topic, [(b"k%d" % i, b"v%d" % i, []) for i in range(RECORDS)], partition=0)

    java_group, java_deliveries = java(kafka, topic)
    our_group, our_deliveries = ours(kafka, topic)
    assert our_deliveries == java_deliveries, (our_deliveries, java_deliveries)
    # What the script means, so equal and wrong in the same way cannot pass: released records come
    # back delivered twice, the renewed ones once (still held under the same delivery), the
    # rejected one never.
    again = {o: (n, v) for poll, o, n, v in our_deliveries if poll > 1}
    assert again == {1: (2, "accept"), 3: (1, "accept"), 4: (2, "accept"), 6: (1, "accept")}, our_deliveries
    # Nothing left to settle in either group (lag 0).  The start offsets are not compared: the
    # share coordinator moves the one it keeps when it next checkpoints the partition, not at once.
    settled(kafka, our_group, topic)
    settled(kafka, java_group, topic)
    print("deliveries (poll, offset, delivery count, verdict):", our_deliveries)
