"""Unit tests for the client's pure parts: configuration, SASL mechanisms, futures, cluster
metadata, subscription state and address parsing.  No sockets, no broker."""

from __future__ import annotations

import base64
import uuid

import pytest

from kdaemon.client import Consumer, ConsumerConfig
from kdaemon.client.config import parse_address
from kdaemon.client.future import Future
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.sasl import PlainMechanism, SaslError, ScramMechanism, make_mechanism
from kdaemon.client.subscription import EARLIEST, LATEST, SubscriptionState
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.errors import BrokerError, Errors
from kdaemon.protocol.primitives import ZERO_UUID
from testkit.secure import ScramAuthError, ScramCredential, ScramServer

SECRET = "s3cr3t-\u00e9-pw-7d1e"
USER = "user-5b9a"


# --- ConsumerConfig ----------------------------------------------------------------------------

def test_config_defaults_follow_the_java_consumer():
    c = ConsumerConfig()
    assert c.bootstrap_servers == ("localhost:9092",)
    assert (c.fetch_min_bytes, c.fetch_max_wait_ms, c.fetch_max_bytes) == (1, 500, 52_428_800)
    assert (c.max_partition_fetch_bytes, c.max_poll_records) == (1_048_576, 500)
    assert (c.auto_offset_reset, c.isolation_level) == ("latest", "read_uncommitted")
    assert (c.request_timeout_ms, c.default_api_timeout_ms) == (30_000, 60_000)
    assert (c.session_timeout_ms, c.heartbeat_interval_ms, c.max_poll_interval_ms) == (45_000, 3000, 300_000)
    assert (c.reconnect_backoff_ms, c.reconnect_backoff_max_ms) == (50, 1000)
    assert (c.retry_backoff_ms, c.retry_backoff_max_ms) == (100, 1000)
    assert (c.metadata_max_age_ms, c.connections_max_idle_ms) == (300_000, 540_000)
    assert c.socket_connection_setup_timeout_ms == 10_000
    assert c.enable_auto_commit and c.check_crcs and c.ssl_check_hostname
    assert c.security_protocol == "PLAINTEXT"
    assert c.unknown_topic == "wait"
    assert not c.allow_auto_create_topics and not c.read_committed


def test_config_bootstrap_servers_from_a_comma_separated_string():
    c = ConsumerConfig(bootstrap_servers=" a:1, b:2 ,,[::1]:3 ")
    assert c.bootstrap_servers == ("a:1", "b:2", "[::1]:3")
    assert ConsumerConfig(bootstrap_servers=["x:9"]).bootstrap_servers == ("x:9",)


def test_unknown_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="unknown consumer option.*fetch_max_wait"):
        ConsumerConfig.from_options(fetch_max_wait=10)
    with pytest.raises(TypeError) as info:
        ConsumerConfig.from_options(zzz=1, aaa=2, fetch_min_bytes=1)
    assert "aaa, zzz" in str(info.value)
    with pytest.raises(TypeError, match="session_timeout"):
        Consumer("127.0.0.1:1", session_timeout=10)


def test_unknown_option_error_never_shows_values():
    with pytest.raises(TypeError) as info:
        ConsumerConfig.from_options(sasl_pasword=SECRET)
    assert "sasl_pasword" in str(info.value) and SECRET not in str(info.value)


def test_every_validation_problem_is_listed_at_once():
    with pytest.raises(ValueError) as info:
        ConsumerConfig(bootstrap_servers="nohost", fetch_max_bytes=0, max_poll_records=-1,
                       fetch_min_bytes=-1, isolation_level="dirty", auto_offset_reset="middle",
                       security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", unknown_topic="ignore",
                       request_timeout_ms="30s")
    text = str(info.value)
    for expected in ("'nohost' is not host:port", "fetch_max_bytes must be positive",
                     "max_poll_records must be positive", "fetch_min_bytes must not be negative",
                     "isolation_level='dirty'", "auto_offset_reset='middle'", "sasl_mechanism='GSSAPI'",
                     "unknown_topic='ignore'", "request_timeout_ms must be an integer",
                     "security_protocol=SASL_SSL needs sasl_username and sasl_password"):
        assert expected in text, expected
    assert text.count(";") == 9


