"""OffsetForLeaderEpoch (key 23): where a leader epoch ends in the leader's log (KIP-101, KIP-320).

Written from Kafka's ``OffsetForLeaderEpochRequest.json`` / ``OffsetForLeaderEpochResponse.json``.
The request JSON says versions 2-4 (0-1 were removed in Kafka 4.0, 2 is the baseline), flexible
from 4; the response JSON still lists 0-4, but a client only ever reads the versions it sends.

A consumer asks it after a leader change: "the last record I consumed was written in epoch E;
where does E end in your log?"  An ``end_offset`` below the consumer's position means the log it
read from was truncated (an unclean leader election) and the records past ``end_offset`` are gone
or different.  ``leader_epoch`` in the answer is the largest epoch <= E the leader knows, which is
E itself unless the leader never had E.

Things to know:

* ``replica_id`` exists from v3 and defaults to -2 in the JSON ("debug consumer": may see offsets
  past the high watermark); a consumer sends -1, so the Java consumer uses v3+ only, and so do we.
* ``current_leader_epoch`` (v2+) fences us: an epoch older than the broker's gives
  FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; both mean "refresh metadata, retry".
* Undefined answers are -1 for both ``leader_epoch`` and ``end_offset`` (no such epoch, or an
  empty log).
"""

from ..schema import INT16, INT32, INT64, STRING, Api, Array, Field, Struct

OFFSET_FOR_LEADER_PARTITION = Struct(
    Field("partition", INT32),
    Field("current_leader_epoch", INT32, "2+", default=-1),
    Field("leader_epoch", INT32),
    name="OffsetForLeaderPartition",
)

OFFSET_FOR_LEADER_TOPIC = Struct(
    Field("topic", STRING),
    Field("partitions", Array(OFFSET_FOR_LEADER_PARTITION)),
    name="OffsetForLeaderTopic",
)

OFFSET_FOR_LEADER_EPOCH_REQUEST = Struct(
    Field("replica_id", INT32, "3+", default=-2),
    Field("topics", Array(OFFSET_FOR_LEADER_TOPIC)),
    name="OffsetForLeaderEpochRequest",
)

EPOCH_END_OFFSET = Struct(
    Field("error_code", INT16),
    Field("partition", INT32),
    Field("leader_epoch", INT32, "1+", default=-1),
    Field("end_offset", INT64),
    name="EpochEndOffset",
)

OFFSET_FOR_LEADER_TOPIC_RESULT = Struct(
    Field("topic", STRING),
    Field("partitions", Array(EPOCH_END_OFFSET)),
    name="OffsetForLeaderTopicResult",
)

OFFSET_FOR_LEADER_EPOCH_RESPONSE = Struct(
    Field("throttle_time_ms", INT32, "2+"),
    Field("topics", Array(OFFSET_FOR_LEADER_TOPIC_RESULT)),
    name="OffsetForLeaderEpochResponse",
)

# The lowest version a consumer may use: v3 is the first that carries replica_id = -1.
CONSUMER_MIN_VERSION = 3

OFFSET_FOR_LEADER_EPOCH = Api(23, "OffsetForLeaderEpoch", versions=(2, 4), flexible="4+",
                              request=OFFSET_FOR_LEADER_EPOCH_REQUEST,
                              response=OFFSET_FOR_LEADER_EPOCH_RESPONSE)
