"""Every API this client speaks, one declarative spec per module, and the registry by key."""

from ..schema import Api
from .api_versions import API_VERSIONS
from .consumer_group_describe import CONSUMER_GROUP_DESCRIBE
from .consumer_group_heartbeat import CONSUMER_GROUP_HEARTBEAT
from .create_topics import CREATE_TOPICS
from .describe_configs import DESCRIBE_CONFIGS
from .describe_groups import DESCRIBE_GROUPS
from .fetch import FETCH
from .find_coordinator import FIND_COORDINATOR
from .get_telemetry_subscriptions import GET_TELEMETRY_SUBSCRIPTIONS
from .heartbeat import HEARTBEAT
from .incremental_alter_configs import INCREMENTAL_ALTER_CONFIGS
from .init_producer_id import INIT_PRODUCER_ID
from .join_group import JOIN_GROUP
from .leave_group import LEAVE_GROUP
from .list_offsets import LIST_OFFSETS
from .metadata import METADATA
from .offset_commit import OFFSET_COMMIT
from .offset_fetch import OFFSET_FETCH
from .offset_for_leader_epoch import OFFSET_FOR_LEADER_EPOCH
from .produce import PRODUCE
from .push_telemetry import PUSH_TELEMETRY
from .sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from .share_acknowledge import SHARE_ACKNOWLEDGE
from .share_fetch import SHARE_FETCH
from .share_group_describe import SHARE_GROUP_DESCRIBE
from .share_group_heartbeat import SHARE_GROUP_HEARTBEAT
from .share_group_offsets import (ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS,
                                  DESCRIBE_SHARE_GROUP_OFFSETS)
from .sync_group import SYNC_GROUP

ALL_APIS: tuple[Api, ...] = (
    FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP,
    HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE,
    CONSUMER_GROUP_HEARTBEAT, OFFSET_FOR_LEADER_EPOCH, DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE,
    PRODUCE, INIT_PRODUCER_ID,   # the DLQ's idempotent producer (client/producer.py)
    DESCRIBE_CONFIGS,            # a group's session timeout, for kdaemon offsets --reset-offsets
    INCREMENTAL_ALTER_CONFIGS,   # a share group's settings from the daemon's [share] table
    CREATE_TOPICS,               # the demo's topic, and a Kafka DLQ's topic when asked (client/admin.py)
    # share groups (KIP-932)
    SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE,
    DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS,
    GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY,   # client telemetry (KIP-714, client/telemetry.py)
)

API_BY_KEY: dict[int, Api] = {api.key: api for api in ALL_APIS}


def api_by_key(key: int) -> Api:
    try:
        return API_BY_KEY[key]
    except KeyError:
        raise KeyError(f"kdaemon does not implement API key {key}") from None


__all__ = [a for a in dir() if a.isupper()] + ["api_by_key"]
