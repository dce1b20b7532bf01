"""ShareAcknowledge (key 79): settle records a ShareFetch handed out, without fetching more.

Versions 1-2 as in Kafka 4.4's ShareAcknowledgeRequest/Response.json; flexible in every version
(v0, the early-access layout of Kafka 4.0, was removed in 4.1).  It travels in the member's share
session like a ShareFetch (``share_session_epoch`` as there: a session must be open, so never 0
here; -1 acknowledges and closes it) and carries the same acknowledgement batches
(``share_fetch.ACKNOWLEDGEMENT_BATCH``, types ``share_fetch.ACK_*``).  Per partition the answer
is one error code; INVALID_RECORD_STATE means a lock had already expired.  v2 (KIP-1222) adds
``is_renew_ack`` and, in the response, ``acquisition_lock_timeout_ms`` for renewed locks.
"""

from ..schema import BOOL, INT16, INT32, STRING, UUID, Api, Array, Field, Struct
from .share_fetch import ACKNOWLEDGEMENT_BATCH, LEADER_ID_AND_EPOCH, NODE_ENDPOINT

SHARE_ACKNOWLEDGE = Api(
    79, "ShareAcknowledge", versions=(1, 2), flexible="0+",
    request=Struct(
        Field("group_id", STRING, nullable="0+", default=None),
        Field("member_id", STRING, nullable="0+", default=""),
        Field("share_session_epoch", INT32),
        Field("is_renew_ack", BOOL, "2+", default=False),
        Field("topics", Array(Struct(
            Field("topic_id", UUID),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("acknowledgement_batches", Array(ACKNOWLEDGEMENT_BATCH)),
                name="AcknowledgePartition",
            ))),
            name="AcknowledgeTopic",
        ))),
        name="ShareAcknowledgeRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("error_message", STRING, nullable="0+", default=None),
        Field("acquisition_lock_timeout_ms", INT32, "2+"),
        Field("responses", Array(Struct(
            Field("topic_id", UUID),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32),
                Field("error_code", INT16),
                Field("error_message", STRING, nullable="0+", default=None),
                Field("current_leader", LEADER_ID_AND_EPOCH),
                name="PartitionData",
            ))),
            name="ShareAcknowledgeTopicResponse",
        ))),
        Field("node_endpoints", Array(NODE_ENDPOINT)),
        name="ShareAcknowledgeResponse",
    ),
)
