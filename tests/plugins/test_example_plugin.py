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
from kdaemon.plugins import SettingsError
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


@pytest.mark.parametrize("settings, problems", [
    ({}, ["tenants: required: the tenant ids whose records are kept"]),
    ({"tenants": []}, ["tenants: expected a non-empty list of tenant ids, found array []"]),
    ({"tenants": "acme"}, ['tenants: expected a non-empty list of tenant ids, found string "acme"']),
    ({"tenants": ["acme", 7]}, ["tenants[1]: expected a string, found integer 7"]),
    ({"tenants": ["acme"], "header": ""}, ['header: expected a header name, found string ""']),
    ({"tenants": ["acme"], "tenant": "x"},
     ["tenant: unknown setting (did you mean 'tenants'?) (known: header, tenants)"]),
    ({"tenants": ["acme"], "type": "x"}, ["type: unknown setting (known: header, tenants)"]),
    ({"tenant": "acme", "header": 5},   # every problem at once, one line each
     ["tenant: unknown setting (did you mean 'tenants'?) (known: header, tenants)",
      "header: expected a header name, found integer 5",
      "tenants: required: the tenant ids whose records are kept"]),
])
def test_tenant_filter_refuses_bad_settings(settings, problems):
    # SettingsError is a ValueError: kdaemon lists its problems under filters[i].settings.
    with pytest.raises(SettingsError) as info:
        kdaemon_example.tenant_filter(settings)
    assert info.value.lines() == problems


def test_redact_masks_fields_of_dict_values_only():
    redact = kdaemon_example.redact_interceptor({"fields": ["email", "card"]})
    original = make_record({"id": 1, "email": "a@b.c", "nested": {"email": "kept"}})
    untouched = make_record(b"not a dict")
    out = redact.on_consume([original, untouched])
    assert out[0].value == {"id": 1, "email": "***", "nested": {"email": "kept"}}
    assert out[1] is untouched
    assert original.value["email"] == "a@b.c"  # the input record was not mutated


@pytest.mark.parametrize("settings, problems", [
    ({}, ["fields: required: the top-level fields of dict values to mask"]),
    ({"fields": []}, ["fields: expected a non-empty list of top-level field names, found array []"]),
    ({"fields": ["a"], "mask": 0}, ["mask: expected a string, found integer 0"]),
    ({"fields": ["a"], "fields2": 1}, ["fields2: unknown setting (did you mean 'fields'?) (known: fields, mask)"]),
])
def test_redact_refuses_bad_settings(settings, problems):
    with pytest.raises(SettingsError) as info:
        kdaemon_example.redact_interceptor(settings)
    assert info.value.lines() == problems


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
