"""Helpers the benchmarks share: a free port, the brokers, one request over a socket, a process's
CPU time, machine facts, and running a benchmark's own script as a child process.

Part of the test kit (testkit/), which the benchmarks and the tests both use; neither imports
the other.

Two brokers, chosen by ``open_broker(kind, directory)``, both context managers with the same
face (``bootstrap``, ``host``/``port``, ``offered``, ``pids``, ``cpu_s()``, ``describe()``):

* ``kafka`` (``KafkaBroker``), the reference: Apache Kafka from ``testkit/apache_kafka.py``
  (the launcher the test suite uses: jars resolved by Maven into ~/.cache/kdaemon, one combined
  KRaft broker+controller node, PLAINTEXT on a free loopback port, data in the given directory).
  The launcher is imported from the test support rather than copied: one place knows how to
  start Kafka.
* ``tansu`` (``TansuBroker``): kdaemon's embedded Tansu (``kdaemon.embedded``, shared with the
  demo and the tests): a free loopback port, in-memory storage, stopped by its own pid.  Its
  high watermark is the last batch's base offset + 1, so benchmarks count records per
  partition instead of trusting it (which works on both brokers).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from kdaemon import embedded
from kdaemon.protocol.connection import Response
from kdaemon.protocol.schema import Api

HOST = embedded.HOST
REPO_ROOT = Path(__file__).resolve().parent.parent


BROKER_KINDS = ("kafka", "tansu")


class BrokerUnavailable(RuntimeError):
    """The broker cannot run here (no Tansu binary; no Java or Maven for Kafka) or did not start;
    the caller decides whether to fall back."""


def free_port(host: str = HOST) -> int:
    return embedded.free_port(host)


def request(host: str, port: int, api: Api, version: int, body: dict, *,
            timeout: float = 10.0, client_id: str = "kdaemon-bench") -> Response:
    """One request/response over a fresh socket, framed by kdaemon's own sans-IO connection
    (testkit/wire.py's, with a benchmark's client id and a longer timeout)."""
    from testkit.wire import request as wire_request
    return wire_request(host, port, api, version, body, timeout=timeout, client_id=client_id)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (``/proc/PID/stat``), or None
    when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _Broker:
    """What both brokers offer a benchmark beyond their address: their CPU time and a summary."""

    name = "broker"

    @property
    def pids(self) -> list[int]:
        raise NotImplementedError

    @property
    def bootstrap(self) -> str:
        raise NotImplementedError

    @property
    def offered(self) -> dict[int, tuple[int, int]]:
        raise NotImplementedError

    def cpu_s(self) -> float:
        """CPU seconds the broker's processes have used so far (for a Kafka node: the JVM, every
        thread).  Sample it before and after a client's run; the difference over the records
        read is the broker's CPU per record served."""
        total = 0.0
        for pid in self.pids:
            cpu = process_cpu_s(pid)
            if cpu is None:
                raise RuntimeError(f"{self.name} process {pid} is gone: no CPU figure for it")
            total += cpu
        return total

    def idle_cpu(self, seconds: float = 3.0) -> float:
        """CPU seconds per wall second the broker uses while no client asks anything of it (its
        own threads, the JVM's housekeeping): the floor under a per-record figure."""
        c0, t0 = self.cpu_s(), time.perf_counter()
        time.sleep(seconds)
        return (self.cpu_s() - c0) / (time.perf_counter() - t0)

    def describe(self) -> str:
        fetch = self.offered.get(1)
        versions = f"Fetch v{fetch[0]}-{fetch[1]}" if fetch else "Fetch not offered"
        return (f"{self.name} on {self.bootstrap} (pid {', '.join(map(str, self.pids))}); {versions}")


class TansuBroker(_Broker):
    """kdaemon's embedded broker (``kdaemon.embedded``) as a context manager for benchmarks."""

    name = "Tansu"

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

    @property
    def pids(self) -> list[int]:
        return [self.pid] if self.pid is not None else []

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


