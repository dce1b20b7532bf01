"""``[otel]``: a section of the daemon's file, parsed by the one settings checker, each problem
named as ``otel.<key>``; refused without the plugin enabled, and with an OTLP protocol from the
environment that the exporters do not speak."""

from __future__ import annotations

import pytest

from kdaemon.config import ConfigError, OtelSection, parse
from kdaemon.config.env import read_overrides
from kdaemon.config.loader import ENV_LAYOUT


def raw(otel, plugins=("otel",)) -> dict:
    return {"plugins": list(plugins), "kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g"},
            "daemon": {"topics": ["t"]}, "sink": {"type": "null"}, "otel": otel}


def problems(doc: dict, environ=None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse(doc, "f.toml", environ=environ or {})
    return err.value.problems


def test_otel_settings_parse_typed():
    config = parse(raw({"endpoint": "http://collector:4318", "protocol": "grpc", "sampling": 0.25,
                        "spans": "batch", "service_name": "orders-consumer", "trace_filtered": True}), "f.toml",
                   environ={})
    assert config.otel == OtelSection("http://collector:4318", "grpc", 0.25, "batch", "orders-consumer", True)
    assert OtelSection().trace_filtered is False   # filtered records are counted, not traced, unless asked
    assert OtelSection().spans == "batch"   # the cheaper (docs/PERFORMANCE.md)
    assert parse(raw({}), "f.toml", environ={}).otel == OtelSection()
    assert parse({k: v for k, v in raw({}).items() if k != "otel"}, "f.toml", environ={}).otel is None


def test_every_bad_key_is_named_with_what_it_takes():
    assert problems(raw({"endpont": "x", "sampling": 1.5, "protocol": "http/json", "spans": "all"})) == [
        "f.toml: otel.endpont: unknown setting (did you mean 'endpoint'?) "
        "(known: endpoint, protocol, sampling, service_name, spans, trace_filtered)",
        "f.toml: otel.sampling: expected a number >= 0 and <= 1, found float 1.5",
        "f.toml: otel.protocol: expected one of http/protobuf, grpc, found string \"http/json\"",
        "f.toml: otel.spans: expected one of record, batch, found string \"all\""]


def test_an_otel_table_without_the_plugin_is_refused():
    assert problems(raw({}, plugins=["json"])) == [
        "f.toml: otel: an [otel] table configures the otel plugin, which is not enabled: add \"otel\" to plugins "
        "(pip install 'kdaemon[otel]'), or remove [otel]"]
    assert parse(raw({}, plugins=["kdaemon_otel:"]), "f.toml", environ={}).otel == OtelSection()


def test_a_protocol_from_the_environment_the_exporters_do_not_speak_is_refused():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}
    assert problems(raw({}), env) == [
        "f.toml: otel.protocol: the environment's OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not a protocol "
        "the otel plugin speaks (http/protobuf, grpc): change it, or set otel.protocol"]
    assert parse(raw({"protocol": "grpc"}), "f.toml", environ=env).otel.protocol == "grpc"   # the file wins


def test_kdaemon_otel_variables_set_the_table_like_any_section():
    doc = raw({"endpoint": "http://a:4318"})
    environ = {"KDAEMON_OTEL_ENDPOINT": '"http://b:4318"', "KDAEMON_OTEL_SAMPLING": "0.5"}
    config = parse(doc, "f.toml", environ=environ, overrides=read_overrides(environ, ENV_LAYOUT, doc))
    assert (config.otel.endpoint, config.otel.sampling) == ("http://b:4318", 0.5)
