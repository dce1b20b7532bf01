"""OffsetCommit (key 8): store consumed positions in the group coordinator.

Versions 0-10 from Kafka's OffsetCommitRequest/Response.json (which describes every field back to
v0); flexible from v8.  Kafka 4.0 removed v0-1 from the broker (KIP-896), so a modern broker
answers v2+ only; the older layouts are kept for old brokers and for tests.

* v1 only: per-partition ``commit_timestamp``.  v2-4 only: ``retention_time_ms``.
* v6+: ``committed_leader_epoch``; v7+: ``group_instance_id``.
* v9+: ``generation_id_or_member_epoch`` may carry a KIP-848 member epoch (same layout as v8).
* v10+: topics are named by ``topic_id`` instead of ``name`` (request and response).
"""

from ..schema import INT16, INT32, INT64, STRING, UUID, Api, Array, Field, Struct

OFFSET_COMMIT = Api(
    8, "OffsetCommit", versions=(0, 10), flexible="8+",
    request=Struct(
        Field("group_id", STRING),
        Field("generation_id_or_member_epoch", INT32, "1+", default=-1),
        Field("member_id", STRING, "1+"),
        Field("group_instance_id", STRING, "7+", nullable="7+", default=None),
        Field("retention_time_ms", INT64, "2-4", default=-1),
        Field("topics", Array(Struct(
            Field("name", STRING, "0-9"),
            Field("topic_id", UUID, "10+"),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("committed_offset", INT64),
                Field("committed_leader_epoch", INT32, "6+", default=-1),
                Field("commit_timestamp", INT64, "1", default=-1),
                Field("committed_metadata", STRING, nullable="0+"),
                name="OffsetCommitRequestPartition",
            ))),
            name="OffsetCommitRequestTopic",
        ))),
        name="OffsetCommitRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "3+"),
        Field("topics", Array(Struct(
            Field("name", STRING, "0-9"),
            Field("topic_id", UUID, "10+"),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("error_code", INT16),
                name="OffsetCommitResponsePartition",
            ))),
            name="OffsetCommitResponseTopic",
        ))),
        name="OffsetCommitResponse",
    ),
)
