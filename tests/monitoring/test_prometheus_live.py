"""The dashboard and the alert rules against a real Prometheus scraping a running daemon.

Debian's ``prometheus`` server (the package .ci/system-deps installs) scrapes, once a second,
``kdaemon run`` (2 workers, a header rule, the jsonl sink) on Apache Kafka and ``kdaemon
lag-exporter`` beside it, while a producer writes on.  Through Prometheus's HTTP API:

* every target is up, and every query of monitoring/grafana/kdaemon.json (panels and variables,
  Grafana's variables at "All", ``$__rate_interval`` at 10 s) returns data;
* every alert rule evaluates without error, and each expression runs as a query;
* a worker killed with SIGKILL is counted as a restart of that worker for reason "signal";
* the exporter's readings agree with themselves (lag = end - committed) and, once the daemon has
  stopped, with the group's committed offsets as librdkafka reads them;
* once the daemon is stopped (SIGTERM) while producing goes on, KdaemonLagGrowing fires, while
  the exporter stays up.

The rules are alerts.yml itself, loaded after one documented transformation (``shortened``):
every ``for:`` and every range window divided by 60, so a minute becomes a second and the test
takes seconds, not a quarter of an hour.  Expressions, thresholds, labels and annotations are
the shipped ones.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from testkit.daemon import HOST, Daemon, daemon_config, free_port, kdaemon_command, wait_for
from tests.monitoring.test_monitoring_rules import ALERTS, alert_rules, dashboard_queries
from testkit.produce import Writer, committed_offsets, create_topic, paced

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed (Debian's prometheus "
                                                  "package; bash .ci/system-deps installs it)"),
]

PARTITIONS = 4
RATE = 300               # records a second, over all partitions: 75 each, so the 1000-record floor
                         # of KdaemonLagGrowing is passed some 14 s after the daemon stops
TIME_FACTOR = 60         # the rules' durations divided by this: minutes become seconds
SCRAPE_S = 1
# Grafana's built-in variables for this Prometheus: $__rate_interval is at least four scrapes.
BUILTINS = {"__rate_interval": "10s", "__interval": "2s", "__range": "5m"}
KEEP = {"header": "type", "op": "in", "values": ["keep"], "action": "keep"}

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"


def _scaled(duration: str, factor: int) -> str:
    ms = sum(int(n) * _UNIT_MS[u] for n, u in re.findall(r"(\d+)(ms|[smhdwy])", duration))
    assert ms % factor == 0, f"{duration} / {factor} is not a whole number of milliseconds"
    return f"{ms // factor}ms"


def shortened(rules_text: str, factor: int = TIME_FACTOR) -> str:
    """alerts.yml with every duration it waits or looks back over divided by ``factor``: each
    rule's ``for:`` and each range selector ``[<duration>]`` in its expression (10m becomes
    10000ms at 60).  Nothing else changes; a file with a duration elsewhere (a subquery, an
    ``offset``) is refused, since this would leave it long."""
    for rule in alert_rules():
        assert not re.search(rf"\[{_DURATION}:|\boffset\s", rule["expr"]), f"{rule['alert']}: extend shortened()"
    text, fors = re.subn(rf"(?m)^(\s*for:\s*)({_DURATION})\s*$", lambda m: m[1] + _scaled(m[2], factor), rules_text)
    text, ranges = re.subn(rf"\[({_DURATION})\]", lambda m: f"[{_scaled(m[1], factor)}]", text)
    assert fors == len(alert_rules()) and ranges, (fors, ranges)
    return text


def test_shortened_rules_change_only_durations():
    text = ALERTS.read_text()
    short = shortened(text)
    assert "for: 10000ms" in short and "deriv(kdaemon_group_lag[10000ms])" in short
    assert "increase(kdaemon_worker_restarts_total[15000ms])" in short
    pattern = rf"\[?{_DURATION}\]?"
    assert re.sub(pattern, "D", short) == re.sub(pattern, "D", text)


# -- Prometheus ------------------------------------------------------------------------------------

class PrometheusServer:
    """Debian's prometheus binary on a free port, its TSDB and log under ``root``."""

    def __init__(self, root: Path, targets: dict[str, str], rules: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.addr = f"{HOST}:{free_port()}"
        self.log_path = root / "prometheus.log"
        config = {"global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                             "evaluation_interval": f"{SCRAPE_S}s"},
                  "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                                     for job, target in targets.items()]}
        self.config_path = root / "prometheus.yml"
        self.config_path.write_text(json.dumps(config, indent=2))   # JSON is YAML
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PrometheusServer":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address={self.addr}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        wait_for(self._ready, 60, "Prometheus to be ready", self.log_tail, interval=0.2)
        return self

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}\n{self.log_tail()}"
        try:
            with urllib.request.urlopen(f"http://{self.addr}/-/ready", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, path: str, **params):
        url = f"http://{self.addr}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:   # a bad query answers 400 with the error in the body
            body = json.loads(exc.read())
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        """The value of a query expected to return one series, None if it returns none."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {result}"
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> dict[str, str]:
        """job -> health ("up", "down", "unknown")."""
        return {t["labels"]["job"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def alerts(self, name: str, state: str | None = None) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == name and (state is None or a["state"] == state)]

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace")
        return "--- prometheus log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# -- what runs beside it -----------------------------------------------------------------------------

class Producing(threading.Thread):
    """Writes ``RATE`` records a second until stopped, half of them of the type the daemon keeps."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="producing", daemon=True)
        self.writer = Writer(bootstrap, topic, **{"linger.ms": 20})
        self.halt = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            for i in paced(itertools.count(), RATE, every=30):
                if self.halt.is_set():
                    break
                kind = b"keep" if i % 2 else b"drop"
                self.writer.send(b'{"n": %d}' % i, b"k%d" % i, headers=[("type", kind)])
                self.writer.poll(0)
            self.writer.flush_checked()
        except BaseException as exc:   # seen by the test through check()
            self.failure = exc
        finally:
            # librdkafka's threads end with the producer, not when pytest lets go of a failed
            # test's frames (they would retry the stopped broker until the session ends).
            self.writer.producer = None

    def check(self) -> None:
        assert self.is_alive() or self.halt.is_set(), f"the producer stopped: {self.failure!r}"
        assert not self.writer.errors, self.writer.errors[:5]

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert self.failure is None, repr(self.failure)


class LagExporterProcess:
    """``kdaemon lag-exporter`` on the daemon's own configuration, polling every second."""

    def __init__(self, root: Path, config_path: Path) -> None:
        self.addr = f"{HOST}:{free_port()}"
        self.log_path = root / "lag-exporter.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(kdaemon_command() + ["lag-exporter", "-c", str(config_path),
                                                              "--listen", self.addr, "--interval", "1"],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log_tail(self, lines: int = 40) -> str:
        return "--- lag-exporter log (tail) ---\n" + "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"the lag exporter did not stop on SIGTERM\n{self.log_tail()}") from None
        return self.proc.returncode