class KafkaBroker(_Broker):
    """Apache Kafka, one combined KRaft node on PLAINTEXT, started by the test suite's launcher
    (``testkit.apache_kafka.start_kafka``) into ``directory``; killed by pid on exit."""

    name = "Apache Kafka"

    # Kafka's own scripts start a broker with a 1 GiB heap (KAFKA_HEAP_OPTS) and G1
    # (KAFKA_JVM_PERFORMANCE_OPTS); the test launcher's defaults are smaller, for the suite's sake.
    JVM_PERFORMANCE_OPTS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                            "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent")

    def __init__(self, directory: Path, *, heap: str | None = "1g", timeout: float = 120.0,
                 properties: dict[str, str] | None = None) -> None:
        self.directory = Path(directory)
        self._heap = heap
        self._timeout = timeout
        self._properties = dict(properties or {})   # server.properties beyond the launcher's
        self._cluster = None

    @property
    def version(self) -> str:
        from testkit.apache_kafka import KAFKA_VERSION
        return KAFKA_VERSION

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._cluster.port if self._cluster else 0

    @property
    def bootstrap(self) -> str:
        return self._cluster.bootstrap if self._cluster else ""

    @property
    def offered(self) -> dict[int, tuple[int, int]]:
        return self._cluster.offered if self._cluster else {}

    @property
    def pids(self) -> list[int]:
        if self._cluster is None:
            return []
        return [n.process.pid for n in self._cluster.nodes.values() if n.process is not None]

    @property
    def pid(self) -> int | None:
        pids = self.pids
        return pids[0] if pids else None

    @property
    def log_path(self) -> Path | None:
        return next(iter(self._cluster.nodes.values())).log_path if self._cluster else None

    def start(self) -> "KafkaBroker":
        try:
            from testkit.apache_kafka import KafkaStartError, KafkaUnavailable, start_kafka
        except ImportError as exc:
            raise BrokerUnavailable(f"Apache Kafka's launcher (testkit/apache_kafka.py) cannot be "
                                    f"imported: {exc}; run from the repository root") from None
        try:
            self._cluster = start_kafka(self.directory, nodes=1, heap=self._heap, timeout=self._timeout,
                                        java_opts=self.JVM_PERFORMANCE_OPTS,
                                        extra_properties=self._properties)
        except (KafkaUnavailable, KafkaStartError) as exc:
            raise BrokerUnavailable(f"Apache Kafka did not start: {exc}") from None
        return self

    def jvm_options(self) -> list[str]:
        """The heap and GC flags the broker's JVM runs with, read from its command line."""
        out = []
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            out += [a for a in args if a.startswith(("-Xm", "-XX:")) and a not in out]
        return out

    def describe(self) -> str:
        return (f"{super().describe().replace(self.name, f'{self.name} {self.version}', 1)}, JVM "
                f"{' '.join(self.jvm_options()) or '(flags unknown)'}, log {self.log_path}")

    def stop(self, timeout: float = 5.0) -> None:
        if self._cluster is not None:
            self._cluster.stop()

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def open_broker(kind: str, directory: Path) -> TansuBroker | KafkaBroker:
    """The broker a benchmark's ``--broker`` names, not started yet (use it as a context manager);
    its data and log go under ``directory``."""
    if kind == "kafka":
        return KafkaBroker(Path(directory) / "kafka")
    if kind == "tansu":
        return TansuBroker(Path(directory) / "tansu.log")
    raise ValueError(f"unknown broker {kind!r}: expected one of {', '.join(BROKER_KINDS)}")


def java_version() -> str | None:
    """``java -version``'s first line (the JVM the Java consumer and Kafka run on), or None."""
    import shutil
    import subprocess
    java = shutil.which("java")
    if java is None:
        return None
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[0] if lines else None


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


# -- child processes ------------------------------------------------------------------------------

def child_env(*, before: list[str] = (), after: list[str] = (), drop: tuple[str, ...] = ()) -> dict:
    """The environment of a benchmark's child: kdaemon and bench from the tree this file lives in
    (first on ``PYTHONPATH``, after ``before``), even when an editable install points elsewhere,
    so a copy of the tree can be measured while others edit the checkout; ``drop`` names
    variables the child must not inherit."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(
        list(before) + [str(REPO_ROOT)] + list(after)
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_child(script: str, flag: str, spec: dict, timeout: float, env: dict | None = None) -> dict:
    """``python SCRIPT FLAG JSON(spec)`` in a fresh process, its answer the JSON object on the last
    line of its stdout; ``{"error": ...}`` (its exit code and stderr's tail) when it fails or does
    not answer within ``timeout`` seconds."""
    cmd = [sys.executable, str(Path(script).resolve()), flag, json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env=child_env() if env is None else env)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:g} s"}
    if proc.returncode:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
