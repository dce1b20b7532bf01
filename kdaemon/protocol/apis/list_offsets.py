"""ListOffsets (key 2): the offset for a timestamp, or for one of the special targets.

Written from Kafka's ``ListOffsetsRequest.json`` / ``ListOffsetsResponse.json`` (Kafka 4.2:
versions 1-11, flexible from 6).  Version 0 (``max_num_offsets``, ``old_style_offsets``) was
removed in Kafka 4.0 and is below our floor, so those two v0-only fields are not described here.

Special timestamps: -1 latest, -2 earliest, -3 max timestamp (v7+), -4 earliest local (v8+),
-5 latest tiered (v9+); v11 adds the earliest offset still pending upload to remote storage
(KIP-1023).  Versions 7-9 and 11 add no fields; they only say which targets the client may ask for.

``replica_id`` has no default in the JSON, so it defaults to 0 here as in Kafka's generated
classes; a consumer must send -1 explicitly.
"""

from ..schema import INT8, INT16, INT32, INT64, STRING, Api, Array, Field, Struct

LIST_OFFSETS_PARTITION = Struct(
    Field("partition_index", INT32),
    Field("current_leader_epoch", INT32, "4+", default=-1),
    Field("timestamp", INT64),
    name="ListOffsetsPartition",
)

LIST_OFFSETS_TOPIC = Struct(
    Field("name", STRING),
    Field("partitions", Array(LIST_OFFSETS_PARTITION)),
    name="ListOffsetsTopic",
)

LIST_OFFSETS_REQUEST = Struct(
    Field("replica_id", INT32),
    Field("isolation_level", INT8, "2+"),
    Field("topics", Array(LIST_OFFSETS_TOPIC)),
    Field("timeout_ms", INT32, "10+"),
    name="ListOffsetsRequest",
)

LIST_OFFSETS_PARTITION_RESPONSE = Struct(
    Field("partition_index", INT32),
    Field("error_code", INT16),
    Field("timestamp", INT64, "1+", default=-1),
    Field("offset", INT64, "1+", default=-1),
    Field("leader_epoch", INT32, "4+", default=-1),
    name="ListOffsetsPartitionResponse",
)

LIST_OFFSETS_TOPIC_RESPONSE = Struct(
    Field("name", STRING),
    Field("partitions", Array(LIST_OFFSETS_PARTITION_RESPONSE)),
    name="ListOffsetsTopicResponse",
)

LIST_OFFSETS_RESPONSE = Struct(
    Field("throttle_time_ms", INT32, "2+"),
    Field("topics", Array(LIST_OFFSETS_TOPIC_RESPONSE)),
    name="ListOffsetsResponse",
)

LIST_OFFSETS = Api(2, "ListOffsets", versions=(1, 11), flexible="6+",
                   request=LIST_OFFSETS_REQUEST, response=LIST_OFFSETS_RESPONSE)
