"""``python -m testkit.durations``: the breakdown docs/TESTING.md is made from."""

from __future__ import annotations

from testkit import durations

LOG = """\
============================= slowest durations =============================
120.50s call     tests/chaos/test_chaos_reduced.py::test_chaos_reduced[classic-jsonl]@lane-slow
30.00s setup    tests/client/test_truncation_kafka.py::test_the_scenario@tests.client.test_truncation_kafka
2.00s call     tests/protocol/test_records.py::test_one
0.01s teardown tests/protocol/test_records.py::test_one
"""

CPU = [
    {"nodeid": "tests/chaos/test_chaos_reduced.py::test_chaos_reduced[classic-jsonl]@lane-slow",
     "wall_s": 120.5, "cpu_s": 100.0, "end": 1000.5, "worker": "gw0"},
    {"nodeid": "tests/client/test_truncation_kafka.py::test_the_scenario@tests.client.test_truncation_kafka",
     "wall_s": 40.0, "cpu_s": 10.0, "end": 920.0, "worker": "gw1"},
    {"nodeid": "tests/protocol/test_records.py::test_one", "wall_s": 2.0, "cpu_s": 2.0, "end": 925.0, "worker": "gw1"},
]


def test_phases_folders_and_fixture_starts():
    entries = durations.parse(LOG)
    assert [(p, n.split("::")[0]) for _, p, n in entries][:2] == [
        ("call", "tests/chaos/test_chaos_reduced.py"), ("setup", "tests/client/test_truncation_kafka.py")]
    text = durations.breakdown(entries)
    assert "3 tests, 153 s of test time" in text
    assert "tests/client/test_truncation_kafka.py (setup)" in text   # a fixture start (over 5 s)
    assert "tests/protocol/test_records.py (teardown)" not in text


def test_cpu_waiting_and_each_workers_end():
    text = durations.breakdown(durations.parse(LOG), CPU)
    assert "CPU: 112 s of 162 s of test time (69%); the rest, 50 s, is waiting" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()[:1] in (["gw0"], ["gw1"])}
    # gw0 began at 880 (its test's end less its wall time), the run's first moment: it ends at 120.5
    assert rows == {"gw0": ["120", "120"], "gw1": ["42", "45"]}
    lane = next(line for line in text.splitlines() if line.startswith("lane-slow"))
    assert lane.split()[1:] == ["120", "0", "120"]