def test_a_wrong_type_for_security_protocol_is_listed_not_a_crash():
    with pytest.raises(ValueError, match="security_protocol must be a string, got None"):
        ConsumerConfig(security_protocol=None)


@pytest.mark.parametrize("option, value, words", [
    ("bootstrap_servers", 5, "bootstrap_servers must be a list of strings (or one comma-separated string), got 5"),
    ("bootstrap_servers", ["a:1", 2], "bootstrap_servers must be a list of strings"),
    ("max_poll_records", True, "max_poll_records must be an integer, got True"),
    ("check_crcs", 1, "check_crcs must be true or false, got 1"),
    ("ssl_check_hostname", "false", "ssl_check_hostname must be true or false, got 'false'"),
    ("client_rack", 5, "client_rack must be a string, got 5"),
    ("group_instance_id", [1], "group_instance_id must be a string or None, got [1]"),
    ("rebalance_timeout_ms", "1s", "rebalance_timeout_ms must be an integer or None, got '1s'"),
    ("partition_assignment_strategy", 5, "partition_assignment_strategy must be a list of strings"),
])
def test_every_option_is_checked_against_its_type(option, value, words):
    with pytest.raises(ValueError) as info:
        ConsumerConfig(**{option: value})
    assert words in str(info.value) and str(info.value).count(";") == 0


def test_empty_bootstrap_is_a_problem():
    with pytest.raises(ValueError, match="bootstrap_servers is empty"):
        ConsumerConfig(bootstrap_servers="")


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_needs_username_and_password(protocol):
    with pytest.raises(ValueError, match="needs sasl_username and sasl_password"):
        ConsumerConfig(security_protocol=protocol, sasl_username=USER)
    ConsumerConfig(security_protocol=protocol, sasl_username=USER, sasl_password="")


def test_secrets_are_not_in_repr():
    c = ConsumerConfig(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username=USER,
                       sasl_password=SECRET, ssl_password=SECRET + "-key")
    for text in (repr(c), str(c), repr(c.replace(client_id="other"))):
        assert SECRET not in text
        assert USER in text  # the user name is not a secret, and helps operators
    consumer = Consumer("127.0.0.1:1", security_protocol="SASL_PLAINTEXT", sasl_username=USER,
                        sasl_password=SECRET)
    try:
        assert SECRET not in repr(consumer)
    finally:
        consumer.close()


def test_config_is_frozen_and_replace_validates():
    c = ConsumerConfig()
    with pytest.raises(AttributeError):
        c.client_id = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_poll_records"):
        c.replace(max_poll_records=0)


# --- SASL: PLAIN and SCRAM ---------------------------------------------------------------------

def test_plain_first_message_and_repr():
    m = PlainMechanism(USER, SECRET)
    assert m.first_message() == b"\0" + USER.encode() + b"\0" + SECRET.encode("utf-8")
    assert m.receive(b"") is None and m.done
    assert USER not in repr(m) and SECRET not in repr(m)


def test_make_mechanism():
    assert make_mechanism("PLAIN", "u", "p").name == "PLAIN"
    assert make_mechanism("SCRAM-SHA-512", "u", "p").name == "SCRAM-SHA-512"
    with pytest.raises(ValueError, match="GSSAPI"):
        make_mechanism("GSSAPI", "u", "p")
    with pytest.raises(ValueError, match="SCRAM-SHA-1"):
        ScramMechanism("SCRAM-SHA-1", "u", "p")


