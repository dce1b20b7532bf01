"""bench/share/scaling.py's plugin: a value deserializer ``burn`` that costs a fixed time per record,
the workload where a share group's extra workers matter (each record is work, not just bytes).

Enabled by Python path (``plugins = ["bench.share.burn_plugin:"]``, the repository root on the
daemon's ``PYTHONPATH``), selected by ``[deserializer] value = "burn"``; its settings
(``[deserializer.settings]``):

* ``cpu_us``: CPU time to burn per record, measured on the thread's own CPU clock
  (``time.thread_time_ns``), so a worker that waits for a core still does the full amount of work
  (a wall-clock spin would do less work on a loaded machine and call it the same);
* ``wait_us``: time to sleep per record after that, a record that waits on something outside (a
  lookup in a remote service), which costs no CPU.

The value is then decoded as UTF-8 text, as the ``str`` deserializer does, for the jsonl sink.
"""

from __future__ import annotations

import time

from kdaemon.plugins import hookimpl


def _factory(settings: dict):
    cpu_ns = int(settings.get("cpu_us", 0)) * 1000
    wait_s = int(settings.get("wait_us", 0)) / 1e6
    if cpu_ns < 0 or wait_s < 0:
        raise ValueError(f"burn: cpu_us and wait_us must not be negative, got {settings!r}")
    clock, sleep = time.thread_time_ns, time.sleep

    def burn(topic, headers, data):
        if cpu_ns:
            end = clock() + cpu_ns
            while clock() < end:
                pass
        if wait_s:
            sleep(wait_s)
        return None if data is None else data.decode("utf-8", "replace")
    return burn


@hookimpl
def kdaemon_deserializers():
    return {"burn": _factory}
