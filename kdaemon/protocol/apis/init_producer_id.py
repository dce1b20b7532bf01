"""InitProducerId (key 22): a producer id and epoch for an idempotent (or transactional) producer.

Written from Kafka's ``InitProducerIdRequest.json`` / ``InitProducerIdResponse.json``.  Kafka 4.4
offers versions 0-5 (flexible from 2); v3 adds ``producer_id``/``producer_epoch`` to the request
so that a producer can ask to *bump* its epoch instead of getting a new id (KIP-360), which is
what the idempotent producer does after an OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID;
v4 and v5 add no fields (only error codes the client must accept: PRODUCER_FENCED,
TRANSACTION_ABORTABLE).  A non-transactional producer sends ``transactional_id`` null and may ask
any broker (no coordinator).
"""

from ..schema import INT16, INT32, INT64, STRING, Api, Field, Struct

INIT_PRODUCER_ID_REQUEST = Struct(
    Field("transactional_id", STRING, nullable="0+", default=None),
    Field("transaction_timeout_ms", INT32),
    Field("producer_id", INT64, "3+", default=-1),
    Field("producer_epoch", INT16, "3+", default=-1),
    name="InitProducerIdRequest",
)

INIT_PRODUCER_ID_RESPONSE = Struct(
    Field("throttle_time_ms", INT32),
    Field("error_code", INT16),
    Field("producer_id", INT64, default=-1),
    Field("producer_epoch", INT16),
    name="InitProducerIdResponse",
)

INIT_PRODUCER_ID = Api(22, "InitProducerId", versions=(0, 5), flexible="2+",
                       request=INIT_PRODUCER_ID_REQUEST, response=INIT_PRODUCER_ID_RESPONSE)
