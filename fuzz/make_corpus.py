"""Regenerate ``fuzz/corpus/``: seeds captured from a real client session against Apache Kafka 4.4.

    .venv/bin/python -m fuzz.make_corpus        # needs Java and Maven (testkit/apache_kafka.py)

What it does, all against one throwaway KRaft node:

1. confluent-kafka (librdkafka) writes records with headers (a null header value, a null key)
   with each codec (none, gzip, snappy, lz4, zstd), then one committed and one aborted
   transaction, so the log holds transactional batches and COMMIT/ABORT control batches.
2. kdaemon's own Consumer reads everything back, once with the classic group protocol
   (JoinGroup/SyncGroup/Heartbeat/OffsetCommit/OffsetFetch/LeaveGroup) and once with KIP-848's
   (ConsumerGroupHeartbeat), and asks ListOffsets for beginning/end/time offsets.  Every response
   frame the connection decodes is recorded as the broker sent it (``messages.read_response``
   is wrapped; the bytes are copied before decoding).
3. A SCRAM-SHA-256, a SCRAM-SHA-512 and a PLAIN login through ``testkit/secure.py``'s
   SecureProxy in front of the broker, with the client nonce pinned to ``targets.SCRAM_NONCE``
   so the captured server-final still verifies when the fuzz target replays it.

Seeds are written in each target's input layout (see targets.py) and kept small: at most three
frames per (api, version), each batch of a record set alone, nothing over 64 KiB.  The config
seeds are the shipped etc/kdaemon.toml and a few hand-written variations of it.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

from . import targets

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = HERE / "corpus"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MAX_SEED = 64 * 1024
PER_PAIR = 3
SASL_USERS = {targets.SCRAM_USER: targets.SCRAM_PASSWORD}


def _produce(bootstrap: str) -> list[str]:
    from confluent_kafka import Producer

    from testkit.produce import create_topic
    topics = []
    for codec in CODECS:
        topic = f"fuzz-{codec}"
        create_topic(bootstrap, topic, 1)
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
                      "enable.idempotence": True})
        for i in range(4):
            headers = [("trace", f"t{i}".encode()), ("k", b"key-" + bytes([48 + i])), ("empty", None)]
            p.produce(topic, value=f"value {i} ".encode() * (3 + i), key=None if i == 2 else f"k{i}".encode(),
                      headers=headers)
        p.flush(30)
        topics.append(topic)
    topic = "fuzz-txn"
    create_topic(bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fuzz-txn", "linger.ms": 20})
    p.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        p.begin_transaction()
        for i in range(2):
            p.produce(topic, value=f"{outcome} {i}".encode(), key=b"tk", headers=[("txn", outcome.encode())])
        p.flush(30)
        (p.commit_transaction if outcome == "commit" else p.abort_transaction)(30)
    topics.append(topic)
    return topics


@contextmanager
def _capture():
    """Record (api key, version, frame bytes) of every response kdaemon's connections decode."""
    from kdaemon.protocol import messages
    frames: list[tuple[int, int, bytes]] = []
    original = messages.read_response

    def recording(api, version, frame, *, strict=True):
        frames.append((api.key, version, bytes(frame)))
        return original(api, version, frame, strict=strict)
    messages.read_response = recording
    try:
        yield frames
    finally:
        messages.read_response = original


def _consume(bootstrap: str, topics: list[str], protocol: str, expect: int) -> None:
    from kdaemon.client import Consumer, TopicPartition
    group = f"fuzz-{protocol}"
    classic = {"heartbeat_interval_ms": 200} if protocol == "classic" else {}
    with Consumer(bootstrap, group_id=group, group_protocol=protocol, auto_offset_reset="earliest",
                  enable_auto_commit=False, isolation_level="read_committed", **classic) as c:
        c.subscribe(topics)
        seen, deadline = 0, time.monotonic() + 90
        while seen < expect and time.monotonic() < deadline:
            seen += sum(len(v) for v in c.poll(500).values())
        if seen < expect:
            raise SystemExit(f"{protocol} consumer saw {seen} of {expect} records")
        c.commit()
        tps = [TopicPartition(t, 0) for t in topics]
        c.committed(tps)
        c.beginning_offsets(tps)
        c.end_offsets(tps)
        c.offsets_for_times({tp: 0 for tp in tps})
        until = time.monotonic() + 1.5   # long enough for heartbeats of either protocol
        while time.monotonic() < until:
            c.poll(100)


def _sasl(bootstrap_host: str, port: int) -> list[tuple[str, list[bytes]]]:
    """Log in with each mechanism through SecureProxy; return the server messages per exchange."""
    from kdaemon.client import Consumer, sasl
    from testkit.secure import SecureProxy
    exchanges: list[tuple[str, list[bytes]]] = []
    scram_receive, plain_receive = sasl.ScramMechanism.receive, sasl.PlainMechanism.receive
    token_bytes = sasl.secrets.token_bytes

    def recording(original):
        def receive(self, data):
            if not exchanges or exchanges[-1][0] != self.name or exchanges[-1][1] is None:
                exchanges.append((self.name, []))
            exchanges[-1][1].append(bytes(data))
            return original(self, data)
        return receive
    sasl.ScramMechanism.receive = recording(scram_receive)
    sasl.PlainMechanism.receive = recording(plain_receive)
    sasl.secrets.token_bytes = lambda n: targets.SCRAM_NONCE_BYTES[:n]
    proxy = SecureProxy()
    proxy.configure(users=SASL_USERS)
    proxy.start((bootstrap_host, port))
    try:
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            with Consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                          sasl_username=targets.SCRAM_USER, sasl_password=targets.SCRAM_PASSWORD) as c:
                c.partitions_for("fuzz-none", timeout_ms=30_000)
            exchanges.append((mechanism, None))   # closes this exchange's list
    finally:
        proxy.close()
        sasl.ScramMechanism.receive, sasl.PlainMechanism.receive = scram_receive, plain_receive
        sasl.secrets.token_bytes = token_bytes
    return [(m, msgs) for m, msgs in exchanges if msgs is not None]


