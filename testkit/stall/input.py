"""The stall run's records: produced with their exact (partition, offset), and found again.

``Producer`` writes ``records`` records of about 200 bytes (an 8-byte key, a 190-byte JSON
value) round-robin over the topic's partitions with confluent-kafka (``testkit.produce.
Writer``: idempotent, so a retried send is never a second, unreported copy on the log), and
keeps each delivery report's (partition, offset) in ``Produced``: a compact array per partition,
since two million tuples would cost the harness more memory than the daemon it measures.

While the daemon recovers, ``Progress`` says how much is in the sink without parsing it: for the
jsonl sink the newlines in its files (``bytes.count``: cheap enough to ask every second while the
workers need both cores), for the Spark sink the rows its manifests name (testkit/chaos/spark.py).
The verdict does not use either: ``verdict`` reads every record back (every jsonl line parsed,
the Spark output read with Spark) and compares the (topic, partition, offset) multiset with
``Produced`` (testkit/chaos/verify.py): lost, duplicates, unknown.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from pathlib import Path

from testkit.chaos.produce import KEPT
from testkit.chaos.spark import SparkOutputReader
from testkit.chaos.verify import OutputReader, compare
from testkit.produce import Writer

VALUE_PAD = b"x" * 142          # 48 bytes of JSON around it: a 190-byte value
PRODUCER_CONF = {"acks": "all", "enable.idempotence": True, "linger.ms": 20,
                 "queue.buffering.max.messages": 500_000}


def value(i: int) -> bytes:
    return b'{"id":%010d,"source":"bench/stall","pad":"%s"}' % (i, VALUE_PAD)


def key(i: int) -> bytes:
    return b"k%07d" % (i % 10_000_000)


class Produced:
    """Delivery reports: the offsets per partition, in report order."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.offsets = {p: array("q") for p in range(partitions)}

    def on_delivered(self, msg) -> None:
        self.offsets[msg.partition()].append(msg.offset())

    def __len__(self) -> int:
        return sum(len(a) for a in self.offsets.values())

    def ends(self) -> dict[int, int]:
        """Per partition, the offset after the last record reported (what a full commit is)."""
        return {p: (max(a) + 1 if a else 0) for p, a in self.offsets.items()}

    def keys(self):
        t = self.topic
        for p, a in self.offsets.items():
            for o in a:
                yield (t, p, o)


class Producer(threading.Thread):
    """Produces everything once, in its own thread; ``done_at`` (wall clock) when every report is in."""

    def __init__(self, bootstrap: str, produced: Produced, records: int) -> None:
        super().__init__(name="stall-producer", daemon=True)
        self.bootstrap = bootstrap
        self.produced = produced
        self.records = records
        self.started_at = 0.0
        self.done_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        self.started_at = time.time()
        try:
            p = self.produced
            writer = Writer(self.bootstrap, p.topic, "lz4", on_delivered=p.on_delivered, **PRODUCER_CONF)
            n = p.partitions
            for i in range(self.records):
                writer.send(value(i), key(i), partition=i % n)
            writer.flush_checked(600)
            if len(p) != self.records:
                raise RuntimeError(f"{len(p)} delivery report(s) for {self.records} record(s)")
            self.done_at = time.time()
        except BaseException as exc:
            self.error = exc


class Progress:
    """How many records the sink holds so far (not the verdict: see the module docstring)."""

    def __init__(self, sink: str, out: Path) -> None:
        self.sink = sink
        self.out = out
        self._lines: dict[tuple[int, int], tuple[int, int]] = {}   # (dev, inode) -> (bytes read, newlines)
        self._manifests = SparkOutputReader(out) if sink == "spark" else None

    def count(self) -> int:
        if self._manifests is not None:
            return self._manifests.progress()[0]
        if not self.out.is_dir():
            return 0
        total = 0
        for entry in os.scandir(self.out):
            if not entry.name.endswith((".jsonl", ".jsonl.open")):
                continue
            try:
                with open(entry.path, "rb") as f:
                    st = os.fstat(f.fileno())
                    ident = (st.st_dev, st.st_ino)
                    done, lines = self._lines.get(ident, (0, 0))
                    f.seek(done)
                    data = f.read()
            except FileNotFoundError:   # published (renamed) meanwhile: the same inode is seen next time
                continue
            self._lines[ident] = (done + len(data), lines + data.count(b"\n"))
        for _, lines in self._lines.values():
            total += lines
        return total


def verdict(sink: str, out: Path, produced: Produced) -> dict:
    """Every record in the output against every delivery report: testkit/chaos/verify.compare."""
    delivered = SparkOutputReader(out).final() if sink == "spark" else OutputReader(out).final()
    fates = dict.fromkeys(produced.keys(), KEPT)
    return compare(fates, delivered)
