"""The client's one table of Kafka error codes a producer cannot get past
(``kdaemon.client.errors.REFUSALS``): what each refuses (a record, or the topic) and the fix,
and that every other code is left to Kafka's own retriable flag.  The producer's use of it is
in test_producer_mock.py (the mock injects the codes) and on Apache Kafka in
tests/sinks/kafka_dlq/test_dlq_refusals_kafka.py."""

from __future__ import annotations

import pytest

from kdaemon.client.errors import (RECORD, REFUSALS, TOPIC, RefusedError, UnknownTopicError, missing_topic,
                                   refusal, topic_refused)
from kdaemon.protocol.errors import ERROR_CODES, Errors

SERVERS = ["b1:9092", "b2:9092"]


@pytest.mark.parametrize("code,refuses", [
    (Errors.MESSAGE_TOO_LARGE, RECORD), (Errors.RECORD_LIST_TOO_LARGE, RECORD), (Errors.INVALID_RECORD, RECORD),
    (Errors.INVALID_TIMESTAMP, RECORD),
    (Errors.TOPIC_AUTHORIZATION_FAILED, TOPIC), (Errors.CLUSTER_AUTHORIZATION_FAILED, TOPIC),
    (Errors.INVALID_CONFIG, TOPIC), (Errors.POLICY_VIOLATION, TOPIC), (Errors.INVALID_TOPIC_EXCEPTION, TOPIC),
    (Errors.UNSUPPORTED_COMPRESSION_TYPE, TOPIC),
    (Errors.UNKNOWN_SERVER_ERROR, TOPIC),          # not listed, not retriable: the topic, "see the broker's log"
])
def test_what_each_permanent_code_refuses(code, refuses):
    assert refusal(code).refuses == refuses and refusal(code).fix


@pytest.mark.parametrize("code", [Errors.NOT_LEADER_OR_FOLLOWER, Errors.LEADER_NOT_AVAILABLE, Errors.REQUEST_TIMED_OUT,
                                  Errors.NOT_ENOUGH_REPLICAS, Errors.KAFKA_STORAGE_ERROR, Errors.UNKNOWN_TOPIC_ID,
                                  Errors.NONE])
def test_what_may_pass_is_no_refusal(code):
    """Transient: an unreachable broker or a leader that moved, a timeout, a disk error."""
    assert refusal(code) is None


def test_only_unknown_topic_is_both_retriable_and_in_the_table():
    """In a Produce answer UNKNOWN_TOPIC_OR_PARTITION is retried (stale metadata); a Metadata
    answer saying the topic is missing is final.  Every other entry is final wherever it comes."""
    assert {c for c in REFUSALS if ERROR_CODES[c].retriable} == {Errors.UNKNOWN_TOPIC_OR_PARTITION}


def test_the_errors_name_the_topic_and_the_fix():
    gone = missing_topic("dlq", SERVERS)
    assert isinstance(gone, UnknownTopicError) and isinstance(gone, RefusedError)
    assert str(gone) == "topic dlq does not exist on the cluster at b1:9092,b2:9092"
    assert gone.fix.startswith("create it: kafka-topics --bootstrap-server b1:9092,b2:9092 --create --topic dlq ")
    acl = topic_refused("dlq", Errors.TOPIC_AUTHORIZATION_FAILED, SERVERS, "denied")
    assert str(acl) == ("the cluster at b1:9092,b2:9092 refuses writes to topic dlq: TOPIC_AUTHORIZATION_FAILED (29): "
                        "denied")
    assert acl.topic == "dlq" and acl.code == 29 and "kafka-acls --add --producer --topic dlq" in acl.fix
    assert "--entity-name dlq" in refusal(Errors.MESSAGE_TOO_LARGE).fix.format(topic="dlq", servers="b1:9092")
