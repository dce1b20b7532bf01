"""A Spark the staged jars are not built for is refused, not retried for ever (issue #36).

With pyspark 4.3 under the Delta/Iceberg jars built for Spark 4.1, every Iceberg job failed in
the JVM with IncompatibleClassChangeError, and the uploader retried it about once a second: 390
ERROR lines in five minutes and nothing delivered.  Now ``check-config`` names both versions and
the fix, and the uploader refuses to start (exit 6), which stops the daemon instead of being
restarted.

No second Spark is installed: the installed version is faked where it is read, in-process (a
monkeypatch) or in a subprocess (a ``sitecustomize`` that sets ``pyspark.__version__`` before
kdaemon imports anything).  No JVM starts: the installed pyspark is checked before one would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark sink needs the spark extra (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="the spark sink needs pyarrow (pip install -e '.[spark]')")

from kdaemon.exit_codes import EXIT_CONFIG, EXIT_SINK_REFUSED  # noqa: E402
from kdaemon.plugins.companion import CompanionSpec  # noqa: E402
from kdaemon.sinks.spark.tables import jars
from kdaemon.sinks.spark import staging  # noqa: E402
from kdaemon.supervisor.companion_run import launch  # noqa: E402
from testkit.daemon import Daemon  # noqa: E402
from testkit.spark import spark_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FAKE = "4.3.0"


@pytest.fixture(autouse=True)
def staged():
    for kind in jars.KINDS:
        try:
            jars.staged_jars(kind)
        except jars.JarsMissing as exc:
            pytest.skip(str(exc))


def shim(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess whose pyspark says it is ``FAKE``."""
    d = tmp_path / "shim"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text(f"import pyspark\npyspark.__version__ = {FAKE!r}\n")
    path = os.pathsep.join([str(d), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path}


def test_each_jar_set_says_which_spark_it_is_built_for_and_the_pinned_pyspark_is_that_one():
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    (pyspark,) = [p for p in pinned if p.startswith("pyspark")]
    version = re.fullmatch(r"pyspark(?:\[\w+\])?==([\d.]+)", pyspark).group(1)
    for kind in jars.KINDS:
        assert jars.built_for(kind) == "4.1"
        assert jars.mismatch(kind, version) is None, kind


def test_a_mismatch_names_both_versions_and_the_fix():
    assert jars.mismatch("delta", "4.1.7") is None
    found = jars.mismatch("iceberg", FAKE)
    assert found.line().startswith(f"the installed pyspark is {FAKE}, but the staged iceberg jars are built for "
                                   "Spark 4.1; to fix: install pyspark 4.1 (pip install 'pyspark==4.1.*'")
    assert "stage iceberg jars built for Spark 4.3" in found.fix
    assert "python -m kdaemon.sinks.spark.tables.jars iceberg" in found.fix
    jvm = jars.mismatch("delta", "4.2.0", jars.JVM)
    assert jvm.problem == "the JVM's Spark (spark.version) is 4.2.0, but the staged delta jars are built for Spark 4.1"
    assert "SPARK_HOME" in jvm.fix


def test_only_the_table_formats_jars_are_checked(monkeypatch):
    monkeypatch.setattr(jars, "installed_pyspark", lambda: FAKE)
    assert staging.spark_mismatch({"path": "/x"}) is None                                # Parquet: no jars
    assert staging.spark_mismatch({"path": "/x", "format": "delta", "master": "sc://h:15002"}) is None  # the server's
    assert staging.spark_mismatch({"path": "/x", "format": "delta"}).found == FAKE


def test_check_config_names_both_versions(tmp_path):
    config = spark_config(tmp_path, "127.0.0.1:1", "t", "g", tmp_path / "lake", sink={"format": "delta"})
    d = Daemon(tmp_path, config)   # writes the file; not started
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(d.config_path)],
                          capture_output=True, text=True, timeout=120, env=shim(tmp_path))
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{d.config_path}: sink: the installed pyspark is {FAKE}, but the staged delta jars are built for Spark 4.1 "
        f"(to fix: {jars.mismatch('delta', FAKE).fix})"], proc.stderr


