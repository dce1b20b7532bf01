"""``kdaemon offsets`` for a consumer-protocol (KIP-848) group, on Apache Kafka: the group's state,
protocol, assignor and members (ConsumerGroupDescribe, key 69), and per partition the member
holding it — checked against what the members themselves report and against the Java Admin's
describeConsumerGroups.  A broker that does not offer key 69 is asked DescribeGroups only.
The classic side is in test_cli_errors_kafka.py."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from kdaemon.client import Consumer, ConsumerConfig
from kdaemon.client.group import describe as describe_module
from kdaemon.client.group.describe import describe_group
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis import API_VERSIONS, CONSUMER_GROUP_DESCRIBE
from tests.cli.test_cli_errors_kafka import kdaemon, write_config
from testkit.apache_kafka import java_binary, kafka_classpath
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

PARTITIONS = 3
WAIT = 60.0


class PollingMember(threading.Thread):
    """A kdaemon consumer of ``group`` polling in its own thread (so it keeps its membership
    while the CLI runs); ``owned`` is its assignment as it last reported it."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str, *, protocol: str = "consumer",
                 instance_id: str | None = None) -> None:
        super().__init__(name=client_id, daemon=True)
        self.consumer = Consumer(bootstrap, group_id=group, group_protocol=protocol, client_id=client_id,
                                 group_instance_id=instance_id, auto_offset_reset="earliest",
                                 enable_auto_commit=False)
        self.topic, self.client_id, self.instance_id = topic, client_id, instance_id
        self.member_id = self.consumer.group_member_id()
        self.owned: frozenset[TopicPartition] = frozenset()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self._stopping.is_set():
                self.consumer.poll(100)
                self.owned = frozenset(self.consumer.assignment())
                self.member_id = self.consumer.group_member_id()
        except BaseException as exc:   # reported by the test, not lost in the thread
            self.error = exc
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)
        assert self.error is None, self.error


def settled(bootstrap: str, group: str, members: list[PollingMember]):
    """Wait until the members own disjoint shares of every partition and the coordinator
    describes the same: Stable, each member (by its own id) holding what it reports."""
    config = ConsumerConfig.from_options(bootstrap_servers=bootstrap, group_id=group)
    deadline = time.monotonic() + WAIT
    while True:
        assert all(m.error is None for m in members), [m.error for m in members]
        owned = [m.owned for m in members]
        if all(owned) and sum(map(len, owned)) == PARTITIONS and len(frozenset().union(*owned)) == PARTITIONS:
            group_now = describe_group(config)
            held = {d.member_id: frozenset(d.partitions) for d in group_now.members}
            if group_now.state == "Stable" and held == {m.member_id: m.owned for m in members}:
                return group_now
        assert time.monotonic() < deadline, (owned, describe_group(config))
        time.sleep(0.2)


@pytest.fixture(scope="module")
def topic(kafka) -> str:
    name = f"cli-848-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, PARTITIONS)
    for p in range(PARTITIONS):
        produce(kafka.bootstrap, name, [(b"k%d" % i, b"v%d" % i) for i in range(5)], partition=p)
    return name


def offsets_table(proc: subprocess.CompletedProcess, topic: str) -> tuple[str, dict[int, list[str]]]:
    """The header line and the rows by partition (topic, partition, committed, end, lag,
    consumer, host, client)."""
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    rows = {int(parts[1]): parts for parts in map(str.split, lines) if parts[:1] == [topic]}
    return lines[0], rows


def test_offsets_shows_a_consumer_protocol_group_and_who_holds_each_partition(kafka, topic, tmp_path):
    """Two consumer-protocol members, one static: the header names the protocol, the state,
    both members and the broker's assignor; each partition's row names the member that reports
    holding it (its instance id, else its member id), its host and its client id."""
    group = f"g848-{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    members = [PollingMember(kafka.bootstrap, group, topic, "cli-848-a", instance_id=f"{group}-static-a"),
               PollingMember(kafka.bootstrap, group, topic, "cli-848-b")]
    for m in members:
        m.start()
    try:
        settled(kafka.bootstrap, group, members)
        header, rows = offsets_table(kdaemon("offsets", "-c", str(config), cwd=tmp_path), topic)
        assert header == f"consumer group (consumer protocol, KIP-848) {group}: Stable, 2 member(s), assignor uniform", \
            header
        assert sorted(rows) == list(range(PARTITIONS)), rows
        for m in members:
            for tp in m.owned:
                assert rows[tp.partition][5:] == [m.instance_id or m.member_id, "127.0.0.1", m.client_id], \
                    (tp, rows[tp.partition], m.member_id)
        java = java_describe(kafka.bootstrap, group, tmp_path)
        assert java["group"] == ["Stable", "Consumer", "uniform"], java
        assert java["members"] == {m.member_id: [m.instance_id or "-", m.client_id, "/127.0.0.1",
                                                 ",".join(sorted(f"{tp.topic}:{tp.partition}" for tp in m.owned))]
                                   for m in members}, java
    finally:
        for m in members:
            m.stop()
    # Both stopped.  The dynamic member left (epoch -1) and is gone; the static one left with
    # epoch -2, and the coordinator keeps its place and its partitions for a successor under the
    # same instance id until its session times out (KIP-848): it is still listed, holding them.
    static, dynamic = members
    header, rows = offsets_table(kdaemon("offsets", "-c", str(config), cwd=tmp_path), topic)
    assert header.startswith(f"consumer group (consumer protocol, KIP-848) {group}: ") and \
        ", 1 member(s), assignor uniform" in header, header
    for tp in static.owned:
        assert rows[tp.partition][5:] == [static.instance_id, "127.0.0.1", static.client_id], rows
    for tp in dynamic.owned:
        assert rows[tp.partition][5:] == ["-", "-", "-"], rows