# -- the test ----------------------------------------------------------------------------------------

def test_dashboard_and_alerts_on_a_real_prometheus_and_the_lag_alert_fires_with_the_daemon_stopped(kafka, tmp_path):
    topic, group = f"live-{uuid.uuid4().hex[:8]}", f"live-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    rules = tmp_path / "alerts.shortened.yml"
    rules.write_text(shortened(ALERTS.read_text()))
    daemon = Daemon(tmp_path / "daemon", daemon_config(tmp_path / "daemon", kafka.bootstrap, topic, group, workers=2,
                                                       filters=[KEEP]))
    producing = Producing(kafka.bootstrap, topic)
    exporter = prometheus = None
    try:
        producing.start()
        daemon.start()
        exporter = LagExporterProcess(tmp_path, daemon.config_path)
        prometheus = PrometheusServer(tmp_path / "prometheus", {"kdaemon": daemon.metrics_addr,
                                                                "kdaemon_lag": exporter.addr}, rules).start()

        def logs() -> str:
            return "\n".join([daemon.log_tail(), exporter.log_tail(), prometheus.log_tail()])

        daemon.wait_all_ready(60)

        # A worker killed from outside: a restart of that worker, reason "signal".
        mark = len(daemon.log())
        os.kill(daemon.workers()[0], signal.SIGKILL)
        daemon.wait_log(r"worker 0 \(pid \d+\) exited with code -9; restarting", 30, after=mark)
        daemon.wait_log(r"worker 0 \(pid \d+\) has its assignment", 60, after=mark)

        wait_for(lambda: set(prometheus.targets().values()) == {"up"}, 30, "every target up",
                 lambda: f"{prometheus.targets()}\n{logs()}")
        wait_for(lambda: prometheus.value('kdaemon_worker_restarts_total{worker="0", reason="signal"}') == 1, 30,
                 "worker 0's restart for reason signal in Prometheus",
                 lambda: str(prometheus.query("kdaemon_worker_restarts_total")))
        # The daemon's start time is its supervisor process's.
        started = psutil.Process(daemon.pid).create_time()
        assert prometheus.value("kdaemon_start_time_seconds") == pytest.approx(started, abs=0.5)
        others = prometheus.query('kdaemon_worker_restarts_total{worker!="0"} > 0 '
                                  'or kdaemon_worker_restarts_total{worker="0", reason!="signal"} > 0')
        assert others == [], others

        # Every dashboard query returns data (the slowest need a few scrapes of a few sources).
        queries = dashboard_queries(builtins=BUILTINS)
        empty: list[str] = []

        def all_answered() -> bool:
            producing.check()
            empty[:] = [f"{where}: {expr}" for where, expr in queries if not prometheus.query(expr)]
            return not empty
        wait_for(all_answered, 90, "every dashboard query to return data",
                 lambda: "still empty:\n" + "\n".join(empty) + "\n" + logs(), interval=1)

        # Every rule has been evaluated, without error, and each alert expression runs as a query.
        def evaluated() -> list[dict]:
            rules_now = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            done = [r for r in rules_now if not r["lastEvaluation"].startswith("0001-")]
            return rules_now if len(done) == len(rules_now) == len(alert_rules()) else []
        for rule in wait_for(evaluated, 30, "every rule evaluated", lambda: str(prometheus.api("rules"))):
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
        for rule in alert_rules():
            prometheus.query(rule["expr"])   # status success, or api() fails naming it

        # While the daemon keeps up, the lag alert is silent: wait for the worker's restart to be
        # caught up first (its partitions waited meanwhile).
        def caught_up() -> bool:
            lag = prometheus.value("max(kdaemon_group_lag)")
            return lag is not None and lag < 500
        wait_for(caught_up, 60,
                 "the group to catch up after the restart", lambda: str(prometheus.query("kdaemon_group_lag")))
        assert prometheus.alerts("KdaemonLagGrowing") == []

        # The exporter's figures hold together: lag = end - committed on every partition.
        assert len(prometheus.query("kdaemon_group_lag")) == PARTITIONS
        mismatched = prometheus.query("kdaemon_group_lag != on (group, topic, partition) "
                                      "(kdaemon_partition_end_offset - kdaemon_group_committed_offset)")
        assert mismatched == [], mismatched

        # The daemon stops; producing goes on; the brokers' view of the lag grows until the alert fires.
        assert daemon.stop(60) == 0, daemon.log_tail()
        committed = committed_offsets(kafka.bootstrap, group, topic, PARTITIONS)
        assert all(offset > 0 for offset in committed.values()), committed

        def exporter_shows_the_final_commits() -> bool:
            seen = {int(r["metric"]["partition"]): int(float(r["value"][1]))
                    for r in prometheus.query(f'kdaemon_group_committed_offset{{group="{group}"}}')}
            return seen == committed
        wait_for(exporter_shows_the_final_commits, 30, f"the exporter to show the committed offsets {committed}",
                 lambda: str(prometheus.query("kdaemon_group_committed_offset")))

        def lag_alert_firing() -> list[dict]:
            producing.check()
            return prometheus.alerts("KdaemonLagGrowing", "firing")
        firing = wait_for(lag_alert_firing, 120, "KdaemonLagGrowing to fire",
                          lambda: f"{prometheus.api('alerts')}\n{prometheus.query('kdaemon_group_lag')}\n{logs()}",
                          interval=1)
        assert {a["labels"]["group"] for a in firing} == {group}
        assert {a["labels"]["topic"] for a in firing} == {topic}
        assert all(float(a["value"]) > 1000 for a in firing), firing
        targets = prometheus.targets()
        assert targets["kdaemon_lag"] == "up" and prometheus.value("kdaemon_lag_exporter_up") == 1, targets
        wait_for(lambda: prometheus.targets()["kdaemon"] == "down", 30, "the daemon's target down")
        assert exporter.proc.poll() is None, exporter.log_tail()
        producing.stop()
        assert exporter.stop() == 0, exporter.log_tail()
    finally:
        producing.halt.set()
        producing.join(60)
        if exporter is not None:
            exporter.stop()
        if prometheus is not None:
            prometheus.stop()
        daemon.kill_all()
