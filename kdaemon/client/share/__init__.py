"""Share groups (KIP-932): ``ShareConsumer`` and what it hands out and takes back.

One module per concern, lowest first: ``types`` (ShareRecord, AcknowledgeType, the modes),
``config`` (the typed settings), ``state`` (the member's state table), ``membership``
(ShareGroupHeartbeat), ``session`` (share sessions per node, pure), ``acknowledgements`` (held
records, verdicts and lock deadlines, pure), ``fetch`` (one partition's ShareFetch answer,
decoded filter-first, pure), ``exchange`` (the requests on the share sessions and their
answers) and ``consumer`` (the public client).
"""

from .consumer import ShareConsumer
from .types import AcknowledgementMode, AcknowledgeType, AcquireMode, ShareRecord

__all__ = ["ShareConsumer", "ShareRecord", "AcknowledgeType", "AcknowledgementMode", "AcquireMode"]
