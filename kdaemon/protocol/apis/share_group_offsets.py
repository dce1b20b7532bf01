"""A share group's start offsets, for ``kdaemon offsets``: DescribeShareGroupOffsets (key 90),
AlterShareGroupOffsets (key 91) and DeleteShareGroupOffsets (key 92), sent to the group
coordinator.

As in Kafka 4.4's JSON definitions; flexible in every version.  A share group commits no offsets:
per partition it has a *start offset* (SPSO, the share-partition start offset; below it every
record is settled) kept by the share coordinator in ``__share_group_state``.

* Describe v0-1: ``topics`` null asks for every partition the group has state for (Kafka's
  default, an empty list, asks for none).  v1 (KIP-1226) adds each partition's ``lag``, the
  records not yet settled (-1 when unknown).  A partition the group has not started reading
  answers ``start_offset`` -1; a group nobody created answers no topics and no error.
* Alter v0 and Delete v0 work only on an empty group (top-level NON_EMPTY_GROUP otherwise), like
  the consumer group admin operations.  Alter on a group nobody created creates it, with those
  start offsets; Delete removes whole topics from the group's state (an unknown topic is
  UNKNOWN_TOPIC_OR_PARTITION, per topic).
"""

from ..schema import INT16, INT32, INT64, STRING, UUID, Api, Array, Field, Struct

DESCRIBE_SHARE_GROUP_OFFSETS = Api(
    90, "DescribeShareGroupOffsets", versions=(0, 1), flexible="0+",
    request=Struct(
        Field("groups", Array(Struct(
            Field("group_id", STRING),
            Field("topics", Array(Struct(
                Field("topic_name", STRING),
                Field("partitions", Array(INT32)),
                name="DescribeShareGroupOffsetsRequestTopic",
            )), nullable="0+", default=[]),
            name="DescribeShareGroupOffsetsRequestGroup",
        ))),
        name="DescribeShareGroupOffsetsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("groups", Array(Struct(
            Field("group_id", STRING),
            Field("topics", Array(Struct(
                Field("topic_name", STRING),
                Field("topic_id", UUID),
                Field("partitions", Array(Struct(
                    Field("partition_index", INT32),
                    Field("start_offset", INT64),
                    Field("leader_epoch", INT32),
                    Field("lag", INT64, "1+", default=-1),
                    Field("error_code", INT16),
                    Field("error_message", STRING, nullable="0+", default=None),
                    name="DescribeShareGroupOffsetsResponsePartition",
                ))),
                name="DescribeShareGroupOffsetsResponseTopic",
            ))),
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            name="DescribeShareGroupOffsetsResponseGroup",
        ))),
        name="DescribeShareGroupOffsetsResponse",
    ),
)

ALTER_SHARE_GROUP_OFFSETS = Api(
    91, "AlterShareGroupOffsets", versions=(0, 0), flexible="0+",
    request=Struct(
        Field("group_id", STRING),
        Field("topics", Array(Struct(
            Field("topic_name", STRING),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("start_offset", INT64),
                name="AlterShareGroupOffsetsRequestPartition",
            ))),
            name="AlterShareGroupOffsetsRequestTopic",
        ))),
        name="AlterShareGroupOffsetsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("error_message", STRING, nullable="0+", default=None),
        Field("responses", Array(Struct(
            Field("topic_name", STRING),
            Field("topic_id", UUID),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("error_code", INT16),
                Field("error_message", STRING, nullable="0+", default=None),
                name="AlterShareGroupOffsetsResponsePartition",
            ))),
            name="AlterShareGroupOffsetsResponseTopic",
        ))),
        name="AlterShareGroupOffsetsResponse",
    ),
)

DELETE_SHARE_GROUP_OFFSETS = Api(
    92, "DeleteShareGroupOffsets", versions=(0, 0), flexible="0+",
    request=Struct(
        Field("group_id", STRING),
        Field("topics", Array(Struct(
            Field("topic_name", STRING),
            name="DeleteShareGroupOffsetsRequestTopic",
        ))),
        name="DeleteShareGroupOffsetsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("error_message", STRING, nullable="0+", default=None),
        Field("responses", Array(Struct(
            Field("topic_name", STRING),
            Field("topic_id", UUID),
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            name="DeleteShareGroupOffsetsResponseTopic",
        ))),
        name="DeleteShareGroupOffsetsResponse",
    ),
)
