"""How ``group_configs`` finds the setting a broker's refusal names (no broker: its messages as
Kafka 4.4 words them, seen in test_group_configs_kafka.py)."""

from __future__ import annotations

from kdaemon.client.group_configs import _named_setting

LOCK, RESET = "share.record.lock.duration.ms", "share.auto.offset.reset"


def test_the_one_setting_the_message_names():
    configs = {LOCK: "1", RESET: "earliest"}
    assert _named_setting(configs, f"Invalid value 1 for configuration {LOCK}: Value must be at least 1000") == LOCK
    assert _named_setting(configs, "Unknown group config name: share.auto.offset.reset") == RESET


def test_a_name_inside_a_longer_one_or_none_at_all_names_nothing():
    assert _named_setting({"share.record.lock": "1"}, f"Invalid value 1 for configuration {LOCK}") is None
    assert _named_setting({LOCK: "1", RESET: "x"}, "Request parameters do not satisfy the configured policy.") is None
    assert _named_setting({LOCK: "1", RESET: "x"}, f"{LOCK} and {RESET} are both wrong") is None
