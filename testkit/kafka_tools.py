"""Kafka's own command-line tools, run from the jars Maven resolved (``apache_kafka.kafka_classpath``),
as operators run ``kafka-consumer-groups.sh``, ``kafka-share-groups.sh`` and
``kafka-leader-election.sh``: what kdaemon's commands are compared with, field by field."""

from __future__ import annotations

import subprocess

from testkit.apache_kafka import java_binary, kafka_classpath, kafka_jvm_flags

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"   # kafka-consumer-groups.sh
SHARE_GROUPS = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"         # kafka-share-groups.sh
LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"                 # kafka-leader-election.sh


def kafka_tool(main_class: str, bootstrap: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """One run of the tool ``main_class`` against ``bootstrap``; its output as text."""
    return subprocess.run([java_binary(), "-Xmx128m", *kafka_jvm_flags(), "-cp", kafka_classpath(), main_class,
                           "--bootstrap-server", bootstrap, *args], capture_output=True, text=True, timeout=timeout)


def table_rows(proc: subprocess.CompletedProcess) -> list[list[str]]:
    """A tool's table (header included), each line split on whitespace; the run must have succeeded."""
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return [line.split() for line in proc.stdout.splitlines() if line.strip()]


def kafka_share_groups(bootstrap: str, *args: str) -> list[list[str]]:
    """``kafka-share-groups.sh --bootstrap-server ... args``: its table rows."""
    return table_rows(kafka_tool(SHARE_GROUPS, bootstrap, *args))
