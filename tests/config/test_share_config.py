"""``[kafka] group_type`` and the ``[share]`` table (share groups, KIP-932): one typed parse, and
every problem named with why and what to write instead.  No broker: ``check-config --offline``
names the settings the daemon will set on the group; the same with the cluster (what the group
has now) is tests/worker/test_share_daemon_kafka.py's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kdaemon.config import ConfigError, ShareSection, parse
from kdaemon.config.env import read_overrides
from kdaemon.config.loader import ENV_LAYOUT
from kdaemon.exit_codes import EXIT_CONFIG


def raw(kafka: dict | None = None, share: dict | None = None, daemon: dict | None = None) -> dict:
    out = {"kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g", "group_type": "share", **(kafka or {})},
           "daemon": {"topics": ["t"], **(daemon or {})}, "sink": {"type": "null"}}
    if share is not None:
        out["share"] = share
    return out


def problems(doc: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse(doc, "f.toml")
    return err.value.problems


def test_share_settings_parse_into_group_configs():
    config = parse(raw(share={"auto_offset_reset": "by_duration:P1DT2H30M", "record_lock_duration_ms": 5000,
                              "delivery_count_limit": 3, "isolation_level": "read_committed"}))
    assert config.group_type == "share"
    assert config.share == ShareSection("by_duration:P1DT2H30M", 5000, 3, "read_committed")
    assert config.share.group_configs() == {"share.auto.offset.reset": "by_duration:P1DT2H30M",
                                            "share.record.lock.duration.ms": "5000",
                                            "share.delivery.count.limit": "3",
                                            "share.isolation.level": "read_committed"}
    # group_type is the daemon's: no client is given it.
    assert "group_type" not in config.consumer_options()


def test_unset_share_settings_leave_the_groups_own():
    config = parse(raw(share={"record_lock_duration_ms": 2000}))
    assert config.share.group_configs() == {"share.record.lock.duration.ms": "2000"}
    assert parse(raw()).share.group_configs() == {}
    consumer = parse({**raw(), "kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g"}})
    assert consumer.group_type == "consumer" and consumer.share == ShareSection()


def test_share_problems_each_named():
    found = problems(raw(share={"auto_offset_reset": "by_duration:1H", "record_lock_duration_ms": 0,
                                "delivery_count_limit": "3", "isolation_level": "committed", "lock_ms": 5}))
    assert found == [
        "f.toml: share.lock_ms: unknown option (auto_offset_reset, record_lock_duration_ms, delivery_count_limit, "
        "isolation_level)",
        "f.toml: share.delivery_count_limit: expected an integer, found string \"3\"",
        "f.toml: share.auto_offset_reset: 'by_duration:1H' is not one of earliest, latest or "
        "by_duration:<ISO-8601 duration> (e.g. by_duration:PT1H)",
        "f.toml: share.isolation_level: 'committed' is not one of read_committed, read_uncommitted",
        "f.toml: share.record_lock_duration_ms: must be positive (found 0)",
    ]


@pytest.mark.parametrize("reset", ["earliest", "latest", "by_duration:PT1H", "by_duration:P2D", "by_duration:PT0.5S"])
def test_offset_resets_taken(reset):
    assert parse(raw(share={"auto_offset_reset": reset})).share.auto_offset_reset == reset


@pytest.mark.parametrize("reset", ["by_duration:", "by_duration:P", "by_duration:PT", "by_duration:-PT1H", "none"])
def test_offset_resets_refused(reset):
    assert any("share.auto_offset_reset" in p for p in problems(raw(share={"auto_offset_reset": reset})))


def test_share_table_needs_a_share_group():
    doc = raw(share={"record_lock_duration_ms": 2000})
    del doc["kafka"]["group_type"]
    assert problems(doc) == ["f.toml: share: a [share] table sets a share group's configs, but [kafka] group_type "
                             "is 'consumer': set kafka.group_type = \"share\", or remove [share]"]


def test_group_type_choices():
    assert problems(raw(kafka={"group_type": "queue"})) == \
        ["f.toml: kafka.group_type: 'queue' is not one of consumer, share"]


def test_consumer_group_options_refused_by_name_with_why():
    found = problems(raw(kafka={"auto_offset_reset": "earliest", "isolation_level": "read_committed",
                                "group_protocol": "consumer", "session_timeout_ms": 10_000,
                                "group_instance_id": "a", "partition_assignment_strategy": "range"},
                         daemon={"assignment": "static"}))
    by_key = {p.split(": ")[1]: p for p in found}
    assert set(by_key) == {"kafka.auto_offset_reset", "kafka.isolation_level", "kafka.group_protocol",
                           "kafka.session_timeout_ms", "kafka.group_instance_id",
                           "kafka.partition_assignment_strategy", "daemon.assignment"}
    assert by_key["kafka.auto_offset_reset"].endswith("set [share] auto_offset_reset instead")
    assert by_key["kafka.isolation_level"].endswith("set [share] isolation_level instead")
    assert "not for a share group (group_type = \"share\"): share groups have no static members; remove it" \
        in by_key["kafka.group_instance_id"]
    assert "'static' cannot be used with kafka.group_type = \"share\"" in by_key["daemon.assignment"]


def test_the_same_options_are_fine_in_a_consumer_group():
    doc = raw(kafka={"auto_offset_reset": "earliest", "session_timeout_ms": 10_000})
    del doc["kafka"]["group_type"]
    assert parse(doc).consumer_options()["auto_offset_reset"] == "earliest"


def test_environment_sets_share_settings():
    doc = raw()
    env = {"KDAEMON_SHARE_RECORD_LOCK_DURATION_MS": "3000", "KDAEMON_KAFKA_GROUP_TYPE": "share"}
    config = parse(doc, "f.toml", environ=env, overrides=read_overrides(env, ENV_LAYOUT, doc))
    assert config.share.record_lock_duration_ms == 3000


def check_config(tmp_path, text: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(path), *args],
                          capture_output=True, text=True, timeout=60)


def test_check_config_names_the_share_group_settings(tmp_path):
    proc = check_config(tmp_path, """
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "orders"
        group_type = "share"

        [daemon]
        topics = ["t"]

        [share]
        auto_offset_reset = "earliest"
        record_lock_duration_ms = 5000

        [sink]
        type = "null"
        """, "--offline")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:4] == [
        "share group orders: share.auto.offset.reset set to earliest at start ([share] auto_offset_reset)",
        "share group orders: share.record.lock.duration.ms set to 5000 at start ([share] record_lock_duration_ms)",
        "share group orders: share.delivery.count.limit not set by the daemon: the group's value stays "
        "([share] delivery_count_limit sets it)",
        "share group orders: share.isolation.level not set by the daemon: the group's value stays "
        "([share] isolation_level sets it)",
    ]


def test_check_config_refuses_consumer_group_options_in_a_share_group(tmp_path):
    proc = check_config(tmp_path, """
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "orders"
        group_type = "share"
        auto_offset_reset = "earliest"

        [daemon]
        topics = ["t"]

        [sink]
        type = "null"
        """, "--offline")
    assert proc.returncode == EXIT_CONFIG
    assert "kafka.auto_offset_reset: not for a share group" in proc.stderr
    assert "set [share] auto_offset_reset instead" in proc.stderr


def test_share_acquire_mode_only_in_a_share_group():
    assert parse(raw(kafka={"share_acquire_mode": "record_limit"})).consumer_options()["share_acquire_mode"] == \
        "record_limit"
    assert problems(raw(kafka={"share_acquire_mode": "exact"})) == [
        "f.toml: kafka.share_acquire_mode: 'exact' is not one of batch_optimized, record_limit"]
    doc = raw(kafka={"share_acquire_mode": "record_limit"})
    del doc["kafka"]["group_type"]
    assert problems(doc) == ["f.toml: kafka.share_acquire_mode: only for a share group: set kafka.group_type = "
                             "\"share\", or remove it"]


def test_a_topic_pattern_is_refused_in_a_share_group():
    doc = raw(daemon={"topic_pattern": "orders-.*"})
    del doc["daemon"]["topics"]
    assert problems(doc) == ["f.toml: daemon.topic_pattern: a share group subscribes to topics by name (a share "
                             "consumer has no pattern subscription, as Java's KafkaShareConsumer): list them in "
                             "daemon.topics"]
