"""The Spark sink end to end: confluent-kafka → Tansu → ``kdaemon run`` (supervisor, 2 workers,
the uploader on local[2]) → Parquet, read back with Spark.

Every test produces with delivery reports, waits until the committed offsets (read with
confluent-kafka) reach the produced ends, stops the daemon with SIGTERM and then checks the
output against what was produced minus what the header rule filters out: exactly those
(topic, partition, offset), once each, with the right columns.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time

import pytest

from kdaemon.sinks.spark.tables import formats
from testkit.spark import (SizeSampler, SparkDaemon, make_record, new_topic, produce, Produced,
                                 read_output, requires_spark, row_key, spark_config, assert_exact,
                                 committed, ts_of)

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]


def _check_columns(df, value_type: str) -> None:
    types = dict(df.dtypes)
    assert types["topic"] == "string"
    assert types["partition"] == "int"
    assert types["offset"] == "bigint"
    assert types["timestamp"] == "timestamp"
    assert types["timestamp_type"] == "tinyint"
    assert types["key"] == "binary"
    assert types["value"] == value_type
    assert types["headers"] == "map<string,binary>"
    assert types["date"] == "date"   # the date=YYYY-MM-DD partition directories


def _check_values(rows, expected, value_of) -> None:
    for row in rows:
        sent = expected[row_key(row)]
        assert row["key"] == sent.key
        assert row["value"] == value_of(sent), row_key(row)
        assert dict(row["headers"]) == dict(sent.headers), row_key(row)   # a repeated key: the last wins
        assert row["timestamp"] == ts_of(sent.timestamp)
        assert row["date"] == ts_of(sent.timestamp).date()
        assert row["timestamp_type"] == 0   # CreateTime


def _assert_clean(out, state_dir) -> None:
    """No upload left half-done, no Spark scratch output, no staged batch left behind."""
    pending = [os.path.join(d, f) for d, _, fs in os.walk(out / "_kdaemon" / "pending") for f in fs]
    assert not pending, f"pending uploads left: {pending[:5]}"
    tmp = out / "_kdaemon" / "tmp"
    assert not tmp.exists() or not os.listdir(tmp), f"Spark scratch output left: {os.listdir(tmp)[:5]}"
    staged = [f for d, _, fs in os.walk(state_dir / "spark-staging") for f in fs]
    assert not staged, f"staged batches left: {staged[:5]}"


def test_100k_records_exactly_once_binary_values(broker, spark, tmp_path):
    topic = new_topic(broker.bootstrap, 4)
    produced = Produced(topic, 4)
    rng = random.Random(1)
    now_ms = int(time.time() * 1000)
    produce(broker.bootstrap, produced, (make_record(i, rng, now_ms) for i in range(100_000)))
    expected = produced.expected()
    assert 40_000 < len(expected) < 60_000   # the header rule keeps about half

    out = tmp_path / "out"
    group = f"g-{topic}"
    config = spark_config(tmp_path / "d", broker.bootstrap, topic, group, out)
    daemon = SparkDaemon(tmp_path / "d", config)
    staging = SizeSampler(daemon.state_dir / "spark-staging")
    with daemon:
        staging.start()
        daemon.wait_caught_up(broker.bootstrap, produced, timeout=120)
        assert daemon.stop() == 0, daemon.log_tail()
    staging.stop()

    df = spark.read.parquet(str(out))
    _check_columns(df, "binary")
    rows = df.toArrow().to_pylist()
    assert_exact(rows, expected)
    _check_values(rows, expected, lambda sent: sent.value)
    assert {r["date"] for r in rows} == {ts_of(now_ms - d * 86_400_000).date() for d in range(3)}

    for p, (offset, metadata) in committed(broker.bootstrap, group, topic, 4).items():
        assert offset == produced.ends()[p]
        # Tansu keeps no commit metadata (confluent-kafka's own comes back empty too), so the
        # "spark:<batch>" metadata is checked against librdkafka's mock cluster below.
        assert metadata is None or metadata.startswith("spark:"), (p, metadata)
    _assert_clean(out, daemon.state_dir)
    assert staging.peak < 64 * 1024 * 1024, staging.peak
    assert "Traceback" not in daemon.log(), daemon.log_tail()


def test_value_schema_types_good_rows_and_dead_letters_bad_ones(broker, spark, tmp_path):
    topic = new_topic(broker.bootstrap, 2)
    produced = Produced(topic, 2)
    rng = random.Random(2)
    now_ms = int(time.time() * 1000)

    def value(i: int) -> bytes:
        if i % 37 == 0:
            return f"not json {i}".encode()
        if i % 41 == 0:
            return json.dumps({"id": "not a number", "kind": "x"}).encode()   # does not fit the schema
        return json.dumps({"id": i, "kind": rng.choice(["a", "b"]), "amount": i / 4,
                           "tags": ["t", str(i % 3)]}).encode()

    produce(broker.bootstrap, produced, [make_record(i, rng, now_ms, value=value(i)) for i in range(20_000)])
    expected = produced.expected()
    bad = {k: r for k, r in expected.items() if not r.value.startswith(b'{"id": ') or b"not a number" in r.value}
    good = {k: r for k, r in expected.items() if k not in bad}
    assert bad and good

    out = tmp_path / "out"
    group = f"g-{topic}"
    schema = "id BIGINT, kind STRING, amount DOUBLE, tags ARRAY<STRING>"
    config = spark_config(tmp_path / "d", broker.bootstrap, topic, group, out,
                          sink={"value_schema": schema, "max_records": 5000})
    with SparkDaemon(tmp_path / "d", config) as daemon:
        daemon.wait_caught_up(broker.bootstrap, produced, timeout=120)
        assert daemon.stop() == 0, daemon.log_tail()

    df = spark.read.parquet(str(out))
    _check_columns(df, "struct<id:bigint,kind:string,amount:double,tags:array<string>>")
    rows = df.toArrow().to_pylist()
    assert_exact(rows, good)
    for row in rows:
        v = json.loads(good[row_key(row)].value)
        assert row["value"] == {"id": v["id"], "kind": v["kind"], "amount": v["amount"], "tags": v["tags"]}

    dlq = spark.read.parquet(str(out / "_kdaemon" / "dlq"))
    dead = dlq.toArrow().to_pylist()
    assert_exact(dead, bad)
    for row in dead:
        assert row["value"] == bad[row_key(row)].value   # the raw bytes, for a replay
        assert schema in row["error"]
    _assert_clean(out, daemon.state_dir)


@pytest.mark.kafka
@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_two_daemons_share_the_group_and_the_output(kafka, spark, tmp_path, fmt):
    """Two "hosts": two supervisors (own daemon_id, state dir and uploader) in one group writing
    one output path, or one Delta or Iceberg table; records keep coming while the second one
    joins (a rebalance).  On Apache Kafka: on Tansu this group wedged once (a member's SyncGroup
    answered REBALANCE_IN_PROGRESS for minutes while the other's heartbeats succeeded)."""
    topic = new_topic(kafka.bootstrap, 4)
    produced = Produced(topic, 4)
    rng = random.Random(3)
    now_ms = int(time.time() * 1000)
    out = tmp_path / "lake" / "db" / "events" if fmt == "iceberg" else tmp_path / "out"
    group = f"g-{topic}"
    daemons = [SparkDaemon(tmp_path / name, spark_config(tmp_path / name, kafka.bootstrap, topic, group, out,
                                                         daemon_id=name,
                                                         sink={"value_format": "string", "format": fmt}))
               for name in ("host-a", "host-b")]
    try:
        daemons[0].start()
        first = [make_record(i, rng, now_ms) for i in range(20_000)]
        produce(kafka.bootstrap, produced, first)
        daemons[0].wait_log(re.escape("uploaded "), timeout=90)
        daemons[1].start()
        more = [make_record(i, rng, now_ms) for i in range(20_000, 60_000)]
        producer = threading.Thread(target=produce, args=(kafka.bootstrap, produced, more), kwargs={"rate": 4000})
        producer.start()
        daemons[1].wait_log(re.escape("uploaded "), timeout=90)
        producer.join(60)
        assert not producer.is_alive()
        wait_all = time.monotonic() + 120
        for d in daemons:
            d.wait_caught_up(kafka.bootstrap, produced, timeout=max(1, wait_all - time.monotonic()))
        for d in daemons:
            assert d.stop() == 0, d.log_tail()
    finally:
        for d in daemons:
            d.kill_all()

    expected = produced.expected()
    df = spark.read.format(fmt).load(str(out))
    if fmt == "parquet":   # the tables' column types: docs/SPARK.md (date a string; Iceberg has no tinyint)
        _check_columns(df, "string")
    rows = df.toArrow().to_pylist()
    assert_exact(rows, expected)
    if fmt == "parquet":
        _check_values(rows, expected, lambda sent: None if sent.value is None else sent.value.decode())
    else:
        for row in rows:
            sent = expected[row_key(row)]
            assert row["value"] == (None if sent.value is None else sent.value.decode())
            assert row["key"] == sent.key and dict(row["headers"]) == dict(sent.headers)
    # Both uploaders wrote part of it.
    uploaders = set()
    for d, _, names in os.walk(out / "_kdaemon" / "manifests"):
        for n in names:
            with open(os.path.join(d, n)) as fh:
                manifest = json.load(fh)
            if manifest["new_rows"]:
                uploaders.add(manifest["uploader"])
    assert len(uploaders) == 2, uploaders
    for d in daemons:
        _assert_clean(out, d.state_dir)


@pytest.mark.kafka
def test_commits_carry_the_uploaded_batch_as_metadata(kafka, spark, tmp_path):
    """On Apache Kafka (Tansu drops commit metadata): the committed offset of a partition names
    the last batch its committing worker uploaded ("spark:p<partition>-<first>-<last>"), read
    the same by kafka-python and by our client, and that batch's manifest exists; "spark:" alone
    only where that worker started the partition at the output after a rebalance."""
    bootstrap = kafka.bootstrap
    topic = new_topic(bootstrap, 2)
    produced = Produced(topic, 2)
    rng = random.Random(4)
    now_ms = int(time.time() * 1000)
    produce(bootstrap, produced, [make_record(i, rng, now_ms) for i in range(4000)])
    out = tmp_path / "out"
    group = f"g-{topic}"
    config = spark_config(tmp_path / "d", bootstrap, topic, group, out, workers=2)
    with SparkDaemon(tmp_path / "d", config) as daemon:
        daemon.wait_caught_up(bootstrap, produced, timeout=90)
        assert daemon.stop() == 0, daemon.log_tail()
    from kdaemon.client import Consumer as KdaemonConsumer, TopicPartition as KdaemonTP
    with KdaemonConsumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        ours = c.committed([KdaemonTP(topic, p) for p in range(2)], timeout_ms=10_000)
    named = 0
    for p, (offset, metadata) in committed(bootstrap, group, topic, 2).items():
        assert offset == produced.ends()[p]
        m = re.fullmatch(rf"spark:(p{p}-(\d{{19}})-(\d{{19}}))?", metadata)   # as kafka-python reads it
        assert m, metadata
        assert ours[KdaemonTP(topic, p)].metadata == metadata         # and as our client reads it
        if m.group(1):
            named += 1
            assert (out / "_kdaemon" / "manifests" / topic / str(p) / f"{m.group(2)}-{m.group(3)}.json").exists()
        else:
            # "spark:" alone: the committing worker uploaded nothing of the partition; it was given
            # it in a rebalance and started where the output already was (worker/resume.py).
            assert re.search(rf"{re.escape(topic)}-{p} starts at offset \d+, where the sink's output", daemon.log()), \
                daemon.log_tail()
    assert named, "no commit names an uploaded batch"
    assert_exact(read_output(spark, out), produced.expected())


def test_a_new_group_starts_where_the_table_already_is(broker, spark, tmp_path):
    """A second daemon in a new group (no commits) delivering the same topic into the same
    Delta table: its workers ask the uploader where each partition starts, begin after the
    offsets the table recorded, and commit there; nothing is read into an upload again (a
    re-read would show as uploads of 0 new rows)."""
    topic = new_topic(broker.bootstrap, 2)
    produced = Produced(topic, 2)
    rng = random.Random(5)
    now_ms = int(time.time() * 1000)
    produce(broker.bootstrap, produced, [make_record(i, rng, now_ms) for i in range(20_000)])
    out = tmp_path / "table"
    for name in ("first", "second"):
        config = spark_config(tmp_path / name, broker.bootstrap, topic, f"g-{name}-{topic}", out, daemon_id=name,
                              sink={"format": "delta"})
        with SparkDaemon(tmp_path / name, config) as daemon:
            daemon.wait_caught_up(broker.bootstrap, produced, timeout=120)
            assert daemon.stop() == 0, daemon.log_tail()
        if name == "first":
            assert "uploaded " in daemon.log()
    log = daemon.log()
    starts = re.findall(rf"{re.escape(topic)}-(\d) starts at offset (\d+), where the sink's output already is", log)
    recorded = formats.FORMATS["delta"].committed_offsets(str(out))
    assert sorted(starts) == sorted((str(p), str(recorded[(topic, p)] + 1)) for p in range(2)), log
    assert "uploaded " not in log, log
    assert_exact(read_output(spark, out, "delta"), produced.expected())
