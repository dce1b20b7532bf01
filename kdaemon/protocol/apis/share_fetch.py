"""ShareFetch (key 78): records from a share group's partitions, each range locked for this member.

Versions 1-2 as in Kafka 4.4's ShareFetchRequest/Response.json; flexible in every version (v0,
the early-access layout of Kafka 4.0, was removed in 4.1; fields Kafka still marks ``0+`` are
``0+`` here too, and ``partition_max_bytes``, v0 only, is never on the wire).

Things a share consumer must get right:

* **Share sessions** (like KIP-227 fetch sessions, keyed by group and member): ``share_session_epoch``
  0 opens one and carries the full list of partitions, later requests increment it and carry only
  changes (``forgotten_topics_data`` drops partitions), -1 closes it.  A lost or stale session is
  SHARE_SESSION_NOT_FOUND / INVALID_SHARE_SESSION_EPOCH (both retriable: open a new one).
* **Acquired records**: ``records`` holds whole record batches, decoded by the record-batch layer
  as Fetch's are, but only the offsets inside ``acquired_records`` (inclusive ranges, with how often
  each was delivered) belong to this member; the rest of a batch is someone else's or not
  available.  The locks last ``acquisition_lock_timeout_ms``.  ``records`` is nullable only in v0;
  from v1 Kafka always writes a (possibly empty) record set.
* **Acknowledgements** ride on the next ShareFetch (or go alone in ShareAcknowledge, key 79):
  ``acknowledgement_batches`` are inclusive offset ranges, each with ``acknowledge_types``: one
  type for the whole range, or one per offset.  Types are the ``ACK_*`` constants below (Gap for
  offsets that are not records, e.g. transaction markers or compacted away).  An acknowledgement
  the broker refuses comes back per partition as ``acknowledge_error_code`` (INVALID_RECORD_STATE:
  the lock had expired and the record went to someone else).
* v2 (KIP-1206, KIP-1222): ``share_acquire_mode`` (0 batch-optimized: ``max_records`` is a soft
  limit rounded to batch boundaries; 1 record-limit: a hard one) and ``is_renew_ack`` (the
  acknowledgements include ACK_RENEW, which extends a lock instead of settling the record).
* ``current_leader`` (not tagged, unlike Fetch's) and ``node_endpoints`` say where a partition
  went when the answer is NOT_LEADER_OR_FOLLOWER; otherwise Kafka leaves the leader at zeros.
"""

from ..schema import (BOOL, INT8, INT16, INT32, INT64, RECORDS, STRING, UUID, Api, Array, Field,
                      Struct)

# AcknowledgementBatch.acknowledge_types values (Kafka's AcknowledgeType, plus Gap).
ACK_GAP = 0
ACK_ACCEPT = 1
ACK_RELEASE = 2
ACK_REJECT = 3
ACK_RENEW = 4        # v2+ (KIP-1222), with is_renew_ack

# ShareFetchRequest.share_acquire_mode values (v2+, KIP-1206).
ACQUIRE_BATCH_OPTIMIZED = 0
ACQUIRE_RECORD_LIMIT = 1

# Shared with ShareAcknowledge (key 79), whose request carries the same batches.
ACKNOWLEDGEMENT_BATCH = Struct(
    Field("first_offset", INT64),
    Field("last_offset", INT64),
    Field("acknowledge_types", Array(INT8)),
    name="AcknowledgementBatch",
)

LEADER_ID_AND_EPOCH = Struct(
    Field("leader_id", INT32),
    Field("leader_epoch", INT32),
    name="LeaderIdAndEpoch",
)

NODE_ENDPOINT = Struct(
    Field("node_id", INT32),
    Field("host", STRING),
    Field("port", INT32),
    Field("rack", STRING, nullable="0+", default=None),
    name="NodeEndpoint",
)

SHARE_FETCH_REQUEST = Struct(
    Field("group_id", STRING, nullable="0+", default=None),
    Field("member_id", STRING, nullable="0+", default=""),
    Field("share_session_epoch", INT32),
    Field("max_wait_ms", INT32),
    Field("min_bytes", INT32),
    Field("max_bytes", INT32, default=0x7FFFFFFF),
    Field("max_records", INT32, "1+"),
    Field("batch_size", INT32, "1+"),
    Field("share_acquire_mode", INT8, "2+", default=ACQUIRE_BATCH_OPTIMIZED),
    Field("is_renew_ack", BOOL, "2+", default=False),
    Field("topics", Array(Struct(
        Field("topic_id", UUID),
        Field("partitions", Array(Struct(
            Field("partition_index", INT32),
            Field("partition_max_bytes", INT32, "0"),
            Field("acknowledgement_batches", Array(ACKNOWLEDGEMENT_BATCH)),
            name="FetchPartition",
        ))),
        name="FetchTopic",
    ))),
    Field("forgotten_topics_data", Array(Struct(
        Field("topic_id", UUID),
        Field("partitions", Array(INT32)),
        name="ForgottenTopic",
    ))),
    name="ShareFetchRequest",
)

ACQUIRED_RECORDS = Struct(
    Field("first_offset", INT64),
    Field("last_offset", INT64),
    Field("delivery_count", INT16),
    name="AcquiredRecords",
)

SHARE_FETCH_RESPONSE = Struct(
    Field("throttle_time_ms", INT32),
    Field("error_code", INT16),
    Field("error_message", STRING, nullable="0+", default=None),
    Field("acquisition_lock_timeout_ms", INT32, "1+"),
    Field("responses", Array(Struct(
        Field("topic_id", UUID),
        Field("partitions", Array(Struct(
            Field("partition_index", INT32),
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            Field("acknowledge_error_code", INT16),
            Field("acknowledge_error_message", STRING, nullable="0+", default=None),
            Field("current_leader", LEADER_ID_AND_EPOCH),
            Field("records", RECORDS, nullable="0"),
            Field("acquired_records", Array(ACQUIRED_RECORDS)),
            name="PartitionData",
        ))),
        name="ShareFetchableTopicResponse",
    ))),
    Field("node_endpoints", Array(NODE_ENDPOINT)),
    name="ShareFetchResponse",
)

SHARE_FETCH = Api(78, "ShareFetch", versions=(1, 2), flexible="0+",
                  request=SHARE_FETCH_REQUEST, response=SHARE_FETCH_RESPONSE)
