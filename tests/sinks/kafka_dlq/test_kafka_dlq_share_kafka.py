"""The Kafka DLQ in a share group needs nothing of its own (issue #33): it writes each dead letter
it is given, in the order given, and keeps no per-partition position, so records that arrive out
of order, or again after a lock expiry, all reach the DLQ topic (a redelivered one twice: the
share group's at-least-once), each naming its source offset in Kafka Connect's headers.  On the
shared Apache Kafka 4.4 broker (fixture ``kafka``)."""

from __future__ import annotations

import uuid

import pytest

from kdaemon.plugins.companion import SinkContext
from kdaemon.plugins.types import Record
from kdaemon.sinks import builtin
from kdaemon.sinks.encoding import dead_letter
from tests.client.readback import read_topic
from testkit.produce import create_topic

pytestmark = [pytest.mark.kafka]


def test_out_of_order_and_redelivered_dead_letters_all_reach_the_topic(kafka, tmp_path):
    dlq = f"share-dlq-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, dlq, 1, config={"retention.ms": "-1"})   # the letters are stamped in 2023
    context = SinkContext(str(tmp_path), "d", 60.0, kafka={"bootstrap_servers": (kafka.bootstrap,)},
                          group_type="share")
    sink = builtin.kdaemon_sinks(context)["kafka"]({"type": "kafka", "topic": dlq})
    offsets = [(0, 7), (0, 3), (1, 2), (0, 5), (0, 3), (1, 0), (0, 1)]   # (0, 3) comes twice
    letters = [dead_letter(Record("src", p, o, 1_700_000_000_000 + o, 0, None, b"v%d" % o, [],
                                  raw_key=None, raw_value=b"v%d" % o),
                           "deserialize", ValueError("not JSON"), plugin="deserializer.value=json")
               for p, o in offsets]
    try:
        sink.write(letters[:4])
        sink.flush()
        sink.write(letters[4:])
        sink.flush()
    finally:
        sink.close()
    (written,) = read_topic(kafka.bootstrap, dlq, 1).values()
    got = [(int(dict(r.headers)["__connect.errors.partition"]), int(dict(r.headers)["__connect.errors.offset"]))
           for r in written]
    assert got == offsets
    assert [r.value for r in written] == [b"v%d" % o for _, o in offsets]
