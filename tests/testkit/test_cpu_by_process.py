"""testkit.cpu_by_process: a run's processes summed by kind, only those under ``make test``."""

from __future__ import annotations

import json

from testkit import cpu_by_process


def _proc(pid, ppid, cmd, cpu, comm="python", first=0.0):
    return {"pid": pid, "ppid": ppid, "comm": comm, "cmd": cmd, "first": first, "last": first + 5, "cpu": cpu}


def test_the_report_sums_the_make_test_tree_by_kind(tmp_path, capsys):
    procs = [
        _proc(1, 0, "make test PYTEST_ARGS=", 0.1, comm="make"),
        _proc(2, 1, "/venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", 40.0),
        _proc(3, 2, "/usr/bin/java -Xmx384m -Dlog4j2.configurationFile=/tmp/x/faults0/node1/log4j2.xml -cp a.jar",
              9.0, comm="java"),
        _proc(4, 2, "/venv/bin/python /venv/bin/kdaemon run -c /tmp/x/kdaemon.toml", 1.0),
        _proc(5, 4, "/venv/bin/python -m kdaemon.supervisor.companion_run kdaemon.sinks.spark.uploader.process:run", 2.0),
        _proc(6, 5, "bash /venv/lib/python3.11/site-packages/pyspark/bin/spark-class org.apache.spark.deploy.SparkSubmit",
              6.0, comm="bash"),
        _proc(7, 0, "/usr/bin/java -Dlog4j2.configurationFile=/tmp/other/node1/log4j2.xml", 50.0, comm="java"),
    ]
    path = tmp_path / "procs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in procs))
    cpu_by_process.report(str(path))
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "58 CPU-s in 6 processes"   # pid 7 is no child of make test
    rows = {line[30:].strip(): float(line.split()[0]) for line in out.splitlines()[2:]}
    assert rows["Python: pytest workers (the tests)"] == 40
    assert rows["JVM: Kafka nodes of suites' own clusters"] == 9
    assert rows["JVM: Spark drivers of daemons' uploaders"] == 6
    assert rows["Python: daemons (supervisors, workers, uploaders)"] == 3