def test_the_uploader_refuses_to_start_with_exit_6_once(tmp_path):
    """The uploader as the supervisor starts it: one line, exit 6, before any JVM or socket."""
    settings = {"type": "spark", "path": str(tmp_path / "lake"), "format": "iceberg"}
    spec = CompanionSpec("spark-uploader", entry="kdaemon.sinks.spark.uploader.process:run",
                         kwargs={"settings": settings, "state_dir": str(tmp_path / "state")})
    argv, env = launch(spec, "INFO", shim(tmp_path))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_SINK_REFUSED, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        f"ERROR spark-uploader kdaemon.spark.uploader: the uploader refuses to start: "
        f"{jars.mismatch('iceberg', FAKE).line()}"), proc.stderr
    assert not (tmp_path / "state" / "spark-uploader.sock").exists()


def test_kdaemon_run_stops_with_exit_6_instead_of_restarting_the_uploader(tmp_path):
    """The supervisor does not restart a companion whose exit a restart cannot cure: it stops the
    workers and exits with that code.  No broker: the workers are still waiting for one."""
    config = spark_config(tmp_path, "127.0.0.1:1", "t", "g", tmp_path / "lake", sink={"format": "delta"})
    with Daemon(tmp_path, config, env=shim(tmp_path)) as d:
        assert d.wait_exit(90) == EXIT_SINK_REFUSED, d.log_tail()
        log = d.log()
    assert log.count("started companion spark-uploader") == 1, log
    assert log.count("the uploader refuses to start") == 1, log
    assert "companion spark-uploader exited with code 6, which a restart does not cure" in log, log
    assert "supervisor exiting with code 6" in log, log


def test_kdaemon_run_in_process_stops_with_exit_6_too(broker, tmp_path):
    """Without a supervisor the process that runs the worker keeps the companions: a refusal
    stops its worker, and it exits with the companion's code."""
    from testkit.daemon import kdaemon_command
    config = spark_config(tmp_path, broker.bootstrap, f"t-{os.getpid()}", "g", tmp_path / "lake",
                          sink={"format": "delta"})
    d = Daemon(tmp_path, config)   # for its configuration file and log only
    with open(d.log_path, "ab") as out:
        proc = subprocess.Popen(kdaemon_command() + ["run", "--in-process", "-c", str(d.config_path)],
                                stdout=out, stderr=subprocess.STDOUT, env={**shim(tmp_path), "PYTHONUNBUFFERED": "1"},
                                cwd=tmp_path)
    try:
        assert proc.wait(90) == EXIT_SINK_REFUSED, d.log_tail()
    finally:
        if proc.poll() is None:
            proc.kill()
    log = d.log()
    assert log.count("the uploader refuses to start") == 1 and log.count("started companion spark-uploader") == 1, log


def test_a_jvm_of_another_spark_is_refused_once_the_session_is_up(tmp_path, monkeypatch):
    """pyspark 4.1 started by a SPARK_HOME naming a Spark 4.3: the installed pyspark passes, the
    session's ``spark.version`` does not.  The session is a stand-in (no JVM): its builder
    hands back a session that says 4.3.0."""
    from pyspark.sql import SparkSession

    from kdaemon.sinks.spark.uploader.writer import SparkMismatchError, SparkWriter

    class Session:
        version = FAKE
        sparkContext = type("Context", (), {"setLogLevel": staticmethod(lambda level: None)})()

    class Builder:
        def __getattr__(self, name):
            return lambda *args, **kwargs: Session() if name == "getOrCreate" else self

    monkeypatch.setattr(SparkSession, "builder", Builder())
    writer = SparkWriter({"type": "spark", "path": str(tmp_path / "lake"), "format": "delta", "master": "local[1]"})
    writer.check_spark()   # the installed pyspark is the pinned one
    with pytest.raises(SparkMismatchError) as refused:
        writer.start()
    assert str(refused.value) == jars.mismatch("delta", FAKE, jars.JVM).line()
    assert not writer.session_ready
