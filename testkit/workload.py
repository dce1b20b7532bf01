"""The data set of the consuming benchmarks (bench/consume (with its decode.py and pipeline.py) and bench/daemon):
the records, the header predicate every Python-side filter uses, and the loader that writes them.

One definition, so that every benchmark reads the same records and a figure in one can be set
beside a figure in another.  Only the standard library at module level: a benchmark's child
process imports this before its client, and must import nothing else (its RSS and import time
are the client's own).
"""

from __future__ import annotations

import json
import math
import random
import time

TOPIC = "bench-consume"
PARTITIONS = 4
TYPES = (b"order.created", b"order.paid", b"order.shipped", b"order.cancelled", b"cart.updated",
         b"user.login", b"user.logout", b"payment.failed", b"refund.issued", b"stock.adjusted")
TARGET = TYPES[2]
SEED = 20240601
MAX_PARTITION_FETCH_BYTES = 1 << 20    # 1 MiB, every client's default
FETCH_MAX_BYTES = 50 << 20             # 50 MiB, every client's default
COMPRESSIONS = ("lz4", "zstd", "gzip", "snappy", "none")
# --records must be a multiple of this: equal partitions, exactly a tenth of each type.
RECORDS_UNIT = math.lcm(PARTITIONS, len(TYPES))


def iter_records(n: int, seed: int = SEED):
    """(id, partition, key, value, headers) for n records, generated lazily (1M would not fit
    comfortably in memory as a list): a ~200-byte JSON value, the user as key, and two headers,
    ``type`` (exactly n/10 of each, shuffled) and ``trace`` (32 hex digits); round-robin over
    the partitions."""
    rng = random.Random(seed)
    types = [TYPES[i % len(TYPES)] for i in range(n)]
    rng.shuffle(types)
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
    for i, kind in enumerate(types):
        doc = {"id": i, "event": kind.decode(), "user": f"user-{rng.randrange(100_000):05d}",
               "amount": round(rng.uniform(1, 5000), 2), "currency": rng.choice(("EUR", "USD", "GBP")),
               "items": [rng.randrange(1000) for _ in range(3)], "note": ""}
        pad = 200 - len(json.dumps(doc, separators=(",", ":")))
        doc["note"] = " ".join(rng.choice(words) for _ in range(40))[:max(pad, 0)]
        value = json.dumps(doc, separators=(",", ":")).encode()
        trace = f"{rng.getrandbits(128):032x}".encode()
        yield i, i % PARTITIONS, doc["user"].encode(), value, [("type", kind), ("trace", trace)]


def type_is_target(headers) -> bool:
    """The one Python predicate every Python-side filter uses, kdaemon's and the peers' alike."""
    for key, value in headers:
        if key == "type":
            return value == TARGET
    return False


def produce(bootstrap: str, n: int, compression: str = "lz4") -> dict:
    """Write n records into a fresh TOPIC with confluent-kafka (testkit/produce.py's Writer)
    in large batches; return the per-partition counts from the delivery reports (every consumer
    stops on those, never on the high watermark) and the check values every mode must reach."""
    from testkit.produce import Writer, create_topic

    create_topic(bootstrap, TOPIC, PARTITIONS)
    writer = Writer(bootstrap, TOPIC, compression, **{
        "enable.idempotence": False,
        # Large batches: up to 1 MB of records (before compression) or 10,000 records each.
        "linger.ms": 200, "batch.size": 1_000_000, "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000})
    raw = json_sum = filter_sum = kept = 0
    t0 = time.monotonic()
    for i, p, key, value, headers in iter_records(n):
        raw += len(value)
        json_sum += i
        if headers[0][1] == TARGET:
            filter_sum += i
            kept += 1
        writer.send(value, key, partition=p, headers=headers)
    writer.flush_checked(120)
    seconds = time.monotonic() - t0
    delivered = [writer.counts.get(p, 0) for p in range(PARTITIONS)]
    if sum(delivered) != n:
        raise RuntimeError(f"produce failed: {sum(delivered)} of {n} delivered")
    for p in range(PARTITIONS):
        if writer.ends.get(p, 0) != delivered[p]:
            raise RuntimeError(f"partition {p}: {delivered[p]} records but last offset {writer.ends.get(p, 0) - 1}; "
                               "offsets are not contiguous from 0")
    del writer
    return {"expected": delivered, "seconds": seconds, "compression": compression,
            "check": {"raw": raw, "json": json_sum, "filter": filter_sum},
            "kept": {"raw": n, "json": n, "filter": kept}}
