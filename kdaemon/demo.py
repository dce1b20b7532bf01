"""``kdaemon demo``: the whole thing on one machine with nothing set up beforehand.

Starts the embedded broker, creates a sample topic and writes it with headers (with kdaemon's own
client: ``client/admin.py`` and the producer the Kafka DLQ uses), writes a configuration derived from
``etc/kdaemon.toml``, runs the supervisor until every sample record is delivered and committed,
stops it gracefully, and prints where the output is and how to read it.

What it shows comes from the daemon, never from what the demo itself wrote: progress and the
final summary are the daemon's own counters (``kdaemon_records_*_total``: scraped from its
``/metrics`` while it runs, read from its multiprocess metrics files once it has stopped and its
workers wrote their last figures), lag is the group's committed offsets against the end
offsets, and the output is counted by reading it back.  How it is shown is the caller's
(``DemoReport``: ``kdaemon/cli/progress.py`` draws it with rich on a terminal, plain lines
elsewhere); this module never writes to the terminal itself.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TOPIC = "demo.events"
TYPES = ["order.created", "order.shipped", "order.cancelled", "page.view", "heartbeat"]
# The sample's JSON values as Spark reads them back: the Spark sink parses each value into these
# typed columns (``value.id``, ...), so the read-back shows the sample's fields, not hex bytes.
VALUE_SCHEMA = "id BIGINT, type STRING, amount DOUBLE, customer STRING"


def sample_value(i: int, rng: random.Random) -> dict:
    """The sample's ``i``-th value: the fields ``VALUE_SCHEMA`` declares."""
    return {"id": i, "type": rng.choice(TYPES), "amount": round(rng.uniform(1, 500), 2),
            "customer": f"c{rng.randrange(1000)}"}


def _seed(bootstrap: str, records: int, partitions: int) -> dict[int, int]:
    """Create the sample topic and write the sample with kdaemon's own client (CreateTopics,
    then the idempotent producer), and return each partition's end offset.

    The ends are counted here, not asked of the broker: Tansu's high watermark is the last
    batch's base offset + 1, not the last offset + 1 (testkit/tansu.py).  Every record has a key,
    and the producer puts a keyed record where ``Partitioner`` says (Java's murmur2), so the same
    partitioner counts them; the topic is new, so each partition starts at offset 0."""
    from .client import KafkaClientError
    from .client.admin import NewTopic, create_topics
    from .client.config import ConsumerConfig
    from .client.partitioner import Partitioner
    from .client.producer import Producer, ProducerSettings
    config = ConsumerConfig.from_options(bootstrap_servers=bootstrap, client_id="kdaemon-demo")
    where = Partitioner()
    ends: dict[int, int] = {}
    rng = random.Random(42)
    now_ms = int(time.time() * 1000)
    producer = None
    try:
        create_topics(config, [NewTopic(TOPIC, partitions, 1)], timeout_ms=30_000)
        producer = Producer(config, ProducerSettings(compression="lz4"))
        for i in range(records):
            value = sample_value(i, rng)
            key = f"c{i % 1000}".encode()
            producer.send(TOPIC, key, json.dumps(value).encode(),
                          [("type", value["type"].encode()), ("source", b"demo")], now_ms)
            p = where.partition(TOPIC, key, partitions)
            ends[p] = ends.get(p, 0) + 1
        producer.flush(60)
    except KafkaClientError as exc:
        fix = getattr(exc, "fix", "")
        raise SystemExit(f"seeding the demo topic failed: {exc}" + (f" ({fix})" if fix else "")) from None
    finally:
        if producer is not None:
            producer.close()
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
                       "max_records": 20000, "max_age_s": 5, "value_format": "json", "value_schema": VALUE_SCHEMA}
    path = state_dir / "kdaemon.toml"
    path.write_text(dump_toml(raw))
    return path


def _committed(bootstrap: str, partitions: list[int]) -> dict[int, int]:
    from .client import Consumer, TopicPartition
    with Consumer(bootstrap, group_id="kdaemon-demo", enable_auto_commit=False) as c:
        found = c.committed([TopicPartition(TOPIC, p) for p in partitions], timeout_ms=10000)
    return {tp.partition: (om.offset if om else 0) for tp, om in found.items()}


# -- what the daemon did -------------------------------------------------------------------------

