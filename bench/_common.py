"""Helpers the benchmarks share: a free port, a Tansu broker, one request over a socket, machine facts.

Deliberately independent of ``tests/``: a benchmark must keep running whatever the test suite's
helpers become.  The broker is kdaemon's embedded Tansu (``kdaemon.embedded``, shared with the
demo and the tests): a free loopback port, in-memory storage, stopped by its own pid.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from kdaemon import embedded
from kdaemon.protocol.connection import KafkaConnection, Response
from kdaemon.protocol.schema import Api

HOST = embedded.HOST


class BrokerUnavailable(RuntimeError):
    """No Tansu binary, or it did not start; the caller decides whether to fall back."""


def free_port(host: str = HOST) -> int:
    return embedded.free_port(host)


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


class TansuBroker:
    """kdaemon's embedded broker (``kdaemon.embedded``) as a context manager for benchmarks."""

    def __init__(self, log_path: Path, *, timeout: float = 30.0, attempts: int = 3) -> None:
        self.log_path = Path(log_path)
        self._timeout = timeout
        self._attempts = attempts
        self._broker: embedded.EmbeddedBroker | None = None

    @property
    def host(self) -> str:
        return self._broker.host if self._broker else HOST

    @property
    def port(self) -> int:
        return self._broker.port if self._broker else 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def offered(self) -> dict[int, tuple[int, int]]:
        return self._broker.offered if self._broker else {}

    @property
    def pid(self) -> int | None:
        proc = self._broker.process if self._broker else None
        return proc.pid if proc is not None else None

    def start(self) -> "TansuBroker":
        try:
            self._broker = embedded.start_broker(self.log_path.parent, timeout=self._timeout,
                                                 attempts=self._attempts)
        except embedded.EmbeddedBrokerError as exc:
            raise BrokerUnavailable(str(exc)) from None
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._broker is not None:
            self._broker.stop(timeout)

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
