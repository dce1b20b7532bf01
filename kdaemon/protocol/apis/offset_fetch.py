"""OffsetFetch (key 9): read committed positions from the group coordinator.

Versions 0-10 from Kafka's OffsetFetchRequest/Response.json; flexible from v6.  Kafka 4.0
removed v0 from the broker (KIP-896); v0 has the v1 layout (it read offsets from ZooKeeper).

* v2+: a null ``topics`` asks for every topic of the group; the response gains a top-level
  ``error_code``.  v5+: ``committed_leader_epoch``.  v7+: ``require_stable`` (KIP-447): the broker
  answers UNSTABLE_OFFSET_COMMIT instead of an offset a pending transaction may still change.
* v8+: batched: the single-group fields (``group_id``, ``topics``, top-level partition results)
  end at v7 and ``groups`` takes over, each group with its own error code.
* v9+: ``member_id``/``member_epoch`` per group (KIP-848).  v10+: topics by ``topic_id``.

Defaults: the single-group ``topics`` is nullable only from v2, so its default is ``[]`` (null
would not encode in v0-1); ``groups[].topics`` defaults to ``[]`` too, as in Kafka's generated
code: asking for all topics (null) must be said explicitly.
"""

from ..schema import BOOL, INT16, INT32, INT64, STRING, UUID, Api, Array, Field, Struct

OFFSET_FETCH = Api(
    9, "OffsetFetch", versions=(0, 10), flexible="6+",
    request=Struct(
        Field("group_id", STRING, "0-7"),
        Field("topics", Array(Struct(
            Field("name", STRING, "0-7"),
            Field("partition_indexes", Array(INT32), "0-7"),
            name="OffsetFetchRequestTopic",
        )), "0-7", nullable="2-7", default=[]),
        Field("groups", Array(Struct(
            Field("group_id", STRING, "8+"),
            Field("member_id", STRING, "9+", nullable="9+", default=None),
            Field("member_epoch", INT32, "9+", default=-1),
            Field("topics", Array(Struct(
                Field("name", STRING, "8-9"),
                Field("topic_id", UUID, "10+"),
                Field("partition_indexes", Array(INT32), "8+"),
                name="OffsetFetchRequestTopics",
            )), "8+", nullable="8+", default=[]),
            name="OffsetFetchRequestGroup",
        )), "8+"),
        Field("require_stable", BOOL, "7+", default=False),
        name="OffsetFetchRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "3+"),
        Field("topics", Array(Struct(
            Field("name", STRING, "0-7"),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32, "0-7"),
                Field("committed_offset", INT64, "0-7"),
                Field("committed_leader_epoch", INT32, "5-7", default=-1),
                Field("metadata", STRING, "0-7", nullable="0-7"),
                Field("error_code", INT16, "0-7"),
                name="OffsetFetchResponsePartition",
            )), "0-7"),
            name="OffsetFetchResponseTopic",
        )), "0-7"),
        Field("error_code", INT16, "2-7", default=0),
        Field("groups", Array(Struct(
            Field("group_id", STRING, "8+"),
            Field("topics", Array(Struct(
                Field("name", STRING, "8-9"),
                Field("topic_id", UUID, "10+"),
                Field("partitions", Array(Struct(
                    Field("partition_index", INT32, "8+"),
                    Field("committed_offset", INT64, "8+"),
                    Field("committed_leader_epoch", INT32, "8+", default=-1),
                    Field("metadata", STRING, "8+", nullable="8+"),
                    Field("error_code", INT16, "8+"),
                    name="OffsetFetchResponsePartitions",
                )), "8+"),
                name="OffsetFetchResponseTopics",
            )), "8+"),
            Field("error_code", INT16, "8+", default=0),
            name="OffsetFetchResponseGroup",
        )), "8+"),
        name="OffsetFetchResponse",
    ),
)
