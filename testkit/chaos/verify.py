"""What the daemon delivered, read back from its jsonl files, against what the ledger expects.

``OutputReader`` reads the sink's directory incrementally (a million lines are read once, not
once per poll): files are followed by inode, so a ``.jsonl.open`` file renamed to ``.jsonl``
when published is not read twice, and only complete lines are taken (a line still being
written is read on a later call).  Every line's (topic, partition, offset) is counted: a
duplicate is a count above one.

``compare`` is the verdict: delivered must equal exactly the records the ledger says are kept
(produced, minus filtered by the header rule, minus inside aborted transactions), each once.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

from testkit.chaos.produce import ABORTED, FILTERED, KEPT

_SUFFIXES = (".jsonl", ".jsonl.open")
SAMPLE_LIMIT = 10


class OutputReader:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.positions: dict[tuple[int, int], int] = {}   # (dev, inode) -> bytes consumed
        self.counts: Counter = Counter()
        self.per_partition: Counter = Counter()   # (topic, partition) -> lines
        self.lines = 0
        self.lock = threading.Lock()   # the sampler and the drain wait both read

    def read(self) -> Counter:
        with self.lock:
            return self._read()

    def _read(self) -> Counter:
        if not self.directory.is_dir():
            return self.counts
        for path in sorted(self.directory.iterdir()):
            if not path.name.endswith(_SUFFIXES):
                continue
            try:
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    key = (st.st_dev, st.st_ino)
                    start = self.positions.get(key, 0)
                    f.seek(start)
                    data = f.read()
            except FileNotFoundError:   # renamed between listing and opening: seen next time
                continue
            end = data.rfind(b"\n") + 1
            for line in data[:end].split(b"\n"):
                if line:
                    obj = json.loads(line)
                    self.counts[(obj["topic"], obj["partition"], obj["offset"])] += 1
                    self.per_partition[(obj["topic"], obj["partition"])] += 1
                    self.lines += 1
            self.positions[key] = start + end
        return self.counts

    def progress(self) -> tuple[int, dict]:
        """(distinct records in the files, lines per partition), for the sampler."""
        counts = self.read()
        return len(counts), dict(self.per_partition)

    def covers(self, expected: set) -> bool:
        counts = self.read()
        return all(k in counts for k in expected)

    def final(self) -> Counter:
        """Every line of the files, read afresh: (topic, partition, offset) -> count."""
        return OutputReader(self.directory).read()


def compare(fates: dict, delivered: Counter) -> dict:
    """The verdict, with a few examples of each kind of mismatch."""
    kept = {k for k, fate in fates.items() if fate == KEPT}
    lost = sorted(kept - delivered.keys())
    duplicates = sorted((k, n) for k, n in delivered.items() if n > 1)
    aborted = sorted(k for k in delivered if fates.get(k) == ABORTED)
    filtered = sorted(k for k in delivered if fates.get(k) == FILTERED)
    unknown = sorted(k for k in delivered if k not in fates)
    fate_counts = Counter(fates.values())
    return {
        "produced": len(fates), "kept": fate_counts[KEPT], "filtered": fate_counts[FILTERED],
        "aborted": fate_counts[ABORTED],
        "delivered_lines": sum(delivered.values()), "delivered_distinct": len(delivered),
        "lost": len(lost), "duplicates": sum(n - 1 for _, n in duplicates),
        "duplicated_records": len(duplicates), "aborted_delivered": len(aborted),
        "filtered_delivered": len(filtered), "unknown_delivered": len(unknown),
        "examples": {"lost": lost[:SAMPLE_LIMIT], "duplicates": duplicates[:SAMPLE_LIMIT],
                     "aborted_delivered": aborted[:SAMPLE_LIMIT],
                     "filtered_delivered": filtered[:SAMPLE_LIMIT], "unknown": unknown[:SAMPLE_LIMIT]},
    }


def verdict_ok(v: dict, *, at_least_once: bool = False) -> bool:
    """Nothing lost, nothing aborted or filtered or unknown delivered, and (unless
    ``at_least_once``) nothing delivered twice.

    ``at_least_once`` is for a sink that promises no more (the jsonl sink with ``dedupe =
    false``): a worker SIGKILLed after a flush and before its commit landed leaves records in
    the files that its successor reads again.  The duplicates are still counted and printed."""
    if v["lost"] or v["aborted_delivered"] or v["filtered_delivered"] or v["unknown_delivered"]:
        return False
    return at_least_once or not v["duplicates"]