# RFC 7677 section 3: the SCRAM-SHA-256 example exchange.
RFC7677 = {
    "client_nonce": "rOprNGfwEbeRWgbNEkqO",
    "client_first": b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    "server_first": b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    "client_final": b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    "server_final": b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
}


def test_scram_sha256_rfc7677_vector():
    m = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce=RFC7677["client_nonce"])
    assert m.first_message() == RFC7677["client_first"]
    assert m.receive(RFC7677["server_first"]) == RFC7677["client_final"]
    assert not m.done
    assert m.receive(RFC7677["server_final"]) is None
    assert m.done
    with pytest.raises(SaslError, match="unexpected SCRAM message in state done"):
        m.receive(RFC7677["server_final"])


def test_the_test_scram_server_reproduces_rfc7677():
    """The in-test server (used for SCRAM-SHA-512 and against Tansu) passes the published vector."""
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pencil",
                                         salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer("SCRAM-SHA-256", {"user": cred}, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.step(RFC7677["client_first"]) == RFC7677["server_first"]
    assert server.step(RFC7677["client_final"]) == RFC7677["server_final"]
    assert server.done


def _exchange(mechanism: str, username: str, password: str, server_password: str | None = None):
    cred = ScramCredential.from_password(mechanism, password if server_password is None else server_password)
    server = ScramServer(mechanism, {username: cred})
    client = ScramMechanism(mechanism, username, password)
    client_final = client.receive(server.step(client.first_message()))
    client.receive(server.step(client_final))
    return client, server


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("username,password", [
    ("user", "pencil"),
    ("a,b=c", "p=a,s"),                         # SCRAM's escaping of "," and "=" in user names
    (USER, "caf\u00e9 \u00a0\ufb01 \u2163"),    # non-ASCII, no-break space, ligature, roman numeral
])
def test_scram_exchange_against_an_rfc5802_server(mechanism, username, password):
    client, server = _exchange(mechanism, username, password)
    assert client.done and server.done and server.username == username


def test_scram_password_is_salted_as_plain_utf8_like_kafka():
    """Kafka's ScramFormatter salts password.getBytes(UTF_8); SASLprep would turn the no-break
    space into a space and the ligature into "fi", and no Kafka broker would accept the proof."""
    with pytest.raises(ScramAuthError, match="invalid proof"):
        _exchange("SCRAM-SHA-512", USER, "x\u00a0\ufb01", server_password="x fi")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_is_refused_by_the_server(mechanism):
    with pytest.raises(ScramAuthError, match="invalid proof"):
        _exchange(mechanism, USER, SECRET, server_password=SECRET + "x")


def _client_after_first(mechanism: str = "SCRAM-SHA-512") -> ScramMechanism:
    m = ScramMechanism(mechanism, USER, SECRET, nonce="cnonce")
    m.first_message()
    return m


SALT = base64.b64encode(b"0123456789abcdef").decode()


@pytest.mark.parametrize("server_first,match", [
    (b"", "malformed SCRAM server-first message"),
    (b"r=cnonceSRV,s=" + SALT.encode(), "malformed SCRAM server-first message"),
    (b"r=cnonceSRV,i=4096", "malformed SCRAM server-first message"),
    (b"s=" + SALT.encode() + b",i=4096", "malformed SCRAM server-first message"),
    (b"r=cnonceSRV,s=!!not-base64!!,i=4096", "malformed SCRAM server-first message"),
    (b"r=cnonceSRV,s=" + SALT.encode() + b",i=many", "malformed SCRAM server-first message"),
    (b"\xff\xfe\x00garbage", "malformed SCRAM server-first message"),
    (b"r=othernonce,s=" + SALT.encode() + b",i=4096", "does not extend the client nonce"),
    (b"r=cnonce,s=" + SALT.encode() + b",i=4096", "does not extend the client nonce"),
    (b"r=cnonceSRV,s=" + SALT.encode() + b",i=1024", "iteration count 1024 is outside 4096..16384"),
    (b"r=cnonceSRV,s=" + SALT.encode() + b",i=-1", "iteration count -1 is outside 4096..16384"),
    (b"r=cnonceSRV,s=" + SALT.encode() + b",i=100000000", "iteration count 100000000 is outside 4096..16384"),
    (b"e=unknown-user", "server rejected the SCRAM exchange: unknown-user"),
])
def test_malformed_server_first_is_a_sasl_error_without_credentials(server_first, match):
    m = _client_after_first()
    with pytest.raises(SaslError, match=match) as info:
        m.receive(server_first)
    for exc in (info.value, info.value.__cause__, info.value.__context__):
        assert SECRET not in str(exc) and USER not in str(exc)


@pytest.mark.parametrize("server_final,match", [
    (b"", "malformed SCRAM server-final message"),
    (b"v=!!!", "malformed SCRAM server-final message"),
    (b"v=" + base64.b64encode(b"\0" * 64), "server signature does not verify"),
    (b"e=invalid-proof", "server rejected the SCRAM proof: invalid-proof"),
])
def test_malformed_server_final_is_a_sasl_error_without_credentials(server_final, match):
    m = _client_after_first()
    m.receive(b"r=cnonceSRV,s=" + SALT.encode() + b",i=4096")
    with pytest.raises(SaslError, match=match) as info:
        m.receive(server_final)
    assert not m.done
    assert SECRET not in str(info.value) and USER not in str(info.value)


def test_scram_message_before_first_is_a_sasl_error():
    m = ScramMechanism("SCRAM-SHA-256", USER, SECRET)
    with pytest.raises(SaslError, match="state start"):
        m.receive(b"r=x,s=y,i=4096")


def test_scram_repr_hides_credentials_and_nonce_is_fresh():
    a, b = ScramMechanism("SCRAM-SHA-256", USER, SECRET), ScramMechanism("SCRAM-SHA-256", USER, SECRET)
    assert USER not in repr(a) and SECRET not in repr(a)
    assert a.first_message() != b.first_message()
    assert b"," not in a.first_message().split(b",r=")[1]


# --- Future ------------------------------------------------------------------------------------

def test_future_success_runs_callbacks_in_order_once():
    calls = []
    f = Future()
    assert not f.done and not f.failed and f.exception is None
    with pytest.raises(RuntimeError, match="not done"):
        f.value()
    f.add_callback(lambda v: calls.append(("cb1", v)))
    f.add_errback(lambda e: calls.append(("eb", e)))
    f.add_callback(lambda v: calls.append(("cb2", v)))
    assert f.success(42) is f
    assert calls == [("cb1", 42), ("cb2", 42)]
    assert f.done and not f.failed and f.value() == 42
    f.add_callback(lambda v: calls.append(("late", v)))   # runs at once
    f.add_errback(lambda e: calls.append(("late-eb", e)))  # never
    assert calls[-1] == ("late", 42) and len(calls) == 3


def test_future_failure_runs_errbacks_and_value_raises():
    calls = []
    exc = ValueError("boom")
    f = Future().add_callback(lambda v: calls.append("cb")).add_errback(calls.append)
    f.failure(exc)
    assert calls == [exc]
    assert f.done and f.failed and f.exception is exc
    with pytest.raises(ValueError, match="boom"):
        f.value()
    f.add_errback(calls.append)
    f.add_callback(lambda v: calls.append("late-cb"))
    assert calls == [exc, exc]


def test_future_completes_only_once():
    f = Future().success(None)  # None is a value, not "pending"
    assert f.done and f.value() is None
    with pytest.raises(RuntimeError, match="twice"):
        f.success(1)
    with pytest.raises(RuntimeError, match="twice"):
        f.failure(ValueError())
    g = Future().failure(KeyError("k"))
    with pytest.raises(RuntimeError, match="twice"):
        g.success(1)


def test_a_raising_callback_does_not_stop_the_others(caplog):
    seen = []

    def bad(value):
        raise RuntimeError("callback bug")

    f = Future().add_callback(bad).add_callback(seen.append)
    f.success(1)
    assert seen == [1] and f.value() == 1
    assert "callback bug" in caplog.text
    g = Future().add_errback(bad).add_errback(seen.append)
    g.failure(KeyError("k"))
    assert isinstance(seen[-1], KeyError)


def test_future_chain_and_add_both():
    seen = []
    src, dst = Future(), Future()
    src.chain(dst)
    dst.add_both(seen.append)
    src.success("v")
    assert dst.value() == "v" and seen == ["v"]
    src2, dst2 = Future(), Future()
    src2.chain(dst2)
    err = OSError("x")
    src2.failure(err)
    assert dst2.exception is err


# --- ClusterMetadata.handle_response -----------------------------------------------------------

TOPIC_ID = uuid.UUID("11111111-2222-3333-4444-555555555555")
NEW_TOPIC_ID = uuid.UUID("99999999-2222-3333-4444-555555555555")


def _partition(index: int, leader: int, epoch: int, error_code: int = 0) -> dict:
    return {"partition_index": index, "error_code": error_code, "leader_id": leader, "leader_epoch": epoch,
            "replica_nodes": [0, 1, 2], "isr_nodes": [0, 1, 2], "offline_replicas": []}


def _topic(name: str, partitions: list, error_code: int = 0, topic_id=TOPIC_ID) -> dict:
    return {"name": name, "error_code": error_code, "topic_id": topic_id, "is_internal": False,
            "partitions": partitions}


def _response(*topics, error_code: int = 0) -> dict:
    body = {"brokers": [{"node_id": n, "host": f"b{n}", "port": 9092 + n, "rack": None} for n in range(3)],
            "cluster_id": "c1", "controller_id": 1, "topics": list(topics)}
    if error_code:
        body["error_code"] = error_code
    return body


def _metadata(*topics: str) -> ClusterMetadata:
    md = ClusterMetadata(retry_backoff_ms=100)
    md.set_wanted(set(topics))
    return md


def test_metadata_applies_brokers_leaders_and_ids():
    md = _metadata("t")
    md.handle_response(_response(_topic("t", [_partition(0, 1, 5), _partition(1, 2, 7)])), now=10.0)
    assert set(md.brokers) == {0, 1, 2} and md.brokers[2].port == 9094
    assert md.leader_for(TopicPartition("t", 0)) == 1
    assert md.leader_epoch(TopicPartition("t", 1)) == 7
    assert md.partitions_for("t") == [0, 1]
    assert md.topic_id("t") == TOPIC_ID and md.topic_names[TOPIC_ID] == "t"
    assert (md.cluster_id, md.controller_id, md.version) == ("c1", 1, 1)
    assert not md.update_due(10.0 + 1)  # fresh: nothing to do until the max age


def test_metadata_ignores_a_stale_leader_epoch():
    md = _metadata("t")
    md.handle_response(_response(_topic("t", [_partition(0, 1, 5)])), now=1.0)
    md.handle_response(_response(_topic("t", [_partition(0, 2, 4)])), now=2.0)
    tp = TopicPartition("t", 0)
    assert (md.leader_for(tp), md.leader_epoch(tp)) == (1, 5), "an older epoch must not move the leader back"
    md.handle_response(_response(_topic("t", [_partition(0, 2, 6)])), now=3.0)
    assert (md.leader_for(tp), md.leader_epoch(tp)) == (2, 6)
    md.handle_response(_response(_topic("t", [_partition(0, 0, -1)])), now=4.0)
    assert md.leader_for(tp) == 0, "a response without epochs (old brokers) is taken as is"


def test_metadata_topic_id_change_is_a_new_topic():
    md = _metadata("t")
    md.handle_response(_response(_topic("t", [_partition(0, 1, 9)])), now=1.0)
    md.handle_response(_response(_topic("t", [_partition(0, 2, 0)], topic_id=NEW_TOPIC_ID)), now=2.0)
    tp = TopicPartition("t", 0)
    assert (md.leader_for(tp), md.leader_epoch(tp)) == (2, 0), "epochs of a recreated topic start over"
    assert md.topic_id("t") == NEW_TOPIC_ID
    assert TOPIC_ID not in md.topic_names and md.topic_names[NEW_TOPIC_ID] == "t"


def test_metadata_missing_topic_then_created():
    md = _metadata("t", "gone")
    md.handle_response(_response(_topic("t", [_partition(0, 1, 1)]),
                                 _topic("gone", [], error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                        topic_id=ZERO_UUID)), now=1.0)
    assert md.missing_topics == {"gone"}
    assert md.partitions_for("gone") is None
    md.handle_response(_response(_topic("t", [_partition(0, 1, 1)]),
                                 _topic("gone", [_partition(0, 0, 0)], topic_id=NEW_TOPIC_ID)), now=2.0)
    assert md.missing_topics == set()
    assert md.partitions_for("gone") == [0]


def test_metadata_unauthorized_topic():
    md = _metadata("secret")
    md.handle_response(_response(_topic("secret", [], error_code=Errors.TOPIC_AUTHORIZATION_FAILED)), now=1.0)
    assert md.unauthorized_topics == {"secret"} and md.partitions_for("secret") is None


@pytest.mark.parametrize("where", ["topic", "partition", "no-leader"])
def test_metadata_leader_not_available_keeps_an_update_due(where):
    md = _metadata("t")
    if where == "topic":
        t = _topic("t", [], error_code=Errors.LEADER_NOT_AVAILABLE)
    elif where == "partition":
        t = _topic("t", [_partition(0, 1, 1), _partition(1, -1, 1, error_code=Errors.LEADER_NOT_AVAILABLE)])
    else:
        t = _topic("t", [_partition(0, -1, 1)])
    md.handle_response(_response(t), now=1.0)
    assert md.update_due(1.0 + 0.2), "LEADER_NOT_AVAILABLE must lead to another update soon"
    assert md.leader_for(TopicPartition("t", 1 if where == "partition" else 0)) is None
    if where == "partition":
        assert md.leader_for(TopicPartition("t", 0)) == 1
    assert "t" not in md.missing_topics


def test_metadata_forgets_topics_no_longer_wanted():
    md = _metadata("a", "b")
    md.handle_response(_response(_topic("a", [_partition(0, 1, 1)]),
                                 _topic("b", [_partition(0, 1, 1)], topic_id=NEW_TOPIC_ID)), now=1.0)
    md.set_wanted({"a"})
    assert md.update_due(2.0)
    md.handle_response(_response(_topic("a", [_partition(0, 1, 1)]),
                                 _topic("b", [_partition(0, 1, 1)], topic_id=NEW_TOPIC_ID)), now=2.0)
    assert set(md.topics) == {"a"} and NEW_TOPIC_ID not in md.topic_names


CLUSTER_AUTHORIZATION_FAILED = 31


def test_metadata_top_level_error_raises_and_changes_nothing():
    md = _metadata("t")
    with pytest.raises(BrokerError) as info:
        md.handle_response(_response(_topic("t", [_partition(0, 1, 1)]),
                                     error_code=CLUSTER_AUTHORIZATION_FAILED), now=1.0)
    assert info.value.code == CLUSTER_AUTHORIZATION_FAILED
    assert md.version == 0 and md.topics == {}


def test_metadata_update_leader_only_moves_forward():
    md = _metadata("t")
    md.handle_response(_response(_topic("t", [_partition(0, 1, 5)])), now=1.0)
    tp = TopicPartition("t", 0)
    md.update_leader(tp, 2, 5)
    assert md.leader_for(tp) == 1
    md.update_leader(tp, 2, 6)
    assert (md.leader_for(tp), md.leader_epoch(tp)) == (2, 6)
    md.update_leader(TopicPartition("unknown", 0), 2, 9)  # ignored, no error


# --- SubscriptionState -------------------------------------------------------------------------

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_assign_keeps_state_of_partitions_that_stay():
    s = SubscriptionState(LATEST)
    s.assign([A0, A1])
    s.seek(A0, 10)
    s.pause(A1)
    version = s.assignment_version
    s.assign([A0, ("b", 0)])
    assert s.assigned() == [A0, B0] and s.assignment_version == version + 1
    assert s.state(A0).position == 10
    assert not s.is_assigned(A1)
    with pytest.raises(ValueError, match="a-1 is not assigned"):
        s.state(A1)
    assert s.topics() == {"a", "b"}


def test_assign_and_subscribe_do_not_mix():
    s = SubscriptionState(LATEST)
    s.assign([A0])
    with pytest.raises(ValueError, match="unsubscribe"):
        s.subscribe(["a"])
    s.unsubscribe()
    assert s.assigned() == [] and not s.user_assigned
    s.subscribe("a")
    assert s.has_subscription and s.subscribed_topics == {"a"}
    with pytest.raises(ValueError, match="unsubscribe"):
        s.assign([A0])
    with pytest.raises(ValueError, match="either topics or pattern"):
        SubscriptionState(LATEST).subscribe(["a"], pattern="a.*")


def test_seek_and_reset():
    s = SubscriptionState(EARLIEST)
    s.assign([A0, A1])
    assert s.needing_position() == [A0, A1] and s.fetchable() == []
    s.request_reset(A0)
    assert s.state(A0).reset_strategy == EARLIEST and s.needing_reset() == [A0]
    s.request_reset(A1, LATEST)
    assert s.state(A1).reset_strategy == LATEST
    s.seek(A0, 5, epoch=3)
    st = s.state(A0)
    assert (st.position, st.position_epoch, st.reset_strategy) == (5, 3, None)
    assert st.has_valid_position and s.fetchable() == [A0] and s.needing_reset() == [A1]
    s.request_reset(A0, LATEST)  # a reset invalidates the position until it completes
    assert not s.state(A0).has_valid_position and s.fetchable() == []
    with pytest.raises(ValueError, match=">= 0"):
        s.seek(A0, -1)
    assert s.all_positions() == {A0: 5}


def test_pause_and_resume():
    s = SubscriptionState(LATEST)
    s.assign([A0, A1])
    s.seek(A0, 0)
    s.seek(A1, 0)
    s.pause(A0)
    assert s.paused() == {A0} and s.fetchable() == [A1]
    s.resume(A0)
    assert s.paused() == set() and s.fetchable() == [A0, A1]
    with pytest.raises(ValueError):
        s.pause(B0)


def test_lag():
    s = SubscriptionState(LATEST)
    s.assign([A0])
    st = s.state(A0)
    assert st.lag(False) is None
    st.position, st.high_watermark, st.last_stable_offset = 7, 10, 8
    assert (st.lag(False), st.lag(True)) == (3, 1)
    st.position = 12
    assert st.lag(False) == 0


# --- parse_address -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("localhost:9092", ("localhost", 9092)),
    (" 127.0.0.1:1 ", ("127.0.0.1", 1)),
    ("[::1]:9093", ("::1", 9093)),
    ("PLAINTEXT://broker:65535", ("broker", 65535)),
    ("SASL_SSL://b.example.com:9094", ("b.example.com", 9094)),
    ("tcp://h:2", ("h", 2)),
])
def test_parse_address(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["localhost", "localhost:", ":9092", "h:0", "h:65536", "h:port", "[::1]",
                                  "[::1]9092", "h:-1", ""])
def test_parse_address_rejects(text):
    with pytest.raises(ValueError, match="is not host:port"):
        parse_address(text)
