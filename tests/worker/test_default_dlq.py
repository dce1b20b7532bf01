"""The minimal configuration (a broker and a group, topics, a sink) runs, and its default policy
for records that fail to deserialize ("dlq") keeps them: without a ``[dlq]`` table they go to
JSON lines under ``<state_dir>/dlq``, durably, before their offsets are committed.  (The file
here also names the json value deserializer: the default, ``bytes``, cannot fail.)

First the daemon's own Worker, pipeline parts built from the minimal file (the json plugin, the
real jsonl DLQ) and the scripted one-partition consumer of testkit/pipeline.py, whose
every commit is checked against what the DLQ files hold at that moment; then ``kdaemon run``
against a real broker (Tansu).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kdaemon.config import load
from kdaemon.worker.build import build_pipeline_parts
from kdaemon.worker.main import load_plugins
from kdaemon.worker.pipeline import Worker
from testkit.pipeline import TOPIC, ScriptedConsumer
from testkit.produce import committed_offsets, create_topic, produce

MINIMAL = """\
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"

[daemon]
topics = ["{topic}"]
state_dir = "{state}"

[deserializer]
value = "json"

[sink]
type = "jsonl"
path = "{out}"
"""


def minimal(root: Path, bootstrap: str = "127.0.0.1:1", group: str = "g", topic: str = TOPIC) -> Path:
    path = root / "kdaemon.toml"
    path.write_text(MINIMAL.format(bootstrap=bootstrap, group=group, topic=topic, state=root / "state",
                                   out=root / "out"))
    return path


def dlq_lines(directory: Path, *, include_open: bool = True) -> list[dict]:
    """Every line the DLQ's files hold (the file still being written too: flushed means fsync'ed)."""
    out = []
    if directory.exists():
        names = sorted(directory.glob("*.jsonl")) + (sorted(directory.glob("*.jsonl.open")) if include_open else [])
        for p in names:
            out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


class InDlq:
    """The ``durable`` set ScriptedConsumer checks each commit against: the offsets the DLQ's
    files hold at the moment of the commit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __rsub__(self, offsets: set[int]) -> set[int]:
        return offsets - {line["offset"] for line in dlq_lines(self.directory)}


def test_a_record_that_fails_to_deserialize_lands_in_the_default_dlq_then_is_committed(tmp_path):
    config = load(minimal(tmp_path))
    assert config.dlq is not None and config.dlq.implicit
    dlq_dir = tmp_path / "state" / "dlq"
    parts = build_pipeline_parts(config, load_plugins(config))
    consumer = ScriptedConsumer(25, InDlq(dlq_dir))   # values b"v0".. are not JSON
    worker = Worker(config, parts, consumer, lambda c, w: None)
    try:
        for _ in range(3):
            worker.step()
        worker.flush_and_commit()
    finally:
        for sink in (parts.sink, parts.dlq):
            sink.close()
    assert consumer.commits and consumer.commits[-1] == 25
    lines = dlq_lines(dlq_dir)
    assert sorted(line["offset"] for line in lines) == list(range(25))
    assert all(line["topic"] == TOPIC for line in lines)
    assert worker.stats.dlq and sum(worker.stats.dlq.values()) == 25
    assert not list((tmp_path / "out").glob("*.jsonl"))   # nothing reached the sink


@pytest.mark.broker
@pytest.mark.slow
def test_the_minimal_config_runs_and_keeps_a_bad_record(broker, tmp_path):
    topic, group = f"minimal-{uuid.uuid4().hex[:8]}", f"minimal-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    path = minimal(tmp_path, broker.bootstrap, group, topic)
    check = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(path)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    log = open(tmp_path / "kdaemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(path), "--in-process"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

    def committed() -> int:
        return committed_offsets(broker.bootstrap, group, topic, 1)[0]

    def wait(what: str, predicate, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert proc.poll() is None, f"kdaemon exited: {(tmp_path / 'kdaemon.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{what}; log:\n{(tmp_path / 'kdaemon.log').read_text()[-3000:]}"
            time.sleep(0.3)

    try:
        # auto_offset_reset is "latest" by default: feed good records until one is committed,
        # so the consumer's position is known to precede what comes next.
        wait("no good record was committed",
             lambda: produce(broker.bootstrap, topic, [(b"k", b'{"ok": 1}')]) and committed() > 0)
        reports = produce(broker.bootstrap, topic, [(b"k", b"not json"), (b"k", b'{"ok": 2}')])
        bad, end = reports[0].offset, reports[1].offset + 1
        wait(f"offsets were not committed up to {end}", lambda: committed() == end)
        proc.terminate()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    in_dlq = dlq_lines(tmp_path / "state" / "dlq", include_open=False)
    assert [line["offset"] for line in in_dlq] == [bad]
    out = [json.loads(line) for p in sorted((tmp_path / "out").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert {"ok": 2} in [o["value"] for o in out]
    assert bad not in [o["offset"] for o in out]