@dataclass(frozen=True)
class PartitionCounts:
    """One partition of the sample as the daemon counted it.  ``consumed`` = read from Kafka
    (kept by the header filter, ``kdaemon_records_fetched_total``, plus dropped by it,
    ``kdaemon_records_filtered_total``); a record read twice (after a worker restart) counts
    twice, as the daemon did the work twice."""

    partition: int
    end: int              # the partition's end offset: records the sample put there
    consumed: int
    filtered: int
    delivered: int
    dead_lettered: int


@dataclass(frozen=True)
class DemoProgress:
    total: int            # records in the sample
    consumed: int
    delivered: int
    filtered: int
    dead_lettered: int
    lag: int              # end offsets minus the group's committed offsets, over all partitions


@dataclass(frozen=True)
class DemoSummary:
    partitions: tuple[PartitionCounts, ...]
    dropped_by_interceptors: int   # by on_consume interceptors (TTL): counted per plugin, not per partition
    output: Path                   # where the sink wrote
    output_records: int | None     # records read back from the jsonl output (None: Spark, not counted here)
    read_back: str                 # a shell command that prints the output, exactly as it can be run
    metrics_url: str

    def total(self, field: str) -> int:
        return sum(getattr(p, field) for p in self.partitions)


class DemoReport(Protocol):
    """How the demo is shown (``kdaemon.cli.progress.DemoDisplay``)."""

    def say(self, text: str) -> None:
        """One line of narration (what is being started)."""

    def begin(self, total: int) -> None:
        """The daemon runs; progress follows."""

    def progress(self, sample: DemoProgress) -> None:
        """The daemon's figures now (about once a second)."""

    def end(self) -> None:
        """No more progress (done, failed or interrupted)."""

    def error(self, text: str) -> None:
        """What went wrong, before the demo exits non-zero."""

    def summary(self, summary: DemoSummary) -> None:
        """The daemon stopped cleanly: what it did, and how to read the output."""


_COUNTERS = {"kdaemon_records_fetched_total": "fetched", "kdaemon_records_filtered_total": "filtered",
             "kdaemon_records_delivered_total": "delivered", "kdaemon_records_dlq_total": "dead_lettered"}


def _tally(families: Iterable) -> tuple[dict[int, dict[str, int]], int]:
    """The demo topic's counters per partition, and the interceptors' drops, from metric
    families (prometheus_client's, parsed from /metrics or merged from the files)."""
    per: dict[int, dict[str, int]] = {}
    dropped = 0
    for family in families:
        for sample in family.samples:
            if sample.name == "kdaemon_records_dropped_by_interceptors_total":
                dropped += int(sample.value)
                continue
            what = _COUNTERS.get(sample.name)
            if what is None or sample.labels.get("topic") != TOPIC:
                continue
            counts = per.setdefault(int(sample.labels["partition"]), dict.fromkeys(_COUNTERS.values(), 0))
            counts[what] += int(sample.value)
    return per, dropped


def _scrape(metrics_url: str) -> tuple[dict[int, dict[str, int]], int]:
    """The running daemon's counters; empty while its /metrics does not answer yet."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}, 0
    return _tally(text_string_to_metric_families(text))


def _final_counts(metrics_dir: Path) -> tuple[dict[int, dict[str, int]], int]:
    """The counters every worker of the stopped daemon wrote (their last update is at exit),
    merged as the daemon's /metrics merges them."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    registry = CollectorRegistry()
    return _tally(MultiProcessCollector(registry, path=str(metrics_dir)).collect())


def _progress(total: int, counts: dict[int, dict[str, int]], lag: int) -> DemoProgress:
    def s(what: str) -> int:
        return sum(c[what] for c in counts.values())
    return DemoProgress(total, s("fetched") + s("filtered"), s("delivered"), s("filtered"), s("dead_lettered"), lag)


# -- the demo ------------------------------------------------------------------------------------

