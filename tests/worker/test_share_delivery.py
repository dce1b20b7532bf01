"""``ShareDelivery`` (kdaemon/worker/share.py) without a broker: what verdict each record of a
poll gets, and when.  The pipeline parts are the daemon's own, built from a configuration (the
json deserializer, the jsonl sink and DLQ in a temporary directory); the share consumer is a
recorder of verdicts and commits, and the sink is swapped for one that fails where a case needs
it.  The same rules on a real broker: tests/worker/test_share_daemon_kafka.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kdaemon.client.share import AcknowledgeType, ShareRecord
from kdaemon.config import parse
from kdaemon.plugins.types import SinkRefused
from kdaemon.worker.build import build_pipeline_parts
from kdaemon.worker.main import load_plugins
from kdaemon.worker.modes import Mode
from kdaemon.worker.share import ShareDelivery
from kdaemon.worker.stages import Pipeline, WorkerStats, WorkerStop

A, R, J = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT
LIMIT = 3


class Recorder:
    """The share consumer as ``ShareDelivery`` uses it: verdicts, then a commit."""

    def __init__(self) -> None:
        self.verdicts: dict[int, AcknowledgeType] = {}
        self.commits: list[str] = []

    def acknowledge(self, record, kind) -> None:
        self.verdicts[record.offset] = AcknowledgeType(kind)

    def commit_async(self) -> None:
        self.commits.append("async")

    def commit_sync(self) -> dict:
        self.commits.append("sync")
        return {}

    def assignment(self) -> set:
        return set()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(offset: int, value: bytes = b'{"a": 1}', delivery_count: int = 1) -> ShareRecord:
    return ShareRecord("t", 0, offset, 0, 0, b"k", value, [], None, delivery_count)


def delivery(tmp_path: Path, *, dlq: bool = True, **daemon) -> tuple[ShareDelivery, Recorder, Clock]:
    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g", "group_type": "share"},
           "daemon": {"topics": ["t"], "state_dir": str(tmp_path / "state"), "sink_retry_backoff_ms": 100,
                      "sink_retry_backoff_max_ms": 100, **daemon},
           "deserializer": {"value": "json"},
           "sink": {"type": "jsonl", "path": str(tmp_path / "out"), "fsync": False}}
    if dlq:
        raw["dlq"] = {"type": "jsonl", "path": str(tmp_path / "dlq"), "fsync": False}
    config = parse(raw)
    parts = build_pipeline_parts(config, load_plugins(config))
    consumer, clock = Recorder(), Clock()
    stats = WorkerStats()
    return (ShareDelivery(config, parts, consumer, stats, Pipeline(config, parts, stats),
                          delivery_count_limit=LIMIT, clock=clock), consumer, clock)


def lines(directory: Path) -> list[dict]:
    out = []
    for p in sorted(directory.glob("*.jsonl*")) if directory.exists() else ():
        out += [json.loads(x) for x in p.read_text().splitlines() if x]
    return out


def test_accepted_after_the_flush_dead_letters_and_the_last_delivery(tmp_path):
    d, consumer, _ = delivery(tmp_path)
    written_at_verdict = []
    consumer.acknowledge = (lambda r, kind, ack=consumer.acknowledge:
                            (written_at_verdict.append(len(lines(tmp_path / "out"))), ack(r, kind)))
    d.settle([record(0), record(1, b"not json"), record(2), record(3, delivery_count=LIMIT), record(4)])
    assert consumer.verdicts == {0: A, 1: A, 2: A, 3: A, 4: A}
    assert consumer.commits == ["async"]
    # Every verdict went out once the poll's records were durable in the sink.
    assert set(written_at_verdict) == {3}
    assert [o["offset"] for o in lines(tmp_path / "out")] == [0, 2, 4]
    dead = {o["offset"]: o for o in lines(tmp_path / "dlq")}
    assert set(dead) == {1, 3}
    headers = {k: base64.b64decode(v["base64"]).decode() for k, v in dead[3]["headers"]}
    assert headers["kdaemon.error"] == "delivery count limit reached: 3 deliveries"


def test_skip_rejects(tmp_path):
    d, consumer, _ = delivery(tmp_path, on_deserialize_error="skip")
    d.settle([record(0), record(1, b"not json")])
    assert consumer.verdicts == {0: A, 1: J}
    assert d.acknowledged["reject"] == 1


def test_stop_releases_the_poll_and_stops(tmp_path):
    d, consumer, _ = delivery(tmp_path, on_deserialize_error="stop")
    with pytest.raises(WorkerStop, match="deserialization failed at t-0@1"):
        d.settle([record(0), record(1, b"not json"), record(2)])
    assert consumer.verdicts == {0: R, 1: R, 2: R} and consumer.commits == ["sync"]


def test_without_a_dlq_the_last_delivery_is_processed_as_any(tmp_path):
    d, consumer, _ = delivery(tmp_path, dlq=False, on_deserialize_error="skip")
    assert d.parts.dlq is None
    d.settle([record(0, delivery_count=LIMIT)])
    assert consumer.verdicts == {0: A}
    assert [o["offset"] for o in lines(tmp_path / "out")] == [0]


class FailingSink:
    def __init__(self, on: str, error: BaseException) -> None:
        self.on, self.error = on, error
        self.closed = False

    def write(self, records) -> None:
        if self.on == "write":
            raise self.error

    def flush(self) -> None:
        if self.on == "flush":
            raise self.error

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("on", ["write", "flush"])
def test_a_sink_failure_releases_the_poll_and_rebuilds(tmp_path, on):
    d, consumer, clock = delivery(tmp_path)
    broken = d.parts.sink = FailingSink(on, OSError("disk gone"))
    d.settle([record(0), record(1)])
    assert consumer.verdicts == {0: R, 1: R} and consumer.commits == ["async"]
    assert d.mode is Mode.REWINDING and broken.closed
    assert d.hold() is True                     # nothing fetched until the sink is rebuilt
    clock.now += 1.0
    assert d.hold() is False and d.mode is Mode.RUNNING and d.parts.sink is not broken
    consumer.verdicts.clear()
    d.settle([record(0, delivery_count=2), record(1, delivery_count=2)])   # they come back
    assert consumer.verdicts == {0: A, 1: A}


def test_a_refusal_releases_the_poll_and_stops(tmp_path):
    d, consumer, _ = delivery(tmp_path)
    d.parts.sink = FailingSink("write", SinkRefused("no such table", target="t", fix="create it"))
    with pytest.raises(SinkRefused):
        d.settle([record(0), record(1)])
    assert consumer.verdicts == {0: R, 1: R} and consumer.commits == ["sync"]
    assert d.mode is Mode.STOPPED
    with pytest.raises(SinkRefused):
        d.hold()


def test_records_the_sink_refuses_for_what_they_are_go_to_the_dlq(tmp_path):
    d, consumer, _ = delivery(tmp_path)

    class Picky(FailingSink):
        def write(self, records) -> None:
            raise SinkRefused("too large", target="t", fix="-", records=[r for r in records if r.offset == 1])
    d.parts.sink = Picky("", OSError())
    d.settle([record(0), record(1), record(2)])
    assert consumer.verdicts == {0: A, 1: A, 2: A}
    assert [o["offset"] for o in lines(tmp_path / "dlq")] == [1]
