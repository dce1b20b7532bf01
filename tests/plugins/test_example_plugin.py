"""Tests for the example plugin — and an example of how to test a plugin.

Three levels, cheapest first:

1. call your factories and objects directly (plain Python, no kdaemon machinery);
2. ``kdaemon.testing.run_plugin``: your plugin loaded by a real PluginManager, records pushed
   through filters → deserializer → interceptors → sink with the worker's semantics;
3. the entry point: ``PluginManager(enabled=[...])`` finds your installed distribution, as the
   daemon will (needs ``pip install -e .`` of your package).
"""

from __future__ import annotations

import pytest

import kdaemon_example
import kdaemon_json
from kdaemon.plugins.manager import PluginManager
from kdaemon.testing import make_record, make_records, run_plugin

TENANTS = {"tenants": ["acme", "globex"]}


# -- 1. the objects directly --------------------------------------------------------------------

def test_tenant_filter_keeps_listed_tenants():
    keep = kdaemon_example.tenant_filter(TENANTS)
    assert keep([("tenant", b"acme")])
    assert keep([("other", b"x"), ("tenant", b"globex")])
    assert not keep([("tenant", b"initech")])
    assert not keep([])                                  # no tenant header
    assert not keep([("tenant", None)])                  # null header
    assert keep([("tenant", b"initech"), ("tenant", b"acme")])  # last occurrence wins


def test_tenant_filter_takes_the_native_fast_path():
    # HeaderRules with only native-capable ops: the C decoder evaluates it without Python.
    assert kdaemon_example.tenant_filter(TENANTS).native_rules is not None


def test_tenant_filter_header_setting():
    keep = kdaemon_example.tenant_filter({"tenants": ["acme"], "header": "x-tenant"})
    assert keep([("x-tenant", b"acme")]) and not keep([("tenant", b"acme")])


@pytest.mark.parametrize("settings, message", [
    ({}, "tenant needs tenants"),
    ({"tenants": []}, "tenant needs tenants"),
    ({"tenants": "acme"}, "tenant needs tenants"),
    ({"tenants": ["acme"], "header": ""}, "header must be"),
    ({"tenants": ["acme"], "tenant": "x"}, r"unknown tenant setting\(s\): tenant"),
])
def test_tenant_filter_refuses_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        kdaemon_example.tenant_filter(settings)


def test_redact_masks_fields_of_dict_values_only():
    redact = kdaemon_example.redact_interceptor({"fields": ["email", "card"]})
    original = make_record({"id": 1, "email": "a@b.c", "nested": {"email": "kept"}})
    untouched = make_record(b"not a dict")
    out = redact.on_consume([original, untouched])
    assert out[0].value == {"id": 1, "email": "***", "nested": {"email": "kept"}}
    assert out[1] is untouched
    assert original.value["email"] == "a@b.c"  # the input record was not mutated


@pytest.mark.parametrize("settings, message", [
    ({}, "redact needs fields"),
    ({"fields": ["a"], "mask": 0}, "mask must be a string"),
    ({"fields": ["a"], "fields2": 1}, r"unknown redact setting\(s\): fields2"),
])
def test_redact_refuses_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        kdaemon_example.redact_interceptor(settings)


# -- 2. through kdaemon.testing.run_plugin --------------------------------------------------------

def test_filter_then_deserialize_then_redact():
    records = [
        make_record(b'{"user": "ann", "email": "ann@acme.test"}', headers={"tenant": "acme"}, offset=0),
        make_record(b'{"user": "bob", "email": "bob@initech.test"}', headers={"tenant": "initech"}, offset=1),
        make_record(b'{"user": "cy"}', headers={"tenant": "globex"}, offset=2),
    ]
    run = run_plugin([kdaemon_example, kdaemon_json], records,   # kdaemon_json provides "json"
                     filters=[("tenant", TENANTS)], deserializer="json",
                     interceptors=[("redact", {"fields": ["email"]})], sink="null")
    assert [r.offset for r in run.dropped] == [1]
    assert run.values == [{"user": "ann", "email": "***"}, {"user": "cy"}]
    assert run.sink.records == 2 and not run.errors
    # the filtered record's offset is committed too: offset 2 + 1
    assert {tp.partition: om.offset for tp, om in run.committed.items()} == {0: 3}


def test_redact_leaves_bytes_values_alone_without_a_deserializer():
    run = run_plugin(kdaemon_example, make_records([b"a", b"b"]),
                     interceptors=[("redact", {"fields": ["email"]})])
    assert run.values == [b"a", b"b"]


# -- 3. through the installed entry point ---------------------------------------------------------

def test_entry_point_offers_both_factories():
    pm = PluginManager(enabled=["example"])
    assert pm.header_filters()["tenant"] is kdaemon_example.tenant_filter
    assert pm.interceptors()["redact"] is kdaemon_example.redact_interceptor
