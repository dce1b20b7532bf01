"""``kdaemon offsets --watch`` on a terminal redraws one rich table per round (committed, end, lag
and status per partition); piped it keeps its plain lines (the ones tests/cli/test_watch_kafka.py
reads), without a control code.  On Apache Kafka (Tansu's ListOffsets answered an end of 1 for a
partition of 10 records produced in one batch), the group's offsets committed by the test itself."""

from __future__ import annotations

import sys
import uuid

import pytest

from tests.cli.terminal import ANSI, plain, run_on_pty
from tests.cli.test_cli_errors_kafka import kdaemon, write_config
from tests.cli.test_watch_kafka import Committer, group_statuses
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka


def test_watch_draws_a_table_on_a_terminal_and_plain_lines_in_a_pipe(kafka, tmp_path):
    topic, group = f"watch-tty-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    for p in range(2):
        produce(kafka.bootstrap, topic, [(None, b"%d" % i) for i in range(10)], partition=p)
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    committer = Committer(kafka.bootstrap, group, topic)
    try:
        committer.commit({0: 10, 1: 4})
    finally:
        committer.close()
    args = ["offsets", "-c", str(config), "--watch", "--interval", "0.2", "--count", "2"]

    code, text = run_on_pty([sys.executable, "-m", "kdaemon.cli", *args], tmp_path, timeout=120)
    assert code == 0, text
    assert ANSI.search(text), "no control codes on a terminal"
    shown = plain(text)
    assert f"group {group}: OK" in shown
    header = next(line for line in shown.splitlines() if "committed" in line)
    assert [w for w in header.replace("┃", " ").split()] == ["topic", "partition", "committed", "end", "lag",
                                                              "status", "why"]
    rows = {tuple(line.replace("│", " ").split()[:6]) for line in shown.splitlines() if topic in line
            and "│" in line}
    assert rows == {(topic, "0", "10", "10", "0", "OK"), (topic, "1", "4", "10", "6", "OK")}, shown
    assert f" {topic}[0]: " not in shown and f" {topic}[1]: " not in shown   # the pipe's lines are not drawn

    piped = kdaemon(*args, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout
    assert group_statuses(piped.stdout, group) == ["OK", "OK"]
    assert f" {topic}[1]: OK (committed 4, end 10, lag 6)" in piped.stdout
