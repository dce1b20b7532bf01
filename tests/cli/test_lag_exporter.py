"""``kdaemon lag-exporter`` without a broker: what it refuses, and that it keeps serving /metrics,
saying that its polls fail, while no broker answers, and while slow clients hold connections.
Its readings on Apache Kafka, through a real Prometheus, are in
tests/monitoring/test_prometheus_live.py.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kdaemon.config import dump_toml
from testkit.daemon import HOST, free_port, kdaemon_command, wait_for
from testkit.slow_clients import SlowClients, tcp


def _config(root: Path, *, bootstrap: str, group: str | None = "lagx-group", **daemon) -> Path:
    kafka = {"bootstrap_servers": bootstrap, "retry_backoff_ms": 50}
    if group is not None:
        kafka["group_id"] = group
    path = root / "kdaemon.toml"
    path.write_text(dump_toml({"plugins": [], "kafka": kafka,
                               "daemon": {"topics": ["lagx-topic"], "state_dir": str(root / "state"), **daemon},
                               "sink": {"type": "null"}}))
    return path


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(kdaemon_command() + ["lag-exporter", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _unused_port() -> int:
    """A port nothing listens on (bound and closed): connections to it are refused."""
    return free_port()


def test_refuses_a_configuration_without_a_group(tmp_path: Path):
    """A static assignment needs no group_id (the loader requires it only with a group)."""
    path = _config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}", group=None, assignment="static")
    out = _run("-c", str(path))
    assert out.returncode == 2, out
    assert out.stderr.strip() == (f"kdaemon lag-exporter: [kafka] group_id is not set in {path}: there is no group "
                                  "whose lag to export"), out.stderr


def test_refuses_a_topic_pattern(tmp_path: Path):
    path = _config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}", topics=[], topic_pattern="^lagx-.*")
    out = _run("-c", str(path))
    assert out.returncode == 2, out
    assert "does not resolve: list the topics in [daemon] topics" in out.stderr, out.stderr


@pytest.mark.parametrize("listen", ["9465", "localhost:", "localhost:http", ":9465", "localhost:70000"])
def test_refuses_a_listen_address_that_is_not_host_port(tmp_path: Path, listen: str):
    out = _run("-c", str(_config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}")), "--listen", listen)
    assert out.returncode == 2, out
    assert f"Invalid value for '--listen': {listen!r} is not HOST:PORT" in out.stderr, out.stderr


def test_refuses_a_listen_address_in_use(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen(1)
        listen = f"{HOST}:{taken.getsockname()[1]}"
        out = _run("-c", str(_config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}")), "--listen", listen)
    assert out.returncode == 2, out
    assert out.stderr.strip().endswith(f"kdaemon lag-exporter: cannot listen on {listen}: Address already in use; "
                                       "choose another --listen"), out.stderr


def _scrape(addr: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def test_keeps_serving_and_says_its_polls_fail_while_no_broker_answers(tmp_path: Path):
    """Every scrape is answered while each poll waits out its timeout on a broker that refuses
    connections; the failures are counted by error class, ``up`` is 0 and no lag is made up."""
    path = _config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}")
    listen = f"{HOST}:{free_port()}"
    log_path = tmp_path / "exporter.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(kdaemon_command() + ["lag-exporter", "-c", str(path), "--listen", listen,
                                                     "--interval", "0.2", "--timeout-ms", "1500"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        def failing_twice():
            assert proc.poll() is None, log_path.read_text()
            try:
                page = _scrape(listen)
            except OSError:   # not listening yet
                return None
            errors = page.get('kdaemon_lag_exporter_errors_total{error="KafkaTimeoutError",group="lagx-group"}', 0)
            return page if errors >= 2 else None

        page = wait_for(failing_twice, 60, "two failed polls on /metrics", log_path.read_text)
        assert page['kdaemon_lag_exporter_up{group="lagx-group"}'] == 0.0
        assert not [k for k in page if k.startswith(("kdaemon_group_", "kdaemon_partition_end_offset",
                                                    "kdaemon_lag_exporter_last_success"))], page
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = log_path.read_text()
    # Said once, with the broker's address and the cause, not once per poll.
    assert log.count("polling Kafka failed") == 1, log
    assert re.search(r"polling Kafka failed \(KafkaTimeoutError: .*ECONNREFUSED", log), log


def test_slow_and_idle_clients_hold_no_scrape_and_no_stop(tmp_path: Path):
    """40 clients trickling a request a byte every 1.5 s and 10 sending nothing, all held by the
    exporter: a scrape is answered (in OpenMetrics when asked), and SIGTERM stops it with 0,
    while every one of them is still connected.  prometheus_client's threaded server gives each
    client its own thread, so none of them is in the way."""
    path = _config(tmp_path, bootstrap=f"{HOST}:{_unused_port()}")
    host, port = HOST, free_port()
    listen = f"{host}:{port}"
    log_path = tmp_path / "exporter.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(kdaemon_command() + ["lag-exporter", "-c", str(path), "--listen", listen,
                                                     "--interval", "0.2", "--timeout-ms", "1500"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: re.search(r"metrics on http://", log_path.read_text()) or proc.poll() is not None, 60,
                 "the exporter listening", log_path.read_text)
        assert proc.poll() is None, log_path.read_text()
        with SlowClients(tcp(host, port), b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ") as slow:
            wait_for(lambda: slow.held_by(proc.pid) == len(slow.all), 30, "the exporter holding the 50 clients",
                     log_path.read_text)
            request = urllib.request.Request(f"http://{listen}/metrics",
                                             headers={"Accept": "application/openmetrics-text; version=1.0.0"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text"), resp.headers
                assert b"kdaemon_lag_exporter_up" in resp.read()
            assert "kdaemon_lag_exporter_up{group=\"lagx-group\"}" in "".join(_scrape(listen))
            assert slow.held() == len(slow.all), "clients were closed or answered"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_command_line_does_not_import_prometheus_client():
    """``kdaemon.cli`` imports the lag exporter for every command; ``kdaemon run`` must import
    prometheus_client only after the supervisor set PROMETHEUS_MULTIPROC_DIR, since its
    multiprocess mode is chosen at that first import (else the workers' metrics are lost)."""
    out = subprocess.run([sys.executable, "-c", "import sys, kdaemon.cli; "
                          "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
