"""``kdaemon broker`` (issue #19): starts the embedded broker, prints the line to paste into a
configuration, serves Kafka there until SIGTERM, then exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys

from kdaemon.embedded import api_versions_body


def test_broker_prints_its_address_serves_and_stops(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "broker", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith('bootstrap_servers = "127.0.0.1:') and line.endswith('"'), (line, proc.stderr)
        host, port = line.split('"')[1].rsplit(":", 1)
        body = api_versions_body(host, int(port), timeout=5.0)
        assert body is not None and body["error_code"] == 0, body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
        assert api_versions_body(host, int(port), timeout=1.0) is None
    finally:
        proc.kill()
        proc.wait()
