"""What a share consumer hands out and takes back: ``ShareRecord`` and ``AcknowledgeType``.

``ShareRecord`` is the classic ``ConsumerRecord`` plus ``delivery_count``: how many times the
broker has handed this record out, this time included (1 on the first delivery, 2 after a
RELEASE or an expired lock; Java's ``ConsumerRecord.deliveryCount()``).  It is a NamedTuple of
the same fields in the same order with the count last, so code written for ``ConsumerRecord``
reads it unchanged.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import NamedTuple

from ...protocol.apis.share_fetch import ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE, ACK_RENEW
from ...protocol.records import Headers


class AcknowledgeType(IntEnum):
    """What a member says of a record it holds (Java's ``AcknowledgeType``); the values are the
    wire's ``acknowledge_types``.

    ACCEPT: processed, never delivered again.  RELEASE: not processed, delivered again (to any
    member) with its delivery count one higher.  REJECT: unprocessable, never delivered again.
    RENEW (explicit acknowledgement, brokers with ShareAcknowledge v2, KIP-1222): still being
    processed: the lock is extended and the record comes back from the next poll, to be
    acknowledged then."""

    ACCEPT = ACK_ACCEPT
    RELEASE = ACK_RELEASE
    REJECT = ACK_REJECT
    RENEW = ACK_RENEW


GAP = ACK_GAP   # an acquired offset with no record behind it (a control batch, a compacted one)


class AcknowledgementMode(str, Enum):
    """Java's ``share.acknowledgement.mode``.  IMPLICIT: every record a poll returned is
    accepted by the next poll, ``commit_sync`` or ``commit_async``.  EXPLICIT: the application
    acknowledges each record; a poll with records of the last one unacknowledged raises."""

    IMPLICIT = "implicit"
    EXPLICIT = "explicit"


class AcquireMode(str, Enum):
    """Java's ``share.acquire.mode`` (KIP-1206).  BATCH_OPTIMIZED: ``max_poll_records`` is a
    soft limit, rounded up to the record batches as written.  RECORD_LIMIT: a hard one, the
    broker acquires no more than that many records per fetch (ShareFetch v2)."""

    BATCH_OPTIMIZED = "batch_optimized"
    RECORD_LIMIT = "record_limit"


class ShareRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    leader_epoch: int | None
    delivery_count: int


new_share_record = tuple.__new__   # ShareRecord from a ConsumerRecord's fields plus the count
