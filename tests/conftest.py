"""Fixtures shared by the whole suite, and how the suite runs in parallel.

``kafka``: one Apache Kafka node (KRaft, combined broker+controller, PLAINTEXT), the reference
broker.  ``kafka_cluster``: three Apache Kafka nodes with racks r1-r3, and SSL (client
certificates required) and SASL_SSL (PLAIN, SCRAM-SHA-256/512) listeners beside PLAINTEXT.
Both are started once per test run and shared by every pytest-xdist worker (testkit/shared.py):
tests create their own uniquely named topics and groups, and never stop a shared node (a suite
that kills brokers starts a cluster of its own with ``start_or_fail``).  Both come from Maven
Central jars (testkit/apache_kafka.py); their logs are printed under any test that used them
and failed.  ``KDAEMON_TEST_SERVERS=DIR`` keeps them running after the run, for the next to
reuse (docs/TESTING.md).

``broker``: one Tansu broker per worker (the embedded default, for quick tests).
``mock_cluster``: a fresh three-broker librdkafka mock cluster per test, for injected errors.

Markers follow the fixtures: a test that uses ``kafka``/``kafka_cluster`` is marked ``kafka``,
one that uses ``broker`` is marked ``broker``, one that uses ``spark`` is marked ``spark`` (so
``-m kafka`` selects the Apache Kafka suites wherever they live).  Under pytest-xdist
(``make test`` runs ``-n``), a module with a module-scoped fixture of its own (its own cluster)
runs on one worker, so that the fixture starts once; tests that load the machine run in lanes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit import jvm_archive, shared
from testkit.apache_kafka import KafkaCluster, KafkaUnavailable, start_kafka
from testkit.mockcluster import MockCluster
from testkit.schema_registry import SchemaRegistryServer
from testkit.tansu import TansuBroker, start_tansu


JVM_TEST_OPTIONS = "-XX:TieredStopAtLevel=1"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """The run's owner (xdist's controller, or the one process) chooses where the shared servers
    are recorded; the workers it spawns inherit the choice through the environment."""
    # xdist registers its marker only when loaded: a run with -p no:xdist (.ci/run's rerun of
    # the failed tests) would otherwise stop at collection on the groups set below.
    config.addinivalue_line("markers", "xdist_group(name): the scheduling unit (tests/conftest.py _group)")
    if _is_worker(config):
        return
    kept = os.environ.get(shared.ENV)
    root = Path(kept) if kept else config._tmp_path_factory.getbasetemp() / "shared-servers"
    root.mkdir(parents=True, exist_ok=True)
    os.environ[shared.RUN_ENV] = str(root)
    # Every JVM of the run (Kafka, the Java peers, Spark's drivers in the daemons' uploaders, the
    # Kafka tools) compiles with C1 only: a SparkSession's start took 18 CPU-s with both
    # compilers and 10.7 with C1 alone here, and the tests' JVMs live too briefly for C2 to pay.
    os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_TEST_OPTIONS)
    # ...and every Spark driver maps a class-data archive of what a driver loads: half the CPU of
    # its start (testkit/jvm_archive.py).  Made once per JDK and pyspark, in the background: the
    # JVMs started meanwhile run without it.
    if not os.environ.get(jvm_archive.DISABLE_ENV):
        os.environ[jvm_archive.ENABLE_ENV] = "1"
        archive = jvm_archive.archive_path()
        if archive is not None:
            jvm_archive.start_making(archive)
            jvm_archive.use(archive)
        # ...and Kafka's (its nodes, their storage format, its tools: testkit.apache_kafka
        # names the archive on their command lines once it exists).
        jvm_archive.start_making(None, "kafka")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Once every worker is done: stop the shared servers, unless the developer keeps them."""
    if _is_worker(session.config) or os.environ.get(shared.ENV) or shared.RUN_ENV not in os.environ:
        return
    shared.stop_all(Path(os.environ[shared.RUN_ENV]))


def _shared_kafka(name: str, **kw) -> KafkaCluster:
    def start(directory: Path) -> KafkaCluster:
        try:
            return start_kafka(directory, **kw)
        except KafkaUnavailable as exc:
            pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)
    return shared.shared(Path(os.environ[shared.RUN_ENV]), name, start, KafkaCluster.describe, KafkaCluster.attach)


@pytest.fixture(scope="session")
def kafka() -> KafkaCluster:
    """A running single-node Apache Kafka: ``.bootstrap`` ("127.0.0.1:PORT"), ``.host``, ``.port``."""
    return _shared_kafka("kafka")


@pytest.fixture(scope="session")
def kafka_cluster() -> KafkaCluster:
    """Three Apache Kafka nodes (racks r1, r2, r3) with PLAINTEXT, SSL and SASL_SSL listeners."""
    return _shared_kafka("kafka-cluster", nodes=3, secure=True)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> TansuBroker:
    """A running Tansu broker: ``.bootstrap`` ("127.0.0.1:PORT"), ``.host``, ``.port``.

    Its log is kept under pytest's temporary directory (``.log_path``).
    """
    tansu = start_tansu(tmp_path_factory.mktemp("tansu"))
    yield tansu
    tansu.stop()


