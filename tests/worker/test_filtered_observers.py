"""``worker/build.FilteredObservers``: the client's ``on_filtered`` handing what header filters
drop to the plugins that asked (``kdaemon_filtered_observer``).  The whole path on a broker is
tests/plugins/otel/test_otel_daemon_kafka.py (``trace_filtered``); the decoder's side is
tests/protocol/test_golden_broker.py."""

from __future__ import annotations

import logging

from kdaemon.plugins.types import Record
from kdaemon.protocol.record_loop import ConsumerRecord
from kdaemon.worker.build import FilteredObservers


def _dropped(*offsets):
    return [ConsumerRecord("t", 2, o, 1000 + o, 0, b"k", b"v%d" % o, [("skip", b"1")], None) for o in offsets]


def test_each_observer_gets_the_dropped_records_as_plugin_records_with_the_brokers_bytes():
    got = {"a": [], "b": []}
    observers = FilteredObservers([("a", got["a"].extend), ("b", got["b"].extend)])
    observers(_dropped(4, 5))
    assert got["a"] == got["b"] == [Record("t", 2, 4, 1004, 0, b"k", b"v4", [("skip", b"1")], b"k", b"v4"),
                                    Record("t", 2, 5, 1005, 0, b"k", b"v5", [("skip", b"1")], b"k", b"v5")]


def test_an_observer_that_raises_is_counted_logged_once_per_error_and_the_others_still_run(caplog):
    got = []
    calls = 0

    def broken(records):
        nonlocal calls
        calls += 1
        raise (ValueError if calls < 3 else KeyError)("boom")

    observers = FilteredObservers([("broken", broken), ("fine", got.extend)])
    with caplog.at_level(logging.ERROR, logger="kdaemon.worker.build"):
        for offset in range(4):
            observers(_dropped(offset))
    assert observers.errors == {"broken": 4}
    assert [r.offset for r in got] == [0, 1, 2, 3]
    said = [r for r in caplog.records if "plugin 'broken'" in r.getMessage()]
    assert len(said) == 2   # ValueError, then KeyError: once per change of error