def run_demo(report: DemoReport, records: int = 50_000, partitions: int = 4, state_dir: str = "var/demo",
             sink: str = "jsonl", follow: bool = False, template: str | None = None) -> int:
    from .embedded import free_port, start_broker
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    template_path = Path(template) if template else Path(__file__).resolve().parent.parent / "etc" / "kdaemon.toml"
    if not template_path.exists():
        raise SystemExit(f"configuration template {template_path} not found; pass --template")
    # The broker is new each time (in memory), so a previous run's output would be counted with
    # this one's, and the jsonl sink's indexes would take this run's offsets for records it has.
    for old in ("out", "dlq", "spark-out", "metrics"):
        if (state / old).exists():
            shutil.rmtree(state / old)
            report.say(f"removed the previous demo run's {state / old}")
    report.say("starting the embedded broker (Tansu) ...")
    broker = start_broker(state / "broker")
    try:
        report.say(f"broker at {broker.bootstrap}; writing {records} sample records with headers to {TOPIC} ...")
        ends = _seed(broker.bootstrap, records, partitions)
        metrics_port = free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        config = _config(template_path, broker.bootstrap, state, metrics_port, sink)
        metrics_dir = state / "metrics"
        log_path = state / "kdaemon.log"
        report.say(f"running: {sys.executable} -m kdaemon.cli run -c {config}  (its log: {log_path})")
        # Its metrics files where the summary reads them (the supervisor honours the variable).
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        # Its log goes to a file: written to the terminal, it would tear through a live display.
        with open(log_path, "ab") as log:
            daemon = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(config)], env=env,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        total = sum(ends.values())
        report.begin(total)
        try:
            deadline = time.monotonic() + 600
            while True:
                time.sleep(1)
                if daemon.poll() is not None:
                    report.end()
                    report.error(f"the daemon exited with code {daemon.returncode}; its log ({log_path}) ends:\n"
                                 + _tail(log_path))
                    return daemon.returncode or 1
                committed = _committed(broker.bootstrap, sorted(ends))
                lag = sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())
                report.progress(_progress(total, _scrape(metrics_url)[0], lag))
                if lag == 0 and not follow:
                    break
                if time.monotonic() > deadline and not follow:
                    report.end()
                    report.error("timed out waiting for the daemon (600 s)")
                    return 1
        except KeyboardInterrupt:   # how --follow ends (the daemon got the SIGINT too): stop, then sum up
            report.end()
            report.say("interrupted: stopping the daemon")
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(60)
            report.end()
        if daemon.returncode != 0:
            report.error(f"the daemon stopped with code {daemon.returncode}, so its figures may be incomplete; "
                         f"its log ({log_path}) ends:\n" + _tail(log_path))
            return daemon.returncode or 1
        report.summary(_summary(state, sink, ends, metrics_dir, metrics_url))
        return 0
    finally:
        broker.stop()


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _summary(state: Path, sink: str, ends: dict[int, int], metrics_dir: Path, metrics_url: str) -> DemoSummary:
    per, dropped = _final_counts(metrics_dir)
    zero = dict.fromkeys(_COUNTERS.values(), 0)
    rows = tuple(PartitionCounts(p, ends[p], c["fetched"] + c["filtered"], c["filtered"], c["delivered"],
                                 c["dead_lettered"]) for p, c in ((p, per.get(p, zero)) for p in sorted(ends)))
    if sink == "spark":
        out = state / "spark-out"
        return DemoSummary(rows, dropped, out, None, read_back_command(sink, out), metrics_url)
    out = state / "out"
    lines = sum(1 for f in sorted(out.glob("*.jsonl")) for _ in open(f, "rb"))
    return DemoSummary(rows, dropped, out, lines, read_back_command(sink, out), metrics_url)


def read_back_command(sink: str, out: Path, python: str = sys.executable) -> str:
    """A shell command that prints how many records ``out`` holds and the first five: this
    interpreter (the one kdaemon is installed in, so pyspark is there for the Spark sink) and
    the real path, quoted for a POSIX shell, so it runs exactly as printed."""
    where = json.dumps(str(out))   # a Python string literal in double quotes: the shell's quotes stay simple
    if sink == "spark":
        code = ("from pyspark.sql import SparkSession; "
                'spark = SparkSession.builder.master("local[1]").getOrCreate(); '
                f'df = spark.read.parquet({where}); '
                'df.select("partition", "offset", "timestamp", "value.*").show(5, truncate=False); '
                'print(df.count(), "records")')
    else:
        code = ("import json, pathlib; "
                f'rows = [json.loads(l) for f in sorted(pathlib.Path({where}).glob("*.jsonl")) for l in open(f)]; '
                'print(len(rows), "records"); [print(r) for r in rows[:5]]')
    return f"{shlex.quote(python)} -c {shlex.quote(code)}"