def test_a_broker_without_consumer_group_describe_is_asked_describe_groups_only(kafka, topic, monkeypatch):
    """A coordinator whose ApiVersions lacks key 69 (Kafka before 3.7) is never sent
    ConsumerGroupDescribe: a classic group is described by DescribeGroups all the same, and a
    consumer-protocol group reads "Dead" there, as that broker could not have one."""
    real, asked = describe_module.ask_coordinator, []

    def without_key_69(config, api, body, timeout_ms, **kw):
        asked.append(api.name)
        resp = real(config, api, body, timeout_ms, **kw)
        if api is API_VERSIONS:
            resp = dict(resp, api_keys=[e for e in resp["api_keys"] if e["api_key"] != CONSUMER_GROUP_DESCRIBE.key])
        return resp

    classic, kip848 = f"gc-{uuid.uuid4().hex[:8]}", f"g848-{uuid.uuid4().hex[:8]}"
    members = [PollingMember(kafka.bootstrap, classic, topic, "classic-a", protocol="classic"),
               PollingMember(kafka.bootstrap, kip848, topic, "kip848-a")]
    for m in members:
        m.start()
    try:
        settled(kafka.bootstrap, classic, members[:1])
        settled(kafka.bootstrap, kip848, members[1:])
        monkeypatch.setattr(describe_module, "ask_coordinator", without_key_69)
        described = describe_group(ConsumerConfig.from_options(bootstrap_servers=kafka.bootstrap, group_id=classic))
        assert (described.protocol, described.state, described.assignor) == ("classic", "Stable", "range"), described
        assert [(d.client_id, frozenset(d.partitions)) for d in described.members] == \
            [("classic-a", members[0].owned)], described
        assert asked == ["ApiVersions", "DescribeGroups"], asked
        described = describe_group(ConsumerConfig.from_options(bootstrap_servers=kafka.bootstrap, group_id=kip848))
        assert (described.protocol, described.state, described.members) == ("", "Dead", ()), described
    finally:
        for m in members:
            m.stop()


# The Java Admin's view of the same group, printed one tab-separated line per fact.
_JAVA_DESCRIBE = """\
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartition;

public class DescribeConsumerGroup {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(props)) {
            ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(args[1])).all().get().get(args[1]);
            System.out.println("@@group\\t" + d.groupState() + "\\t" + d.type() + "\\t" + d.partitionAssignor());
            for (MemberDescription m : d.members()) {
                List<String> parts = new ArrayList<>();
                for (TopicPartition tp : m.assignment().topicPartitions()) parts.add(tp.topic() + ":" + tp.partition());
                Collections.sort(parts);
                System.out.println("@@member\\t" + m.consumerId() + "\\t" + m.groupInstanceId().orElse("-") + "\\t"
                                   + m.clientId() + "\\t" + m.host() + "\\t" + String.join(",", parts));
            }
        }
    }
}
"""


def java_describe(bootstrap: str, group: str, tmp_path: Path) -> dict:
    """Kafka 4.4's Admin.describeConsumerGroups for ``group`` (Java's single-file source launch:
    no javac step): {"group": [state, type, assignor], "members": {member id: [instance id,
    client id, host, "topic:partition,..."]}}."""
    source = tmp_path / "DescribeConsumerGroup.java"
    source.write_text(_JAVA_DESCRIBE)
    proc = subprocess.run([java_binary(), "-Xmx128m", "-cp", kafka_classpath(), str(source), bootstrap, group],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict = {"members": {}}
    for line in proc.stdout.splitlines():
        kind, *fields = line.split("\t")
        if kind == "@@group":
            out["group"] = fields
        elif kind == "@@member":
            out["members"][fields[0]] = fields[1:]
    return out
