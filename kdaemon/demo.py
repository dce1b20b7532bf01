"""``kdaemon demo``: the whole thing on one machine with nothing set up beforehand.

Starts the embedded broker, writes a sample topic with headers (with confluent-kafka, from the
``demo`` extra: the daemon itself never produces), writes a configuration derived from
``etc/kdaemon.toml``, runs the supervisor until every sample record is delivered and committed,
stops it gracefully, and prints where the output is and how to read it.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

TOPIC = "demo.events"
TYPES = ["order.created", "order.shipped", "order.cancelled", "page.view", "heartbeat"]


def _seed(bootstrap: str, records: int, partitions: int) -> dict[int, int]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 20})
    ends: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    rng = random.Random(42)
    now_ms = int(time.time() * 1000)
    for i in range(records):
        kind = rng.choice(TYPES)
        value = {"id": i, "type": kind, "amount": round(rng.uniform(1, 500), 2), "customer": f"c{rng.randrange(1000)}"}
        producer.produce(TOPIC, key=f"c{i % 1000}".encode(), value=json.dumps(value).encode(),
                         headers=[("type", kind.encode()), ("source", b"demo")], timestamp=now_ms,
                         on_delivery=delivered)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(60) or errors:
        raise SystemExit(f"seeding the demo topic failed: {errors[:3]}")
    return ends


def _config(template: Path, bootstrap: str, state_dir: Path, metrics_port: int, sink: str) -> Path:
    import tomllib

    from .config import dump_toml
    raw = tomllib.loads(template.read_text())
    raw["kafka"]["bootstrap_servers"] = bootstrap
    raw["kafka"]["group_id"] = "kdaemon-demo"
    raw["kafka"]["session_timeout_ms"] = 6000  # group joins on the embedded broker are slow otherwise
    raw["daemon"].update(topics=[TOPIC], state_dir=str(state_dir), metrics_addr=f"127.0.0.1:{metrics_port}",
                         workers=2, flush_interval_ms=500)
    raw["sink"]["path"] = str(state_dir / "out")
    raw["dlq"]["path"] = str(state_dir / "dlq")
    if sink == "spark":
        raw["sink"] = {"type": "spark", "master": "local[2]", "path": str(state_dir / "spark-out"),
                       "max_records": 20000, "max_age_s": 5}
    path = state_dir / "kdaemon.toml"
    path.write_text(dump_toml(raw))
    return path


def _committed(bootstrap: str, partitions: list[int]) -> dict[int, int]:
    from .client import Consumer, TopicPartition
    with Consumer(bootstrap, group_id="kdaemon-demo", enable_auto_commit=False) as c:
        found = c.committed([TopicPartition(TOPIC, p) for p in partitions], timeout_ms=10000)
    return {tp.partition: (om.offset if om else 0) for tp, om in found.items()}


def run_demo(records: int = 50_000, partitions: int = 4, state_dir: str = "var/demo", sink: str = "jsonl",
             follow: bool = False, template: str | None = None) -> int:
    from .embedded import free_port, start_broker
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    template_path = Path(template) if template else Path(__file__).resolve().parent.parent / "etc" / "kdaemon.toml"
    if not template_path.exists():
        raise SystemExit(f"configuration template {template_path} not found; pass --template")
    print("starting the embedded broker (Tansu) ...", flush=True)
    broker = start_broker(state / "broker")
    try:
        print(f"broker at {broker.bootstrap}; writing {records} sample records with headers to {TOPIC} ...",
              flush=True)
        ends = _seed(broker.bootstrap, records, partitions)
        metrics_port = free_port()
        config = _config(template_path, broker.bootstrap, state, metrics_port, sink)
        print(f"running: kdaemon run -c {config}", flush=True)
        daemon = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(config)])
        try:
            deadline = time.monotonic() + 600
            while True:
                time.sleep(1)
                if daemon.poll() is not None:
                    print(f"the daemon exited with code {daemon.returncode}", file=sys.stderr)
                    return daemon.returncode or 1
                committed = _committed(broker.bootstrap, sorted(ends))
                done = all(committed.get(p, 0) >= end for p, end in ends.items())
                print(f"  committed {sum(committed.values())} / {sum(ends.values())}", flush=True)
                if done and not follow:
                    break
                if time.monotonic() > deadline:
                    print("timed out waiting for the daemon", file=sys.stderr)
                    return 1
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(60)
        _describe_output(state, sink, metrics_port)
        return 0
    finally:
        broker.stop()


def _describe_output(state: Path, sink: str, metrics_port: int) -> None:
    if sink == "spark":
        out = state / "spark-out"
        print(f"\ndone. Spark output (Parquet) is in {out}\nread it back with:\n"
              f"  python -c \"from pyspark.sql import SparkSession; "
              f"s = SparkSession.builder.master('local[1]').getOrCreate(); "
              f"df = s.read.parquet('{out}'); df.show(5); print(df.count())\"")
        return
    out = state / "out"
    files = sorted(out.glob("*.jsonl"))
    lines = sum(1 for f in files for _ in open(f, "rb"))
    print(f"\ndone. {lines} records in {len(files)} file(s) under {out}")
    print("(the header rule in etc/kdaemon.toml keeps only order.created and order.shipped)")
    if files:
        with open(files[0]) as fh:
            print("first record:", fh.readline().strip())
    print(f"DLQ: {state / 'dlq'}; metrics were served at http://127.0.0.1:{metrics_port}/metrics while running")
