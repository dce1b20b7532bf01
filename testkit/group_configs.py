"""A group's dynamic configs (KIP-848, KIP-932): IncrementalAlterConfigs on the GROUP resource,
through confluent-kafka's admin client, before or after the group exists.

Kafka 4 lets a group carry its own timings within the broker's bounds: a consumer group's
``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``, a share group's
``share.record.lock.duration.ms``, ``share.auto.offset.reset`` and heartbeat.  A suite that
needs a fenced member within seconds sets them on its own groups on the run's shared broker,
instead of starting a broker of its own with other defaults (a start of 10-15 s, and the module
one scheduling unit: docs/TESTING.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

TIMEOUT = 30.0


def set_group_configs(bootstrap: str, group: str, configs: Mapping[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)
