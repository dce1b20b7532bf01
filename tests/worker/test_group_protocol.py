"""``[kafka] group_protocol``: the option, the broker probe behind "auto", and the worker's choice.

The pure part (``choose_group_protocol``) is fed ApiVersions answers encoded and decoded by our
own codec, so the tagged ``finalized_features`` field is read as it comes off the wire.  The
probe itself runs against the real Tansu broker here (no API 68 there: "auto" is classic, and
a daemon started with "auto" logs that, with the reason); the Apache Kafka side ("auto" is
consumer) is in tests/worker/test_daemon_consumer_protocol_kafka.py.
"""

from __future__ import annotations

import logging
import re
import uuid

import pytest

from kdaemon.client import ConsumerConfig
from kdaemon.client.errors import NoBrokersAvailableError
from kdaemon.client.features import BrokerFeatures, choose_group_protocol, probe
from kdaemon.config import ConfigError, parse
from kdaemon.protocol.apis import API_VERSIONS, CONSUMER_GROUP_HEARTBEAT
from kdaemon.protocol.messages import decode_response, encode_response
from kdaemon.worker.main import consumer_options, resolve_group_protocol
from testkit.daemon import Daemon, daemon_config, free_port
from testkit.produce import create_topic

HB = CONSUMER_GROUP_HEARTBEAT


def answer(apis: dict[int, tuple[int, int]], finalized: dict[str, int] | None = None, *,
           version: int = 3) -> BrokerFeatures:
    """An ApiVersions answer as a broker would send it, through our encoder and decoder."""
    body = {"error_code": 0, "throttle_time_ms": 0,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in apis.items()],
            "supported_features": [], "finalized_features_epoch": 7 if finalized else -1,
            "finalized_features": [{"name": n, "max_version_level": v, "min_version_level": v}
                                   for n, v in (finalized or {}).items()]}
    frame = encode_response(API_VERSIONS, version, 1, body)[4:]   # without the size prefix
    return BrokerFeatures.from_api_versions(decode_response(API_VERSIONS, version, frame), version, "b:1")


BASE = {18: (0, 4), 1: (4, 17), 3: (0, 12)}


def test_consumer_when_api_68_is_offered_and_group_version_is_finalized():
    got = choose_group_protocol(answer({**BASE, 68: (0, 1)}, {"group.version": 1, "metadata.version": 27}))
    assert (got.protocol, got.reason) == ("consumer", "broker offers ConsumerGroupHeartbeat v0-1 and group.version=1")


@pytest.mark.parametrize("apis, finalized, version, reason", [
    (BASE, {"group.version": 1}, 3, "broker does not offer ConsumerGroupHeartbeat (API 68)"),
    ({**BASE, 68: (0, 1)}, {"metadata.version": 21}, 3,
     "broker offers ConsumerGroupHeartbeat v0-1 but group.version=0 (not finalized at 1 or more)"),
    ({**BASE, 68: (0, 1)}, {"group.version": 0}, 3,
     "broker offers ConsumerGroupHeartbeat v0-1 but group.version=0 (not finalized at 1 or more)"),
    ({**BASE, 68: (0, 1)}, None, 2,
     "broker offers ConsumerGroupHeartbeat v0-1 but answered ApiVersions v2, which carries no finalized features"),
    ({**BASE, 68: (HB.max_version + 1, HB.max_version + 2)}, {"group.version": 1}, 3,
     f"broker offers ConsumerGroupHeartbeat v{HB.max_version + 1}-{HB.max_version + 2}; "
     f"this client speaks v{HB.min_version}-{HB.max_version}"),
], ids=["no-api-68", "feature-absent", "feature-zero", "old-api-versions", "no-common-version"])
def test_classic_otherwise_saying_why(apis, finalized, version, reason):
    got = choose_group_protocol(answer(apis, finalized, version=version))
    assert (got.protocol, got.reason) == ("classic", reason)


def test_an_error_answer_is_not_taken_for_features():
    with pytest.raises(ValueError, match="error code 35"):
        BrokerFeatures.from_api_versions({"error_code": 35, "api_keys": []}, 0)


# -- the option -----------------------------------------------------------------------------------

def raw(**kafka) -> dict:
    return {"plugins": [], "kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g", **kafka},
            "daemon": {"topics": ["t"], "on_deserialize_error": "skip"}, "sink": {"type": "null"}}


def test_group_protocol_defaults_to_auto_which_no_consumer_is_given():
    config = parse(raw())
    assert config.group_protocol == "auto"
    assert "group_protocol" not in config.consumer_options()
    config = parse(raw(group_protocol="auto"))
    assert config.group_protocol == "auto" and "group_protocol" not in config.consumer_options()


def test_a_bad_group_protocol_is_named():
    with pytest.raises(ConfigError) as err:
        parse(raw(group_protocol="next-gen"), "kd.toml")
    assert err.value.problems == ["kd.toml: kafka.group_protocol: 'next-gen' is not one of auto, classic, consumer"]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_an_explicit_group_protocol_reaches_the_consumer(protocol, caplog):
    config = parse(raw(group_protocol=protocol))
    assert config.consumer_options()["group_protocol"] == protocol
    ConsumerConfig.from_options(**config.consumer_options())   # the consumer takes it
    with caplog.at_level(logging.INFO, logger="kdaemon.worker.main"):
        assert resolve_group_protocol(config, index=3) == protocol   # no broker is asked
    assert f"worker 3: group protocol {protocol} (set in [kafka] group_protocol)" in caplog.text


