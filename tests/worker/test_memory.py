"""kdaemon/worker/memory.py: the budget's shares reach the consumer and the sink, and the watch
gives memory back and says so when the RSS is above the budget.  The RSS the budget holds
under a stalled sink is measured by testkit/stall/run.py (docs/RELIABILITY.md)."""

from __future__ import annotations

import logging

import pytest

from kdaemon.config import parse
from kdaemon.worker import memory
from kdaemon.worker.build import sink_context
from kdaemon.worker.main import consumer_options
from kdaemon.worker.memory import MB, MemoryShares, MemoryWatch, rss_bytes


def _config(daemon: dict | None = None, kafka: dict | None = None):
    return parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g", **(kafka or {})},
                  "daemon": {"topics": ["t"], **(daemon or {})}, "sink": {"type": "null"}})


class _Parts:
    header_filter = None
    on_filtered = None


def test_the_default_budget_caps_fetch_sizes_and_the_sink_share():
    config = _config()
    assert config.daemon.memory_budget_mb == 80
    opts = consumer_options(config, _Parts())
    assert opts["fetch_max_bytes"] == 10 * MB and opts["fetch_buffer_bytes"] == 10 * MB
    assert sink_context(config).memory_budget_bytes == 10 * MB


def test_kafka_settings_win_and_no_budget_means_the_client_defaults():
    opts = consumer_options(_config(kafka={"fetch_max_bytes": 52_428_800}), _Parts())
    assert opts["fetch_max_bytes"] == 52_428_800 and opts["fetch_buffer_bytes"] == 10 * MB
    config = _config(daemon={"memory_budget_mb": 0})
    opts = consumer_options(config, _Parts())
    assert "fetch_max_bytes" not in opts and "fetch_buffer_bytes" not in opts
    assert sink_context(config).memory_budget_bytes == 0 and MemoryShares.of(0).budget == 0


def test_the_spark_sink_stages_before_its_buffers_pass_its_share(tmp_path):
    pytest.importorskip("pyarrow")
    from kdaemon.sinks.spark.staging import DEFAULT_MAX_BYTES, SparkSink
    settings = {"type": "spark", "path": str(tmp_path / "out")}
    assert SparkSink(settings, str(tmp_path), memory_bytes=10 * MB).max_bytes == 5 * MB
    assert SparkSink(settings, str(tmp_path)).max_bytes == DEFAULT_MAX_BYTES
    assert SparkSink({**settings, "max_bytes": 32 * MB}, str(tmp_path), memory_bytes=10 * MB).max_bytes == 32 * MB


def test_the_watch_gives_memory_back_and_warns_once_per_excursion(monkeypatch, caplog):
    # MB per read; a tick above the budget reads again after giving memory back.
    readings = iter([90, 85,   # over; still over after relief: warned
                     85, 85,   # still over: not warned again
                     70,       # back under
                     95, 95])  # over again: a new excursion, warned again
    relieved = []
    monkeypatch.setattr(memory, "relieve", lambda: relieved.append(1))
    now = [0.0]
    watch = MemoryWatch(80, clock=lambda: now[0], read=lambda: next(readings) * MB)
    caplog.set_level(logging.WARNING, logger="kdaemon.worker.memory")
    watch.tick()
    watch.tick()                           # within the second: not read at all
    for t in (1, 2, 3):
        now[0] = float(t)
        watch.tick()
    assert len(relieved) == 3 and watch.peak == 95 * MB
    assert len(caplog.records) == 2
    assert "RSS 90 MB is above its memory budget of 80 MB" in caplog.records[0].getMessage()
    assert "RSS 95 MB" in caplog.records[1].getMessage()


def test_rss_is_read_from_proc():
    assert rss_bytes() > 5 * MB
