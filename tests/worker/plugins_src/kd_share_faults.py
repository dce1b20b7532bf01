"""For tests/worker/test_share_daemon_kafka.py: faults in a share-group worker's pipeline.

Interceptors that stop a worker in the middle of a batch, holding its records' locks:

* ``crash_on``: ends its worker process at once (``os._exit(70)``, as a crashing native library
  would: no flush, no verdict sent) when a record carries the header ``settings["header"]``.
  Each delivery of such a record kills the worker that got it, until the share group's
  delivery count limit makes it a dead letter.
* ``hold_on``: the first worker that meets a record carrying the header ``settings["header"]``
  creates the file ``settings["flag"]`` with its pid and waits there for ever (until the test
  kills it); once the file exists, the record passes like any other.

And a sink ``fail_flush``: JSON lines (the jsonl sink, without its dedupe) whose flushes with
records in ``settings["fail_flushes"]`` (1-based, counted per process) raise ``OSError`` and
lose the records written since the last flush, as a disk that failed would.
"""

from __future__ import annotations

import os
import time

from kdaemon.plugins import hookimpl
from kdaemon.sinks.jsonl import JsonlSink

_FLUSHES = [0]


class CrashOn:
    def __init__(self, header: str) -> None:
        self.header = header

    def on_consume(self, records):
        for r in records:
            if any(k == self.header for k, _ in r.headers):
                os._exit(70)
        return records


class HoldOn:
    def __init__(self, header: str, flag: str) -> None:
        self.header = header
        self.flag = flag

    def on_consume(self, records):
        for r in records:
            if any(k == self.header for k, _ in r.headers):
                try:
                    fd = os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return records   # held once already
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                while True:
                    time.sleep(1)
        return records


class FailFlush:
    def __init__(self, settings: dict) -> None:
        self.inner = JsonlSink.from_settings({"path": settings["path"], "fsync": False, "dedupe": False})
        self.fail_flushes = set(settings.get("fail_flushes", ()))
        self.accepted: list = []

    def write(self, records) -> None:
        self.accepted += records

    def flush(self) -> None:
        if self.accepted:
            _FLUSHES[0] += 1
            if _FLUSHES[0] in self.fail_flushes:
                self.accepted = []
                raise OSError(f"fail_flush: injected flush failure (flush {_FLUSHES[0]})")
            self.inner.write(self.accepted)
            self.accepted = []
        self.inner.flush()

    def close(self) -> None:
        self.accepted = []
        self.inner.close()


@hookimpl
def kdaemon_sinks():
    return {"fail_flush": FailFlush}


@hookimpl
def kdaemon_interceptors():
    return {"crash_on": lambda settings: CrashOn(settings["header"]),
            "hold_on": lambda settings: HoldOn(settings["header"], settings["flag"])}
