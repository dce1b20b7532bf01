"""Fault injection for tests/worker/test_pipeline_e2e.py: a kdaemon plugin that misbehaves on
purpose.  The test copies this file into a temporary directory with a dist-info whose
``entry_points.txt`` names it (entry point ``e2e_faults``), and puts that directory on the
daemon's PYTHONPATH, so kdaemon finds it exactly like an installed third-party plugin.

* interceptor ``explode``: raises in ``on_consume`` on every ``every``-th batch and in
  ``on_commit`` on every ``commit_every``-th commit; otherwise passes records through.
* sink ``flaky``: a ``jsonl`` sink that fails on purpose and then recovers.  It keeps what
  ``write`` accepted in memory and hands it to the jsonl sink in ``flush``, so a failure can
  really lose accepted records, as a disk would:
  - ``fail_writes``: write calls (1-based, counted over the whole process) that raise
    ``OSError``; the batch is not stored, earlier records are intact;
  - ``break_writes``: write calls that raise ``OSError`` *and* lose every record accepted since
    the last flush; the sink then refuses every further call (as the jsonl sink does after
    losing accepted records) until the worker builds a new one;
  - ``fail_flushes``: flushes with records to store (1-based) that raise ``OSError`` and lose
    those records;
  - ``reject_field``: records whose JSON value has this key set to true are refused with a
    ``SinkWriteError`` naming their indexes (the rest of the batch is accepted).
  Every failure is appended to ``journal`` (JSON lines: the event and the (partition, offset)
  of the records concerned), so the test knows which records the worker had to handle.
  Messages never contain payloads.

Counters are per process, not per sink object: the worker rebuilds its sink after a failed
flush, and a rebuilt sink must not start failing from the beginning again.
"""

from __future__ import annotations

import json

from kdaemon.plugins import hookimpl
from kdaemon.plugins.types import SinkWriteError
from kdaemon.sinks.jsonl import JsonlSink

_COUNTS = {"write": 0, "flush": 0, "consume": 0, "commit": 0}


class ExplodingInterceptor:
    def __init__(self, every: int, commit_every: int) -> None:
        self.every = every
        self.commit_every = commit_every

    def on_consume(self, records):
        _COUNTS["consume"] += 1
        if _COUNTS["consume"] % self.every == 0:
            raise RuntimeError(f"explode: injected on_consume failure #{_COUNTS['consume']}")
        return records

    def on_commit(self, offsets):
        _COUNTS["commit"] += 1
        if _COUNTS["commit"] % self.commit_every == 0:
            raise RuntimeError(f"explode: injected on_commit failure #{_COUNTS['commit']}")


class FlakySink:
    def __init__(self, settings: dict) -> None:
        inner = {k: settings[k] for k in ("path", "prefix", "fsync") if k in settings}
        self.inner = JsonlSink.from_settings(inner)
        self.fail_writes = set(settings.get("fail_writes", ()))
        self.break_writes = set(settings.get("break_writes", ()))
        self.fail_flushes = set(settings.get("fail_flushes", ()))
        self.reject_field = settings.get("reject_field")
        self.journal = settings["journal"]
        self.accepted: list = []   # written, not yet flushed
        self.broken = False

    def _note(self, event: str, records) -> None:
        with open(self.journal, "a") as f:
            f.write(json.dumps({"event": event, "records": [[r.partition, r.offset] for r in records]}) + "\n")

    def _check(self) -> None:
        if self.broken:
            raise OSError("flaky: this sink lost accepted records and refuses further use")

    def write(self, records) -> None:
        self._check()
        _COUNTS["write"] += 1
        n = _COUNTS["write"]
        if n in self.fail_writes:
            self._note("write_failed", records)
            raise OSError(f"flaky: injected write failure (call {n})")
        if n in self.break_writes:
            self._note("write_broke", records)
            self._note("lost", self.accepted)
            self.accepted = []
            self.broken = True
            raise OSError(f"flaky: injected write failure that lost accepted records (call {n})")
        field = self.reject_field
        rejected = [i for i, r in enumerate(records)
                    if field and isinstance(r.value, dict) and r.value.get(field) is True]
        refused = set(rejected)
        self.accepted += [r for i, r in enumerate(records) if i not in refused]
        if rejected:
            self._note("rejected", [records[i] for i in rejected])
            raise SinkWriteError(f"flaky: {len(rejected)} record(s) refused", rejected)

    def flush(self) -> None:
        self._check()
        if self.accepted:
            _COUNTS["flush"] += 1
            if _COUNTS["flush"] in self.fail_flushes:
                self._note("flush_failed", self.accepted)
                self.accepted = []
                raise OSError(f"flaky: injected flush failure (flush {_COUNTS['flush']})")
            self.inner.write(self.accepted)
            self.accepted = []
        self.inner.flush()

    def close(self) -> None:
        # Like the jsonl sink: close stores what was accepted, unless the sink is broken.
        if self.accepted and not self.broken:
            self.inner.write(self.accepted)
        self.accepted = []
        self.inner.close()


def _explode(settings: dict) -> ExplodingInterceptor:
    return ExplodingInterceptor(int(settings.get("every", 3)), int(settings.get("commit_every", 2)))


def _flaky(settings: dict) -> FlakySink:
    if "journal" not in settings:
        raise ValueError("flaky needs journal: a file to note the injected failures in")
    return FlakySink(settings)


@hookimpl
def kdaemon_interceptors():
    return {"explode": _explode}


@hookimpl
def kdaemon_sinks():
    return {"flaky": _flaky}