def _batches(record_set: bytes) -> list[bytes]:
    out, pos = [], 0
    while len(record_set) - pos >= 12:
        length = struct.unpack_from(">i", record_set, pos + 8)[0]
        if length < 0 or pos + 12 + length > len(record_set):
            break
        out.append(record_set[pos:pos + 12 + length])
        pos += 12 + length
    return out


def _record_sets(frames) -> list[bytes]:
    from kdaemon.protocol import messages
    from kdaemon.protocol.apis import FETCH
    sets = []
    for key, version, frame in frames:
        if key != FETCH.key:
            continue
        body, _ = messages.read_response(FETCH, version, memoryview(frame), strict=False)
        for topic in body["responses"]:
            for p in topic["partitions"]:
                if p["records"]:
                    sets.append(bytes(p["records"]))
    return sets


def _write(target: str, seeds: list[bytes]) -> int:
    d = CORPUS / target
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    unique = {hashlib.sha1(s).hexdigest()[:16]: s for s in seeds if len(s) <= MAX_SEED}
    for name, data in unique.items():
        (d / name).write_bytes(data)
    return len(unique)


def _config_seeds() -> list[bytes]:
    shipped = (ROOT / "etc" / "kdaemon.toml").read_bytes()
    return [shipped, b"""
[kafka]
bootstrap_servers = "localhost:9092"
group_id = "g"
sasl_password = "${KDAEMON_FUZZ_SECRET}"
[daemon]
topics = ["a", "b"]
on_sink_error = "dlq"
[[filters]]
header = "h"
op = "in"
values = ["x", "y"]
action = "drop"
[sink]
type = "jsonl"
[dlq]
type = "jsonl"
""", b'plugins = []\n[daemon]\ntopic_pattern = "^t.*"\nassignment = "group"\n[kafka]\ngroup_id = "g"\n']


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from testkit.apache_kafka import start_kafka
    with tempfile.TemporaryDirectory(prefix="kdaemon-fuzz-corpus-") as tmp, \
            start_kafka(Path(tmp) / "kafka") as cluster:
        bootstrap = cluster.bootstrap
        topics = _produce(bootstrap)
        with _capture() as frames:
            expect = 4 * len(CODECS) + 4   # the aborted transaction is not delivered
            _consume(bootstrap, topics, "classic", expect)
            _consume(bootstrap, topics, "consumer", expect)
            host, port = bootstrap.rsplit(":", 1)
            exchanges = _sasl(host, int(port))

    record_sets = _record_sets(frames)
    batches = [b for s in record_sets for b in _batches(s)]
    record_seeds = []
    for s in record_sets:
        record_seeds += [b"\x00" + s, b"\x01" + s]
    for b in batches:
        record_seeds += [b"\x00" + b, b"\x02" + b, b"\x04" + b, b"\x09" + b, b"\x10" + b]
    print(f"record sets: {len(record_sets)}, batches: {len(batches)}, "
          f"codecs: {sorted({b[22] & 7 for b in batches if len(b) > 22})}, "
          f"control batches: {sum(1 for b in batches if len(b) > 22 and b[22] & 0x20)}")
    print("records_python:", _write("records_python", record_seeds), "seeds")
    print("records_c:", _write("records_c", record_seeds), "seeds")

    per_pair: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for key, version, frame in sorted(frames, key=lambda f: len(f[2])):
        if len(per_pair[(key, version)]) < PER_PAIR and frame not in per_pair[(key, version)]:
            per_pair[(key, version)].append(frame)
    response_seeds = [bytes([k, v]) + f for (k, v), fs in per_pair.items() for f in fs]
    response_seeds += _consumer_protocol_seeds(frames)
    print("responses:", _write("responses", response_seeds), "seeds for", sorted(per_pair))

    sasl_seeds = []
    for mechanism, msgs in exchanges:
        if mechanism.startswith("SCRAM") and len(msgs) == 2:
            sasl_seeds.append(bytes([mechanism.endswith("512")]) + msgs[0] + b"\0" + msgs[1])
        elif mechanism == "PLAIN":
            sasl_seeds.append(b"\x02" + b"".join(msgs))
    print("sasl:", _write("sasl", sasl_seeds), "seeds from", [m for m, _ in exchanges])
    print("config:", _write("config", _config_seeds()), "seeds")
    return 0


def _consumer_protocol_seeds(frames) -> list[bytes]:
    """The subscription (JoinGroup members) and assignment (SyncGroup) bytes the broker relayed."""
    from kdaemon.protocol import messages
    from kdaemon.protocol.apis import JOIN_GROUP, SYNC_GROUP
    seeds = []
    for key, version, frame in frames:
        if key == JOIN_GROUP.key:
            body, _ = messages.read_response(JOIN_GROUP, version, memoryview(frame), strict=False)
            seeds += [b"\xfa\x00" + bytes(m["metadata"]) for m in body["members"] if m["metadata"]]
        elif key == SYNC_GROUP.key:
            body, _ = messages.read_response(SYNC_GROUP, version, memoryview(frame), strict=False)
            if body["assignment"]:
                seeds.append(b"\xfb\x00" + bytes(body["assignment"]))
    return seeds


if __name__ == "__main__":
    sys.exit(main())