def test_static_assignment_joins_no_group_and_asks_nothing():
    config = parse({**raw(), "daemon": {"topics": ["t"], "on_deserialize_error": "skip", "assignment": "static"}})
    assert resolve_group_protocol(config) is None


class _Parts:
    header_filter = None
    on_filtered = None


def test_auto_resolved_to_consumer_drops_the_classic_only_options(caplog):
    config = parse(raw(session_timeout_ms=12_000, heartbeat_interval_ms=500, max_poll_records=7))
    with caplog.at_level(logging.INFO, logger="kdaemon.worker.main"):
        opts = consumer_options(config, _Parts(), index=1, group_protocol="consumer")
    assert opts["group_protocol"] == "consumer" and opts["max_poll_records"] == 7
    assert "session_timeout_ms" not in opts and "heartbeat_interval_ms" not in opts
    assert "worker 1: session_timeout_ms, heartbeat_interval_ms not used under the consumer protocol" in caplog.text
    classic = consumer_options(config, _Parts(), group_protocol="classic")
    assert classic["session_timeout_ms"] == 12_000 and classic["group_protocol"] == "classic"


# -- the probe against real brokers ---------------------------------------------------------------

def test_probe_gives_up_naming_the_servers_it_tried():
    port = free_port()   # nothing listens there
    waits = []
    with pytest.raises(NoBrokersAvailableError, match=rf"127\.0\.0\.1:{port} answered ApiVersions within 1 s"):
        probe(ConsumerConfig(bootstrap_servers=f"127.0.0.1:{port}", reconnect_backoff_ms=20),
              timeout_ms=1000, on_wait=lambda: waits.append(1))
    assert waits, "on_wait was never called while waiting"


def test_auto_is_classic_on_tansu(broker, caplog):
    """Tansu answers ApiVersions without ConsumerGroupHeartbeat: "auto" picks classic and says so."""
    features = probe(ConsumerConfig(bootstrap_servers=broker.bootstrap), timeout_ms=15_000)
    assert features.broker == broker.bootstrap
    assert features.offered(API_VERSIONS.key) is not None
    assert features.offered(HB.key) is None, f"Tansu now offers API 68 {features.offered(HB.key)}: revisit"
    config = parse(raw(bootstrap_servers=broker.bootstrap))
    with caplog.at_level(logging.INFO, logger="kdaemon.worker.main"):
        assert resolve_group_protocol(config, index=0, wait_ms=15_000) == "classic"
    assert (f'worker 0: group protocol classic (group_protocol = "auto": broker does not offer '
            f'ConsumerGroupHeartbeat (API 68), asked {broker.bootstrap})') in caplog.text


def test_daemon_on_tansu_with_auto_logs_classic_for_every_worker(broker, tmp_path):
    topic, group = f"auto-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    config = daemon_config(tmp_path, broker.bootstrap, topic, group, workers=2)
    assert "group_protocol" not in config["kafka"]   # the default: auto
    with Daemon(tmp_path, config) as d:
        d.wait_all_ready(timeout=60)
        choices = re.findall(r"worker-(\d) kdaemon\.worker\.main: worker \d: group protocol (\w+) "
                             r"\(group_protocol = \"auto\": (.*?), asked", d.log())
        assert sorted(choices) == [("0", "classic", "broker does not offer ConsumerGroupHeartbeat (API 68)"),
                                   ("1", "classic", "broker does not offer ConsumerGroupHeartbeat (API 68)")], \
            d.log_tail()
        assert d.joins(0) and d.joins(1), "classic members complete JoinGroup"
        assert d.stop(timeout=60) == 0, d.log_tail()


def test_releasing_a_static_member_needs_its_instance_id():
    from kdaemon.client.group.release import release_static_member
    with pytest.raises(ValueError, match="needs group_id and group_instance_id"):
        release_static_member(ConsumerConfig(group_id="g", group_protocol="consumer"), "m")


@pytest.mark.parametrize("was, clean, now", [("consumer", True, "consumer"), ("consumer", True, "classic"),
                                             ("classic", True, "classic"), ("classic", False, "classic")])
def test_nothing_to_release_after_a_clean_stop_or_within_classic(was, clean, now, caplog):
    """A consumer-protocol worker that stopped cleanly left with -2 itself, and a classic
    successor replaces a classic static member at once: no request goes out (the bootstrap
    server here has nobody listening, so one would be logged as a failure)."""
    from kdaemon.worker.main import release_predecessor
    config = parse(raw(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=500))
    with caplog.at_level(logging.INFO, logger="kdaemon.worker.main"):
        release_predecessor(config, 1, now, member_id="m-1", was=was, clean=clean)
    assert caplog.text == ""


def test_a_failed_release_is_logged_and_the_worker_goes_on(caplog):
    from kdaemon.worker.main import release_predecessor
    config = parse(raw(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=500,
                       reconnect_backoff_ms=20))
    with caplog.at_level(logging.INFO, logger="kdaemon.worker.main"):
        release_predecessor(config, 1, "consumer", member_id="m-1", was="consumer", clean=False)
    assert "worker 1: could not release the consumer static membership of its predecessor m-1: " in caplog.text


def test_classic_only_options_with_an_explicit_consumer_protocol_are_named():
    with pytest.raises(ConfigError) as err:
        parse(raw(group_protocol="consumer", session_timeout_ms=12_000), "kd.toml")
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("kd.toml: kafka.session_timeout_ms: cannot be set with "
                                            "group_protocol='consumer'"), err.value.problems


def test_the_example_configuration_is_valid_and_says_auto():
    from pathlib import Path
    from kdaemon.config import load
    config = load(Path(__file__).parents[2] / "etc" / "kdaemon.toml")
    assert config.group_protocol == "auto"