@pytest.fixture
def mock_cluster() -> MockCluster:
    """A librdkafka mock cluster with brokers 1, 2 and 3, destroyed after the test."""
    with MockCluster(3) as cluster:
        yield cluster


# The servers whose log ends are attached to the report of a failed test that used one (as a
# fixture of any scope, the session's or a suite's own), and the section's title.
LOGGED_SERVERS = ((KafkaCluster, "Apache Kafka logs"), (SchemaRegistryServer, "Apicurio Registry log"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the logs of the servers a failed test used (``LOGGED_SERVERS``) to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        for server_type, title in LOGGED_SERVERS:
            if isinstance(value, server_type):
                report.sections.append((f"{title} ({name})", value.log_tail(40)))


# Fixtures whose use marks a test (``-m kafka`` and friends select by what a test needs).
MARKING_FIXTURES = {"kafka": "kafka", "kafka_cluster": "kafka", "broker": "broker", "spark": "spark"}


def _has_own_module_fixture(item: pytest.Item) -> bool:
    """The test uses a module- or class-scoped fixture defined in its own module (a cluster of
    the module's own, typically): every test of that module must run on one xdist worker."""
    module = getattr(item, "module", None)
    info = getattr(item, "_fixtureinfo", None)
    if module is None or info is None:
        return False
    for defs in info.name2fixturedefs.values():
        for d in defs:
            if d.scope in ("module", "class") and getattr(d.func, "__module__", None) == module.__name__:
                return True
    return False


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Mark by fixture; group modules with a cluster of their own; slow tests first.

    A wrapper, and its work before the ``yield``: xdist's own hook turns the ``xdist_group``
    marks into scheduling groups, and must see them (with ``tryfirst`` it ran first all the
    same, and every group was ignored).  The order is the same in every worker (a stable sort
    of the collected order), as xdist needs.
    """
    for item in items:
        for fixture, marker in MARKING_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    grouped = {item.module.__name__ for item in items if _has_own_module_fixture(item)}
    groups = {}
    for item in items:
        group = groups[item] = _group(item, grouped)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The lanes of FIRST_LANES first, each at once on a worker of its own; then the collected
    # order (make test passes --no-loadscope-reorder: xdist would otherwise hand out the units
    # with the most tests first, every group before any of the thousands of quick tests).
    items.sort(key=lambda item: FIRST_LANES.index(groups[item]) if groups[item] in FIRST_LANES else len(FIRST_LANES))
    return (yield)


# The Spark lanes start at once, one a worker (xdist hands a worker a second unit only once fewer
# than three of its tests are left); the other slow tests' lane is next in the collected order
# (tests/chaos), and the quick tests fill in beside them.  A lane handed out at its place in that
# order instead (tests/sinks/spark comes late) started 700 s into the run and ended it.
FIRST_LANES = ("lane-spark-slow-a", "lane-spark-slow-b", "lane-spark")
# The slow Spark tests are two lanes of 800-900 s each (one lane of 1,320 s was the run's
# longest chain, and with the Delta maintenance test, 640 s of mostly waiting, lane b took 1,160
# s against a's 578): the daemons under faults (the chaos and stall runs, the Spark cluster, the
# sink's chaos test) and the refused rows in one, the sink's end-to-end, failure and maintenance
# suites in the other.  Modules stay whole: the cluster's module fixture starts once.
SPARK_SLOW_A = ("tests.chaos.", "tests.stall.", "tests.sinks.spark.test_spark_cluster",
                "tests.sinks.spark.test_spark_sink_chaos", "tests.sinks.spark.test_spark_refused_rows")


def _group(item: pytest.Item, grouped: set[str]) -> str | None:
    """The scheduling unit of a test that loads the machine, or shares a costly start.

    Lanes run their tests one after another on one worker, which bounds how many machine-loading
    tests share the two cores at once: the slow Spark tests (daemons whose uploaders each start
    a SparkSession: a JVM of a core's worth of CPU for 10 s and a gigabyte), the other Spark
    tests (one reader session among them), the Schema Registry tests (one registry JVM, not one
    per worker), and the other slow tests.  A module with a cluster of its own is a unit of its
    own (the cluster starts once).  Every other test fills the remaining workers, and the lanes'
    workers once they are done."""
    module = item.module.__name__ if getattr(item, "module", None) is not None else None
    if item.get_closest_marker("spark") is not None:
        if item.get_closest_marker("slow") is None:
            return "lane-spark"
        return "lane-spark-slow-a" if (module or "").startswith(SPARK_SLOW_A) else "lane-spark-slow-b"
    if "schema_registry" in getattr(item, "fixturenames", ()):
        return "lane-registry"
    if module in grouped:
        return module
    if item.get_closest_marker("slow") is not None:
        return "lane-slow"
    return None


# -- what each test computed (KDAEMON_TEST_CPU=path; read by `python -m testkit.durations`) ----

def _cpu_s() -> float:
    import resource
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    path = os.environ.get("KDAEMON_TEST_CPU")
    if not path:
        yield
        return
    import json
    import time
    wall, cpu = time.monotonic(), _cpu_s()
    yield
    record = {"nodeid": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
              "cpu_s": round(_cpu_s() - cpu, 3), "end": round(time.time(), 1),
              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a") as fh:   # one short line per test: appends from several workers stay whole
        fh.write(json.dumps(record) + "\n")
