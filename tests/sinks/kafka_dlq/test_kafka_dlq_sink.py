"""The ``kafka`` DLQ's configuration and the dead letters it would write, without a broker:
``check-config`` names what is wrong with a ``[dlq] type = "kafka"`` table, the consumer's
connection settings carry over, and the error context becomes Kafka Connect's headers (the
records themselves are read back from Apache Kafka in test_kafka_dlq_kafka.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kdaemon.client.producer import connection_config
from kdaemon.client.types import ConsumerRecord
from kdaemon.config import load
from kdaemon.exit_codes import EXIT_CONFIG
from kdaemon.plugins.companion import SinkContext
from kdaemon.plugins.types import Record
from kdaemon.sinks.encoding import dead_letter, error_parts
from kdaemon.sinks.kafka_dlq import KafkaDeadLetterSink, connect_headers
from kdaemon.worker.build import build_pipeline_parts
from kdaemon.worker.main import load_plugins
from kdaemon.worker.stages import Pipeline

CONTEXT = SinkContext(state_dir="/nonexistent", daemon_id="d", heartbeat_timeout_s=60.0,
                      kafka={"bootstrap_servers": ("b1:9092",), "group_id": "g", "security_protocol": "SASL_SSL",
                             "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u", "sasl_password": "secret",
                             "session_timeout_ms": 10_000})


@pytest.mark.parametrize("settings,problem", [
    ({}, "sink.topic: required: the Kafka topic dead letters are written to"),
    ({"topic": " "}, 'sink.topic: expected a topic name, found string " "'),
    ({"topic": "dlq", "compresion": "gzip"},
     "sink.compresion: unknown setting (did you mean 'compression'?)"),
    ({"topic": "dlq", "compression": "brotli"},
     'sink.compression: expected one of none, gzip, snappy, lz4, zstd, found string "brotli"'),
    ({"topic": "dlq", "timeout_ms": 0}, "sink.timeout_ms: expected a positive integer (milliseconds), found integer 0"),
    ({"topic": "dlq", "timeout_ms": 60_000},
     "sink.timeout_ms: expected an integer below [daemon] heartbeat_timeout_s (60 s"),
    ({"topic": "dlq", "bootstrap_servers": []},
     "sink.bootstrap_servers: expected a host:port string or a non-empty list of them, found array []"),
    ({"topic": "dlq", "bootstrap_servers": "nohostport"}, "sink.bootstrap_servers: connection settings: bootstrap server"),
    ({"topic": "dlq", "partitions": 3}, "sink.partitions: only with create_topic = true"),
    ({"topic": "dlq", "create_topic": True, "replication_factor": 0},
     "sink.replication_factor: expected a positive integer (the new topic's replicas per partition), found integer 0"),
    ({"topic": "dlq", "create_topic": "yes"}, "sink.create_topic: expected"),
])
def test_settings_are_checked_with_a_clear_error(settings, problem):
    with pytest.raises(ValueError) as info:
        KafkaDeadLetterSink.validate_settings({"type": "kafka", **settings}, CONTEXT)
    assert problem in str(info.value)


def test_the_consumers_connection_settings_carry_over_and_bootstrap_may_be_overridden():
    config = connection_config(CONTEXT.kafka)
    assert (config.bootstrap_servers, config.security_protocol, config.sasl_username, config.sasl_password) == \
        (("b1:9092",), "SASL_SSL", "u", "secret")
    assert config.group_id is None and config.session_timeout_ms == 45_000   # nothing of the group
    sink = KafkaDeadLetterSink.from_settings({"type": "kafka", "topic": "dlq", "bootstrap_servers": "b2:1,b3:2",
                                             "compression": "zstd"}, CONTEXT)
    try:
        c = sink.producer.config
        assert (c.bootstrap_servers, c.sasl_mechanism, c.client_id) == \
            (("b2:1", "b3:2"), "SCRAM-SHA-512", "kdaemon-dlq")
        assert sink.producer.settings.compression == "zstd" and sink.timeout_ms == 30_000
    finally:
        sink.close()
    assert "secret" not in repr(CONTEXT)
    with pytest.raises(ValueError, match="sink.bootstrap_servers: required when \\[kafka\\] has none"):
        KafkaDeadLetterSink.validate_settings({"topic": "dlq"}, SinkContext("/x", "d", 60.0))


def test_check_config_names_the_dlq_problem(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(f"""
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "g"
        [daemon]
        topics = ["t"]
        [sink]
        type = "jsonl"
        path = "{tmp_path / 'out'}"
        [dlq]
        type = "kafka"
        compression = "gzip"
    """))
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert f"{path}: dlq.topic: required: the Kafka topic dead letters are written to" in proc.stderr.splitlines(), \
        proc.stderr


def record(headers) -> Record:
    return Record("orders", 2, 41, 1_600_000_000_000, 0, b"key", b"{bad", list(headers), b"key", b"{bad")


@pytest.mark.parametrize("stage,plugin,connect_stage,class_name", [
    ("deserialize", "deserializer.value=json", b"VALUE_CONVERTER", b"json"),
    ("deserialize", "deserializer.key=avro", b"KEY_CONVERTER", b"avro"),
    ("sink", "sink.type=spark", b"TASK_PUT", b"spark"),
    ("interceptor", None, b"TRANSFORMATION", None),
])
def test_error_context_in_kafka_connects_headers(stage, plugin, connect_stage, class_name):
    dead = dead_letter(record([("trace", b"t1"), ("null", None)]), stage, ValueError("not valid JSON: x"),
                       plugin=plugin)
    h = connect_headers(dead)
    assert h[:2] == [("trace", b"t1"), ("null", None)]
    connect = {k: v for k, v in h if k.startswith("__connect.errors.")}
    expected = {"__connect.errors.topic": b"orders", "__connect.errors.partition": b"2",
                "__connect.errors.offset": b"41", "__connect.errors.stage": connect_stage,
                "__connect.errors.exception.class.name": b"ValueError",
                "__connect.errors.exception.message": b"not valid JSON: x"}
    if class_name is not None:
        expected["__connect.errors.class.name"] = class_name
    assert connect == expected
    assert dict(h)["kdaemon.stage"] == stage.encode()


def test_error_parts_reads_back_what_dead_letter_wrote():
    assert error_parts("ValueError: a: b") == ("ValueError", "a: b")
    assert error_parts("json.decoder.JSONDecodeError: x") == ("json.decoder.JSONDecodeError", "x")
    assert error_parts("the uploader refused the batch: full") == (None, "the uploader refused the batch: full")


def test_the_pipeline_names_the_deserializer_that_failed(tmp_path):
    """Key and value deserializers run in one expression; the dead letter says which raised."""
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(f"""
        plugins = ["json"]
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "g"
        [daemon]
        topics = ["t"]
        [deserializer]
        key = "json"
        value = "json"
        [sink]
        type = "null"
        [dlq]
        type = "jsonl"
        path = "{tmp_path / 'dlq'}"
    """))
    config = load(str(path))
    parts = build_pipeline_parts(config, load_plugins(config))
    try:
        raw = [ConsumerRecord("t", 0, 0, 0, 0, b"{bad", b"1", [], None),
               ConsumerRecord("t", 0, 1, 0, 0, b"1", b"{bad", [], None),
               ConsumerRecord("t", 0, 2, 0, 0, b"1", b"2", [], None)]
        ok, dead = Pipeline(config, parts).deserialize(raw)
    finally:
        parts.dlq.close()
    assert [r.offset for r in ok] == [2]
    assert [(d.offset, dict(d.headers)["kdaemon.plugin"]) for d in dead] == \
        [(0, b"deserializer.key=json"), (1, b"deserializer.value=json")]


# -- what fails for good, and what passes ----------------------------------------------------------

def test_the_clients_permanent_errors_become_the_sinks_one_permanent_error():
    """Translated once (``refused_for_good``), from the client's table of Kafka error codes;
    the Kafka tests (test_dlq_refusals_kafka.py) make the broker say these for real."""
    from kdaemon.client.errors import (AuthenticationError, RecordsRefusedError, RefusedRecord, missing_topic,
                                       topic_refused)
    from kdaemon.plugins.types import SinkRefused
    from kdaemon.protocol.errors import Errors
    from kdaemon.sinks.kafka_dlq import refused_for_good

    gone = refused_for_good("dlq", missing_topic("dlq", ["b1:9092"]))
    assert isinstance(gone, SinkRefused) and gone.target == "dlq" and gone.records is None
    assert gone.line() == ("dead-letter topic dlq: topic dlq does not exist on the cluster at b1:9092 (to fix: create "
                           "it: kafka-topics --bootstrap-server b1:9092 --create --topic dlq --partitions <n> "
                           "--replication-factor <n> (kdaemon's producer never creates topics))")
    acl = refused_for_good("dlq", topic_refused("dlq", Errors.TOPIC_AUTHORIZATION_FAILED, ["b1:9092"]))
    assert "TOPIC_AUTHORIZATION_FAILED" in str(acl) and "WRITE and DESCRIBE on topic dlq" in acl.fix
    login = refused_for_good("dlq", AuthenticationError("SASL authentication failed"))
    assert "login" in str(login) and "sasl_" in login.fix
    tag = record([])
    big = refused_for_good("dlq", RecordsRefusedError("MESSAGE_TOO_LARGE", [RefusedRecord(tag, "dlq", 9000)],
                                                      topic="dlq", code=Errors.MESSAGE_TOO_LARGE, fix="raise it"))
    assert big.records == [tag] and big.fix == "raise it"


def test_a_cluster_that_does_not_answer_is_not_a_refusal():
    """``preflight`` (and check-config) cannot tell whether the topic exists when no broker
    answers: a reason to wait (the worker) or a note (check-config), never a refusal."""
    from kdaemon.sinks.kafka_dlq import preflight_settings
    reason = preflight_settings({"type": "kafka", "topic": "dlq", "bootstrap_servers": "127.0.0.1:9"}, CONTEXT,
                                timeout_ms=300)
    assert reason is not None and "no broker answered" in reason


def test_check_config_offline_does_not_ask_the_cluster(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(f"""
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "g"
        [daemon]
        topics = ["t"]
        [sink]
        type = "jsonl"
        path = "{tmp_path / 'out'}"
        [dlq]
        type = "kafka"
        topic = "dlq"
    """))
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "--offline", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
