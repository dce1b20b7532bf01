"""``kdaemon.client.group_configs`` against Apache Kafka 4.4: a share group's own configs set with
IncrementalAlterConfigs and read back with DescribeConfigs (ours), and by confluent-kafka's admin
client (librdkafka's DescribeConfigs) as a second reader; the broker's refusals come back as
``GroupConfigRefused`` naming the setting, and a broker nobody answers for as
``GroupConfigUnavailable`` (transient).
"""

from __future__ import annotations

import socket
import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.group_configs import (GroupConfigRefused, GroupConfigUnavailable, alter_group_configs,
                                          describe_group_configs)
from kdaemon.protocol.errors import Errors

pytestmark = pytest.mark.kafka

LOCK = "share.record.lock.duration.ms"
RESET = "share.auto.offset.reset"
LIMIT = "share.delivery.count.limit"
ISOLATION = "share.isolation.level"
TIMEOUT = 30.0


def client_config(bootstrap: str, **options) -> ConsumerConfig:
    return ConsumerConfig.from_options(bootstrap_servers=bootstrap, client_id="group-configs-test", **options)


def admin_view(bootstrap: str, group: str) -> dict[str, str]:
    """The group's configs as librdkafka's admin client reads them."""
    resource = ConfigResource(ResourceType.GROUP, group)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def test_set_and_read_back_share_group_configs(kafka):
    group = f"cfg-{uuid.uuid4().hex[:8]}"
    config = client_config(kafka.bootstrap)
    before = describe_group_configs(config, group, [LOCK, RESET, LIMIT, ISOLATION])
    # A group nobody configured has the broker's defaults (Kafka 4.4: 30 s, latest, 5, uncommitted).
    assert before == {LOCK: "30000", RESET: "latest", LIMIT: "5", ISOLATION: "read_uncommitted"}, before
    wanted = {LOCK: "15000", RESET: "earliest", LIMIT: "3", ISOLATION: "read_committed"}
    alter_group_configs(config, group, wanted)
    assert describe_group_configs(config, group, [LOCK, RESET, LIMIT, ISOLATION]) == wanted
    seen = admin_view(kafka.bootstrap, group)
    assert {name: seen[name] for name in wanted} == wanted
    # Incremental: one more SET leaves the others as they were.
    alter_group_configs(config, group, {LOCK: "20000"})
    assert describe_group_configs(config, group, [LOCK, RESET, LIMIT]) == {LOCK: "20000", RESET: "earliest", LIMIT: "3"}
    # A name that is not a group config is left out of the answer, not an error.
    assert describe_group_configs(config, group, [LOCK, "no.such.config"]) == {LOCK: "20000"}


def test_a_value_outside_the_bounds_is_refused_by_name(kafka):
    group = f"cfg-{uuid.uuid4().hex[:8]}"
    config = client_config(kafka.bootstrap)
    with pytest.raises(GroupConfigRefused) as refused:
        alter_group_configs(config, group, {RESET: "earliest", LOCK: "1"})   # below group.share.min.record.lock.duration.ms
    exc = refused.value
    assert (exc.setting, exc.value, exc.code, exc.retriable) == (LOCK, "1", Errors.INVALID_CONFIG, False)
    assert exc.broker_message and LOCK in str(exc) and "INVALID_CONFIG" in str(exc), str(exc)
    assert "bounds" in exc.fix and "kafka-configs" in exc.fix and group in exc.fix, exc.fix
    # All or nothing: the valid setting of the refused request was not applied either.
    assert describe_group_configs(config, group, [RESET]) == {RESET: "latest"}


def test_an_unknown_setting_and_a_bad_value_are_refused_by_name(kafka):
    group = f"cfg-{uuid.uuid4().hex[:8]}"
    config = client_config(kafka.bootstrap)
    with pytest.raises(GroupConfigRefused) as refused:
        alter_group_configs(config, group, {"share.no.such.setting": "1"})
    assert (refused.value.setting, refused.value.code) == ("share.no.such.setting", Errors.INVALID_CONFIG), refused.value
    with pytest.raises(GroupConfigRefused) as refused:
        alter_group_configs(config, group, {LOCK: "20000", RESET: "sometimes"})
    assert (refused.value.setting, refused.value.value) == (RESET, "sometimes"), refused.value
    assert describe_group_configs(config, group, [LOCK]) == {LOCK: "30000"}


def test_no_broker_is_a_transient_error():
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = client_config(f"127.0.0.1:{port}", reconnect_backoff_ms=50, retry_backoff_ms=50)
    with pytest.raises(GroupConfigUnavailable) as unavailable:
        alter_group_configs(config, "g", {LOCK: "20000"}, timeout_ms=500)
    assert unavailable.value.retriable and "IncrementalAlterConfigs" in str(unavailable.value)
    with pytest.raises(GroupConfigUnavailable):
        describe_group_configs(config, "g", [LOCK], timeout_ms=500)
