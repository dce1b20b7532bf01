"""A real Spark cluster for tests, from the pyspark distribution: a standalone master, workers,
and a Spark Connect server.

``start_standalone(dir, workers=2)`` runs ``spark-class org.apache.spark.deploy.master.Master``
and ``...deploy.worker.Worker`` (the classes ``sbin/start-master.sh`` and ``start-worker.sh``
run; pip's pyspark ships ``bin/spark-class`` but not those scripts) on loopback ports, and
returns once the master's JSON page lists every worker ALIVE.  ``start_connect(dir, master)``
runs ``org.apache.spark.sql.connect.service.SparkConnectServer`` through ``spark-submit`` (what
``sbin/start-connect-server.sh`` does; the server's jar is in pyspark's ``jars/``) and returns
once it accepts connections.  Every process is in its own session and killed with its group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from testkit.ports import HOST, listen_port

START_TIMEOUT = 120.0


class SparkClusterError(RuntimeError):
    """A cluster process did not come up; the message carries its log tail."""


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


@dataclass
class _Proc:
    name: str
    log: Path
    popen: subprocess.Popen

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(l for l in text[-lines:] if not l.lstrip().startswith("at "))

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass


def _spawn(name: str, directory: Path, args: list[str], env: dict[str, str] | None = None) -> _Proc:
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"{name}.log"
    full_env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST,
                "SPARK_LOG_DIR": str(directory), **(env or {})}
    with open(log, "ab") as fh:
        popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                 env=full_env, cwd=directory, start_new_session=True)
    return _Proc(name, log, popen)


@dataclass
class Standalone:
    master_url: str
    web_port: int
    procs: list[_Proc] = field(default_factory=list)

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json/", timeout=5) as resp:
            return json.load(resp)

    def alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.status()["workers"])
        except (OSError, ValueError, KeyError):
            return 0

    def log_tail(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def start_standalone(directory: Path, *, workers: int = 2, cores: int = 2, memory: str = "1g") -> Standalone:
    """A master and ``workers`` workers of ``cores`` cores each (cores are slots, not CPUs: two
    2-core workers on a 2-CPU machine let a Connect server and an uploader both get executors)."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, web = listen_port(), listen_port()
    cluster = Standalone(f"spark://{HOST}:{port}", web)
    try:
        cluster.procs.append(_spawn("master", directory, [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
            "--webui-port", str(web)]))
        for i in range(1, workers + 1):
            cluster.procs.append(_spawn(f"worker{i}", directory, [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--cores", str(cores),
                "--memory", memory, "--webui-port", str(listen_port()), "--work-dir", str(directory / f"work{i}"),
                cluster.master_url]))
        _wait(lambda: cluster.alive_workers() == workers, cluster.procs, f"{workers} workers ALIVE at the master")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@dataclass
class ConnectServer:
    url: str
    proc: _Proc

    def log_tail(self) -> str:
        return self.proc.tail()

    def stop(self) -> None:
        self.proc.stop()


def start_connect(directory: Path, master: str, *, conf: dict[str, str] | None = None) -> ConnectServer:
    """A Spark Connect server whose own driver runs on ``master``."""
    port = listen_port()
    settings = {"spark.connect.grpc.binding.address": HOST, "spark.connect.grpc.binding.port": str(port),
                "spark.ui.enabled": "false", "spark.driver.host": HOST, "spark.driver.bindAddress": HOST,
                "spark.sql.session.timeZone": "UTC", **(conf or {})}
    args = [str(spark_home() / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "Spark Connect server",
            "--master", master]
    for k, v in settings.items():
        args += ["--conf", f"{k}={v}"]
    proc = _spawn("connect", directory, args + ["spark-internal"])
    server = ConnectServer(f"sc://{HOST}:{port}", proc)
    try:
        _wait(lambda: _accepts(port) and "Spark Connect server started" in proc.log.read_text(errors="replace"),
              [proc], f"the Connect server on port {port}")
    except BaseException:
        server.stop()
        raise
    return server


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _wait(ready, procs: list[_Proc], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        dead = [p for p in procs if p.popen.poll() is not None]
        if dead:
            raise SparkClusterError(f"{dead[0].name} exited with {dead[0].popen.returncode} while waiting for "
                                    f"{what}:\n{dead[0].tail()}")
        if time.monotonic() > deadline:
            raise SparkClusterError(f"no {what} within {START_TIMEOUT:.0f} s:\n" + "\n".join(p.tail() for p in procs))
        time.sleep(0.5)
