"""Metadata (key 3): brokers, partition leaders and topic ids.

Written from Kafka's ``MetadataRequest.json`` / ``MetadataResponse.json`` (Kafka 4.2: versions
0-13, flexible from 9).  We implement 1-13: v0 reads an empty topic list as "all topics", every
later version reads it as "no topics" and uses a null list for "all topics".

Things that have bitten clients:

* ``topics`` in the request: ``None`` means all topics, ``[]`` means none (v1+).  The JSON gives
  no "null" default, so the default here is ``[]``, as in Kafka's generated classes.
* Topic ids exist from v10, but brokers only honour them (and a null topic ``name``) from v12;
  at v10-11 send names.
* ``leader_epoch`` (v7+) is what fences stale fetches (KIP-320); keep it with the leader.
* ``cluster_authorized_operations`` and its request flag exist only in v8-10 (KIP-700 moved them
  to DescribeCluster).  ``-2147483648`` means "not requested".
* v13 adds a top-level ``error_code`` (KIP-1102, e.g. REBOOTSTRAP_REQUIRED).
"""

from ..schema import BOOL, INT16, INT32, STRING, UUID, Api, Array, Field, Struct

AUTHORIZED_OPERATIONS_OMITTED = -2147483648

METADATA_REQUEST_TOPIC = Struct(
    Field("topic_id", UUID, "10+"),
    Field("name", STRING, nullable="10+", default=""),
    name="MetadataRequestTopic",
)

METADATA_REQUEST = Struct(
    Field("topics", Array(METADATA_REQUEST_TOPIC), nullable="1+", default=[]),
    Field("allow_auto_topic_creation", BOOL, "4+", default=True),
    Field("include_cluster_authorized_operations", BOOL, "8-10"),
    Field("include_topic_authorized_operations", BOOL, "8+"),
    name="MetadataRequest",
)

METADATA_RESPONSE_BROKER = Struct(
    Field("node_id", INT32),
    Field("host", STRING),
    Field("port", INT32),
    Field("rack", STRING, "1+", nullable="1+", default=None),
    name="MetadataResponseBroker",
)

METADATA_RESPONSE_PARTITION = Struct(
    Field("error_code", INT16),
    Field("partition_index", INT32),
    Field("leader_id", INT32),
    Field("leader_epoch", INT32, "7+", default=-1),
    Field("replica_nodes", Array(INT32)),
    Field("isr_nodes", Array(INT32)),
    Field("offline_replicas", Array(INT32), "5+"),
    name="MetadataResponsePartition",
)

METADATA_RESPONSE_TOPIC = Struct(
    Field("error_code", INT16),
    Field("name", STRING, nullable="12+", default=""),
    Field("topic_id", UUID, "10+"),
    Field("is_internal", BOOL, "1+", default=False),
    Field("partitions", Array(METADATA_RESPONSE_PARTITION)),
    Field("topic_authorized_operations", INT32, "8+", default=AUTHORIZED_OPERATIONS_OMITTED),
    name="MetadataResponseTopic",
)

METADATA_RESPONSE = Struct(
    Field("throttle_time_ms", INT32, "3+"),
    Field("brokers", Array(METADATA_RESPONSE_BROKER)),
    Field("cluster_id", STRING, "2+", nullable="2+", default=None),
    Field("controller_id", INT32, "1+", default=-1),
    Field("topics", Array(METADATA_RESPONSE_TOPIC)),
    Field("cluster_authorized_operations", INT32, "8-10", default=AUTHORIZED_OPERATIONS_OMITTED),
    Field("error_code", INT16, "13+"),
    name="MetadataResponse",
)

METADATA = Api(3, "Metadata", versions=(1, 13), flexible="9+",
               request=METADATA_REQUEST, response=METADATA_RESPONSE)
